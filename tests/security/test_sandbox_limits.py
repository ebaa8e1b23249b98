"""Attacks on a sandbox's aggregate limits (one cheap call must not exhaust the host) and on what a
sandbox can learn about its host from /proc (nothing may name the evaluation or the split).

Each test attacks through the public API (``run_isolated``, ``run_isolated_async``,
``IsolatedProcess``, ``SandboxGroup``) the way a hostile harness would, and asserts the defence.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import pytest

from rsigym_env.worlds.local.sandbox import isolation
from rsigym_env.worlds.local.sandbox.isolation import (
    ExecResult, IsolatedProcess, Limits, Mount, SandboxGroup, bwrap_available, run_isolated, run_isolated_async,
)

pytestmark = pytest.mark.skipif(not bwrap_available(), reason="bubblewrap is not usable here")

PY = "/usr/bin/python3"
MB = 1 << 20
MARKER = "official-secret-marker"


def tree_bytes(root: Path) -> int:
    """Bytes allocated to files under ``root`` as the host sees them."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + dirnames:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def mounted(path: Path) -> bool:
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return str(path) in points


@pytest.fixture
def group(tmp_path: Path) -> Iterator[SandboxGroup]:
    g = SandboxGroup(tmp_path / "sandbox", memory_mb=1024, processes=256, disk_mb=256, inodes=4096)
    yield g
    g.close()


def need_cgroup(g: SandboxGroup) -> None:
    if g.mode == "rlimits":
        pytest.skip("no usable cgroup here: the group limits memory and processes per command only")


def need_tmpfs(g: SandboxGroup) -> None:
    if g.disk_mode != "tmpfs":
        pytest.skip("cannot mount a tmpfs here (not root): the watchdog test covers this machine")


# --------------------------------------------------------------------------------------------
# Memory over every process of every command


@pytest.mark.slow
def test_concurrent_memory_hogs_cannot_pass_the_group_limit(tmp_path: Path) -> None:
    # each holds its 800 MB until a common deadline, so the survivors held theirs at the same time
    hold_until = time.time() + 6
    hog = (f"import time; x = bytearray(b'1') * (800 << 20); print('touched', flush=True); "
           f"time.sleep(max(0, {hold_until} - time.time()))")
    with SandboxGroup(tmp_path / "sb", memory_mb=2048, disk_mb=64) as g:
        need_cgroup(g)
        app = g.subdir("app")
        per_command = Limits(memory_mb=1024, wall_s=60)  # each one alone is within its own rlimit
        with ThreadPoolExecutor(6) as pool:
            results = list(pool.map(lambda _: run_isolated([PY, "-c", hog], workdir=app, group=g, limits=per_command),
                                    range(6)))
        usage = g.usage()
        assert usage.memory_peak_bytes is not None and usage.memory_peak_bytes <= 2048 * MB
        killed = [r for r in results if r.limit == "memory"]
        survivors = [r for r in results if r.stdout == "touched\n" and r.exit_code == 0]
        assert killed, results
        assert len(survivors) * 800 <= 2048 and len(killed) + len(survivors) == 6, results
        for r in killed:  # killed while allocating, or later to make room for another one
            assert r.exit_code == 137
            assert ("[sandbox] memory limit of the sandbox (2048 MB over all its processes and files) reached"
                    in r.stderr)
        # the group is still usable and the host is fine
        assert run_isolated("echo alive", workdir=app, group=g).stdout == "alive\n"
    assert bytearray(b"1") * (200 * MB)  # the host can still allocate
    assert subprocess.run(["true"]).returncode == 0


def test_tmpfs_files_count_towards_the_memory_limit(tmp_path: Path) -> None:
    # a disk quota above the memory limit: the tmpfs pages the sandbox writes are charged to its memory
    with SandboxGroup(tmp_path / "sb", memory_mb=256, disk_mb=1024) as g:
        need_cgroup(g)
        need_tmpfs(g)
        app = g.subdir("app")
        r = run_isolated("for i in 1 2 3 4 5 6; do head -c 100M /dev/zero > f$i || exit 9; done; echo wrote-all",
                         workdir=app, group=g, limits=Limits(file_mb=512, wall_s=60))
        assert "wrote-all" not in r.stdout and r.limit == "memory", r
        assert g.usage().memory_peak_bytes <= 256 * MB
        assert tree_bytes(app) <= 256 * MB


