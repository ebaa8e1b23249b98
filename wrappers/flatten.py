"""``FlatObservation``: the env's observation as one float32 vector, so standard RL libraries accept it.

The text log is dropped; money, time and steps become fractions of the scenario's limits. The layout
is :attr:`FlatObservation.FEATURES`:

>>> import gymnasium as gym, rsigym_env
>>> env = FlatObservation(gym.make("RSIGym/Joint-v0", benchmark="aime", budget_usd=100))
>>> obs, info = env.reset(seed=0)
>>> obs.dtype, obs.shape, env.observation_space.contains(obs)
(dtype('float32'), (17,), True)
>>> dict(zip(FlatObservation.FEATURES[:7], obs[:7].tolist()))
{'budget_left_frac': 1.0, 'time_left_frac': 1.0, 'step_frac': 0.0, 'dev_initial': -1.0, 'dev_best': -1.0, 'dev_last': -1.0, 'running_jobs': 0.0}
>>> FlatObservation.FEATURES[7:10]
('mask_generate_data', 'mask_transform_data', 'mask_train')
"""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from rsigym_env.tools import TOOL_NAMES


class FlatObservation(gym.ObservationWrapper[np.ndarray, Any, dict[str, Any]], gym.utils.RecordConstructorArgs):
    """A ``Box`` float32 vector observation; entries in the order of :attr:`FEATURES`.

    ``budget_left_frac``, ``time_left_frac``, ``step_frac``: money and time left and steps taken as a
    fraction of the scenario's budget, time limit and step limit (each in [0, 1]);
    ``dev_initial``, ``dev_best``, ``dev_last``: the dev scores, -1 while not measured;
    ``running_jobs``: how many jobs run (a count, at most the step limit);
    ``mask_<tool>``: 1 if the tool is allowed and usable now (the env's ``action_mask``), one per tool
    of :data:`rsigym_env.tools.TOOL_NAMES`.
    """

    FEATURES: ClassVar[tuple[str, ...]] = (
        "budget_left_frac", "time_left_frac", "step_frac", "dev_initial", "dev_best", "dev_last",
        "running_jobs", *(f"mask_{name}" for name in TOOL_NAMES),
    )

    def __init__(self, env: gym.Env):
        gym.utils.RecordConstructorArgs.__init__(self)
        gym.ObservationWrapper.__init__(self, env)
        scenario = env.unwrapped.scenario
        self._budget = float(scenario.budget_usd)
        self._time_h = float(scenario.time_limit_h)
        self._max_steps = int(scenario.max_steps)
        n_masks = len(TOOL_NAMES)
        low = np.array([0, 0, 0, -1, -1, -1, 0] + [0] * n_masks, dtype=np.float32)
        high = np.array([1, 1, 1, 1, 1, 1, self._max_steps] + [1] * n_masks, dtype=np.float32)
        self.observation_space = spaces.Box(low, high, dtype=np.float32)

    def observation(self, observation: dict[str, Any]) -> np.ndarray:
        """The flat vector of one ``Dict`` observation of the env."""
        head = [
            float(observation["budget_left_usd"][0]) / self._budget if self._budget > 0 else 0.0,
            float(observation["time_left_h"][0]) / self._time_h if self._time_h > 0 else 0.0,
            float(observation["step"][0]) / self._max_steps if self._max_steps > 0 else 1.0,
            *np.asarray(observation["dev_scores"], dtype=np.float64).tolist(),
            float(observation["running_jobs"][0]),
        ]
        flat = np.concatenate([np.asarray(head, dtype=np.float64),
                               np.asarray(observation["action_mask"], dtype=np.float64)])
        space = self.observation_space
        return np.clip(flat, space.low, space.high).astype(np.float32)
