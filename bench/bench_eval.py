"""Evaluation trials per second through Harbor's ``Job`` (the local world's ``LocalEvalService``),
against the same trial commands run directly through ``run_isolated_async`` in the same run.

Workload: tiny tasks ("write N to /app/answer.txt", checked by ``tests/test.sh``) and a trivial
stdlib harness that asks the model once over the unix socket and writes the answer; the model is
an instant rule (no NumPy model), so what is measured is the evaluation machinery.

* ``harbor``: ``LocalEvalService.start(...)`` of n tasks × k attempts, ``concurrency`` trials at a
  time, timed from the call to the resolved future (Harbor's job, trial bookkeeping, the per-eval
  model server, summary). Per-trial phases come from Harbor's own ``TrialResult`` timings:
  environment start (copy ``environment/`` to the trial's ``/app``), agent (upload the instruction,
  the harness's sandbox, trajectory → ATIF), verifier (upload tests, ``chmod``, ``test.sh`` sandbox,
  reward), and the rest of the trial (Harbor's bookkeeping: config, lock and result files, hooks,
  artifacts, stop).
* ``direct``: per trial, a fresh sandbox group (its cgroup and tmpfs, as every trial has), copy
  ``environment/`` into it, run the harness command and then ``test.sh`` (tests mounted) with
  ``run_isolated_async``, read the reward; same concurrency, same model server.
* ``sandbox_start``: one ``run_isolated_async("true")`` (bubblewrap start-up, the floor of any command).

Both paths run ``--rounds`` times, interleaved (the machine's speed drifts by ±10% within minutes); the
median round of each is reported, with the CPU each trial cost: the whole machine's (``/proc/stat``:
sandboxes and kernel included) and the evaluating process's own.

    python bench/bench_eval.py [--tasks 10] [--k 3] [--concurrency 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HARBOR_TELEMETRY", "0")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from rsigym_env.prices import DEFAULT_PRICES  # noqa: E402
from rsigym_env.serving.models import ChatChoice, ChatRequest, ModelRegistry, apply_limits  # noqa: E402
from rsigym_env.serving.openai_server import OpenAIServer  # noqa: E402
from rsigym_env.services import EvalRequest  # noqa: E402
from rsigym_env.worlds.local.sandbox import isolation  # noqa: E402
from rsigym_env.worlds.common.evaluation import list_tasks, write_harness
from rsigym_env.worlds.local.harbor.evaluation import LocalEvalService  # noqa: E402

HARNESS = r'''
import http.client, json, os, socket
class Conn(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(os.environ["RSIGYM_MODEL_SOCKET"])
instruction = open(os.environ["RSIGYM_INSTRUCTION_FILE"]).read()
conn = Conn("localhost")
conn.request("POST", "/v1/chat/completions", json.dumps({"model": os.environ["RSIGYM_MODEL"],
    "messages": [{"role": "user", "content": instruction}], "seed": int(os.environ["RSIGYM_SEED"])}))
text = json.loads(conn.getresponse().read())["choices"][0]["message"]["content"]
open("/app/answer.txt", "w").write(text.split("ANSWER:")[-1].strip() + "\n")
json.dump({"end_reason": "answer", "steps": [{"role": "user", "content": instruction},
           {"role": "assistant", "content": text}]}, open("/logs/agent/trajectory.json", "w"))
'''


class Solver:
    """Answers the instruction's number at once."""

    def complete(self, request: ChatRequest) -> list[ChatChoice]:
        number = request.messages[-1].text.split()[1]
        return [apply_limits(f"ANSWER: {number}", request)]


def make_tasks(root: Path, n: int) -> Path:
    for i in range(n):
        task = root / f"t-{i:03d}"
        for sub in ("environment", "tests", "solution"):
            (task / sub).mkdir(parents=True)
        (task / "task.toml").write_text('schema_version = "1.4"\n[verifier]\ntimeout_sec = 30.0\n[agent]\ntimeout_sec = 30.0\n')
        (task / "instruction.md").write_text(f"Write {i + 10} to /app/answer.txt\n")
        (task / "environment" / "notes.txt").write_text("answer in answer.txt\n")
        (task / "tests" / "expected.txt").write_text(f"{i + 10}\n")
        (task / "tests" / "test.sh").write_text(
            '#!/bin/bash\nif [ "$(cat /app/answer.txt)" = "$(cat /tests/expected.txt)" ]; then echo 1; else echo 0; fi'
            ' > /logs/verifier/reward.txt\n')
        (task / "solution" / "solve.sh").write_text(f"#!/bin/bash\necho {i + 10} > /app/answer.txt\n")
    return root