# --------------------------------------------------------------------------------------------
# Processes over every command


FORKER = ("import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n"
          "            time.sleep(4); os._exit(0)\n        n += 1\n"
          "except OSError as e:\n    print(n, e.errno, flush=True)\ntime.sleep(1)")


@pytest.mark.slow
def test_forks_spread_over_concurrent_commands_are_bounded_by_the_group(tmp_path: Path) -> None:
    with SandboxGroup(tmp_path / "sb", processes=64) as g:
        need_cgroup(g)
        app = g.subdir("app")
        roomy = Limits(processes=4096, wall_s=60)   # the per-command (per-uid) limit does not bind
        with ThreadPoolExecutor(3) as pool:
            results = list(pool.map(lambda _: run_isolated([PY, "-c", FORKER], workdir=app, group=g, limits=roomy),
                                    range(3)))
        started = [r for r in results if r.exit_code == 0]
        forked = [int(r.stdout.split()[0]) for r in started]
        assert all(r.stdout.split()[1] == "11" for r in started), results   # EAGAIN
        # every forker and its bwrap + namespace init count too: the total stays within the group's 64
        assert sum(forked) + 3 * len(started) <= 64, results
        usage = g.usage()
        assert usage.processes_peak is None or usage.processes_peak <= 64
        assert subprocess.run(["true"]).returncode == 0  # the host still forks

        with ThreadPoolExecutor(3) as pool:  # classic fork bombs, three at once
            rs = list(pool.map(lambda _: run_isolated("bomb() { bomb | bomb & }; bomb; sleep 2", workdir=app, group=g,
                                                      limits=roomy), range(3)))
        assert any(r.limit == "processes" for r in rs), rs
        for r in rs:
            if r.limit == "processes":
                assert "[sandbox] process limit of the sandbox (64 over all its commands) reached" in r.stderr
            assert not r.timed_out
        assert (g.usage().processes_peak or 0) <= 64


# --------------------------------------------------------------------------------------------
# Disk


def test_a_disk_hog_stops_at_the_quota(group: SandboxGroup) -> None:
    need_tmpfs(group)
    app, logs = group.subdir("app"), group.subdir("logs")
    r = run_isolated("for i in $(seq 13); do head -c 100M /dev/zero > f$i || exit 3; done; echo wrote-all",
                     workdir=app, group=group, limits=Limits(file_mb=1024, wall_s=60))  # 1.3 GB, 256 MB quota
    assert r.limit == "disk" and r.exit_code == 3 and "wrote-all" not in r.stdout, r
    assert "No space left on device" in r.stderr and "[sandbox] disk quota reached" in r.stderr
    assert 200 * MB <= tree_bytes(group.root) <= 256 * MB
    # the quota is over all the sandbox's directories: a writable mount shares it
    r = run_isolated("head -c 10M /dev/zero > /logs/more", workdir=app, group=group,
                     mounts=[Mount(logs, "/logs", writable=True)])
    assert r.limit == "disk" and tree_bytes(group.root) <= 256 * MB
    # deleting makes room again, as on any full disk
    r = run_isolated("rm f*; head -c 10M /dev/zero > small && echo ok", workdir=app, group=group)
    assert r.stdout == "ok\n" and r.limit is None
    usage = group.usage()
    assert 10 * MB <= usage.disk_bytes <= 256 * MB


@pytest.mark.parametrize("kind", ["file", "dir", "symlink"])
def test_many_small_entries_hit_the_inode_bound(tmp_path: Path, kind: str) -> None:
    make = {"file": "open(f'e{i}', 'w').close()", "dir": "os.mkdir(f'e{i}')", "symlink": "os.symlink('x', f'e{i}')"}
    with SandboxGroup(tmp_path / "sb", inodes=500, disk_mb=64) as g:
        need_tmpfs(g)
        app = g.subdir("app")
        r = run_isolated([PY, "-c", f"import os\nfor i in range(100000):\n    {make[kind]}"], workdir=app, group=g)
        assert r.limit == "disk" and "[Errno 28] No space left on device" in r.stderr, r
        assert len(os.listdir(app)) < 500
        assert g.usage().disk_inodes <= 500


