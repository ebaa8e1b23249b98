"""The bubblewrap sandbox: what a command inside can reach, and that each limit ends it with a clear error."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
import sys
import threading
from pathlib import Path
from typing import Iterator

import pytest

from rsigym_env.worlds.local.sandbox import isolation
from rsigym_env.worlds.local.sandbox.isolation import (
    ExecResult, IsolatedProcess, IsolationUnavailable, Limits, Mount, bwrap_available, isolated_argv, run_isolated,
    run_isolated_async, sandbox_uid,
)

pytestmark = pytest.mark.skipif(not bwrap_available(), reason="bubblewrap is not usable here")

PY = "/usr/bin/python3"


@pytest.fixture
def app(tmp_path: Path) -> Path:
    d = tmp_path / "app"
    d.mkdir()
    return d


@pytest.fixture
def listener() -> Iterator[tuple[int, list[bytes]]]:
    """A TCP server on the host's loopback that records what it receives."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.2)
    got: list[bytes] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except (socket.timeout, OSError):
                continue
            with conn:
                conn.settimeout(2)
                try:
                    got.append(conn.recv(100))
                except OSError:
                    pass
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1], got
    stop.set()
    t.join(2)
    srv.close()


def connect_script(port: int) -> str:
    return (f"{PY} -c \"import socket; s = socket.create_connection(('127.0.0.1', {port}), timeout=2); "
            f"s.sendall(b'hello-from-sandbox'); s.close(); print('connected')\"")


# --------------------------------------------------------------------------------------------
# Network


def test_network_off_cannot_reach_a_host_port(app: Path, listener: tuple[int, list[bytes]]) -> None:
    port, got = listener
    r = run_isolated(connect_script(port), workdir=app)
    assert r.exit_code != 0 and "connected" not in r.stdout
    assert "ConnectionRefusedError" in r.stderr  # only the sandbox's own loopback exists
    assert got == []


def test_network_on_reaches_the_host(app: Path, listener: tuple[int, list[bytes]]) -> None:
    port, got = listener
    r = run_isolated(connect_script(port), workdir=app, network=True)
    assert r.exit_code == 0, r.stderr
    assert r.stdout == "connected\n"
    for _ in range(50):
        if got:
            break
        threading.Event().wait(0.02)
    assert got == [b"hello-from-sandbox"]


def test_network_off_has_no_dns_and_only_loopback(app: Path) -> None:
    r = run_isolated(f"{PY} -c \"import socket; print(socket.getaddrinfo('pypi.org', 443))\"", workdir=app,
                     limits=Limits(wall_s=10))
    assert r.exit_code != 0 and "gaierror" in r.stderr
    r = run_isolated("cat /proc/net/dev", workdir=app)
    interfaces = [line.split(":")[0].strip() for line in r.stdout.splitlines()[2:]]
    assert interfaces == ["lo"]


# --------------------------------------------------------------------------------------------
# File system


