"""The agent gateway: every surface through which an agent outside this process drives a run.

All of them (REST, MCP, OpenEnv, Harbor tasks) are thin adapters over one :class:`RunBackend`:
a research run behind a lock, called by tool name with the same JSON arguments as a ``step``
action. One source for schemas (the tool models), validation, billing, audit and scoring.
"""

from .backend import LocalRun, RunBackend, ToolReply

__all__ = ["LocalRun", "RunBackend", "ToolReply"]