def test_fallback_warns_and_the_watchdog_stops_a_disk_hog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv(isolation.FALLBACK_ENV, "all")
    monkeypatch.setattr(isolation, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="rsigym_env.isolation"):
        g = SandboxGroup(tmp_path / "sb", disk_mb=256, inodes=2000)
        SandboxGroup(tmp_path / "sb2", disk_mb=1).close()  # one warning per process, not per group
    try:
        assert (g.mode, g.disk_mode) == ("rlimits", "watchdog")
        warnings = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.WARNING]
        assert len(warnings) == 2
        assert any("NO cgroup" in w and isolation.FALLBACK_ENV in w for w in warnings)
        assert any("WATCHDOG" in w for w in warnings)
        app = g.subdir("app")
        started = time.monotonic()
        r = run_isolated("for i in $(seq 13); do head -c 100M /dev/zero > f$i || exit 3; done; echo wrote-all",
                         workdir=app, group=g, limits=Limits(file_mb=1024, wall_s=60))
        assert r.limit == "disk" and "wrote-all" not in r.stdout, r
        assert "[sandbox] disk quota of the sandbox (256 MB, 2000 files) exceeded" in r.stderr
        assert tree_bytes(app) < 1000 * MB and time.monotonic() - started < 30
        # over quota, a command that deletes runs; one that writes more is stopped again
        r = run_isolated("rm -f f*; echo cleaned", workdir=app, group=g)
        assert r.stdout == "cleaned\n" and r.limit is None
        r = run_isolated("i=0; while :; do : > f$i; i=$((i+1)); done", workdir=app, group=g,
                         limits=Limits(wall_s=30))
        assert r.limit == "disk" and not r.timed_out, r
        assert len(os.listdir(app)) < 50_000
    finally:
        g.close()
    assert not (tmp_path / "sb").exists()  # the group made it and removed it with the sandbox's files


# --------------------------------------------------------------------------------------------
# Lifetime