def test_the_host_is_invisible_outside_the_workdir(app: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret-tests"
    secret.mkdir()
    (secret / "test_hidden.py").write_text("ANSWER = 'hidden-answer'\n")
    host_tmp = Path("/tmp") / f"rsigym-host-secret-{os.getpid()}"
    host_tmp.write_text("host tmp secret\n")
    try:
        targets = [secret / "test_hidden.py", host_tmp, Path("/work/main/pyproject.toml"), Path("/root/.bashrc"),
                   Path("/etc/shadow"), Path("/home")]
        script = "; ".join(f"cat {t} 2>/dev/null || echo MISSING" for t in targets)
        r = run_isolated(script, workdir=app)
        assert r.stdout == "MISSING\n" * len(targets)
        r = run_isolated("ls /; ls -A /root; ls -A /tmp", workdir=app)
        assert set(r.stdout.split()) <= {"app", "bin", "dev", "etc", "lib", "lib64", "proc", "root", "sbin", "tmp",
                                         "usr", ".pyenv", "lib32", "libx32", "opt"}
    finally:
        host_tmp.unlink()


def test_the_system_python_installs_are_reachable_by_the_sandbox_user(app: Path) -> None:
    """bubblewrap makes a missing parent of a system bind (``/root/.pyenv`` of ``/root/.pyenv/versions``)
    with its host mode, 0700 there; the isolation layer makes such parents 0755, so the sandbox's
    unprivileged uid can run an interpreter installed there."""
    installs = [p for p in isolation._system_paths() if p.count("/") > 1 and os.path.isdir(p) and not os.path.islink(p)
                and os.path.dirname(p) not in ("/", "/usr")]
    if not installs:
        pytest.skip("no nested system path (e.g. /root/.pyenv/versions) on this host")
    exe = os.path.realpath(getattr(sys, "_base_executable", "") or sys.executable)
    for path in installs:
        r = run_isolated(f"stat -c %a {os.path.dirname(path)}; ls {path} > /dev/null && echo LISTED", workdir=app)
        assert r.stdout.split() == ["755", "LISTED"], (path, r.stdout, r.stderr)
    assert not isolation.shows("/work") and not isolation.shows("/root/.bashrc")
    if not isolation.shows(exe):
        return  # this interpreter lives where no sandbox sees it (the program sandbox binds it at /python)
    r = run_isolated([exe, "-I", "-S", "-c", "import json, os; print(os.getuid() != 0 or 'root')"], workdir=app)
    assert r.exit_code == 0 and r.stdout.strip() == "True", (r.stdout, r.stderr)


def test_etc_shows_the_hosts_readable_entries_read_only_in_one_mount(app: Path) -> None:
    """/etc is one read-only copy (etc_directory): the host's readable ETC_RO entries with the same content,
    nothing another user may not read, the sandbox user's identity, no writes, no mounts below it."""
    names = [n for n in isolation.ETC_RO if os.path.exists(f"/etc/{n}")]
    files = [n for n in names if os.path.isfile(f"/etc/{n}") and os.access(f"/etc/{n}", os.R_OK)]
    script = ("ls -A /etc; echo ---; " + "; ".join(f"md5sum /etc/{n}" for n in files) +
              "; echo ---; grep -c . /proc/self/mountinfo; id -un; touch /etc/x 2>/dev/null || echo DENIED; "
              "ls /etc/ssl/private 2>/dev/null | wc -l")
    r = run_isolated(script, workdir=app)
    assert r.exit_code == 0, r.stderr
    listing, sums, rest = r.stdout.split("---\n")
    assert set(listing.split()) == set(names) | {"passwd", "group"}
    import hashlib
    for line in sums.splitlines():
        digest, path = line.split()
        assert digest == hashlib.md5(Path(path).read_bytes()).hexdigest(), path
    mounts, user, denied, private = rest.split()
    assert int(mounts) < 20 + len(isolation.MASKED_PROC) and denied == "DENIED" and private == "0"
    assert user == ("sandbox" if os.geteuid() == 0 else user)
    with pytest.raises(ValueError, match="cannot mount over"):
        run_isolated("true", workdir=app, mounts=[Mount(app, "/etc/extra")])


def test_the_sandbox_writes_only_its_workdir(app: Path, tmp_path: Path) -> None:
    victims = [tmp_path / "planted", Path("/work") / f"planted-{os.getpid()}", Path("/root") / f"planted-{os.getpid()}",
               Path("/usr") / f"planted-{os.getpid()}", Path("/etc") / f"planted-{os.getpid()}"]
    script = "; ".join(f"echo x > {v} 2>/dev/null || echo DENIED" for v in victims)
    r = run_isolated(script + "; echo kept > /app/out.txt; echo tmp > /tmp/scratch", workdir=app)
    assert r.stdout.count("DENIED") == len(victims)
    assert not any(v.exists() for v in victims)
    assert (app / "out.txt").read_text() == "kept\n"
    # /tmp is the sandbox's own, fresh for every command
    assert not Path("/tmp/scratch").exists() or Path("/tmp/scratch").read_text() != "tmp\n"
    assert run_isolated("ls /tmp", workdir=app).stdout == ""


def test_mounts_read_only_and_writable(app: Path, tmp_path: Path) -> None:
    harness = tmp_path / "harness"
    harness.mkdir()
    (harness / "agent.py").write_text("print('agent ran')\n")
    logs = tmp_path / "logs"
    logs.mkdir()
    r = run_isolated(f"{PY} /harness/agent.py; echo x > /harness/agent.py || echo RO; echo log > /logs/a.txt",
                     workdir=app, mounts=[Mount(harness, "/harness"), Mount(logs, "/logs", writable=True)])
    assert r.stdout.startswith("agent ran\n") and "RO" in r.stdout
    assert (harness / "agent.py").read_text() == "print('agent ran')\n"
    assert (logs / "a.txt").read_text() == "log\n"


def test_a_unix_socket_mount_reaches_the_host_server(app: Path, tmp_path: Path) -> None:
    path = tmp_path / "model.sock"  # created by the host with mode 0755, in a 0700 directory
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(path))
    srv.listen(1)

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.sendall(b"pong:" + conn.recv(10))
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    code = ("import os, socket; s = socket.socket(socket.AF_UNIX); s.connect(os.environ['SOCK']); "
            "s.sendall(b'ping'); print(s.recv(20).decode())")
    try:
        r = run_isolated([PY, "-c", code], workdir=app, env={"SOCK": "/run/rsigym/model.sock"},
                         mounts=[Mount(path, "/run/rsigym/model.sock")])
    finally:
        t.join(5)
        srv.close()
    assert r.stdout == "pong:ping\n", r.stderr


