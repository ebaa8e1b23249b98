"""Two checkouts' ``MenuArrayEnv`` stepped side by side, in alternating chunks: an A/B of the CPU a step that the
machine's swings do not decide (bench/README.md, "The vector sim, round 7").

Each checkout runs in a process of its own (``PYTHONPATH`` = the checkout), builds the same env (swe-bench-verified
$500, ``make_vec(..., menu=True)``), resets it with seed 0 and takes 20 masked-uniform steps; then the two are
stepped ``--steps`` steps at a time, in turn (the order flips every chunk), each timing its own ``step`` calls in
CPU seconds (``process_time``). Both draw the same actions and (when the checkouts give the same results) step
the same episodes: a digest of every observation, reward and end is compared at the end. Printed per track and N:
each side's mean CPU a step over the chunks, the ratio A / B of the means and the median of the chunks' ratios;
with several N, ``t(N) = a + b N`` fitted to each side's means.

    python bench/bench_menu_pair.py --a /work/main --b . [--tracks harness,joint,data] [--sizes 256]
        [--chunks 24] [--steps 30] [--ledger episode|step|false]

(``--steps 0``: 7,680 // N steps a chunk, at least 5.) Run it alone on the machine (``flock``): the chunks
alternate, so a slow phase of the machine falls on both sides, but a process stepping beside them does not.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

IDS = {"joint": "RSIGym/Joint-v0", "data": "RSIGym/Data-v0", "harness": "RSIGym/Harness-v0"}
LEDGER = {"episode": True, "step": "step", "false": False}


def worker(track: str, n: int, ledger: str) -> None:
    """One side: build the env, then for each line ``k`` on stdin take k steps and print their CPU and the digest."""
    import rsigym_env  # noqa: F401  (registers the ids; pins NumPy's code)
    import gymnasium as gym
    import numpy as np

    env = gym.make_vec(IDS[track], num_envs=n, vectorization_mode="vector_entry_point", menu=True,
                       benchmark="swe-bench-verified", budget_usd=500, write_episodes=LEDGER[ledger])
    rng, digest = np.random.default_rng(0), hashlib.sha256()
    obs, info = env.reset(seed=0)

    def act(info: dict) -> np.ndarray:
        mask = info["action_mask"]
        return np.argmax(np.where(mask, rng.random(mask.shape), -1.0), axis=1)

    for _ in range(20):
        obs, _, _, _, info = env.step(act(info))
    print("ready", flush=True)
    for line in sys.stdin:
        cpu = 0.0
        for _ in range(int(line)):
            actions = act(info)
            start = time.process_time()
            obs, reward, terminated, truncated, info = env.step(actions)
            cpu += time.process_time() - start
            for value in (obs, reward, terminated, truncated):
                digest.update(np.ascontiguousarray(value).tobytes())
        print(f"{cpu} {digest.hexdigest()[:16]}", flush=True)


def pair(trees: dict[str, str], track: str, n: int, ledger: str, chunks: int, steps: int) -> dict[str, float]:
    """Mean CPU a step of each side over ``chunks`` alternating chunks of ``steps`` steps; prints the line."""
    procs = {name: subprocess.Popen([sys.executable, __file__, "--worker", track, str(n), ledger],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                    env={**os.environ, "PYTHONPATH": str(Path(tree).resolve())})
             for name, tree in trees.items()}
    for proc in procs.values():
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError("a side did not start (see its error above)")
    cpu: dict[str, list[float]] = {name: [] for name in procs}
    digest = {}
    for i in range(chunks):
        for name in (("a", "b") if i % 2 == 0 else ("b", "a")):
            procs[name].stdin.write(f"{steps}\n")
            procs[name].stdin.flush()
            spent, digest[name] = procs[name].stdout.readline().split()
            cpu[name].append(float(spent) / steps)
    for proc in procs.values():
        proc.stdin.close()
        proc.wait()
    a, b = cpu["a"], cpu["b"]
    print(f"{track:7s} N={n:5d} ledger={ledger:7s}: A {sum(a) / chunks * 1e3:8.3f} ms, B {sum(b) / chunks * 1e3:8.3f} ms "
          f"CPU a step ({chunks} chunks of {steps} steps); A/B {sum(a) / sum(b):.3f} (median of the chunks' ratios "
          f"{statistics.median(x / y for x, y in zip(a, b)):.3f}); same digest {digest['a'] == digest['b']}; "
          f"load {os.getloadavg()[0]:.2f}", flush=True)
    return {"a": sum(a) / chunks, "b": sum(b) / chunks}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--a", required=True, help="checkout A (e.g. the main branch's)")
    parser.add_argument("--b", required=True, help="checkout B")
    parser.add_argument("--tracks", default="harness,joint,data")
    parser.add_argument("--sizes", default="256")
    parser.add_argument("--chunks", type=int, default=24)
    parser.add_argument("--steps", type=int, default=30, help="steps a chunk (0: 7,680 // N, at least 5)")
    parser.add_argument("--ledger", choices=sorted(LEDGER), default="episode")
    args = parser.parse_args()
    sizes = [int(n) for n in args.sizes.split(",")]
    print(f"A = {args.a}, B = {args.b}; load before {os.getloadavg()}", flush=True)
    for track in args.tracks.split(","):
        means = [pair({"a": args.a, "b": args.b}, track, n, args.ledger, args.chunks,
                      args.steps or max(5, 7680 // n)) for n in sizes]
        if len(sizes) > 1:
            import numpy as np

            for side in ("a", "b"):
                b, a = np.polyfit(sizes, [m[side] for m in means], 1)
                print(f"{track:7s} {side.upper()}: t(N) = a + b N, a = {a * 1e3:.3f} ms, b = {b * 1e6:.3f} us a row-step",
                      flush=True)
    print(f"load after {os.getloadavg()}")


if __name__ == "__main__":
    main()
