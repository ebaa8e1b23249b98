"""Hostile program researchers (rsigym_env/programs): code that reads the host's secrets, forks without
end, opens sockets, writes outside its directory, hunts for ledgers and seeds, loops forever, takes all
the memory or all the CPU.

Each attack is a program whose ``act`` does the deed and reports what it got in its action (the
attacker's own view), run through the public API (:class:`ProgramResearcher`, and ``run_spec`` with an
``EpisodeSpec`` of a program spec). Each ends with its ``ProgramError``, or, when the attempt only fails
inside the sandbox, the program keeps running and the attempts are counted; and nothing else is
touched: the host's files, another episode right after in the same process, the books of the platform
that billed the failed episode.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import textwrap
import time
from pathlib import Path

import gymnasium as gym
import pytest
from proc_helpers import process_tree

import rsigym_env
from rsigym_env.agents import AgentSpec
from rsigym_env.episode import run_episode
from rsigym_env.platform import Platform
from rsigym_env.programs import ProgramError, ProgramLimits, ProgramResearcher
from rsigym_env.programs.sandbox import ProgramPool, default_pool
from rsigym_env.sweep import EpisodeSpec, episode_scenario, run_local, run_spec
from rsigym_env.worlds.local.sandbox import isolation
from rsigym_env.worlds.local.sandbox.isolation import bwrap_available

pytestmark = pytest.mark.skipif(not bwrap_available(), reason="bubblewrap is not usable here")

SHORT = ProgramLimits(act_wall_s=2, episode_wall_s=10, start_wall_s=20, cpu_s=5)
MARKER = "hostile-program-marker-" + secrets.token_hex(6)

SUBMIT = {"tool": "submit", "args": {}}
HONEST = {"researcher.py": textwrap.dedent('''
    class Honest:
        def reset(self, observation, info, seed):
            self.plan = iter([{"tool": "evaluate", "args": {"k": 1}}, {"tool": "wait", "args": {}}])

        def act(self, observation, info):
            return next(self.plan, {"tool": "submit", "args": {}})

    def make_researcher(params):
        return Honest()
    ''')}


def attacker(act_body: str, *, first_act: str = "") -> dict[str, str]:
    """A program whose act runs ``act_body`` (``found`` collects what it got; ``params`` are its params)
    and returns ``{"tool": "submit", "args": {}, "found": found}``. ``first_act``: the action of its
    first act instead (e.g. an evaluate, so that money is reserved when the attack runs)."""
    first = f"self.first = {first_act}" if first_act else "self.first = None"
    return {"researcher.py": f'''
import os, sys, socket, subprocess, time, signal

class Attacker:
    def __init__(self, params):
        self.params = params

    def reset(self, observation, info, seed):
        {first}

    def act(self, observation, info):
        if self.first is not None:
            action, self.first = self.first, None
            return action
        params, found = self.params, {{}}
{textwrap.indent(textwrap.dedent(act_body), " " * 8)}
        return {{"tool": "submit", "args": {{}}, "found": found}}


def make_researcher(params):
    return Attacker(params)
'''}


@pytest.fixture
def pool():
    default_pool().close()  # idle sandboxes other tests of this process left are not this test's processes
    p = ProgramPool()
    yield p
    p.close()


@pytest.fixture
def host(tmp_path, monkeypatch):
    """The host's secrets: a run directory with a ledger and an audit log, a home, an environment variable."""
    run = tmp_path / "run"
    run.mkdir()
    for name in ("ledger.db", "audit.jsonl", "official.json", "seeds.txt"):
        (run / name).write_text(MARKER)
    home = tmp_path / "home"
    home.mkdir()
    (home / "secret").write_text(MARKER)
    monkeypatch.setenv("RSIGYM_HOME", str(home))
    monkeypatch.setenv("RSIGYM_HOSTILE_SECRET", MARKER)
    return {"run": run, "home": home}