def test_files_the_host_adds_are_writable_inside(app: Path) -> None:
    (app / "sub").mkdir()
    (app / "sub" / "buggy.py").write_text("x = 1\n")  # created by the host (root here)
    r = run_isolated("echo 'x = 2' > sub/buggy.py && id -un", workdir=app)
    assert r.exit_code == 0, r.stderr
    assert r.stdout == "sandbox\n"
    assert (app / "sub" / "buggy.py").read_text() == "x = 2\n"


def test_cwd_env_stdin_exit_code(app: Path) -> None:
    (app / "d").mkdir()
    r = run_isolated("pwd; echo $GREETING; cat; echo oops >&2; exit 7", workdir=app, cwd="d",
                     env={"GREETING": "hi"}, stdin=b"from stdin\n")
    assert (r.stdout, r.stderr, r.exit_code, r.limit, r.isolated) == ("/app/d\nhi\nfrom stdin\n", "oops\n", 7, None,
                                                                       True)
    r = run_isolated(["printenv", "HOME", "RSIGYM_SECRET"], workdir=app)
    assert r.stdout == "/tmp\n" and r.exit_code == 1  # the host's environment does not leak in
    r = run_isolated(["/bin/echo", "a b", "$HOME"], workdir=app)
    assert r.stdout == "a b $HOME\n"


def test_no_privileges_inside(app: Path) -> None:
    r = run_isolated("grep -E '^(CapEff|NoNewPrivs)' /proc/self/status; ps -e -o pid= | wc -l", workdir=app)
    lines = r.stdout.split()
    assert lines[1] == "0000000000000000" and lines[3] == "1"
    assert int(lines[4]) <= 4  # its own PID namespace: bwrap's init, sh, ps, wc


# --------------------------------------------------------------------------------------------
# Limits


@pytest.mark.slow
def test_fork_bomb_hits_the_process_limit(app: Path) -> None:
    r = run_isolated("bomb() { bomb | bomb & }; bomb; sleep 1", workdir=app, limits=Limits(processes=64, wall_s=10))
    assert r.limit == "processes", r
    assert "[sandbox] process limit (64) reached" in r.stderr
    assert not r.timed_out
    # the process limit counts exactly: 1 parent + 63 children, the 64th fork is refused
    code = ("import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n"
            "            time.sleep(2); os._exit(0)\n        n += 1\nexcept OSError as e:\n    print(n, e.errno)")
    r = run_isolated([PY, "-c", code], workdir=app, limits=Limits(processes=32))
    assert r.stdout == "31 11\n" and r.limit is None  # handled by the program itself: nothing in stderr


