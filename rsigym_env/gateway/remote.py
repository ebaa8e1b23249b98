"""``RemoteRun``: a run of a session service over HTTP, as a :class:`~rsigym_env.gateway.backend.RunBackend`.

What ``rsigym mcp`` (or any surface) uses to drive a run that lives in ``rsigym serve``: the same
``call`` / ``observation`` as an in-process :class:`~rsigym_env.gateway.backend.LocalRun`, with the
run key as the bearer token. A refusal is a reply (its error code as the service gave it); a
service that cannot be reached is a reply too, ``service_unreachable``. ``close()`` closes the
connection only: the run's life belongs to the service.

>>> RemoteRun.from_env({"RSIGYM_URL": "http://127.0.0.1:8765", "RSIGYM_RUN_KEY": "rsr_..."}).url
'http://127.0.0.1:8765'
"""

from __future__ import annotations

import os
from urllib.parse import quote
from typing import Any, Mapping

import httpx

from .backend import ToolReply
from .host import refusal


class RemoteError(Exception):
    """A read-only view the service refused (``code``, ``status``)."""

    def __init__(self, code: str, message: str, status: int):
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.status = code, message, status


class RemoteRun:
    """A run behind ``url`` (e.g. ``http://127.0.0.1:8765``), reached with ``key``. Thread-safe."""

    def __init__(self, url: str, key: str, *, timeout_s: float = 120.0, client: httpx.Client | None = None):
        self.url = url.rstrip("/")
        self._client = client or httpx.Client(base_url=self.url, timeout=timeout_s,
                                              headers={"Authorization": f"Bearer {key}"})
        self._budget_left = 0.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **kwargs: Any) -> "RemoteRun":
        """From ``RSIGYM_URL`` and ``RSIGYM_RUN_KEY`` (``KeyError`` naming the missing one)."""
        env = os.environ if environ is None else environ
        for name in ("RSIGYM_URL", "RSIGYM_RUN_KEY"):
            if not env.get(name):
                raise KeyError(f"{name} is not set")
        return cls(env["RSIGYM_URL"], env["RSIGYM_RUN_KEY"], **kwargs)

    def call(self, tool: str, args: dict[str, Any] | None = None) -> ToolReply:
        """``POST /v1/tools/{tool}``; never raises for a refusal or an unreachable service."""
        try:
            response = self._client.post(f"/v1/tools/{quote(tool, safe='')}", json={} if args is None else args)
        except httpx.HTTPError as exc:
            return refusal(tool, "service_unreachable", f"{self.url}: {type(exc).__name__}: {exc}", self._budget_left)
        try:
            reply = ToolReply.model_validate_json(response.content)
        except ValueError:
            return refusal(tool, "bad_response", f"HTTP {response.status_code} without a tool reply: "
                                                 f"{response.text[:300]}", self._budget_left)
        self._budget_left = reply.budget_left_usd
        return reply

    def _get(self, path: str) -> Any:
        try:
            response = self._client.get(path)
        except httpx.HTTPError as exc:
            raise RemoteError("service_unreachable", f"{self.url}: {type(exc).__name__}: {exc}", 0) from None
        try:
            body = response.json()
        except ValueError:
            body = {"error": "bad_response", "message": response.text[:300]}
        if response.status_code != 200:
            raise RemoteError(str(body.get("error", "error")), str(body.get("message", "")), response.status_code)
        return body

    def observation(self) -> dict[str, Any]:
        """``GET /v1/observation`` (:class:`RemoteError` if the service refuses)."""
        return self._get("/v1/observation")

    def balance(self) -> dict[str, float]:
        return self._get("/v1/balance")

    def jobs(self) -> list[dict[str, Any]]:
        return self._get("/v1/jobs")["jobs"]

    def job(self, job_id: str) -> dict[str, Any] | None:
        try:
            return self._get(f"/v1/jobs/{quote(job_id, safe='')}")
        except RemoteError as exc:
            if exc.code == "unknown_job":
                return None
            raise

    def close(self) -> None:
        self._client.close()
