"""The local envd against the unchanged e2b SDK (debug mode): commands, files, escapes and limits."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

e2b = pytest.importorskip("e2b")
from e2b import Sandbox  # noqa: E402
from e2b.exceptions import FileNotFoundException, SandboxException, TimeoutException  # noqa: E402
from e2b.sandbox.commands.command_handle import CommandExitException  # noqa: E402

from rsigym_env.worlds.local.sandbox.envd import EnvdServer, SandboxFS, SandboxPathError, health  # noqa: E402
from rsigym_env.worlds.local.sandbox.isolation import Limits, Mount, bwrap_available  # noqa: E402

pytestmark = pytest.mark.skipif(not bwrap_available(), reason="bubblewrap is not usable here")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EnvdServer]:
    root = tmp_path_factory.mktemp("envd") / "app"
    data = tmp_path_factory.mktemp("envd-data")
    with EnvdServer(root, limits=Limits(processes=64, memory_mb=512, cpu_s=2),
                    mounts=[Mount(data, "/data", writable=True)]) as srv:
        yield srv


@pytest.fixture(scope="module")
def sbx(server: EnvdServer) -> Sandbox:
    return Sandbox.create(debug=True, sandbox_url=server.url)


# --------------------------------------------------------------------------------------------
# Commands


def test_run_stdout_stderr_exit_code(sbx: Sandbox) -> None:
    r = sbx.commands.run("echo out; echo err >&2")
    assert (r.stdout, r.stderr, r.exit_code, r.error) == ("out\n", "err\n", 0, None)
    with pytest.raises(CommandExitException) as info:
        sbx.commands.run("echo partial; exit 3")
    assert info.value.exit_code == 3 and info.value.stdout == "partial\n"


def test_run_cwd_envs_and_user(sbx: Sandbox, server: EnvdServer) -> None:
    sbx.files.make_dir("/app/work/deep")
    r = sbx.commands.run("pwd; echo $GREETING; id -un; ls /", cwd="/app/work/deep", envs={"GREETING": "bonjour"})
    lines = r.stdout.splitlines()
    assert lines[:3] == ["/app/work/deep", "bonjour", "sandbox"]
    assert "work" not in lines[3:] and "root" in lines[3:]  # the host's / is not there; /app/work is
    assert sbx.commands.run("echo $GREETING").stdout == "\n"  # envs are per command


def test_streaming_callbacks_and_stdin(sbx: Sandbox) -> None:
    seen: list[str] = []
    r = sbx.commands.run("for i in 1 2 3; do echo line$i; sleep 0.05; done", on_stdout=seen.append)
    assert "".join(seen) == r.stdout == "line1\nline2\nline3\n"
    # the third read ends only at EOF, so the command is alive until close_stdin (else it could exit before it)
    handle = sbx.commands.run("read a; read b; read c || echo got $a $b", background=True, stdin=True)
    sbx.commands.send_stdin(handle.pid, "x\n")
    handle.send_stdin("y\n")
    sbx.commands.close_stdin(handle.pid)
    assert handle.wait().stdout == "got x y\n"


def test_background_wait_list_connect_kill(sbx: Sandbox, server: EnvdServer) -> None:
    # connect() streams what comes after it (envd's Connect does not replay), so the echo waits long enough for
    # list and connect to land first on a loaded machine (0.5 s did not, once, in CI)
    bg = sbx.commands.run("sleep 2; echo finished", background=True)
    listed = {p.pid: p for p in sbx.commands.list()}
    assert bg.pid in listed and listed[bg.pid].args == ["-l", "-c", "sleep 2; echo finished"]
    other = sbx.commands.connect(bg.pid)
    assert bg.wait().stdout == "finished\n"
    assert other.wait().stdout == "finished\n"
    long = sbx.commands.run("sleep 30; touch /app/should-not-exist", background=True)
    assert long.kill() is True
    with pytest.raises(CommandExitException) as info:
        long.wait()
    assert info.value.exit_code == 128 + 9
    assert sbx.commands.kill(long.pid) is False  # gone
    assert not (server.root / "should-not-exist").exists()
    assert bg.pid not in {p.pid for p in sbx.commands.list()}


@pytest.mark.slow
def test_timeout_kills_the_command(sbx: Sandbox, server: EnvdServer) -> None:
    start = time.monotonic()
    with pytest.raises(TimeoutException):
        sbx.commands.run("sleep 2; touch /app/late", timeout=1)
    assert time.monotonic() - start < 1.8
    time.sleep(1.5)
    assert not (server.root / "late").exists()
    assert sbx.commands.list() == []


def test_network_is_off(sbx: Sandbox) -> None:
    host = socket.socket()
    host.bind(("127.0.0.1", 0))
    host.listen(1)
    try:
        port = host.getsockname()[1]
        with pytest.raises(CommandExitException) as info:
            sbx.commands.run(f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 2)\"")
        assert "ConnectionRefusedError" in info.value.stderr
        with pytest.raises(CommandExitException) as info:
            sbx.commands.run("python3 -c \"import socket; socket.getaddrinfo('pypi.org', 443)\"")
        assert "gaierror" in info.value.stderr
    finally:
        host.close()


# --------------------------------------------------------------------------------------------
# Files


def test_files_write_read_list_exists_remove(sbx: Sandbox, server: EnvdServer) -> None:
    info = sbx.files.write("/app/notes/a.txt", "alpha")
    assert (info.name, info.path) == ("a.txt", "/app/notes/a.txt")
    sbx.files.write("notes/b.bin", b"\x00\x01beta")  # relative to /app
    assert (server.root / "notes" / "a.txt").read_text() == "alpha"
    assert sbx.files.read("/app/notes/a.txt") == "alpha"
    assert bytes(sbx.files.read("notes/b.bin", format="bytes")) == b"\x00\x01beta"
    assert b"".join(sbx.files.read("notes/a.txt", format="stream")) == b"alpha"
    entries = sbx.files.list("/app/notes")
    assert [(e.name, e.type.value, e.size, e.path) for e in entries] == [
        ("a.txt", "file", 5, "/app/notes/a.txt"), ("b.bin", "file", 6, "/app/notes/b.bin")]
    assert entries[0].owner == "sandbox" and entries[0].permissions == "-rw-r--r--"
    # the command sees what the file API wrote, and the file API what commands write
    assert sbx.commands.run("cat notes/a.txt; echo -n gamma > notes/c.txt").stdout == "alpha"
    assert sbx.files.read("notes/c.txt") == "gamma"
    assert sbx.files.exists("/app/notes/a.txt") and not sbx.files.exists("/app/notes/zzz")
    sbx.files.remove("/app/notes/a.txt")
    assert not sbx.files.exists("/app/notes/a.txt")
    with pytest.raises(FileNotFoundException):
        sbx.files.read("/app/notes/a.txt")
    sbx.files.remove("/app/notes")
    assert not (server.root / "notes").exists()


def test_files_multi_write_dirs_rename_info(sbx: Sandbox) -> None:
    infos = sbx.files.write_files([{"path": "/app/m/one.txt", "data": "1"}, {"path": "/app/m/two.txt", "data": "2"}])
    assert [i.path for i in infos] == ["/app/m/one.txt", "/app/m/two.txt"]
    import io
    sbx.files.write("/app/m/streamed.txt", io.BytesIO(b"streamed" * 1000))  # octet-stream upload
    sbx.files.write("/app/m/zipped.txt", "compressed", gzip=True)
    assert sbx.files.read("/app/m/streamed.txt") == "streamed" * 1000
    assert sbx.files.read("/app/m/zipped.txt") == "compressed"
    assert sbx.files.make_dir("/app/m/sub/deeper") is True
    assert sbx.files.make_dir("/app/m/sub/deeper") is False
    moved = sbx.files.rename("/app/m/one.txt", "/app/m/sub/uno.txt")
    assert moved.path == "/app/m/sub/uno.txt" and sbx.files.read("/app/m/sub/uno.txt") == "1"
    assert sbx.files.get_info("/app/m/sub").type.value == "dir"
    deep = sbx.files.list("/app/m", depth=2)
    assert "/app/m/sub/uno.txt" in [e.path for e in deep]
    # a writable mount is reachable by the file API too
    sbx.files.write("/data/in.txt", "mounted")
    assert sbx.commands.run("cat /data/in.txt").stdout == "mounted"


def test_files_cannot_leave_the_sandbox(sbx: Sandbox, server: EnvdServer, tmp_path: Path) -> None:
    secret = tmp_path / "secret-tests"
    secret.mkdir()
    (secret / "answer.txt").write_text("42")
    outside = tmp_path / "outside"
    outside.mkdir()
    for path in ["/etc/passwd", "/root/.bashrc", "/app/../etc/passwd", str(secret / "answer.txt"), "../x"]:
        with pytest.raises(SandboxException):
            sbx.files.read(path)
    with pytest.raises(SandboxException):
        sbx.files.write(str(outside / "planted.txt"), "x")
    # links made inside the sandbox that point at the host
    sbx.commands.run(f"ln -s {secret}/answer.txt /app/leak; ln -s {outside} /app/door; ln -s /app/target /app/ok; "
                     "echo inside > /app/target")
    with pytest.raises(SandboxException, match="outside"):
        sbx.files.read("/app/leak")
    with pytest.raises(SandboxException, match="outside"):
        sbx.files.write("/app/door/planted.txt", "x")
    with pytest.raises(SandboxException, match="outside"):
        sbx.files.list("/app/door")
    assert list(outside.iterdir()) == []
    assert sbx.files.read("/app/ok") == "inside\n"  # a link inside the sandbox is fine
    info = sbx.files.get_info("/app/leak")
    assert info.type.value == "symlink" and info.symlink_target == f"{secret}/answer.txt"
    sbx.files.remove("/app/door")  # removes the link, not the host directory
    assert outside.is_dir()


def test_sandbox_fs_resolves_relative_links_inside(tmp_path: Path) -> None:
    fs = SandboxFS(tmp_path)
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f").write_text("x")
    os.symlink("../a/f", tmp_path / "a" / "rel")
    os.symlink("../../../../etc/passwd", tmp_path / "a" / "up")
    assert fs.read_all("/app/a/rel") == b"x"
    with pytest.raises(SandboxPathError):
        fs.read_all("/app/a/up")


def test_health_and_plain_http_errors(server: EnvdServer) -> None:
    assert health(server.url)
    r = httpx.get(f"{server.url}/files", params={"path": "/app/none"})
    assert r.status_code == 404 and r.json()["code"] == 404
    r = httpx.get(f"{server.url}/files")
    assert r.status_code == 400


# --------------------------------------------------------------------------------------------
# Limits: each ends the command with a named limit, and the server keeps answering


@pytest.mark.slow
def test_limits_end_commands_and_the_server_survives(sbx: Sandbox, server: EnvdServer) -> None:
    with pytest.raises(CommandExitException) as info:
        sbx.commands.run("sh -c 'bomb() { bomb | bomb & }; bomb; sleep 1'; exit 1")  # dash: no fork retries
    assert "[sandbox] process limit (64) reached" in info.value.stderr
    with pytest.raises(CommandExitException) as info:
        sbx.commands.run("python3 -c 'x = bytearray(1 << 30)'")
    assert "MemoryError" in info.value.stderr and "[sandbox] memory limit (512 MB) reached" in info.value.stderr
    assert info.value.error is not None and "memory limit" in info.value.error
    with pytest.raises(CommandExitException) as info:
        sbx.commands.run("python3 -c 'while True: pass'")
    assert info.value.exit_code == 152 and "[sandbox] CPU time limit (2 s) reached" in info.value.stderr
    assert health(server.url) and sbx.is_running()
    assert sbx.commands.run("echo still here").stdout == "still here\n"
    assert sbx.files.write("after.txt", "ok").path == "/app/after.txt"