def test_memory_hog_hits_the_memory_limit(app: Path) -> None:
    r = run_isolated(f"{PY} -c \"x = bytearray(600 << 20); print('allocated')\"", workdir=app,
                     limits=Limits(memory_mb=256))
    assert r.limit == "memory" and r.exit_code == 1 and "allocated" not in r.stdout
    assert "MemoryError" in r.stderr and "[sandbox] memory limit (256 MB) reached" in r.stderr
    ok = run_isolated(f"{PY} -c \"x = bytearray(100 << 20); print('allocated')\"", workdir=app,
                      limits=Limits(memory_mb=256))
    assert ok.stdout == "allocated\n" and ok.limit is None


@pytest.mark.slow
def test_endless_loop_hits_the_cpu_limit(app: Path) -> None:
    r = run_isolated(f"{PY} -c 'while True: pass'", workdir=app, limits=Limits(cpu_s=1, wall_s=20))
    assert r.limit == "cpu" and r.exit_code == 128 + 24 and not r.timed_out
    assert "[sandbox] CPU time limit (1 s) reached" in r.stderr
    assert 0.9 < r.duration_s < 10


@pytest.mark.slow
def test_wall_clock_limit_kills_the_whole_sandbox(app: Path) -> None:
    # a background child that would outlive its shell and write later
    r = run_isolated("(sleep 2; echo late > /app/late.txt) & echo started; sleep 30", workdir=app,
                     limits=Limits(wall_s=1))
    assert r.timed_out and r.limit == "wall" and r.exit_code == isolation.WALL_EXIT
    assert r.stdout == "started\n" and "[sandbox] wall-clock limit (1 s) reached" in r.stderr
    assert 0.9 < r.duration_s < 3
    threading.Event().wait(1.5)
    assert not (app / "late.txt").exists()


def test_output_and_file_size_limits(app: Path) -> None:
    r = run_isolated("head -c 100000 /dev/zero | tr '\\0' a; echo done >&2", workdir=app,
                     limits=Limits(output_bytes=1000))
    assert r.truncated and r.limit == "output" and len(r.stdout) == 1000 and r.exit_code == 0
    assert r.stderr.startswith("done\n") and "[sandbox] output limit" in r.stderr
    r = run_isolated("head -c 3000000 /dev/zero > big.bin", workdir=app, limits=Limits(file_mb=1))
    assert r.limit == "file" and (app / "big.bin").stat().st_size == 1 << 20


# --------------------------------------------------------------------------------------------
# Async, argv, fallback


def test_async_runs_concurrently_with_streaming_output(app: Path) -> None:
    async def main() -> tuple[list[ExecResult], list[tuple[str, bytes]], ExecResult]:
        chunks: list[tuple[str, bytes]] = []
        p = await IsolatedProcess.start("read line; echo got $line; echo e >&2", workdir=app, stdin=True,
                                        on_output=lambda s, c: chunks.append((s, c)))
        await p.write(b"ping\n")
        await p.close_stdin()
        streamed = await p.wait()
        many = await asyncio.gather(*(run_isolated_async(f"sleep 0.3; echo {i}", workdir=app) for i in range(4)))
        return many, chunks, streamed

    many, chunks, streamed = asyncio.run(main())
    assert [r.stdout for r in many] == ["0\n", "1\n", "2\n", "3\n"]
    assert streamed.stdout == "got ping\n" and ("stdout", b"got ping\n") in chunks and ("stderr", b"e\n") in chunks


def test_async_wall_limit_and_cancel(app: Path) -> None:
    async def main() -> tuple[ExecResult, bool]:
        r = await run_isolated_async("echo a; sleep 10", workdir=app, limits=Limits(wall_s=0.5))
        p = await IsolatedProcess.start("sleep 10", workdir=app)
        task = asyncio.ensure_future(p.wait())
        await asyncio.sleep(0.2)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        await asyncio.sleep(0.3)
        return r, p._proc.returncode is not None

    r, killed = asyncio.run(main())
    assert r.timed_out and r.stdout == "a\n" and r.limit == "wall"
    assert killed


def test_isolated_argv_is_a_plain_command_line(app: Path) -> None:
    argv = isolated_argv("echo hi", workdir=app, env={"A": "1"})
    assert argv[0].endswith("bwrap") and "--unshare-net" in argv and "--clearenv" in argv
    assert argv[-3:] == ["/bin/sh", "-c", "echo hi"]
    assert "--unshare-net" not in isolated_argv("x", workdir=app, network=True)
    i = argv.index("--bind")
    assert argv[i + 1:i + 3] == [str(app.resolve()), "/app"]
    with pytest.raises(ValueError):
        isolated_argv("x", workdir=app, mounts=[Mount(app, "/usr")])
    assert sandbox_uid(app) == sandbox_uid(app)


