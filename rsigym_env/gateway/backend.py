"""``RunBackend``: one research run as a thread-safe, JSON-in/JSON-out object every surface adapts.

A backend is called by tool name with the tool's JSON arguments (exactly a ``step`` action's
``args``) and answers with a :class:`ToolReply`: the text the researcher reads, the structured
result, the error code of a refusal, what the call cost and what is left. Refusals are replies,
never exceptions.

>>> import gymnasium as gym, rsigym_env
>>> run = LocalRun(gym.make("RSIGym/Joint-v0", world="sim", benchmark="aime", budget_usd=50), seed=0)
>>> run.call("evaluate", {"k": 1}).result["job"]
'job-1'
>>> reply = run.call("evaluate", {"k": "two"})
>>> reply.ok, reply.error
(False, 'invalid_args')
>>> run.call("submit", {}).done
True
>>> run.close()
"""

from __future__ import annotations

import threading
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, Field

from ..canonical import jsonable  # noqa: F401  (the surfaces import it from here)


class ToolReply(BaseModel):
    """The answer to one tool call, in every surface's terms."""

    ok: bool = Field(description="False if the call was refused (then `error` and `message` say why).")
    tool: str = Field(description="The tool that was called ('?' if the call was not a tool call).")
    text: str = Field(description="What the researcher reads: the status line and the call's result.")
    result: dict[str, Any] | None = Field(None, description="The structured result of an allowed call.")
    error: str | None = Field(None, description="Error code of a refused call, e.g. invalid_args, insufficient_budget.")
    message: str | None = Field(None, description="What was wrong, for a refused call.")
    cost_usd: float = Field(0.0, description="What this call cost (0 for refusals).")
    budget_left_usd: float = Field(description="Dollars left on the run's key after the call.")
    events: list[dict[str, Any]] = Field(default_factory=list, description="Jobs that finished during the call.")
    done: bool = Field(False, description="True once the episode has ended (submitted, or out of steps/time/money).")
    reward: float | None = Field(None, description="The normalized gain on the held-out split, once done.")
    end: dict[str, Any] | None = Field(None, description="The end-of-episode summary (official score, spend, ...), once done.")


@runtime_checkable
class RunBackend(Protocol):
    """One run as the gateway sees it. Implementations must be safe to call from many threads."""

    def call(self, tool: str, args: dict[str, Any] | None = None) -> ToolReply: ...
    def observation(self) -> dict[str, Any]: ...
    def close(self) -> None: ...


END_KEYS = ("initial_score", "official_score", "normalized_gain", "spend_usd", "budget_usd", "submitted",
            "end_reason", "best_dev_score", "best_candidate", "steps", "elapsed_h", "official_eval_usd")



class LocalRun:
    """A run in this process: a ``ResearchEnv`` (reset once, with ``seed``) behind a lock.

    ``env`` is any env built by ``gymnasium.make("RSIGym/...")`` or ``ResearchEnv(...)``.
    """

    def __init__(self, env: Any, seed: int | None = None):
        self.env = env
        self._lock = threading.Lock()
        self._obs, self.reset_info = env.reset(seed=seed)
        self._done = False
        self._last: ToolReply | None = None

    @property
    def done(self) -> bool:
        return self._done

    def call(self, tool: str, args: dict[str, Any] | None = None) -> ToolReply:
        """Run one tool call (``args`` as a ``step`` action's ``args``); never raises for bad input."""
        action = {"tool": tool, "args": {} if args is None else args}
        with self._lock:
            obs, reward, terminated, truncated, info = self.env.step(action)
            self._obs = obs
            done = bool(terminated or truncated) or self._done
            self._done = done
            reply = ToolReply(
                ok=bool(info.get("ok", False)), tool=str(info.get("tool", tool)), text=str(obs["log"]),
                result=jsonable(info.get("result")) if info.get("ok") else None,
                error=info.get("error"), message=info.get("message"),
                cost_usd=float(info.get("cost_usd", 0.0)), budget_left_usd=float(info.get("budget_left_usd", 0.0)),
                events=jsonable(info.get("events", [])), done=done,
                reward=float(reward) if done and "normalized_gain" in info else None,
                end=jsonable({k: info[k] for k in END_KEYS if k in info}) if "normalized_gain" in info else None)
            if reply.end is not None:
                self._last = reply
            return reply

    def observation(self) -> dict[str, Any]:
        """The last observation (log, budget and time left, step, dev scores, running jobs, action mask)."""
        with self._lock:
            obs = jsonable(self._obs)
        out = {k: (v[0] if isinstance(v, list) and len(v) == 1 else v) for k, v in obs.items()}
        out["done"] = self._done
        if self._last is not None:
            out["end"] = self._last.end
        return out

    def close(self) -> None:
        with self._lock:
            self.env.close()