def play(code: dict[str, str], pool: ProgramPool, params: dict | None = None, limits: ProgramLimits = SHORT):
    """reset + one act, as an episode does: (the action or the ProgramError, the researcher)."""
    researcher = ProgramResearcher(code, params or {}, name="attacker", limits=limits, pool=pool)
    try:
        researcher.reset({"budget_left_usd": [500.0]}, {"tools": ["submit"]}, seed=0)
        return researcher.act({"budget_left_usd": [500.0]}, {}), researcher
    except ProgramError as exc:
        return exc, researcher


def still_fine(pool: ProgramPool) -> None:
    """Another episode right after, in the same process and pool, plays to the end; the host can fork."""
    env = gym.make("RSIGym/Joint-v0", benchmark="aime", budget_usd=500)
    researcher = ProgramResearcher(HONEST, limits=SHORT, pool=pool)
    result = run_episode(env, researcher, seed=0)
    researcher.close()
    env.close()
    assert result.terminated and result.steps == 3 and result.info["submitted"]["by"] == "agent"
    assert subprocess.run(["true"], timeout=10).returncode == 0


def sandbox_processes() -> list[int]:
    """Processes descending from this one that run a program's runtime (or its bubblewrap)."""
    found = []
    for pid in process_tree(os.getpid()) - {os.getpid()}:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"runtime.py" in cmdline or b"bwrap" in cmdline:
            found.append(pid)
    return found


def events(researcher: ProgramResearcher) -> set[str]:
    return {a["event"] for a in researcher.attempts}


# --------------------------------------------------------------------------------------------
# (a) reading the host's files


def test_the_hosts_files_cannot_be_read(host, pool):
    paths = ["/etc/shadow", "/work/main/pyproject.toml", str(Path(rsigym_env.__file__)), "/root/.rsigym",
             os.path.expanduser("~/.rsigym"), str(host["home"] / "secret"), str(host["run"] / "ledger.db"),
             str(host["run"] / "audit.jsonl"), "/proc/1/environ", "/proc/1/root/etc/hostname", "/proc/self/environ",
             "/proc/self/mountinfo", "/proc/1/cmdline", "/etc/passwd"]
    action, researcher = play(attacker('''
        for path in params["paths"]:
            try:
                with open(path, "rb") as f:
                    found[path] = "read:" + f.read(1 << 16).decode("latin-1")
            except Exception as exc:
                found[path] = f"{type(exc).__name__}: {exc}"
        found["environ"] = dict(os.environ)
        found["listing"] = sorted(os.listdir("/"))
        found["uid"] = os.getuid()
    '''), pool, {"paths": paths})
    assert isinstance(action, dict), action   # the attempts only failed inside: the program kept running
    found = action["found"]
    for path in paths[:10]:
        assert not found[path].startswith("read:"), (path, found[path][:200])
    for path in ("/proc/self/mountinfo", "/proc/1/cmdline", "/etc/passwd"):
        assert found[path].startswith("read:")   # its own, harmless: nothing of the host in them
    # (/proc/self/environ: unreadable, the episode's process is not dumpable; its environment is its own anyway)
    assert MARKER not in repr(found)
    rest = repr([found[p] for p in paths[10:]] + [found["environ"], found["listing"]])  # (not the paths it was given)
    assert str(host["run"]) not in rest and str(host["home"]) not in rest and "/work" not in rest
    assert "RSIGYM" not in repr(found["environ"])
    assert set(found["listing"]) <= {"app", "bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "program",
                                     "python", "root", "runtime", "sbin", "tmp", "usr", "opt"}
    if os.geteuid() == 0:
        assert found["uid"] != 0
    opened = {a["detail"] for a in researcher.attempts if a["event"] == "open"}
    assert {"/etc/shadow (read)", "/proc/1/environ (read)", "/work/main/pyproject.toml (read)"} <= opened
    researcher.close()
    still_fine(pool)


# --------------------------------------------------------------------------------------------
# (b) processes


def test_a_fork_bomb_ends_with_its_error_and_the_host_can_still_fork(pool):
    action, researcher = play(attacker('''
        while True:
            os.fork()
    '''), pool)
    assert isinstance(action, ProgramError) and action.code == "program_processes", action
    assert "Resource temporarily unavailable" in str(action) and "os.fork" in events(researcher)
    assert pool.idle == 0 and sandbox_processes() == []   # the whole sandbox is gone, every fork with it
    still_fine(pool)


