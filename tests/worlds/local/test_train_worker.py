"""Training in a process of its own (``train_worker``): the same checkpoint, byte for byte, as training in
process; errors keep their kind; a cancelled job's worker stops at once; a worker that dies fails the job,
billed for what it trained, and nothing else is lost."""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tinker")

from rsigym_env.errors import WorkFailed  # noqa: E402
from rsigym_env.prices import DEFAULT_PRICES  # noqa: E402
from rsigym_env.tools import Train  # noqa: E402
from rsigym_env.worlds.common.datasets import DatasetStore  # noqa: E402
from rsigym_env.worlds.common.jobs import JobCancelled  # noqa: E402
from rsigym_env.worlds.common.train import TinkerTrainService  # noqa: E402
from rsigym_env.worlds.common.training import DatasetError, SupervisedConfig, run_supervised  # noqa: E402
from rsigym_env.worlds.local.lm import tinker_client  # noqa: E402
from rsigym_env.worlds.local.lm.model import ModelConfig  # noqa: E402
from rsigym_env.worlds.local.lm.train_worker import TrainingProcess, TrainingProcessDied  # noqa: E402

TINY = "train-worker-tiny"


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("base")
    tinker_client.register_base_model(TINY, tinker_client.make_random_base(
        root / "base", ModelConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64, max_seq_len=256)))
    return TINY


def dataset(path: Path, n: int = 24) -> Path:
    path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"What is {i} + {i}?"},
                                                     {"role": "assistant", "content": str(2 * i)}]}) + "\n"
                            for i in range(n)))
    return path


def arrays(root: Path, tinker_path: str) -> dict[str, np.ndarray]:
    directory = tinker_client.LocalServiceClient(root_dir=root).checkpoint_dir(tinker_path)
    out = {}
    for file in sorted(directory.glob("*.npz")):
        with np.load(file) as data:
            out |= {f"{file.name}/{k}": data[k] for k in data.files}
    return out


def test_the_worker_trains_the_same_checkpoint_as_in_process(base, tmp_path):
    data = dataset(tmp_path / "data.jsonl")
    config = SupervisedConfig(base_model=base, learning_rate=1e-2, batch_size=4, num_epochs=2, lora_rank=4, seed=3)
    here = run_supervised(tinker_client.LocalServiceClient(root_dir=tmp_path / "here"), config, data)
    seen = []
    there = TrainingProcess(tmp_path / "there")(config, data, seen.append)
    assert [s.loss for s in there.steps] == [s.loss for s in here.steps] and len(here.steps) == 12
    assert [s.step for s in seen] == list(range(12))  # each step as it was made
    assert there.billable_tokens == here.billable_tokens
    for kind in ("sampler_path", "state_path"):
        mine, theirs = arrays(tmp_path / "here", getattr(here, kind)), arrays(tmp_path / "there", getattr(there, kind))
        assert mine.keys() == theirs.keys() and mine
        assert all(np.array_equal(mine[k], theirs[k]) for k in mine), kind
    # the caller's own client serves the worker's checkpoint (it reads the run directory)
    caller = tinker_client.LocalServiceClient(root_dir=tmp_path / "there")
    assert caller.create_sampling_client(model_path=there.sampler_path).result() is not None


def test_errors_keep_their_kind_and_message(base, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}]}\nnot json\n')
    config = SupervisedConfig(base_model=base, lora_rank=4)
    with pytest.raises(DatasetError) as here:
        run_supervised(tinker_client.LocalServiceClient(root_dir=tmp_path / "here"), config, bad)
    with pytest.raises(DatasetError) as there:
        TrainingProcess(tmp_path / "there")(config, bad)
    assert str(there.value) == str(here.value) and there.value.code == "invalid_args"
    with pytest.raises(tinker_client.UnknownModelError, match="unknown base model 'no-such-base'"):
        TrainingProcess(tmp_path / "there")(SupervisedConfig(base_model="no-such-base", lora_rank=4),
                                            dataset(tmp_path / "d.jsonl"))


def _workers() -> list[int]:
    """This process's training workers (their pids)."""
    pids = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        for pid in (task / "children").read_text().split():
            try:
                if b"train_worker" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    pids.append(int(pid))
            except OSError:
                pass
    return pids


def test_an_on_step_that_raises_stops_the_worker_at_once(base, tmp_path):
    config = SupervisedConfig(base_model=base, learning_rate=1e-2, batch_size=1, num_epochs=50, lora_rank=4)

    def stop(metrics):
        if metrics.step == 1:
            raise JobCancelled("cancelled")

    started = time.monotonic()
    with pytest.raises(JobCancelled):
        TrainingProcess(tmp_path / "t")(config, dataset(tmp_path / "d.jsonl"), stop)
    assert time.monotonic() - started < 30 and _workers() == []
    assert not list((tmp_path / "t").glob("runs/*/sampler_weights"))  # it never got to save


def test_a_worker_that_dies_fails_the_job_billed_for_what_it_trained(base, tmp_path):
    """Through the training service: the worker is SIGKILLed after its second step; the job fails with a
    WorkFailed carrying exactly the trained tokens' cost, and the next job trains normally."""
    store = DatasetStore(tmp_path / "datasets")
    (tmp_path / "datasets").mkdir()
    info = store.ingest("arith", dataset(tmp_path / "d.jsonl", n=40), origin="test")
    pool = cf.ThreadPoolExecutor(1)
    checkpoints = []
    service = TinkerTrainService(client=None, store=store, prices=DEFAULT_PRICES, pool=pool, clock=time.monotonic,
                                 base_model=base, seed=0, on_checkpoint=lambda c, p: checkpoints.append(c),
                                 runner=TrainingProcess(tmp_path / "tinker"))
    steps = []
    real = service.runner

    def killing(config, path, on_step):
        def step(metrics):
            steps.append(metrics)
            on_step(metrics)
            if metrics.step == 1:
                os.kill(_workers()[0], signal.SIGKILL)
        return real(config, path, step)

    service.runner = killing
    call = Train(dataset=info.id, batch_size=1, num_epochs=5)
    job = service.start(call, "job-1", "ckpt-1")
    with pytest.raises(WorkFailed) as failed:
        job.future.result(120)
    trained = sum(s.num_tokens for s in steps)
    assert failed.value.code == "service_error" and isinstance(failed.value.__cause__, TrainingProcessDied)
    assert failed.value.__cause__.steps == len(steps) >= 2 and "died" in str(failed.value)  # a step may be in the pipe
    assert failed.value.cost_usd == pytest.approx(DEFAULT_PRICES.train_usd(trained)) and trained > 0
    assert checkpoints == [] and _workers() == []
    service.runner = real
    done = service.start(call.model_copy(update={"num_epochs": 1}), "job-2", "ckpt-2").future.result(120)
    assert done.value.checkpoint == "ckpt-2" and checkpoints == ["ckpt-2"]
    pool.shutdown()
