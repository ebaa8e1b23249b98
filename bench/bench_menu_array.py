"""The vector sim of the menu interface (``gym.make_vec(id, num_envs=N, vectorization_mode="vector_entry_point",
menu=True)``: ``MenuArrayEnv``) against the per-env route and one CartPole-v1, in the same run (issue 27 item 1).

A step is one menu entry per env (one or more tool calls); the aggregate rate is N x vector steps per second.
Policies: ``masked`` (a seeded uniform draw over each env's unmasked entries: data macros are most of them)
and ``policy`` (the shipped RL policy, greedy: one batched forward pass per step, its time included; the
scripted-like mix: evaluate, fix, probe the teachers, buy data, clean, train, evaluate, submit); each row
also gives the rate in the env's own time (``reset`` and ``step``, without the policy's). Rows: every track
(joint: every macro; data; harness: evaluate, fix, wait and submit) at each N, with the default ledger (an
account and an audited entry per finished episode); at the largest N the joint and harness tracks again with
``write_episodes="step"`` (one ledger entry per step) and ``False`` (none), to show what the default costs;
``route``: the joint id with ``array=False`` (``ResearchVectorEnv`` over ``DiscreteMenu`` sub-envs).
CartPole-v1 (``gym.make``, sampled) runs at the start, the end, and for 1 s right before each row (the
``[x]`` ratio; also per CPU-second of this process: "env CPU" is the env's steps per CPU-second of its own
``reset``/``step`` against that, the ratio that moves least when other jobs load the machine). The policy's forward pass runs on one BLAS thread (OpenBLAS's second thread spins between
calls: on 2 shared cores that made the 256 x 50 forward pass take ~19 ms instead of ~1.4 ms).

    python bench/bench_menu_array.py [--seconds 3] [--sizes 1,16,256] [--route-sizes 16] [--tracks joint,data,harness]

``--fit 64,256,1024,4096`` measures instead the env's CPU time a step at each N (masked uniform, ``--fit-steps``
steps after 20, ``step`` alone; a checksum of every observation, reward and end to compare two checkouts) and
fits ``t(N) = a + b N`` per track by least squares: ``a`` the fixed cost of a step, ``b`` the cost of a row.

``--workers 2`` measures instead the rows on worker processes (``num_workers``, ``MenuWorkersEnv``): at each N
of ``--worker-sizes`` (default 256,1024), every track and both policies, the one-process env (W = 1) and W
workers, each by WALL clock (aggregate steps/s, with the policy's time; and the env's own), against CartPole-v1's
wall-clock steps/s measured for 1 s right before the row; "main CPU" is the main process's CPU a step (the
policy's, the transport's and the ledger's: the workers' CPU is theirs); "start" the workers' start-up.
``--overhead`` times the transport alone: the one-process env against one worker (``MenuWorkersEnv``,
``num_workers=1``: the same work, plus the pipe, the shared buffer and the info built again) at N = 256, joint
track, masked, interleaved, wall and main-process CPU a step.

    python bench/bench_menu_array.py --workers 2 [--worker-sizes 256,1024] [--seconds 3]
    python bench/bench_menu_array.py --overhead [--seconds 3]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from pathlib import Path

import rsigym_env  # noqa: F401  (first: it pins NumPy's code; registers the ids)

import gymnasium as gym
import numpy as np
from threadpoolctl import threadpool_limits

from rsigym_env.baselines.rl_researcher import default_policy_path, policy_actions, shared_policy

sys.path.insert(0, str(Path(__file__).parent))
from bench_env import cartpole  # noqa: E402  (the same reference as bench_env.py)

KWARGS = {"benchmark": "swe-bench-verified", "budget_usd": 500}
IDS = {"joint": "RSIGym/Joint-v0", "data": "RSIGym/Data-v0", "harness": "RSIGym/Harness-v0"}


def cartpole_cpu(seconds: float) -> tuple[float, float]:
    """CartPole-v1 (``gym.make``, sampled actions, as ``bench_env.cartpole``) for ``seconds``: (steps/s,
    steps per CPU-second of this process). On a machine other jobs load, the CPU rate moves less."""
    env = gym.make("CartPole-v1")
    env.reset(seed=0)
    env.action_space.seed(0)
    steps, start, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        for _ in range(1000):
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            if terminated or truncated:
                env.reset()
        steps += 1000
    return steps / (time.perf_counter() - start), steps / (time.process_time() - cpu)


def measure(env, n: int, seconds: float, policy: str) -> tuple[float, float, float, int, float, float]:
    """(aggregate steps/s by the wall clock with the policy's time, the same in the env's time alone (reset and
    steps), mean steps of the episodes that ended, episodes ended, aggregate steps per CPU-second of the env
    alone, this process's CPU a step in ms, the policy's included: with workers, the main process's share)."""
    params = shared_policy(default_policy_path())
    rng = np.random.default_rng(0)
    start, cpu_start = time.perf_counter(), time.process_time()
    obs, info = env.reset(seed=0)
    in_env, in_env_cpu = time.perf_counter() - start, time.process_time() - cpu_start
    steps, lengths, running = 0, [], np.zeros(n, np.int64)
    while time.perf_counter() - start < seconds:
        mask = info["action_mask"]
        if policy == "masked":
            actions = np.argmax(np.where(mask, rng.random(mask.shape), -1.0), axis=1)
        else:
            actions, _ = policy_actions(params, np.asarray(obs, np.float64), mask, None)
        t, c = time.perf_counter(), time.process_time()
        obs, _, terminated, truncated, info = env.step(actions)
        in_env += time.perf_counter() - t
        in_env_cpu += time.process_time() - c
        steps += n
        running += 1
        ended = terminated | truncated
        lengths += running[ended].tolist()
        running[ended] = -1  # the next step is the autoreset (NEXT_STEP): not an episode step
    wall, main_cpu = time.perf_counter() - start, time.process_time() - cpu_start
    mean = float(np.mean(lengths)) if lengths else float("nan")
    return steps / wall, steps / in_env, mean, len(lengths), steps / in_env_cpu, main_cpu / (steps / n) * 1e3


def fit(tracks: list[str], sizes: list[int], steps: int) -> None:
    """CPU a step of ``step`` at each N per track (masked uniform, ``steps`` steps after 20), and the line through them."""
    for track in tracks:
        points = []
        for n in sizes:
            env = gym.make_vec(IDS[track], num_envs=n, vectorization_mode="vector_entry_point", menu=True, **KWARGS)
            rng = np.random.default_rng(0)
            obs, info = env.reset(seed=0)
            digest, cpu, ended = hashlib.sha256(), 0.0, 0
            for i in range(20 + steps):
                mask = info["action_mask"]
                actions = np.argmax(np.where(mask, rng.random(mask.shape), -1.0), axis=1)
                start = time.process_time()
                obs, reward, terminated, truncated, info = env.step(actions)
                if i >= 20:
                    cpu += time.process_time() - start
                    ended += int((terminated | truncated).sum())
                for value in (obs, reward, terminated, truncated):
                    digest.update(np.ascontiguousarray(value).tobytes())
            env.close()
            points.append((n, cpu / steps))
            print(f"fit {track:7s} N={n:5d}: {cpu / steps * 1e3:8.3f} ms CPU a step, {cpu / steps / n * 1e6:6.2f} us a row; "
                  f"{ended / (n * steps):.4f} episodes a row-step; checksum {digest.hexdigest()[:16]}; load "
                  f"{os.getloadavg()[0]:.2f}", flush=True)
        b, a = np.polyfit([float(p[0]) for p in points], [p[1] for p in points], 1)
        print(f"fit {track:7s}: t(N) = a + b N, a = {a * 1e3:.3f} ms, b = {b * 1e6:.3f} us a row-step", flush=True)


def make(track: str, n: int, workers: int, **extra):
    """The env of a row: ``make_vec(..., menu=True, num_workers=workers)`` (W = 1: ``MenuArrayEnv``)."""
    env = gym.make_vec(IDS[track], num_envs=n, vectorization_mode="vector_entry_point", menu=True,
                       num_workers=workers, **extra, **KWARGS)
    assert type(env.unwrapped).__name__ == ("MenuArrayEnv" if workers == 1 else "MenuWorkersEnv")
    return env


def workers(count: int, sizes: list[int], tracks: list[str], seconds: float) -> None:
    """W = 1 and W = ``count`` side by side at each N, track and policy (module docstring)."""
    print(f"load before {os.getloadavg()}; {os.cpu_count()} cores", flush=True)
    for policy in ("masked", "policy"):
        for track in tracks:
            for n in sizes:
                for w in (1, count):
                    near = cartpole(1.0)
                    start = time.perf_counter()
                    env = make(track, n, w)
                    started = time.perf_counter() - start
                    with threadpool_limits(limits=1, user_api="blas"):
                        rate, env_rate, per_episode, episodes, _, main_cpu = measure(env, n, seconds, policy)
                    env.close()
                    print(f"{policy:6s} {track:7s} N={n:5d} W={w}: {rate:9,.0f} steps/s ({rate / near:6.3f}x "
                          f"CartPole's {near:,.0f}/s just before); env alone {env_rate:9,.0f} ({env_rate / near:6.3f}x); "
                          f"main CPU {main_cpu:6.2f} ms a step; start {started:5.2f} s; {per_episode:5.1f} "
                          f"steps/episode over {episodes} episodes; load {os.getloadavg()[0]:.2f}", flush=True)
    print(f"load after {os.getloadavg()}", flush=True)


def overhead(seconds: float, n: int = 256, rounds: int = 3) -> None:
    """The transport's cost a step: the one-process env against one worker, interleaved (module docstring)."""
    from rsigym_env.menu_vector import MenuArrayEnv
    from rsigym_env.menu_workers import MenuWorkersEnv

    print(f"load before {os.getloadavg()}", flush=True)
    kw = dict(track="joint", **KWARGS)
    for r in range(rounds):
        for name in ("in-process", "1 worker"):
            env = MenuArrayEnv(n, **kw) if name == "in-process" else MenuWorkersEnv(n, num_workers=1, **kw)
            rng = np.random.default_rng(0)
            obs, info = env.reset(seed=0)
            for _ in range(20):
                obs, _, _, _, info = env.step(np.argmax(np.where(info["action_mask"], rng.random((n, len(info["action_mask"][0]))), -1.0), axis=1))
            steps, wall, cpu = 0, 0.0, 0.0
            while wall < seconds:
                actions = np.argmax(np.where(info["action_mask"], rng.random(info["action_mask"].shape), -1.0), axis=1)
                t, c = time.perf_counter(), time.process_time()
                obs, _, _, _, info = env.step(actions)
                wall += time.perf_counter() - t
                cpu += time.process_time() - c
                steps += 1
            env.close()
            print(f"round {r} {name:10s} N={n}: {wall / steps * 1e3:6.3f} ms wall a step, {cpu / steps * 1e3:6.3f} ms "
                  f"CPU of the main process a step ({steps} steps); load {os.getloadavg()[0]:.2f}", flush=True)
    print(f"load after {os.getloadavg()}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--sizes", default="1,16,256")
    parser.add_argument("--route-sizes", default="16")
    parser.add_argument("--tracks", default="joint,data,harness")
    parser.add_argument("--fit", default="", help="sizes to fit t(N) = a + b N at instead of the rates (e.g. 64,256,1024,4096)")
    parser.add_argument("--fit-steps", type=int, default=200)
    parser.add_argument("--workers", type=int, default=0, help="rows on this many worker processes against W = 1")
    parser.add_argument("--worker-sizes", default="256,1024")
    parser.add_argument("--overhead", action="store_true", help="the transport's cost a step (one worker vs none)")
    args = parser.parse_args()
    if args.overhead:
        overhead(args.seconds)
        return
    if args.workers:
        workers(args.workers, [int(n) for n in args.worker_sizes.split(",")], args.tracks.split(","), args.seconds)
        return
    if args.fit:
        fit(args.tracks.split(","), [int(n) for n in args.fit.split(",")], args.fit_steps)
        return
    sizes = [int(n) for n in args.sizes.split(",")]
    print(f"load before {os.getloadavg()}")
    ref = cartpole(args.seconds)
    print(f"cartpole-v1 (gym.make, sampled): {ref:,.0f} steps/s", flush=True)
    tracks = args.tracks.split(",")
    rows = ([("array", track, n, "episode") for track in tracks for n in sizes]
            + [("array", track, sizes[-1], mode) for track in ("joint", "harness") if track in tracks
               for mode in ("step", False)]
            + [("route", "joint", int(n), "episode") for n in args.route_sizes.split(",") if n])
    for policy in ("masked", "policy"):
        for kind, track, n, ledger in rows:
            near, near_cpu = cartpole_cpu(1.0)
            extra = {"write_episodes": ledger} if kind == "array" else {}
            env = gym.make_vec(IDS[track], num_envs=n, vectorization_mode="vector_entry_point", menu=True,
                               array=kind == "array", **extra, **KWARGS)
            assert type(env.unwrapped).__name__ == ("MenuArrayEnv" if kind == "array" else "ResearchVectorEnv")
            with threadpool_limits(limits=1, user_api="blas"):
                rate, env_rate, per_episode, episodes, env_cpu, _ = measure(env, n, args.seconds, policy)
            env.close()
            print(f"{policy:6s} {kind:5s} {track:7s} N={n:4d} ledger={str(ledger):7s}: {rate:9,.0f} steps/s "
                  f"({rate / ref:6.3f}x cartpole [{rate / near:6.3f}x]); env alone {env_rate:9,.0f} "
                  f"({env_rate / ref:6.3f}x [{env_rate / near:6.3f}x]); env CPU {env_cpu:9,.0f} steps/CPU-s "
                  f"({env_cpu / near_cpu:6.3f}x CartPole's {near_cpu:,.0f}); {per_episode:5.1f} steps/episode over "
                  f"{episodes} episodes, load {os.getloadavg()[0]:.2f}", flush=True)
    print(f"cartpole-v1 again: {cartpole(args.seconds):,.0f} steps/s; load after {os.getloadavg()}")


if __name__ == "__main__":
    main()