def test_a_process_that_hides_from_its_episode_does_not_outlive_it(pool):
    code = attacker('''
        others = sorted(int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, os.getpid(), os.getppid()))
        found["others"] = others
        if os.fork() == 0:             # a daemon of its own session, double-forked, that would carry state
            os.setsid()
            if os.fork() == 0:
                while True:
                    open("/app/alive", "w").write(str(time.time()))
                    time.sleep(0.01)
            os._exit(0)
        time.sleep(0.1)
        found["alive"] = os.path.exists("/app/alive")
    ''')
    first, researcher = play(code, pool)
    assert first["found"] == {"others": [], "alive": True}
    researcher.close()
    second, researcher = play(code, pool)     # the same sandbox (reused), a new episode
    assert second["found"]["others"] == [] and pool.started == 1
    researcher.close()


def test_killing_every_process_in_reach_only_ends_its_own_sandbox(pool):
    action, researcher = play(attacker('''
        os.kill(-1, signal.SIGKILL)
        time.sleep(1)
    '''), pool)
    # the zygote dies with the rest, and bubblewrap's init with it: the whole sandbox ends, nothing else
    assert isinstance(action, ProgramError) and action.code == "program_crashed", action
    assert "sandbox ended during act" in str(action)
    still_fine(pool)


# --------------------------------------------------------------------------------------------
# (c) the network


def test_sockets_reach_nothing_of_the_host(pool, tmp_path):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.3)
    port = listener.getsockname()[1]
    unix_path = tmp_path / "host.sock"
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(str(unix_path))
    unix.listen(1)
    try:
        action, researcher = play(attacker('''
            for family, address in ((socket.AF_INET, ("127.0.0.1", params["port"])),
                                    (socket.AF_INET, ("10.0.2.2", 80)), (socket.AF_INET6, ("::1", params["port"])),
                                    (socket.AF_UNIX, params["unix"]), (socket.AF_UNIX, "/var/run/docker.sock")):
                try:
                    with socket.socket(family, socket.SOCK_STREAM) as s:
                        s.settimeout(1)
                        s.connect(address)
                    found[str(address)] = "connected"
                except Exception as exc:
                    found[str(address)] = f"{type(exc).__name__}: {exc}"
            try:
                found["dns"] = str(socket.getaddrinfo("pypi.org", 443))
            except Exception as exc:
                found["dns"] = f"{type(exc).__name__}: {exc}"
            found["interfaces"] = [name for _, name in socket.if_nameindex()]
        '''), pool, {"port": port, "unix": str(unix_path)})
        assert isinstance(action, dict), action
        found = action["found"]
        assert not any(v == "connected" for v in found.values()), found
        assert found["dns"].startswith("gaierror") and found["interfaces"] == ["lo"]
        with pytest.raises(socket.timeout):   # nothing ever knocked
            listener.accept()
        unix.settimeout(0.1)
        with pytest.raises(socket.timeout):
            unix.accept()
        assert {"socket.connect", "socket.getaddrinfo"} <= events(researcher)
        researcher.close()
    finally:
        listener.close()
        unix.close()


# --------------------------------------------------------------------------------------------
# (d) writing outside its directory