@pytest.mark.parametrize("fallback", [False, True])
def test_close_kills_everything_and_cleans_up(tmp_path: Path, fallback: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if fallback:
        monkeypatch.setenv(isolation.FALLBACK_ENV, "cgroups,mount")
    g = SandboxGroup(tmp_path / "sb")
    app = g.subdir("app")
    cgroup_dirs = list(g._state.cgroup.dirs) if g._state.cgroup else []
    # a command that leaves a background child behind, waited on from a thread, and an async one
    out: list[ExecResult] = []
    waiter = threading.Thread(target=lambda: out.append(run_isolated(
        "(sleep 60; echo late > /app/late) & sleep 60", workdir=app, group=g, limits=Limits(wall_s=120))))
    waiter.start()

    async def main() -> ExecResult:
        p = await IsolatedProcess.start("sleep 60", workdir=app, group=g, limits=Limits(wall_s=120))
        await asyncio.sleep(0.5)
        started = time.monotonic()
        await asyncio.to_thread(g.close)
        r = await p.wait()
        assert time.monotonic() - started < 10
        return r

    r = asyncio.run(main())
    waiter.join(10)
    assert not waiter.is_alive() and out and out[0].exit_code != 0 and not out[0].timed_out
    assert r.exit_code != 0 and not r.timed_out
    assert out[0].limit is None and r.limit is None  # killed by close(), not by a limit
    g.close()  # twice is fine
    assert g.closed and not (tmp_path / "sb").exists() and not mounted(tmp_path / "sb")
    assert all(not d.exists() for d in cgroup_dirs)
    with pytest.raises(RuntimeError, match="closed"):
        run_isolated("true", workdir=tmp_path, group=g)


def test_kill_ends_running_commands_and_the_group_stays_usable(tmp_path: Path) -> None:
    with SandboxGroup(tmp_path / "sb", cgroups=False, mount=False) as g:
        assert (g.mode, g.disk_mode) == ("rlimits", "watchdog")
        app = g.subdir("app")
        with ThreadPoolExecutor(2) as pool:
            running = [pool.submit(run_isolated, "sleep 60", workdir=app, group=g, limits=Limits(wall_s=120))
                       for _ in range(2)]
            time.sleep(1.0)
            started = time.monotonic()
            g.kill()
            results = [f.result(timeout=20) for f in running]
        assert time.monotonic() - started < 10
        assert all(r.exit_code == 137 and not r.timed_out for r in results), results
        assert run_isolated("echo again", workdir=app, group=g).stdout == "again\n"


def test_context_manager_and_paths_outside_the_group(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    with SandboxGroup(tmp_path / "sb") as g:
        app = g.subdir("app")
        assert g.subdir("app") == app and app.parent == g.root
        for bad in ("", ".", "..", "../escape", "a/b", "x\0y"):
            with pytest.raises(ValueError):
                g.subdir(bad)
        with pytest.raises(ValueError, match="not under the sandbox group"):
            run_isolated("true", workdir=outside, group=g)   # its disk would be unbounded
        with pytest.raises(ValueError, match="not under the sandbox group"):
            run_isolated("true", workdir=app, group=g, mounts=[Mount(outside, "/out", writable=True)])
        (app / "escape").symlink_to(outside)
        with pytest.raises(ValueError, match="not under the sandbox group"):
            run_isolated("true", workdir=app / "escape", group=g)
        r = run_isolated("ls /ro", workdir=app, group=g, mounts=[Mount(outside, "/ro")])  # read-only is fine
        assert r.exit_code == 0
        assert run_isolated("id -u", workdir=app, group=g).stdout == f"{g.uid}\n" or os.geteuid() != 0
    assert g.closed
    if os.geteuid() == 0:  # the uid, visible inside, is random: not a function of the host path
        uids = set()
        for _ in range(3):
            with SandboxGroup(tmp_path / "same-path") as again:
                uids.add(again.uid)
        assert len(uids) == 3
    with pytest.raises(ValueError, match="empty"):
        (tmp_path / "full").mkdir()
        (tmp_path / "full" / "f").write_text("x")
        SandboxGroup(tmp_path / "full")
    for bad in ({"memory_mb": 0}, {"processes": -1}, {"disk_mb": 1.5}, {"inodes": True}):
        with pytest.raises(ValueError):
            SandboxGroup(tmp_path / "bad", **bad)  # type: ignore[arg-type]


def test_async_commands_report_group_limits(group: SandboxGroup) -> None:
    need_tmpfs(group)
    app = group.subdir("app")

    async def main() -> list[ExecResult]:
        return list(await asyncio.gather(*(run_isolated_async(
            f"head -c 200M /dev/zero > f{i}", workdir=app, group=group, limits=Limits(file_mb=512)) for i in range(3))))

    results = asyncio.run(main())
    assert any(r.limit == "disk" for r in results), results
    assert tree_bytes(group.root) <= 256 * MB


# --------------------------------------------------------------------------------------------
# What /proc shows inside


# The probe prints sections separated by SEP, which its own command line (shown in /proc) does not contain.
SEP = "---SEP---"
_SEP = "printf '\\055\\055\\055SEP\\055\\055\\055\\n'"
PROBE = (f"for f in /proc/[0-9]*/cmdline; do cat $f; echo; done; {_SEP}; cat /proc/1/environ 2>/dev/null; {_SEP};"
         f" cat /proc/self/cgroup; {_SEP}; cat /proc/self/mountinfo; {_SEP}; cat /proc/self/mounts")


def test_proc_cmdline_shows_no_host_path_mount_or_environment(tmp_path: Path) -> None:
    base = tmp_path / MARKER
    app, harness, logs = base / "app", base / "harness", base / "logs"
    for d in (app, harness, logs):
        d.mkdir(parents=True)
    r = run_isolated(f"sleep 1 & {PROBE}", workdir=app, env={"TOKEN": f"{MARKER}-env"},
                     mounts=[Mount(harness, "/harness"), Mount(logs, "/logs", writable=True)])
    assert r.exit_code == 0, r.stderr
    sections = r.stdout.split(SEP)
    assert len(sections) == 5, r.stdout
    cmdlines, environ, _, mountinfo, _ = sections
    assert "bwrap --args" in cmdlines.replace("\0", " ")  # bwrap's own argv is there, without its options
    assert "sleep" in cmdlines  # the probe does read the other processes' command lines
    assert MARKER not in cmdlines and MARKER not in environ and "/work" not in cmdlines
    assert "--bind" not in cmdlines and "--setenv" not in cmdlines
    # mountinfo of a plain bind mount shows its host path: the documented reason to use a group
    assert MARKER in mountinfo


def test_a_group_shows_no_host_path_in_mountinfo_or_cgroup(tmp_path: Path) -> None:
    with SandboxGroup(tmp_path / MARKER / "sb") as g:
        need_tmpfs(g)
        app, logs = g.subdir("app"), g.subdir("logs")
        r = run_isolated(f"sleep 1 & {PROBE}", workdir=app, group=g, env={"TOKEN": f"{MARKER}-env"},
                         mounts=[Mount(logs, "/logs", writable=True)])
        assert r.exit_code == 0, r.stderr
        cmdlines, environ, cgroup, mountinfo, mounts = r.stdout.split(SEP)
        assert "bwrap --args" in cmdlines.replace("\0", " ") and "sleep" in cmdlines
        for text in (cmdlines, environ, cgroup, mountinfo, mounts):
            assert MARKER not in text and str(tmp_path) not in text
        names = [d.name for d in (g._state.cgroup.dirs if g._state.cgroup else [])]
        assert all(name not in cgroup for name in names) and "rsigym" not in cgroup
        assert " /app " in mountinfo and " /logs " in mountinfo


@pytest.mark.parametrize("where", ["env-value", "env-key", "cwd", "mount-target"])
def test_nul_bytes_cannot_inject_bubblewrap_options(tmp_path: Path, where: str) -> None:
    app = tmp_path / "app"
    app.mkdir()
    payload = "x\0--bind\0/\0/hostroot"
    kwargs: dict = {"env-value": {"env": {"A": payload}}, "env-key": {"env": {payload: "1"}},
                    "cwd": {"cwd": "/app/" + payload}, "mount-target": {"mounts": [Mount(app, "/m" + payload)]}}[where]
    with pytest.raises(ValueError, match="NUL"):
        run_isolated("touch /app/ran; ls /hostroot/work", workdir=app, **kwargs)
    assert not (app / "ran").exists()


def test_groups_left_behind_by_a_killed_process_are_reaped(tmp_path):
    """A process holding a sandbox group (tmpfs + cgroup, a command running) dies by SIGKILL: the next
    process to make a group unmounts the tmpfs, kills the command, removes the cgroup and the files."""
    import signal
    import subprocess
    import sys
    import textwrap

    from rsigym_env.worlds.local.sandbox.isolation import group_registry, reap_stale_groups

    child = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from rsigym_env.worlds.local.sandbox.isolation import SandboxGroup, IsolatedProcess
        import asyncio
        g = SandboxGroup(Path({str(tmp_path / 'sb')!r}), memory_mb=256, disk_mb=32)
        app = g.subdir("app")
        (app / "data").write_bytes(b"x" * 1000000)
        async def go():
            await IsolatedProcess.start("sleep 600", workdir=app, group=g)
            print("ready", flush=True)
            await asyncio.sleep(600)
        asyncio.run(go())
    """)
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        mounted = (tmp_path / "sb").is_mount()
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert mounted and (tmp_path / "sb").is_mount()  # left behind
    assert reap_stale_groups() >= 1
    assert not (tmp_path / "sb").exists() or not (tmp_path / "sb").is_mount()
    assert not (tmp_path / "sb" / "app" / "data").exists()
    leftovers = [p for p in group_registry().glob("*.json") if str(tmp_path) in p.read_text()]
    assert leftovers == []


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can mount the tmpfs that hides the host path")
def test_a_socket_shared_from_an_opaque_directory_shows_no_host_path(tmp_path: Path) -> None:
    """What several sandboxes share (an evaluation's model socket) from ``opaque_directory`` shows in their
    mountinfo as its bare name: nothing links the sandboxes that share it. Unmounted and gone afterwards."""
    import socket

    app = tmp_path / "app"
    app.mkdir()
    with isolation.opaque_directory(prefix="rsigym-ev-") as shared:
        with socket.socket(socket.AF_UNIX) as server:
            server.bind(str(shared / "model.sock"))
            server.listen()
            r = run_isolated("cat /proc/self/mountinfo", workdir=app, mounts=[Mount(shared / "model.sock", "/m.sock")])
        assert shared.is_mount() and list(group_registry_records(str(shared)))
    assert r.exit_code == 0, r.stderr
    line = next(line for line in r.stdout.splitlines() if " /m.sock " in line)
    assert line.split()[3] == "/model.sock", line
    assert shared.name not in r.stdout and "rsigym-ev-" not in r.stdout
    assert not shared.exists() and not list(group_registry_records(str(shared)))


def group_registry_records(needle: str) -> Iterator[Path]:
    registry = isolation.group_registry()
    return (p for p in (registry.glob("*.json") if registry.is_dir() else []) if needle in p.read_text())
