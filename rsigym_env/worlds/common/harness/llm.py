"""A stdlib OpenAI-compatible chat client over a unix socket or http (the harness's only way out).

Importing ``openai`` costs ~0.6 s per trial and ``http.client`` ~0.04 s; this speaks HTTP/1.1 on a
plain socket (``http.client`` only for https), ``_socket``'s: the ``socket`` module around it imports
``selectors`` and builds its enums, ~2 ms of each start. ``RSIGYM_MODEL_SOCKET`` (a unix socket path) wins over
``RSIGYM_MODEL_URL`` (e.g. ``http://127.0.0.1:8000/v1``).

>>> client = Client(url="http://127.0.0.1:9/v1")
>>> client.path("/chat/completions")
'/v1/chat/completions'
"""

from __future__ import annotations

import _socket as socket  # socket.socket's C base class: the same calls, errors and timeouts
import json
import os


class LLMError(RuntimeError):
    """The model server answered with an error (``status``, OpenAI ``code``) or could not be reached."""

    def __init__(self, message: str, status: int = 0, code: str | None = None):
        super().__init__(message)
        self.status, self.code = status, code


def _request(sock: socket.socket, host: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    """One HTTP/1.1 POST on a connected socket (``Connection: close``) → (status, body)."""
    head = "".join(f"{k}: {v}\r\n" for k, v in {"Host": host, "Content-Length": str(len(body)),
                                                  "Connection": "close", **headers}.items())
    sock.sendall(f"POST {path} HTTP/1.1\r\n{head}\r\n".encode() + body)
    chunks = []
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        chunks.append(chunk)
    raw = b"".join(chunks)
    header, _, data = raw.partition(b"\r\n\r\n")
    lines = header.decode("latin-1").split("\r\n")
    try:
        status = int(lines[0].split()[1])
    except (IndexError, ValueError):
        raise OSError(f"not an HTTP response: {lines[0][:80]!r}") from None
    fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    if fields.get("transfer-encoding", "").lower() == "chunked":
        out, rest = b"", data
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line.split(b";")[0] or b"0", 16)
            if size == 0:
                break
            out, rest = out + rest[:size], rest[size + 2:]
        data = out
    return status, data


class Client:
    """``Client(socket_path=...)`` or ``Client(url=...)``; ``Client.from_env()`` reads the environment."""

    def __init__(self, socket_path: str | None = None, url: str | None = None, timeout: float = 120.0,
                 api_key: str = "local"):
        if not socket_path and not url:
            raise LLMError("no model endpoint: set RSIGYM_MODEL_SOCKET or RSIGYM_MODEL_URL")
        self.socket_path, self.timeout, self.api_key = socket_path, timeout, api_key
        self.host, self.port, self.https, self.prefix = "localhost", None, False, "/v1"
        if url:  # the stdlib's URL parser, imported only then (imports are a trial's start-up cost)
            import urllib.parse

            parsed = urllib.parse.urlparse(url)
            self.host, self.port = parsed.hostname or "localhost", parsed.port
            self.https = parsed.scheme == "https"
            self.prefix = parsed.path.rstrip("/")

    @classmethod
    def from_env(cls) -> "Client":
        return cls(socket_path=os.environ.get("RSIGYM_MODEL_SOCKET") or None,
                   url=os.environ.get("RSIGYM_MODEL_URL") or None)

    def path(self, endpoint: str) -> str:
        return self.prefix + endpoint

    def _post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        if self.https:  # rare (a remote endpoint): the stdlib's client, imported only then
            import http.client

            conn = http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout)
            try:
                conn.request("POST", path, body=body, headers=headers)
                resp = conn.getresponse()
                return resp.status, resp.read()
            finally:
                conn.close()
        if self.socket_path:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            address: str | tuple[str, int] = self.socket_path
        else:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            address = (self.host, self.port or 80)
        sock.settimeout(self.timeout)
        try:
            sock.connect(address)
            return _request(sock, "localhost" if self.socket_path else self.host, path, body, headers)
        finally:
            sock.close()

    def chat(self, model: str, messages: list[dict[str, object]], **params: object) -> dict[str, object]:
        """POST /chat/completions → ``{"content", "finish_reason", "usage"}`` of the first choice."""
        body = json.dumps({"model": model, "messages": messages, **{k: v for k, v in params.items() if v is not None}})
        try:
            status, data = self._post(self.path("/chat/completions"), body.encode(),
                                      {"Content-Type": "application/json", "Authorization": f"Bearer {self.api_key}"})
        except OSError as exc:
            raise LLMError(f"cannot reach the model server: {exc}") from None
        try:
            payload = json.loads(data or b"{}")
        except ValueError:
            raise LLMError(f"model server answered {status} with non-JSON", status) from None
        if status != 200:
            err = payload.get("error") or {}
            raise LLMError(err.get("message") or f"HTTP {status}", status, err.get("code"))
        choice = payload["choices"][0]
        return {"content": (choice.get("message") or {}).get("content") or "",
                "finish_reason": choice.get("finish_reason"), "usage": payload.get("usage") or {}}
