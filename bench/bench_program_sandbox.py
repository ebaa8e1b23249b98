"""Program researchers: sim episodes per second of one program in-process vs in its sandbox, with and
without the pool of live sandboxes.

    .venv/bin/python bench/bench_program_sandbox.py [--seconds 3] [--program seed|tiny] [--json out.json]

Workloads (the same program, the same sim episodes, interleaved rounds; every figure against the
in-process reference measured in the same run):

* ``in_process``: the program loaded in this process (``load_program``, trusted code: the reference),
  a fresh ``make_researcher(params)`` per episode.
* ``pooled``: a fresh :class:`ProgramResearcher` per episode, as ``run_spec`` builds one, over a warm
  pool: each episode is a fork of the program's live sandbox (no process start).
* ``unpooled``: the same with ``ProgramPool(capacity=0)``: a sandbox (bubblewrap + interpreter + the
  program compiled) started for every episode.
* ``candidate``: what evaluating a candidate costs: a program never seen before (its code differs by a
  comment, so its hash does), then ``--episodes`` episodes of it through the pool: one sandbox start
  plus the forks.

Also: a sandbox's start (median), a ``reset`` of a trivial program (the fork of an episode process and
``end``), and the round trip of one ``act`` with a real observation and info (JSON both ways, pipes,
the runtime), against calling ``act`` in-process. Processes started are counted per workload
(``sandboxes_started``). The seed program (``rsigym_env/programs/seed``) is used when present, else a
tiny evaluate-wait-submit program. The load average before and after is reported: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym

import rsigym_env  # noqa: F401  (registers the envs)
from rsigym_env.episode import run_episode
from rsigym_env.programs import ProgramLimits, ProgramResearcher, load_program
from rsigym_env.programs.sandbox import ProgramPool, sandboxes_started

SEED_DIR = Path(rsigym_env.__file__).parent / "programs" / "seed"
TINY = {"researcher.py": '''
class Tiny:
    name = "tiny"

    def reset(self, observation, info, seed):
        self.plan = iter([{"tool": "evaluate", "args": {"k": 1}}, {"tool": "wait", "args": {}}])

    def act(self, observation, info):
        return next(self.plan, {"tool": "submit", "args": {}})


def make_researcher(params):
    return Tiny()
'''}
ECHO = {"researcher.py": '''
class Echo:
    def reset(self, observation, info, seed):
        pass

    def act(self, observation, info):
        return {"tool": "read", "args": {"ref": "budget"}}


def make_researcher(params):
    return Echo()
'''}
LIMITS = ProgramLimits()


def program(which: str) -> tuple[str, dict[str, str]]:
    if which == "seed" and (SEED_DIR / "researcher.py").exists():
        return "seed", {p.name: p.read_text(encoding="utf-8") for p in sorted(SEED_DIR.glob("*.py"))}
    return "tiny", dict(TINY)


def _episodes(env: gym.Env, make: Any, seconds: float, seeds: Any) -> tuple[int, int, float, list[float]]:
    """(episodes, steps, seconds, rewards) of back-to-back episodes for ``seconds``."""
    n = steps = 0
    rewards = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds or n == 0:
        researcher = make()
        result = run_episode(env, researcher, seed=next(seeds))
        close = getattr(researcher, "close", None)
        if close is not None:
            close()
        n, steps = n + 1, steps + result.steps
        rewards.append(result.reward)
    return n, steps, time.perf_counter() - start, rewards


def equal_results(code: dict[str, str], env: gym.Env, pool: ProgramPool, seeds: int = 5) -> bool:
    """The same episodes in-process and sandboxed end with the same reward and the same number of steps."""
    module = load_program(code)
    for seed in range(seeds):
        a = run_episode(env, module.make_researcher({}), seed=seed)
        r = ProgramResearcher(code, limits=LIMITS, pool=pool)
        b = run_episode(env, r, seed=seed)
        r.close()
        if (a.reward, a.steps, a.info.get("official_score")) != (b.reward, b.steps, b.info.get("official_score")):
            return False
    return True


def micro(env: gym.Env, n_starts: int = 7, n_acts: int = 300) -> dict[str, float]:
    """A sandbox's start, the reset (fork) of an episode, the round trip of an act."""
    starts = []
    for _ in range(n_starts):
        pool = ProgramPool(capacity=0)
        started = time.perf_counter()
        sandbox = pool.acquire("bench-start", ECHO, LIMITS)
        starts.append(time.perf_counter() - started)
        sandbox.close()
    obs, info = env.reset(seed=0)
    pool = ProgramPool()
    researcher = ProgramResearcher(ECHO, limits=LIMITS, pool=pool)
    researcher.reset(obs, info, seed=0)  # the sandbox is started here
    resets = []
    for _ in range(30):
        started = time.perf_counter()
        researcher.reset(obs, info, seed=0)  # end of the last episode + fork of a new one
        resets.append(time.perf_counter() - started)
    _, _, _, _, info = env.step({"tool": "evaluate", "args": {"k": 1}})
    obs, _, _, _, info = env.step({"tool": "wait", "args": {}})  # an info with a finished job's event
    acts = []
    for _ in range(n_acts):
        started = time.perf_counter()
        researcher.act(obs, info)
        acts.append(time.perf_counter() - started)
    researcher.close()
    pool.close()
    local = load_program(ECHO).make_researcher({})
    started = time.perf_counter()
    for _ in range(n_acts):
        local.act(obs, info)
    local_act = (time.perf_counter() - started) / n_acts
    return {"start_ms": 1e3 * statistics.median(starts), "start_max_ms": 1e3 * max(starts),
            "reset_ms": 1e3 * statistics.median(resets), "act_us": 1e6 * statistics.median(acts),
            "act_p90_us": 1e6 * sorted(acts)[int(0.9 * len(acts))], "in_process_act_us": 1e6 * local_act,
            "message_bytes": len(json.dumps({"op": "act", "observation": obs, "info": info}, default=str))}


