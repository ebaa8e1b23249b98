"""A stdlib OpenAI-compatible chat client over a unix socket or http (the harness's only way out).

Importing ``openai`` costs ~0.6 s per trial; this costs ~0.03 s. ``RSIGYM_MODEL_SOCKET`` (a unix
socket path) wins over ``RSIGYM_MODEL_URL`` (e.g. ``http://127.0.0.1:8000/v1``).

>>> client = Client(url="http://127.0.0.1:9/v1")
>>> client.path("/chat/completions")
'/v1/chat/completions'
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import urllib.parse
from typing import Any


class LLMError(RuntimeError):
    """The model server answered with an error (``status``, OpenAI ``code``) or could not be reached."""

    def __init__(self, message: str, status: int = 0, code: str | None = None):
        super().__init__(message)
        self.status, self.code = status, code


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


class Client:
    """``Client(socket_path=...)`` or ``Client(url=...)``; ``Client.from_env()`` reads the environment."""

    def __init__(self, socket_path: str | None = None, url: str | None = None, timeout: float = 120.0,
                 api_key: str = "local"):
        if not socket_path and not url:
            raise LLMError("no model endpoint: set RSIGYM_MODEL_SOCKET or RSIGYM_MODEL_URL")
        self.socket_path, self.timeout, self.api_key = socket_path, timeout, api_key
        parsed = urllib.parse.urlparse(url or "http://localhost/v1")
        self.host, self.port = parsed.hostname or "localhost", parsed.port
        self.https = parsed.scheme == "https"
        self.prefix = parsed.path.rstrip("/") if url else "/v1"

    @classmethod
    def from_env(cls) -> "Client":
        return cls(socket_path=os.environ.get("RSIGYM_MODEL_SOCKET") or None,
                   url=os.environ.get("RSIGYM_MODEL_URL") or None)

    def path(self, endpoint: str) -> str:
        return self.prefix + endpoint

    def _connection(self) -> http.client.HTTPConnection:
        if self.socket_path:
            return _UnixConnection(self.socket_path, self.timeout)
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=self.timeout)

    def chat(self, model: str, messages: list[dict[str, Any]], **params: Any) -> dict[str, Any]:
        """POST /chat/completions → ``{"content", "finish_reason", "usage"}`` of the first choice."""
        body = json.dumps({"model": model, "messages": messages, **{k: v for k, v in params.items() if v is not None}})
        conn = self._connection()
        try:
            conn.request("POST", self.path("/chat/completions"), body=body.encode(),
                         headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.api_key}"})
            resp = conn.getresponse()
            data = resp.read()
        except OSError as exc:
            raise LLMError(f"cannot reach the model server: {exc}") from None
        finally:
            conn.close()
        try:
            payload = json.loads(data or b"{}")
        except ValueError:
            raise LLMError(f"model server answered {resp.status} with non-JSON", resp.status) from None
        if resp.status != 200:
            err = payload.get("error") or {}
            raise LLMError(err.get("message") or f"HTTP {resp.status}", resp.status, err.get("code"))
        choice = payload["choices"][0]
        return {"content": (choice.get("message") or {}).get("content") or "",
                "finish_reason": choice.get("finish_reason"), "usage": payload.get("usage") or {}}
