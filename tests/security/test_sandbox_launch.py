"""Attacks on how a sandboxed command is started: the in-process launch (the parent puts bubblewrap in
the group's cgroup and under the command's rlimits while bubblewrap waits for its options on a pipe,
``isolation._Launch``) against the older start through an ``sh`` join and ``prlimit`` inside
(``RSIGYM_SANDBOX_FALLBACK=spawn``). Both must confine every process of a command from its first
instruction, report the same limits, and show the sandbox the same things.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest
from proc_helpers import process_tree

from rsigym_env.worlds.local.sandbox import isolation
from rsigym_env.worlds.local.sandbox.isolation import (
    IsolatedProcess, Limits, SandboxGroup, bwrap_available, run_isolated,
)

pytestmark = pytest.mark.skipif(not bwrap_available(), reason="bubblewrap is not usable here")

PY = "/usr/bin/python3"
PATHS = ["launch", "exec"]


@pytest.fixture(params=PATHS)
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "exec":
        monkeypatch.setenv(isolation.FALLBACK_ENV, "spawn")
    else:
        monkeypatch.delenv(isolation.FALLBACK_ENV, raising=False)
    return request.param


@pytest.fixture
def group(tmp_path: Path, path: str) -> Iterator[SandboxGroup]:
    g = SandboxGroup(tmp_path / "sb", memory_mb=512, processes=64, disk_mb=64, inodes=2048)
    yield g
    g.close()


def need_cgroup(g: SandboxGroup) -> None:
    if g.mode == "rlimits":
        pytest.skip("no usable cgroup here")


def run(command: str, g: SandboxGroup, **kw: object) -> isolation.ExecResult:
    return run_isolated(command, workdir=g.subdir("app"), group=g, **kw)  # type: ignore[arg-type]


def test_the_launch_is_the_path_taken_as_root_or_with_a_cgroup(group: SandboxGroup, path: str) -> None:
    prep = isolation._prepare("true", group.subdir("app"), isolation.APP, (), None, False, Limits(), True, None,
                              group, launch=True)
    try:
        used = prep.launch is not None
        expected = path == "launch" and (os.geteuid() == 0 or group.mode != "rlimits")
        assert used == expected
        if used and os.geteuid() == 0:
            assert "prlimit" not in prep.argv and "/bin/sh" not in prep.spawn_argv(group)[:1]
    finally:
        prep.abandon()


def test_every_process_of_a_command_is_in_the_group_from_the_start(group: SandboxGroup) -> None:
    need_cgroup(group)

    async def go() -> None:
        # forks before anything else, then a daemon that leaves its parent (setsid, double fork)
        proc = await IsolatedProcess.start(
            f"sleep 30 & ( setsid sh -c 'sleep 30 & exit 0' & ) ; {PY} -c 'import os, time\n"
            f"if os.fork() == 0: time.sleep(30)\nprint(\"up\", flush=True); time.sleep(30)'",
            workdir=group.subdir("app"), group=group)
        deadline = time.monotonic() + 20
        while b"up" not in proc._bufs["stdout"] and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        time.sleep(0.2)
        mine = process_tree(proc.pid)
        inside = group._state.cgroup.pids()  # type: ignore[union-attr]
        try:
            assert len(mine) >= 6, mine   # bwrap, its sandbox child and init, sh, sleeps, python and its fork
            for procs in group._state.cgroup.procs_files:  # type: ignore[union-attr]
                members = {int(p) for p in Path(procs).read_text().split()}
                assert mine <= members, (procs, mine - members)
            assert mine <= inside
        finally:
            proc.kill()
            await proc.wait()
        # the daemon (reparented to the sandbox's init, so still below bubblewrap) died with its sandbox
        deadline = time.monotonic() + 10
        while group._state.cgroup.pids() and time.monotonic() < deadline:  # type: ignore[union-attr]
            await asyncio.sleep(0.05)
        assert not group._state.cgroup.pids()  # type: ignore[union-attr]

    asyncio.run(go())


def test_the_sandbox_sees_the_same_cgroup_limits_fds_and_identity(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                   ) -> None:
    script = ("cat /proc/self/cgroup; echo ---; cat /proc/self/limits; echo ---; ls /proc/self/fd; echo ---; "
              "id -u; grep -E '^(Cap|NoNewPrivs|Seccomp)' /proc/self/status; echo ---; ls /sys/fs/cgroup 2>&1; "
              "echo ---; cat /proc/self/uid_map")
    seen = {}
    for path in PATHS:
        if path == "exec":
            monkeypatch.setenv(isolation.FALLBACK_ENV, "spawn")
        with SandboxGroup(tmp_path / path) as g:
            r = run_isolated(script, workdir=g.subdir("app"), group=g,
                             limits=Limits(cpu_s=7, memory_mb=300, processes=33, file_mb=5))
            assert r.exit_code == 0, r
            uid = g.uid
        seen[path] = r.stdout.replace(str(uid), "<uid>")
    assert seen["launch"] == seen["exec"]
    cgroup, limits, fds, ident, sys_, _ = seen["launch"].split("---\n")
    assert all(line.endswith(":/") for line in cgroup.split()), cgroup  # the group is the namespace's root
    rows = {" ".join(line.split()[:-3]): line.split()[-3:] for line in limits.splitlines()[1:]}
    assert rows["Max cpu time"][:2] == ["7", "8"] and rows["Max address space"][:2] == [str(300 << 20)] * 2
    assert rows["Max processes"][:2] == ["33", "33"] and rows["Max file size"][:2] == [str(5 << 20)] * 2
    assert rows["Max core file size"][:2] == ["0", "0"]
    assert fds.split() == ["0", "1", "2", "3"]  # ls's own directory: no pipe or memfd of ours leaked in
    assert "No such file" in sys_


@pytest.mark.parametrize("limit", ["cpu", "file", "memory", "processes"])
def test_each_limit_binds_and_is_reported(group: SandboxGroup, limit: str) -> None:
    command, limits = {
        "cpu": (f"{PY} -c 'while True: pass'", Limits(cpu_s=1, wall_s=20)),
        "file": ("head -c 3000000 /dev/zero > big", Limits(file_mb=1)),
        "memory": (f"{PY} -c 'x = bytearray(400 << 20)'", Limits(memory_mb=200)),
        "processes": (f"{PY} -c 'import os, time\nfor _ in range(100):\n    if os.fork() == 0: time.sleep(5); "
                      "os._exit(0)'", Limits(processes=20)),
    }[limit]
    r = run(command, group, limits=limits)
    assert r.limit == limit, r
    assert "[sandbox] " in r.stderr


def test_a_failed_join_runs_nothing_and_says_so(group: SandboxGroup, monkeypatch: pytest.MonkeyPatch) -> None:
    need_cgroup(group)
    app = group.subdir("app")
    monkeypatch.setattr(group._state.cgroup, "procs_files", [str(group.root / "no" / "cgroup.procs")])
    r = run_isolated("touch /app/ran; echo ran", workdir=app, group=group)
    assert r.exit_code == 125 and r.stdout == "" and isolation.JOIN_FAILED in r.stderr
    assert not (app / "ran").exists()

    async def go() -> isolation.ExecResult:
        p = await IsolatedProcess.start("touch /app/ran", workdir=app, group=group)
        return await p.wait()

    r = asyncio.run(go())
    assert r.exit_code == 125 and isolation.JOIN_FAILED in r.stderr and not (app / "ran").exists()


def test_a_parent_gone_before_the_release_leaves_bubblewrap_nothing_to_run(tmp_path: Path) -> None:
    """The parent dies between starting bubblewrap and handing it its options: bubblewrap reads none (no
    namespace, no mount) and must run nothing at all."""
    with SandboxGroup(tmp_path / "sb") as g:
        app = g.subdir("app")
        token = f"/tmp/rsigym-ran-on-host-{secrets.token_hex(8)}"
        prep = isolation._prepare(f"touch /app/ran; touch {token}", app, isolation.APP, (), None, False,
                                  Limits(), True, None, g, launch=True)
        if prep.launch is None:
            prep.abandon()
            pytest.skip("no in-process launch here")
        proc = subprocess.Popen(prep.spawn_argv(g), env={}, pass_fds=prep.pass_fds, start_new_session=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        prep.close()
        time.sleep(0.1)
        assert proc.poll() is None  # waiting for its options
        prep.abandon()              # what the parent's death does to the pipe
        out, err = proc.communicate(timeout=20)
        assert proc.returncode != 0 and out == b"", err
        assert not (app / "ran").exists()
        assert not os.path.exists(token)