def test_writes_outside_its_own_directories_never_reach_the_host(host, pool):
    token = secrets.token_hex(6)
    targets = [f"/work/main/PWNED-{token}", f"/tmp/PWNED-{token}", str(host["run"] / "ledger.db"),
               str(host["home"] / f"PWNED-{token}"), "/program/researcher.py", "/runtime/runtime.py",
               f"/python/PWNED-{token}", f"/etc/PWNED-{token}", f"/PWNED-{token}", f"/usr/PWNED-{token}",
               f"/root/PWNED-{token}"]
    code = attacker('''
        found["before"] = sorted(os.listdir("/tmp")) + sorted(os.listdir("."))
        for path in params["targets"]:
            try:
                with open(path, "a") as f:
                    f.write("pwned")
                found[path] = "written"
            except Exception as exc:
                found[path] = f"{type(exc).__name__}: {exc}"
        for src, dst in (("/program/researcher.py", "/tmp/copy"), ("/program", "/tmp/prog")):
            try:
                os.rename(src, dst)
                found["rename " + src] = "renamed"
            except Exception as exc:
                found["rename " + src] = f"{type(exc).__name__}: {exc}"
        open("left-behind", "w").write("state for the next episode")
    ''')
    action, researcher = play(code, pool, {"targets": targets})
    assert isinstance(action, dict), action
    found = action["found"]
    assert found.pop("before") == []
    written = {p for p, v in found.items() if v in ("written", "renamed")}
    assert written == {f"/tmp/PWNED-{token}"}, found     # its own private /tmp only
    assert not Path(f"/work/main/PWNED-{token}").exists() and not Path(f"/tmp/PWNED-{token}").exists()
    assert not (host["home"] / f"PWNED-{token}").exists() and (host["run"] / "ledger.db").read_text() == MARKER
    assert not any(p.name.startswith("PWNED") for p in Path("/tmp").iterdir())
    assert "open" in events(researcher)
    researcher.close()
    second, researcher = play(code, pool, {"targets": []})   # the same sandbox, the next episode:
    assert second["found"]["before"] == [] and pool.started == 1  # what the last one wrote is gone
    researcher.close()


# --------------------------------------------------------------------------------------------
# (e) hunting for the ledger, the audit log, seeds, the package


def test_hunting_for_ledgers_seeds_and_the_package_finds_nothing(host, pool):
    action, researcher = play(attacker('''
        hits = []
        for root, dirs, files in os.walk("/"):
            if root in ("/proc", "/sys"):
                dirs[:] = []
                continue
            for name in files + dirs:
                low = name.lower()
                if any(w in low for w in ("ledger", "audit", "official", "rsigym", "seed")) or \\
                        low.endswith((".jsonl", ".db", ".sqlite")):
                    hits.append(os.path.join(root, name))
        found["hits"] = hits
        sys.path[:0] = ["/work/main", "/work/main/.venv/lib/python3.12/site-packages", "/python/lib/python3.12/site-packages",
                        "/root/.pyenv/versions/3.12.1/lib/python3.12/site-packages", "/usr/lib/python3/dist-packages"]
        for module in ("rsigym_env", "numpy", "pydantic", "gymnasium"):
            try:
                __import__(module)
                found[module] = "imported"
            except Exception as exc:
                found[module] = f"{type(exc).__name__}: {exc}"
    '''), pool, limits=ProgramLimits(act_wall_s=30, start_wall_s=20, cpu_s=30))
    assert isinstance(action, dict), action
    found = action["found"]
    assert all(found[m].startswith(("ModuleNotFoundError", "ImportError")) for m in ("rsigym_env", "pydantic",
                                                                                       "gymnasium", "numpy")), found
    # what it finds are the standard library's and the system's own files (the read-only system paths the
    # isolation layer shows, /usr and the Python installs), never the host's run data
    strays = [h for h in found["hits"] if not (isolation.shows(h) or h.startswith(("/python/", "/etc/")))]
    assert strays == [], strays
    assert not any("rsigym" in h and "isolation" not in h for h in found["hits"]), found["hits"]
    assert {"os.scandir", "import"} <= events(researcher)
    assert {a["detail"] for a in researcher.attempts if a["event"] == "import"} >= {"rsigym_env", "numpy"}
    researcher.close()