class CpuMeter:
    """CPU seconds since it was made: the whole machine's (``/proc/stat``: every process, the sandboxes'
    and the kernel's included) and this process's own."""

    def __init__(self) -> None:
        self.machine, self.own = self._machine(), time.process_time()

    @staticmethod
    def _machine() -> float:
        with open("/proc/stat") as fh:
            ticks = [int(x) for x in fh.readline().split()[1:]]
        return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")

    def used(self) -> tuple[float, float]:
        return self._machine() - self.machine, time.process_time() - self.own


def per_trial(used: tuple[float, float], n: int) -> dict[str, float]:
    """Milliseconds of CPU per trial: the machine's and the evaluating (this) process's."""
    return {"machine_cpu_ms": 1000 * used[0] / n, "process_cpu_ms": 1000 * used[1] / n}


def _seconds(timing: Any) -> float:
    if timing is None or timing.started_at is None or timing.finished_at is None:
        return 0.0
    return (timing.finished_at - timing.started_at).total_seconds()


def harbor(root: Path, n_tasks: int, k: int, concurrency: int) -> dict[str, float]:
    """Trials/s through LocalEvalService (Harbor's Job) and the mean per-trial phase split."""
    tasks = make_tasks(root / "tasks", n_tasks)
    svc = LocalEvalService(model_for=lambda c: Solver(), tasks={"dev": tasks}, run_dir=root / "evals",
                           prices=DEFAULT_PRICES, concurrency=concurrency, private_dir=root / "private")
    req = EvalRequest(checkpoint="base", harness_version="bench", harness_files={"agent.py": HARNESS}, k=k)
    try:
        cpu = CpuMeter()
        start = time.perf_counter()
        billed = svc.start(req, "bench").future.result()
        wall = time.perf_counter() - start
        used = cpu.used()
    finally:
        svc.close()
    assert billed.value.score == 1.0, billed.value
    from harbor.models.trial.result import TrialResult

    phases: dict[str, list[float]] = {"env_start": [], "agent_setup": [], "agent": [], "verifier": [], "harbor": [],
                                      "trial": []}
    for path in (root / "evals" / "bench" / "harbor").glob("*/result.json"):
        r = TrialResult.model_validate_json(path.read_text())
        total = (r.finished_at - r.started_at).total_seconds()
        parts = {"env_start": _seconds(r.environment_setup), "agent_setup": _seconds(r.agent_setup),
                 "agent": _seconds(r.agent_execution), "verifier": _seconds(r.verifier)}
        for key, value in parts.items():
            phases[key].append(value)
        phases["harbor"].append(total - sum(parts.values()))
        phases["trial"].append(total)
    n = n_tasks * k
    return {"trials": n, "wall_s": wall, "trials_per_s": n / wall, **per_trial(used, n),
            **{f"{key}_ms": 1000 * statistics.mean(v) for key, v in phases.items() if v}}


async def _direct(root: Path, n_tasks: int, k: int, concurrency: int) -> float:
    tasks = list_tasks(make_tasks(root / "tasks", n_tasks))
    harness_dir = root / "harness"
    write_harness({"agent.py": HARNESS}, harness_dir)
    sock = Path(tempfile.mkdtemp(prefix="rsigym-bench-")) / "model.sock"
    gate = asyncio.Semaphore(concurrency)
    rewards: list[float] = []

    async def trial(task: Path, attempt: int) -> None:
        async with gate:
            d = root / "trials" / f"{task.name}-{attempt}"
            group = isolation.SandboxGroup(d, memory_mb=2048, processes=256, disk_mb=512)  # as every trial has
            app, logs, verifier = d / "app", d / "agent", d / "verifier"
            for x in (app, logs, verifier):
                x.mkdir(parents=True)
            shutil.copytree(task / "environment", app, dirs_exist_ok=True)
            (logs / "instruction.md").write_text((task / "instruction.md").read_text())
            env = {"RSIGYM_MODEL_SOCKET": "/model.sock", "RSIGYM_MODEL": "m", "RSIGYM_SEED": str(attempt),
                   "RSIGYM_INSTRUCTION_FILE": "/logs/agent/instruction.md", "RSIGYM_LOGS_DIR": "/logs/agent",
                   "RSIGYM_APP_DIR": "/app"}
            skeleton = d / "skeleton"
            (skeleton / "agent").mkdir(parents=True)
            (skeleton / "verifier").mkdir()
            skeleton.chmod(0o755)
            await isolation.run_isolated_async(
                "python3 /harness/agent.py", workdir=app, env=env, group=group,
                mounts=[isolation.Mount(skeleton, "/logs"), isolation.Mount(logs, "/logs/agent", writable=True),
                        isolation.Mount(harness_dir, "/harness"), isolation.Mount(sock, "/model.sock")])
            await isolation.run_isolated_async(
                "bash /tests/test.sh", workdir=app, group=group,
                mounts=[isolation.Mount(skeleton, "/logs"), isolation.Mount(verifier, "/logs/verifier", writable=True),
                        isolation.Mount(task / "tests", "/tests")])
            rewards.append(float((verifier / "reward.txt").read_text()))
            group.close()

    with OpenAIServer(ModelRegistry({"m": Solver()}), port=None, uds=sock):
        cpu = CpuMeter()
        start = time.perf_counter()
        await asyncio.gather(*(trial(t, a) for t in tasks for a in range(k)))
        wall = time.perf_counter() - start
        used = cpu.used()
    shutil.rmtree(sock.parent, ignore_errors=True)
    assert rewards == [1.0] * len(rewards), rewards
    return wall, used


