"""The local HTTP servers that untrusted code reaches (envd, the OpenAI-compatible server) cannot be
hung, flooded or made to talk: attacks through the real clients (the ``e2b`` SDK, the ``openai`` SDK)
and raw HTTP where a client would not send the bytes."""

from __future__ import annotations

import gzip
import io
import json
import logging
import socket
import statistics
import threading
import time
import zlib
from pathlib import Path
from typing import Iterator

import httpx
import openai
import pytest
from openai import OpenAI
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

e2b = pytest.importorskip("e2b")
from e2b import Sandbox  # noqa: E402
from e2b.exceptions import SandboxException  # noqa: E402

from rsigym_env.serving import EchoModel, ModelRegistry, OpenAIServer  # noqa: E402
from rsigym_env.serving.asgi import BodyLimitMiddleware, ThreadedASGIServer  # noqa: E402
from rsigym_env.serving.openai_server import UnixHTTPConnection  # noqa: E402
from rsigym_env.worlds.local.sandbox.envd import EnvdServer, health  # noqa: E402
from rsigym_env.worlds.local.sandbox.isolation import Limits, Mount, bwrap_available  # noqa: E402

needs_bwrap = pytest.mark.skipif(not bwrap_available(), reason="bubblewrap is not usable here")
MiB = 1 << 20
USER = [{"role": "user", "content": "hi"}]