def test_a_program_never_sees_its_own_memory(host, tmp_path):
    """A spec's ``memory/`` (the cover improver's moves.md) never reaches its program's sandbox: not in its
    files, its params, its environment or anywhere it can walk, even with the spec stored in the home and
    written out beside it. So two specs that differ only in memory play the same episodes, which
    ``measure.behaviour_key`` (the episode cache, the successor) relies on."""
    from rsigym_env.agents import AgentRegistry, build_researcher

    code = attacker('''
        mark = "memory-" + "marker-"          # (so that this source itself does not contain it)
        hits, names = [], []
        for root, dirs, files in os.walk("/"):
            if root in ("/proc", "/sys", "/dev"):
                dirs[:] = []
                continue
            system = root.startswith(("/usr", "/lib", "/bin", "/sbin", "/python", "/root/.pyenv", "/etc"))
            for name in files:
                path = os.path.join(root, name)
                if name == "moves.md" or "memory" in root.split("/"):
                    names.append(path)
                if system:
                    continue
                try:
                    with open(path, "rb") as f:
                        if mark.encode() in f.read(1 << 20):
                            hits.append(path)
                except Exception:
                    pass
        found["hits"], found["names"] = hits, names
        found["program"] = sorted(os.listdir("/program"))
        found["seen"] = mark in repr([params, dict(os.environ), sys.argv, sys.path])
    ''')
    specs = [AgentSpec(kind="program", name="forgetful", code=code, memory={"moves": f"memory-marker-{tag}"})
             for tag in (secrets.token_hex(6), secrets.token_hex(6))]
    for spec in specs:
        AgentRegistry(host["home"] / "agents").register(spec)
        for path, text in spec.to_files().items():
            (tmp_path / spec.id / path).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / spec.id / path).write_text(text)
        assert (tmp_path / spec.id / "memory" / "moves.md").read_text().startswith("memory-marker-")
    seen = []
    for spec in specs:
        researcher = build_researcher(spec)         # as every episode of a spec builds it, with its limits
        assert isinstance(researcher.inner, ProgramResearcher) and list(researcher.inner.code) == ["researcher.py"]
        researcher.reset({"budget_left_usd": [500.0]}, {"tools": ["submit"]}, seed=0)
        action = researcher.act({"budget_left_usd": [500.0]}, {})
        researcher.close()
        assert isinstance(action, dict), action
        found = action["found"]
        assert found["hits"] == [] and found["names"] == [] and not found["seen"], found
        assert found["program"] == ["researcher.py"]
        seen.append(found)
    assert specs[0].id != specs[1].id and seen[0] == seen[1]   # different specs, the same view


# --------------------------------------------------------------------------------------------
# (f) time, memory, CPU, output


def test_a_program_that_never_answers_is_killed_at_its_wall_limit(pool):
    started = time.monotonic()
    action, researcher = play(attacker('''
        while True:
            pass
    '''), pool)
    took = time.monotonic() - started
    assert isinstance(action, ProgramError) and action.code == "program_timeout", action
    assert "2 s per act" in str(action) and took < 2 + 5
    assert sandbox_processes() == []   # killed, not left spinning
    still_fine(pool)
    # the same program again is refused at once: a hanging candidate costs one timeout, not one per episode
    started = time.monotonic()
    again, _ = play(attacker('''
        while True:
            pass
    '''), pool)
    assert isinstance(again, ProgramError) and again.code == "program_timeout" and "refused" in str(again)
    assert time.monotonic() - started < 1.0


def test_the_episode_wall_limit_adds_up_over_the_acts(pool):
    limits = ProgramLimits(act_wall_s=2, episode_wall_s=1.5, start_wall_s=20)
    researcher = ProgramResearcher(attacker("time.sleep(0.6)"), limits=limits, pool=pool)
    researcher.reset({}, {})
    researcher.act({}, {})
    researcher.act({}, {})
    with pytest.raises(ProgramError, match="1.5 s per episode") as caught:
        researcher.act({}, {})
    assert caught.value.code == "program_timeout"


def test_ten_gigabytes_are_refused(pool):
    action, researcher = play(attacker('x = bytearray(10 << 30); found["got"] = len(x)'), pool)
    assert isinstance(action, ProgramError) and action.code == "program_memory", action
    assert "MemoryError" in str(action)
    still_fine(pool)


def test_processes_together_cannot_pass_the_sandboxs_memory(pool):
    # each of 3 children touches 250 MB: each one is within its own 512 MB, not all of them in the sandbox's 512 MB
    action, researcher = play(attacker('''
        children = []
        for _ in range(3):
            pid = os.fork()
            if pid == 0:
                b = bytearray(250 << 20)
                for i in range(0, len(b), 4096):
                    b[i] = 1
                time.sleep(2)
                os._exit(0)
            children.append(pid)
        found["status"] = [os.waitpid(pid, 0)[1] for pid in children]
    '''), pool, limits=ProgramLimits(act_wall_s=20, start_wall_s=20, memory_mb=512))
    if isinstance(action, ProgramError):   # the kernel may pick the episode's own process
        assert action.code in ("program_memory", "program_crashed"), action
    else:
        statuses = action["found"]["status"]
        assert any(os.WIFSIGNALED(s) and os.WTERMSIG(s) == 9 for s in statuses), statuses
    researcher.close()
    still_fine(pool)