def direct(root: Path, n_tasks: int, k: int, concurrency: int) -> dict[str, float]:
    wall, used = asyncio.run(_direct(root, n_tasks, k, concurrency))
    return {"wall_s": wall, "trials_per_s": n_tasks * k / wall, **per_trial(used, n_tasks * k)}


def sandbox_start(root: Path, n: int = 20) -> float:
    """Mean milliseconds of ``run_isolated_async("true")``."""
    work = root / "true"
    work.mkdir()

    async def go() -> float:
        start = time.perf_counter()
        for _ in range(n):
            await isolation.run_isolated_async("true", workdir=work)
        return (time.perf_counter() - start) / n * 1000

    return asyncio.run(go())


TASK_WORK = r"""
import json, sys, timeit, warnings
from pathlib import Path
warnings.simplefilter("ignore")
from harbor.models.task.task import Task
task = Path(sys.argv[1])
def trial_work():  # what every trial does with its task: load it (Trial.create), select the tests (the verifier)
    t = Task(task)
    t.file_filter.require_included(t.paths.tests_dir / "test.sh")
    t.file_filter.select(t.paths.tests_dir)
own = min(timeit.repeat(trial_work, number=100, repeat=5)) / 100 * 1e3
from rsigym_env.worlds.common.evaluation import tune_harbor
tune_harbor()
tuned = min(timeit.repeat(trial_work, number=100, repeat=5)) / 100 * 1e3
print(json.dumps({"own_ms": own, "tuned_ms": tuned}))
"""


def task_work(task_dir: Path) -> dict[str, float]:
    """Milliseconds of one trial's task work (load the task, check and select its tests) by Harbor's own code
    and with :func:`~rsigym_env.worlds.common.evaluation.tune_harbor`, in a fresh process (tuning is for good)."""
    out = subprocess.run([sys.executable, "-c", TASK_WORK, str(task_dir)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _median_run(runs: list[dict[str, float]]) -> dict[str, float]:
    """The run with the median trials/s, with every round's trials/s beside it."""
    ranked = sorted(runs, key=lambda r: r["trials_per_s"])
    return ranked[len(ranked) // 2] | {"rounds_per_s": [r["trials_per_s"] for r in runs]}


def measure(n_tasks: int = 10, k: int = 3, concurrency: int = 2, rounds: int = 3) -> dict[str, Any]:
    """Both paths ``rounds`` times, interleaved (the machine's speed drifts); the median round of each."""
    if not isolation.bwrap_available():
        return {"skipped": "bubblewrap does not work here"}
    root = Path(tempfile.mkdtemp(prefix="rsigym-bench-eval-"))
    try:
        direct(root / "warm", 1, 1, 1)  # imports, page cache
        harbor(root / "warm-harbor", 1, 1, 1)
        runs: dict[str, list[dict[str, float]]] = {"harbor": [], "direct": []}
        for i in range(rounds):
            runs["harbor"].append(harbor(root / f"harbor-{i}", n_tasks, k, concurrency))
            runs["direct"].append(direct(root / f"direct-{i}", n_tasks, k, concurrency))
        h, d = _median_run(runs["harbor"]), _median_run(runs["direct"])
        floor = sandbox_start(root)
        work = task_work(next(p for p in (root / "harbor-0" / "tasks").iterdir() if p.is_dir()))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"n_tasks": n_tasks, "k": k, "concurrency": concurrency, "rounds": rounds, "harbor": h, "direct": d,
            "sandbox_start_ms": floor, "direct_over_harbor": d["trials_per_s"] / h["trials_per_s"], "task_work": work}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=10)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of each path (medians)")
    args = parser.parse_args()
    json.dump(measure(args.tasks, args.k, args.concurrency, args.rounds), sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