def measure(seconds: float = 3.0, which: str = "seed", episodes_per_candidate: int = 10, rounds: int = 6) -> dict[str, Any]:
    load_before = os.getloadavg()
    name, code = program(which)
    env = gym.make("RSIGym/Joint-v0", benchmark="aime", budget_usd=500)
    pool = ProgramPool()
    equal = equal_results(code, env, pool)
    module = load_program(code)
    unpooled = ProgramPool(capacity=0)
    fresh_pool = ProgramPool()  # the candidates' own: their sandboxes do not push the pooled one out
    makers = {
        "in_process": lambda: module.make_researcher({}),
        "pooled": lambda: ProgramResearcher(code, limits=LIMITS, pool=pool),
        "unpooled": lambda: ProgramResearcher(code, limits=LIMITS, pool=unpooled),
    }
    totals = {k: [0, 0, 0.0, 0] for k in (*makers, "candidate")}   # episodes, steps, seconds, processes
    seeds = iter(range(10**9))
    slice_s = seconds / rounds
    candidates = 0
    for i in range(rounds):
        order = list(makers) + ["candidate"]
        for kind in order if i % 2 == 0 else order[::-1]:
            before = sandboxes_started()
            if kind == "candidate":
                start = time.perf_counter()
                n = steps = 0
                while time.perf_counter() - start < slice_s or n == 0:
                    candidates += 1
                    fresh = {**code, "researcher.py": code["researcher.py"] + f"\n# candidate {candidates}\n"}
                    for _ in range(episodes_per_candidate):
                        r = ProgramResearcher(fresh, limits=LIMITS, pool=fresh_pool)
                        steps += run_episode(env, r, seed=next(seeds)).steps
                        r.close()
                        n += 1
                took = time.perf_counter() - start
            else:
                n, steps, took, _ = _episodes(env, makers[kind], slice_s, seeds)
            t = totals[kind]
            t[0], t[1], t[2], t[3] = t[0] + n, t[1] + steps, t[2] + took, t[3] + sandboxes_started() - before
    pool.close()
    fresh_pool.close()
    out: dict[str, Any] = {"program": name, "files": len(code), "code_bytes": sum(len(v) for v in code.values()),
                           "equal_results": equal, "episodes_per_candidate": episodes_per_candidate, "rounds": rounds}
    for kind, (n, steps, took, procs) in totals.items():
        out[kind] = {"episodes": n, "episodes_per_s": n / took, "ms_per_episode": 1e3 * took / n,
                     "steps_per_episode": steps / n, "processes": procs,
                     "ms_per_candidate": 1e3 * took / n * episodes_per_candidate}
    ref = out["in_process"]["episodes_per_s"]
    for kind in totals:
        out[kind]["vs_in_process"] = out[kind]["episodes_per_s"] / ref
    out["micro"] = micro(env)
    env.close()
    out["loadavg_before"], out["loadavg_after"], out["cpus"] = load_before, os.getloadavg(), os.cpu_count()
    return out


def table(r: dict[str, Any]) -> list[str]:
    """The figures as Markdown."""
    m = r["micro"]
    rows = [("in_process", "in-process (`load_program`, reference)"),
            ("pooled", "sandboxed, pooled (a fork of a live sandbox per episode)"),
            ("unpooled", "sandboxed, no pool (a sandbox started per episode)"),
            ("candidate", f"sandboxed, a new program per {r['episodes_per_candidate']} episodes (pooled)")]
    lines = [
        f"Program researchers (`bench_program_sandbox.py`): the {r['program']} program ({r['files']} files, "
        f"{r['code_bytes']:,} bytes), sim aime episodes; load {r['loadavg_before'][0]:.2f} → "
        f"{r['loadavg_after'][0]:.2f} on {r['cpus']} cores; same results in-process and sandboxed: "
        f"{'yes' if r['equal_results'] else 'NO'}.",
        "",
        f"| path | episodes/s | ms/episode | ms per candidate ({r['episodes_per_candidate']} episodes) | "
        "processes started | vs in-process |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for kind, label in rows:
        w = r[kind]
        lines.append(f"| {label} | {w['episodes_per_s']:,.1f} | {w['ms_per_episode']:.2f} | {w['ms_per_candidate']:.1f} | "
                     f"{w['processes']} of {w['episodes']} episodes | {w['vs_in_process']:.2f} |")
    lines += ["", f"A sandbox starts in {m['start_ms']:.1f} ms (median of 7, max {m['start_max_ms']:.1f}); an episode's "
              f"reset (the end of the last one + a fork) takes {m['reset_ms']:.2f} ms; an act's round trip "
              f"{m['act_us']:.0f} µs (p90 {m['act_p90_us']:.0f}; a {m['message_bytes']:,}-byte message) against "
              f"{m['in_process_act_us']:.2f} µs in-process; {r['in_process']['steps_per_episode']:.1f} acts per episode."]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per workload, spread over the rounds")
    parser.add_argument("--program", choices=["seed", "tiny"], default="seed")
    parser.add_argument("--episodes", type=int, default=10, help="episodes per candidate")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    r = measure(args.seconds, args.program, args.episodes)
    print("\n".join(table(r)))
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=2))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