def test_spinning_the_cpu_ends_at_its_cpu_limit(pool):
    started = time.monotonic()
    action, researcher = play(attacker('''
        import threading
        def spin():
            while True:
                pass
        for _ in range(2):
            threading.Thread(target=spin, daemon=True).start()
        while True:
            pass
    '''), pool, limits=ProgramLimits(act_wall_s=30, start_wall_s=20, cpu_s=1))
    assert isinstance(action, ProgramError) and action.code == "program_cpu", action
    assert time.monotonic() - started < 20 and sandbox_processes() == []
    still_fine(pool)


def test_an_oversized_or_forged_reply_is_a_protocol_error(pool):
    action, researcher = play(attacker('found["blob"] = "x" * (3 << 20)'), pool)
    assert isinstance(action, ProgramError) and action.code == "program_protocol", action
    assert "longer than" in str(action)
    action, researcher = play(attacker('''
        for fd in map(int, os.listdir("/proc/self/fd")):
            try:
                os.write(fd, b"not json at all\\n")
            except OSError:
                pass
    '''), pool)
    assert isinstance(action, ProgramError) and action.code == "program_protocol", action
    still_fine(pool)


def test_a_flood_of_output_neither_blocks_nor_fills_the_host(pool):
    action, researcher = play(attacker('''
        chunk = "y" * 65536
        for _ in range(300):     # ~20 MB on stdout and stderr
            print(chunk)
            sys.stderr.write(chunk)
        found["done"] = True
    '''), pool, limits=ProgramLimits(act_wall_s=30, start_wall_s=20))
    assert isinstance(action, dict) and action["found"] == {"done": True}
    researcher.close()


# --------------------------------------------------------------------------------------------
# Through the sweep: a failed record, balanced books, the next episode fine


def program_spec(code: dict[str, str], seed: int = 0) -> EpisodeSpec:
    agent = AgentSpec(kind="program", name="hostile", code=code)
    return EpisodeSpec("hostile", "aime", seed, budget_usd=200, agent_spec=agent.model_dump_json())


ATTACKS_AFTER_EVALUATE = {
    "raises": ('raise RuntimeError("hostile")', "program_raised"),
    "loops": ("while True:\n    pass", "program_timeout"),
    "dies": ("os._exit(9)", "program_crashed"),
    "hogs": ("x = bytearray(10 << 30)", "program_memory"),
    "forks": ("while True:\n    os.fork()", "program_processes"),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS_AFTER_EVALUATE))
def test_a_hostile_program_in_a_sweep_is_a_failed_record_and_the_books_balance(attack, monkeypatch):
    # programs built from specs get the default limits: shorten the wall for this test
    monkeypatch.setitem(ProgramResearcher.__init__.__kwdefaults__, "limits", SHORT)
    body, code = ATTACKS_AFTER_EVALUATE[attack]
    spec = program_spec(attacker(body, first_act='{"tool": "evaluate", "args": {"k": 2}}'))
    platform = Platform()
    key = platform.issue_key(episode_scenario(spec))
    record = run_spec(spec, platform=platform, key=key)
    assert not record.ok and record.error.startswith(f"ProgramError: {code}:"), record.error[:500]
    assert record.steps == 1            # the evaluate went through, then the attack ended the episode
    balance = platform.balance(key)
    assert balance.reserved_usd == 0 and balance.spent_usd + balance.available_usd == pytest.approx(200)
    books = platform.ledger.books()
    assert books.ok, books.problems
    # the same process goes on: an honest program's episode right after
    records = run_local([program_spec(attacker(body), seed=1), program_spec(HONEST, seed=1)])
    assert [r.ok for r in records] == [False, True] and records[1].submitted_by == "agent"