def gzip_bomb(decoded_bytes: int) -> bytes:
    """``decoded_bytes`` zeros, gzip-compressed (about a thousandth of the size), built in pieces."""
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(MiB)
    return b"".join(z.compress(zeros) for _ in range(decoded_bytes // MiB)) + z.flush()


def raw_request(port: int, head: bytes, body: bytes = b"", timeout: float = 5.0) -> tuple[int, bytes]:
    """Send ``head`` (request line and headers) and ``body`` on a fresh connection; (status, response bytes)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
        conn.sendall(head + b"\r\n\r\n" + body)
        data = b""
        while b"\r\n\r\n" not in data or len(data) < data.index(b"\r\n\r\n") + 4 + _length(data):
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
    return int(data.split(b" ", 2)[1]), data


def _length(data: bytes) -> int:
    head = data[:data.index(b"\r\n\r\n")].lower()
    for line in head.split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 0


# --------------------------------------------------------------------------------------------
# envd: special files are never opened for content, nothing blocks the event loop


@pytest.fixture(scope="module")
def envd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EnvdServer]:
    if not bwrap_available():
        pytest.skip("bubblewrap is not usable here")
    root = tmp_path_factory.mktemp("envd-sec") / "app"
    data = tmp_path_factory.mktemp("envd-sec-data")
    with EnvdServer(root, limits=Limits(processes=64, memory_mb=512),
                    mounts=[Mount(data, "/data", writable=True)]) as srv:
        yield srv


@pytest.fixture(scope="module")
def sbx(envd: EnvdServer) -> Sandbox:
    return Sandbox.create(debug=True, sandbox_url=envd.url)


@pytest.fixture(scope="module")
def small_envd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EnvdServer]:
    """An envd with small limits (no commands run in it): 1 MiB uploads, 64 KiB Connect messages."""
    with EnvdServer(tmp_path_factory.mktemp("envd-small") / "app", require_isolation=False,
                    max_upload_bytes=MiB, max_message_bytes=64 << 10) as srv:
        yield srv


SPECIAL_FILES = {
    "fifo in /app": ("mkfifo /app/pipe", "pipe", "/app/pipe", "FIFO"),
    "fifo in a writable mount": ("mkfifo /data/out.jsonl", "/data/out.jsonl", "/data/out.jsonl", "FIFO"),
    "link to a fifo": ("mkfifo /app/p2 && ln -s p2 /app/to-pipe", "to-pipe", "/app/p2", "FIFO"),
    "unix socket": ("python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('/app/sock')\"", "sock",
                    "/app/sock", "socket"),
}


@needs_bwrap
@pytest.mark.parametrize("case", list(SPECIAL_FILES))
def test_reading_a_special_file_is_refused_at_once(sbx: Sandbox, envd: EnvdServer, case: str) -> None:
    command, path, named, kind = SPECIAL_FILES[case]
    sbx.commands.run(command)
    for form in ("text", "bytes", "stream"):
        start = time.monotonic()
        with pytest.raises(SandboxException) as err:
            result = sbx.files.read(path, format=form, request_timeout=10)
            if form == "stream":
                b"".join(result)
        assert time.monotonic() - start < 2.0, f"reading {path} ({form}) took too long"
        assert kind in str(err.value) and named in str(err.value) and "not a regular file" in str(err.value)
        assert health(envd.url, timeout_s=0.5)
    response = httpx.get(f"{envd.url}/files", params={"path": path}, timeout=5)
    assert response.status_code == 400 and kind in response.json()["message"]
    # writing over it is refused just as fast, and the special file is left alone
    start = time.monotonic()
    with pytest.raises(SandboxException, match=kind):
        sbx.files.write(path, "x", request_timeout=10)
    assert time.monotonic() - start < 2.0
    # its metadata stays readable (ListDir has it; the SDK's files.list leaves out entries of other types)
    parent, name = named.rsplit("/", 1)
    listed = httpx.post(f"{envd.url}/filesystem.Filesystem/ListDir", json={"path": parent},
                        headers={"connect-protocol-version": "1"}).json()["entries"]
    assert name in [e["name"] for e in listed]
    assert sbx.files.exists(path) and sbx.files.get_info(named).name == name


@needs_bwrap
def test_a_file_swapped_with_a_fifo_in_a_loop_never_hangs_a_read(sbx: Sandbox, envd: EnvdServer) -> None:
    """The sandbox swaps a regular file and a FIFO at the same name as fast as it can (the race
    between the server's check and its open): every read ends at once, with the content or an error."""
    racer = sbx.commands.run("end=$(($(date +%s)+4)); while [ $(date +%s) -lt $end ]; do "
                             "echo data > /app/swap.tmp; mv -f /app/swap.tmp /app/swap; rm -f /app/swap; "
                             "mkfifo /app/swap; rm -f /app/swap; done", background=True)
    outcomes: dict[str, int] = {}
    try:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            start = time.monotonic()
            try:
                r = httpx.get(f"{envd.url}/files", params={"path": "/app/swap"}, timeout=2)
                outcome = str(r.status_code)
            except httpx.TimeoutException:
                outcome = "timeout"
            assert time.monotonic() - start < 2.0
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
    finally:
        racer.kill()
    assert "timeout" not in outcomes and set(outcomes) <= {"200", "400", "404", "409"}, outcomes
    assert health(envd.url, timeout_s=0.5)


@needs_bwrap
def test_a_fifo_as_a_script_output_fails_the_script_promptly(tmp_path: Path) -> None:
    """transform_data's path: a script leaves a FIFO where the host will read its output."""
    from rsigym_env.worlds.local.sandbox.service import LocalSandboxService

    def envd_threads() -> int:
        return sum(t.name.startswith("envd:") for t in threading.enumerate())

    with LocalSandboxService(tmp_path / "sandbox") as service:
        before = envd_threads()
        start = time.monotonic()
        with pytest.raises(Exception, match="FIFO"):
            service.run_script("mkfifo /data/out.jsonl", outputs=["/data/out.jsonl"], timeout_s=30)
        assert time.monotonic() - start < 10.0
        assert envd_threads() == before  # the job's server is gone, no thread left stuck on the FIFO


def _probe_latencies(url: str, seconds: float, stop: threading.Event) -> list[float]:
    latencies = []
    with httpx.Client(timeout=5) as client:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not stop.is_set():
            start = time.perf_counter()
            assert client.get(f"{url}/health").status_code == 204
            latencies.append(time.perf_counter() - start)
            time.sleep(0.01)
    return latencies


@needs_bwrap
def test_the_event_loop_answers_while_big_files_move(sbx: Sandbox, envd: EnvdServer) -> None:
    big = envd.root / "big.bin"
    with open(big, "wb") as f:
        for _ in range(100):
            f.write(bytes(MiB))
    done = threading.Event()
    got: dict[str, int] = {}

    def slow_reader() -> None:  # another client reading the 100 MB file, slowly
        total = 0
        for chunk in sbx.files.read("big.bin", format="stream"):
            total += len(chunk)
            time.sleep(0.0005)
        got["read"] = total
        done.set()

    reader = threading.Thread(target=slow_reader)
    reader.start()
    time.sleep(0.05)
    latencies = _probe_latencies(envd.url, 10, done)
    reader.join(30)
    assert got.get("read") == 100 * MiB
    assert len(latencies) >= 5
    assert statistics.median(latencies) < 0.1 and max(latencies) < 0.5, latencies

    done.clear()  # and while one is uploaded
    writer = threading.Thread(target=lambda: (sbx.files.write("up.bin", io.BytesIO(bytes(100 * MiB))), done.set()))
    writer.start()
    latencies = _probe_latencies(envd.url, 10, done)
    writer.join(30)
    assert (envd.root / "up.bin").stat().st_size == 100 * MiB
    assert statistics.median(latencies) < 0.1 and max(latencies) < 0.5, latencies
    big.unlink()
    (envd.root / "up.bin").unlink()


# --------------------------------------------------------------------------------------------
# envd: sizes


def _no_upload_left(root: Path) -> None:
    assert [p.name for p in root.rglob("*") if "upload" in p.name] == []


@pytest.mark.parametrize("how", ["multipart", "octet-stream", "gzip"])
def test_an_upload_over_the_limit_is_refused_and_leaves_nothing(small_envd: EnvdServer, how: str) -> None:
    sandbox = Sandbox.create(debug=True, sandbox_url=small_envd.url)
    (small_envd.root / "kept.txt").write_text("old")
    data = b"\x00" * (MiB + 1) if how == "gzip" else bytes(range(256)) * (MiB // 256 + 1)
    kwargs = {"multipart": {"use_octet_stream": False}, "octet-stream": {"use_octet_stream": True},
              "gzip": {"gzip": True}}[how]
    for target in ("new.bin", "kept.txt"):
        with pytest.raises(SandboxException, match="over the limit of 1 MiB") as err:
            sandbox.files.write(target, io.BytesIO(data) if how != "multipart" else data, **kwargs)
        assert "413" in str(err.value) or "limit" in str(err.value)
    assert not (small_envd.root / "new.bin").exists()
    assert (small_envd.root / "kept.txt").read_text() == "old"  # the file it would have replaced is intact
    _no_upload_left(small_envd.root)
    fits = MiB - (4 << 10 if how == "multipart" else 0)  # the limit counts the whole body (multipart headers too)
    assert sandbox.files.write("fits.bin", io.BytesIO(bytes(fits)), **kwargs).path == "/app/fits.bin"
    assert (small_envd.root / "fits.bin").stat().st_size == fits
    assert health(small_envd.url)


def test_a_huge_declared_upload_is_refused_before_its_body(envd_any: EnvdServer) -> None:
    """The default limit (256 MiB): a Content-Length over it is answered without reading a byte."""
    start = time.monotonic()
    status, data = raw_request(envd_any.port, b"POST /files?path=/app/huge HTTP/1.1\r\nHost: x\r\n"
                                              b"Content-Type: application/octet-stream\r\n"
                                              b"Content-Length: %d" % (257 * MiB))
    assert status == 413 and b"over the limit of 256 MiB" in data
    assert time.monotonic() - start < 1.0
    assert not (envd_any.root / "huge").exists() and health(envd_any.url)


@pytest.fixture(scope="module")
def envd_any(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EnvdServer]:
    """An envd with the default limits, usable without bubblewrap (no command runs in it)."""
    with EnvdServer(tmp_path_factory.mktemp("envd-any") / "app", require_isolation=False) as srv:
        yield srv


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_compressed_bomb_is_refused(small_envd: EnvdServer, encoding: str) -> None:
    bomb = gzip_bomb(64 * MiB) if encoding == "gzip" else zlib.compress(bytes(64 * MiB), 9)
    assert len(bomb) < MiB // 4
    start = time.monotonic()
    r = httpx.post(f"{small_envd.url}/files", params={"path": "bomb.bin"}, content=bomb,
                   headers={"content-type": "application/octet-stream", "content-encoding": encoding}, timeout=10)
    assert r.status_code == 413 and "decompressed request body is over the limit of 1 MiB" in r.json()["message"]
    assert time.monotonic() - start < 2.0
    assert not (small_envd.root / "bomb.bin").exists()
    _no_upload_left(small_envd.root)
    assert health(small_envd.url)


def test_connect_messages_are_limited_too(small_envd: EnvdServer) -> None:
    sandbox = Sandbox.create(debug=True, sandbox_url=small_envd.url)
    with pytest.raises(SandboxException, match="over the limit"):
        sandbox.files.get_info("/app/" + "a" * (100 << 10))  # a 100 KiB path in a 64 KiB-limited Stat
    for encoding, body in [("gzip", gzip_bomb(32 * MiB)), ("deflate", zlib.compress(bytes(32 * MiB)))]:
        r = httpx.post(f"{small_envd.url}/filesystem.Filesystem/Stat", content=body,
                       headers={"content-type": "application/json", "content-encoding": encoding,
                                "connect-protocol-version": "1"}, timeout=10)
        assert r.status_code == 413 and r.json()["code"] == "resource_exhausted"
    # a stream whose envelope announces a 1 GiB message is refused by its header
    envelope = b"\x00" + (1 << 30).to_bytes(4, "big") + b"{}"
    r = httpx.post(f"{small_envd.url}/process.Process/Start", content=envelope,
                   headers={"content-type": "application/connect+json", "connect-protocol-version": "1"}, timeout=10)
    assert b"larger than configured max" in r.content
    assert sandbox.files.get_info("/app").type.value == "dir" and health(small_envd.url)


# --------------------------------------------------------------------------------------------
# Aborted requests: one log line each


@pytest.fixture()
def server_logs(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> pytest.LogCaptureFixture:
    """caplog seeing uvicorn's loggers even if something in this process made them stop propagating."""
    for name in ("uvicorn", "uvicorn.error"):
        monkeypatch.setattr(logging.getLogger(name), "propagate", True)
    caplog.set_level(logging.INFO)
    return caplog


def _server_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith(("uvicorn", "rsigym_env")) and r.levelno >= logging.WARNING]


def _abort_mid_body(port: int, head: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(head + b"\r\nContent-Length: 100000\r\n\r\n" + b'{"model": ')
        time.sleep(0.2)
    time.sleep(0.5)


def test_an_aborted_upload_is_one_log_line_and_leaves_nothing(envd_any: EnvdServer,
                                                              server_logs: pytest.LogCaptureFixture) -> None:
    server_logs.clear()
    _abort_mid_body(envd_any.port, b"POST /files?path=/app/aborted HTTP/1.1\r\nHost: x\r\n"
                                   b"Content-Type: application/octet-stream")
    records = _server_records(server_logs)
    assert len(records) == 1, [r.getMessage() for r in records]
    line = server_logs.handler.format(records[0])
    assert "aborted request POST /files" in line and "\n" not in line and records[0].exc_info is None
    assert not (envd_any.root / "aborted").exists()
    _no_upload_left(envd_any.root)

    server_logs.clear()  # a download the client leaves early: at most that one line, no traceback
    (envd_any.root / "big.bin").write_bytes(bytes(20 * MiB))
    with socket.create_connection(("127.0.0.1", envd_any.port)) as conn:
        conn.sendall(b"GET /files?path=big.bin HTTP/1.1\r\nHost: x\r\n\r\n")
        conn.recv(1000)
    time.sleep(0.5)
    records = _server_records(server_logs)
    assert len(records) <= 1 and all(r.exc_info is None and r.exc_text is None for r in records)
    assert health(envd_any.url)

    server_logs.clear()  # a file that shrinks while it is sent: the response is cut, not padded or hung
    with httpx.stream("GET", f"{envd_any.url}/files", params={"path": "big.bin"}, timeout=5) as r:
        assert r.headers["content-length"] == str(20 * MiB)
        with pytest.raises(httpx.RemoteProtocolError):
            for i, _ in enumerate(r.iter_raw(MiB)):
                if i == 0:
                    (envd_any.root / "big.bin").write_bytes(b"short")
    time.sleep(0.3)
    records = _server_records(server_logs)
    assert len(records) == 1 and "the file shrank while it was sent" in records[0].getMessage()
    assert records[0].exc_info is None and health(envd_any.url)


def test_an_aborted_completion_request_is_one_log_line(server_logs: pytest.LogCaptureFixture) -> None:
    with OpenAIServer({"echo": EchoModel()}) as server:
        server_logs.clear()
        _abort_mid_body(server.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json")
        records = _server_records(server_logs)
        assert len(records) == 1, [r.getMessage() for r in records]
        assert "aborted request POST /v1/chat/completions" in records[0].getMessage()
        assert records[0].exc_info is None and "\n" not in server_logs.handler.format(records[0])


def test_real_errors_keep_their_traceback(server_logs: pytest.LogCaptureFixture) -> None:
    async def broken(request: Request) -> Response:
        raise RuntimeError("a real bug")

    with ThreadedASGIServer(Starlette(routes=[Route("/", broken)]), name="broken") as server:
        server_logs.clear()
        assert httpx.get(server.url).status_code == 500
        time.sleep(0.1)
    records = [r for r in _server_records(server_logs) if r.exc_info]
    assert records and "RuntimeError: a real bug" in server_logs.text and "Traceback" in server_logs.text


# --------------------------------------------------------------------------------------------
# The body-limit middleware itself: the app never sees more than the limit


def test_the_app_sees_at_most_the_limit_of_a_bomb() -> None:
    seen: list[int] = []

    async def count(request: Request) -> Response:
        n = 0
        try:
            async for chunk in request.stream():
                n += len(chunk)
        finally:
            seen.append(n)
        return PlainTextResponse(str(n))

    app = Starlette(routes=[Route("/", count, methods=["POST"])],
                    middleware=[Middleware(BodyLimitMiddleware, max_bytes=MiB)])
    with ThreadedASGIServer(app, name="count") as server:
        for encoding in ["gzip", "x-gzip"]:
            r = httpx.post(server.url, content=gzip_bomb(64 * MiB), headers={"content-encoding": encoding}, timeout=10)
            assert r.status_code == 413
        multi = gzip.compress(bytes(MiB // 2)) * 3  # three gzip members, 1.5 MiB decoded in all
        assert httpx.post(server.url, content=multi, headers={"content-encoding": "gzip"}).status_code == 413
        def chunked() -> Iterator[bytes]:  # no Content-Length: counted as it comes
            for _ in range(64):
                yield bytes(64 << 10)
        assert httpx.post(server.url, content=chunked()).status_code == 413
        assert httpx.post(server.url, content=b"x", headers={"content-encoding": "br"}).status_code == 415
        assert httpx.post(server.url, content=b"not gzip", headers={"content-encoding": "gzip"}).status_code == 400
        assert httpx.post(server.url, content=gzip.compress(b"ok" * 10)[:-6],
                          headers={"content-encoding": "gzip"}).status_code == 400  # truncated
        r = httpx.post(server.url, content=gzip.compress(bytes(MiB)), headers={"content-encoding": "gzip"})
        assert (r.status_code, r.text) == (200, str(MiB))
    assert max(seen) <= MiB


def test_threaded_server_life_cycle(tmp_path: Path) -> None:
    app = PlainTextResponse("up")
    sock = tmp_path / "s.sock"
    server = ThreadedASGIServer(app, uds=sock, name="both")
    with server:
        assert httpx.get(server.url).text == "up" and sock.is_socket()
        conn = UnixHTTPConnection(sock)
        conn.request("GET", "/")
        assert conn.getresponse().read() == b"up"
        port = server.port
    assert not server.running and not sock.exists()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/", timeout=1)
    server.stop()  # twice is fine
    with server:  # and it starts again
        assert httpx.get(server.url).text == "up"
    with pytest.raises(ValueError):
        ThreadedASGIServer(app, port=None)
    with pytest.raises(RuntimeError, match="unix socket only"):
        _ = ThreadedASGIServer(app, port=None, uds=sock).url
    (tmp_path / "taken").write_text("not a socket")
    with pytest.raises(OSError):  # a file that is not a stale socket is never replaced
        ThreadedASGIServer(app, port=None, uds=tmp_path / "taken").start()
    assert (tmp_path / "taken").read_text() == "not a socket"


# --------------------------------------------------------------------------------------------
# The OpenAI-compatible server: sizes, nesting, hidden model list


@pytest.fixture(scope="module")
def model_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpenAIServer]:
    sock = tmp_path_factory.mktemp("oai") / "model.sock"
    with OpenAIServer({"echo": EchoModel()}, uds=sock, max_body_bytes=MiB) as server:
        yield server


def test_completion_bodies_over_the_limit_get_413(model_server: OpenAIServer) -> None:
    client = OpenAI(base_url=model_server.base_url, api_key="x", max_retries=0, timeout=10)
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "x" * (MiB + 10)}])
    assert err.value.status_code == 413 and err.value.code == "request_too_large"
    assert "over the limit of 1 MiB" in err.value.message
    r = httpx.post(f"{model_server.base_url}/chat/completions", content=gzip_bomb(32 * MiB),
                   headers={"content-type": "application/json", "content-encoding": "gzip"}, timeout=10)
    assert r.status_code == 413 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    # the same over the unix socket the sandboxed harness uses
    conn = UnixHTTPConnection(model_server.uds)
    conn.request("POST", "/v1/chat/completions", body=b"{" + b" " * (2 * MiB) + b"}",
                 headers={"content-type": "application/json"})
    assert conn.getresponse().status == 413
    # a compressed request within the limit is decoded and served
    body = gzip.compress(json.dumps({"model": "echo", "messages": USER}).encode())
    r = httpx.post(f"{model_server.base_url}/chat/completions", content=body,
                   headers={"content-type": "application/json", "content-encoding": "gzip"})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "hi"
    assert client.chat.completions.create(model="echo", messages=USER).choices[0].message.content == "hi"


def _nested(kind: str, depth: int) -> str:
    return ("[" * depth + "]" * depth) if kind == "list" else ('{"a":' * depth + "1" + "}" * depth)


@pytest.mark.parametrize("depth", [65, 900, 5_000, 100_000])
@pytest.mark.parametrize("kind", ["list", "dict"])
@pytest.mark.parametrize("where", ["body", "tool parameters", "message content"])
def test_deeply_nested_json_is_a_400(model_server: OpenAIServer, kind: str, depth: int, where: str) -> None:
    if where == "body":
        body = _nested(kind, depth)
    elif where == "tool parameters":
        body = ('{"model": "echo", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", '
                f'"function": {{"name": "f", "parameters": {{"type": "object", "x": {_nested(kind, depth)}}}}}}}]}}')
    else:
        body = f'{{"model": "echo", "messages": [{{"role": "user", "content": {_nested(kind, depth)}}}]}}'
    r = httpx.post(f"{model_server.base_url}/chat/completions", content=body,
                   headers={"content-type": "application/json"}, timeout=10)
    assert r.status_code == 400, r.text[:300]
    assert r.json()["error"]["code"] == "invalid_json"
    assert httpx.get(f"{model_server.url}/health").status_code == 200


ALIASES = [f"ckpt-{i}@ev-{i}/task-{i}/0" for i in range(1, 6)]


def _probes(server: OpenAIServer) -> list[httpx.Response]:
    """Everything a client can ask without knowing a model id."""
    base = server.base_url
    return [
        httpx.get(f"{base}/models"),
        httpx.get(f"{server.url}/health"),
        httpx.get(f"{base}/models/ckpt-9@ev-9"),
        httpx.get(f"{base}/models/"),
        httpx.get(f"{base}/nothing"),
        httpx.delete(f"{base}/models"),
        httpx.post(f"{base}/chat/completions", json={"model": "ckpt", "messages": USER}),
        httpx.post(f"{base}/chat/completions", json={"model": "", "messages": USER}),
        httpx.post(f"{base}/chat/completions", json={"model": "*", "messages": USER}),
        httpx.post(f"{base}/chat/completions", json={"messages": USER}),
        httpx.post(f"{base}/chat/completions", json={"model": ["echo"], "messages": USER}),
        httpx.post(f"{base}/chat/completions", content=b"{bad"),
        httpx.post(f"{base}/chat/completions", content=b"x" * (MiB + 1)),
    ]


def test_list_models_false_hides_every_model_id() -> None:
    registry = ModelRegistry({alias: EchoModel() for alias in ALIASES})
    with OpenAIServer(registry, list_models=False, max_body_bytes=MiB) as hidden, \
            OpenAIServer(registry, max_body_bytes=MiB) as shown:
        client = OpenAI(base_url=hidden.base_url, api_key="x", max_retries=0)
        assert list(client.models.list()) == []
        texts = [r.text for r in _probes(hidden)]
        assert all("ckpt-1@" not in t and "task-" not in t for t in texts), texts
        assert "models" not in httpx.get(f"{hidden.url}/health").json()  # not even how many
        assert "ckpt-1@" not in repr(hidden)
        # the count cannot be read either: the answers are the same with one model registered
        with OpenAIServer({ALIASES[0]: EchoModel()}, list_models=False, max_body_bytes=MiB) as one:
            assert [r.text for r in _probes(one)] == texts
        # a client that knows its own alias is served as before
        reply = client.chat.completions.create(model=ALIASES[2], messages=USER)
        assert reply.choices[0].message.content == "hi"
        assert client.models.retrieve(ALIASES[2]).id == ALIASES[2]
        # the default still lists them (so the check above can fail)
        shown_ids = [m.id for m in OpenAI(base_url=shown.base_url, api_key="x").models.list()]
        assert shown_ids == ALIASES and httpx.get(f"{shown.url}/health").json()["models"] == 5
