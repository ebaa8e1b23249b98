"""``DevScoreShaping``: potential-based reward shaping with the best dev score so far (Ng et al., 1999).

The env pays its reward only at the end. This wrapper adds ``scale * (gamma * phi(s') - phi(s))``
on every step, where ``phi`` is the best dev score measured so far (0 while none is) and
``phi = 0`` once the episode has ended, so the discounted shaped return is the unshaped one minus
``phi(s_0)`` (which is 0 here) and the optimal policy does not change.

>>> import gymnasium as gym, rsigym_env
>>> env = DevScoreShaping(gym.make("RSIGym/Joint-v0", benchmark="aime", budget_usd=100), gamma=1.0)
>>> _ = env.reset(seed=0)
>>> _ = env.step({"tool": "evaluate", "args": {"k": 1}})
>>> obs, reward, *_, info = env.step({"tool": "wait", "args": {}})
>>> reward == info["potential"] > 0, info["reward_unshaped"]
(True, 0.0)
>>> obs, reward, terminated, truncated, info = env.step({"tool": "submit", "args": {}})
>>> terminated, bool(abs(reward - (info["reward_unshaped"] - obs["dev_scores"][1])) < 1e-9)
(True, True)
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym


class DevScoreShaping(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Adds ``scale * (gamma * phi(s') - phi(s))`` to every reward; ``phi`` = best dev score so far.

    ``phi`` is read from the env itself (``env.unwrapped.run_view().best_dev``), so the wrapper may sit above
    wrappers that change the observation (``FlatObservation``, ``ToolCallWrapper``). Every episode end
    (``terminated`` or ``truncated``) counts as terminal, ``phi = 0``: in this env both mean the run is
    over and its final reward has been paid, there is nothing to bootstrap from.

    ``info`` gets ``reward_unshaped`` (the env's reward) and ``potential`` (``phi(s')``).

    Args:
        env: an RSIGym env, possibly wrapped.
        gamma: the discount of the learner (policy invariance needs the learner's own gamma).
        scale: multiplies the shaping term.
    """

    def __init__(self, env: gym.Env, gamma: float = 0.99, scale: float = 1.0):
        gym.utils.RecordConstructorArgs.__init__(self, gamma=gamma, scale=scale)
        gym.Wrapper.__init__(self, env)
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {gamma}")
        self.gamma = float(gamma)
        self.scale = float(scale)
        self._phi = 0.0

    def potential(self) -> float:
        """``phi`` of the current state: the best dev score so far, 0 if none."""
        view = self.env.unwrapped.run_view()
        best = view.best_dev if view is not None else None
        return 0.0 if best is None else float(best)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        self._phi = self.potential()
        return obs, info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        phi_next = 0.0 if (terminated or truncated) else self.potential()
        shaped = float(reward) + self.scale * (self.gamma * phi_next - self._phi)
        self._phi = phi_next
        info = {**info, "reward_unshaped": float(reward), "potential": phi_next}
        return obs, shaped, terminated, truncated, info