def test_bwrap_options_travel_through_a_descriptor_the_sandbox_cannot_read(app: Path) -> None:
    r = run_isolated("ls /proc/$$/fd; cat /proc/1/cmdline | tr '\\0' ' '; echo; "
                     "ls /proc/1/fd 2>/dev/null || echo DENIED", workdir=app, env={"GREETING": "hi"})
    fds, cmdline, denied = r.stdout.split("\n")[:3], r.stdout.split("\n")[3], r.stdout.split("\n")[4]
    assert fds == ["0", "1", "2"]  # bwrap closed the options' pipe or memfd before running the command
    # the rlimits set by prlimit inside, or (as root) by the parent before bwrap read its options
    first = "setpriv" if os.geteuid() == 0 and "spawn" not in isolation._fallbacks() else "prlimit"
    assert re.match(rf"{isolation.bwrap_path()} --args \d+ -- {first} ", cmdline), cmdline
    assert "--setenv" not in cmdline and "GREETING" not in cmdline and str(app) not in cmdline
    assert denied == "DENIED"  # bwrap's init is root's: its descriptors are out of reach


def test_a_group_is_only_the_aggregate_limits_on_top(tmp_path: Path) -> None:
    with isolation.SandboxGroup(tmp_path / "sb", disk_mb=16) as group:
        app = group.subdir("app")
        r = run_isolated("pwd; echo x > f; id -un", workdir=app, group=group)
        assert (r.stdout, r.exit_code, r.limit) == ("/app\nsandbox\n", 0, None)
        assert (app / "f").read_text() == "x\n"
        usage = group.usage()
        assert usage.disk_bytes > 0 and usage.disk_inodes >= 2
        assert repr(group).startswith("SandboxGroup(") and group.mode in ("cgroup2", "cgroup1", "rlimits")


def test_missing_bwrap_raises_or_falls_back_loudly(app: Path, monkeypatch: pytest.MonkeyPatch,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(isolation, "_bwrap_works", lambda: (False, "bwrap not found"))
    with pytest.raises(IsolationUnavailable, match="apt-get install -y bubblewrap"):
        run_isolated("true", workdir=app)
    with caplog.at_level(logging.WARNING, logger="rsigym_env.isolation"):
        r = run_isolated("pwd; echo x > f", workdir=app, require_isolation=False)
    assert not r.isolated and r.exit_code == 0 and r.stdout == f"{app}\n"
    assert (app / "f").exists()
    assert any("NOT isolated" in rec.message for rec in caplog.records)
    r = asyncio.run(run_isolated_async(f"{PY} -c \"x = bytearray(600 << 20)\"", workdir=app,
                                       limits=Limits(memory_mb=256), require_isolation=False))
    assert not r.isolated and r.limit == "memory"  # the rlimits still apply


def test_a_failed_bwrap_check_is_tried_again_later_a_success_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """One check that times out on a loaded machine must not refuse every sandbox of a long run."""
    import subprocess

    real, calls = subprocess.run, []

    def slow_once(argv, **kw):
        calls.append(argv)
        if len(calls) == 1:
            raise subprocess.TimeoutExpired(argv, kw.get("timeout", 20))
        return real(argv, **kw)

    monkeypatch.setattr(isolation, "_BWRAP_CHECK", {"ok": None, "why": "", "at": float("-inf")})
    monkeypatch.setattr(isolation.subprocess, "run", slow_once)
    assert isolation._bwrap_works()[0] is False and "failed to run" in isolation._bwrap_works()[1]
    assert len(calls) == 1                                       # the failure is remembered for a while ...
    monkeypatch.setattr(isolation, "BWRAP_RECHECK_S", 0.0)
    assert isolation.bwrap_available() and len(calls) == 2      # ... then checked again
    monkeypatch.setattr(isolation, "BWRAP_RECHECK_S", 1e9)
    assert isolation.bwrap_available() and len(calls) == 2      # a success is kept
