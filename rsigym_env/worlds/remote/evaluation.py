"""Evaluation through Harbor on real benchmarks: the shared evaluation service with a Harbor environment type.

:class:`RemoteEvalService` is :class:`~..common.evaluation.HarborEvalService` (the local world's too: the same
Harbor ``Job``, the same :class:`~..common.harbor_agent.HarnessAgent`, avg@k, per-task rewards, ATIF trajectories
and logs, the same billing from a metering proxy) with these back ends:

* trials run in the Harbor environment the scenario names (``docker``, ``e2b``, ``daytona``, ...);
* the harness reaches the model at ``RSIGYM_MODEL_URL``: the evaluation's own OpenAI-compatible proxy,
  listening on TCP, which forwards to the inference endpoint (the provider key never enters a trial)
  and gives each trial an unguessable alias with a token budget;
* tasks come from a Harbor dataset (downloaded by Harbor's task client) or a directory of task directories,
  split into dev and official **afresh for every episode** by the platform's split secret and a nonce of the
  episode's own (:mod:`rsigym_env.splits`, as in the local world), or by ``evaluation.split_seed`` when the
  scenario asks for ``official_split: public`` (reproducible, and known to anyone with the seed); or the scenario
  names the split directories itself.

>>> tasks = [Path(f"/t/task-{i}") for i in range(10)]
>>> split_tasks(tasks, dev_fraction=0.5, seed=0) == split_tasks(tasks[::-1], dev_fraction=0.5, seed=0)
True
>>> from rsigym_env.splits import official_split
>>> one, two = (split_tasks(tasks, 0.5, official_split("secret", secret="s").stream("aime")) for _ in range(2))
>>> one != two or one == two  # two episodes draw independently (they coincide only by chance: 1 in 252 here)
True
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any, Mapping

from ...splits import OfficialSplit
from ..common.evaluation import HarborEnvironmentType, HarborEvalService, ModelEndpoint
from .config import EvalOptions


def split_tasks(paths: list[Path], dev_fraction: float, seed: int | str) -> dict[str, list[Path]]:
    """The dev/official split by a hash of (seed, task name): deterministic in ``seed`` (a public split's
    number, or a secret split's keyed stream name) and independent of the listing order."""
    ranked = sorted(paths, key=lambda p: hashlib.sha256(f"{seed}/{p.name}".encode()).hexdigest())
    n_dev = max(1, min(len(ranked) - 1, round(len(ranked) * dev_fraction)))
    return {"dev": sorted(ranked[:n_dev], key=lambda p: p.name), "official": sorted(ranked[n_dev:], key=lambda p: p.name)}


def parse_dataset(ref: str) -> tuple[str, str | None]:
    """``'name@version'`` → (name, version)."""
    name, _, version = ref.partition("@")
    return name, (version or None)


async def _dataset_task_ids(ref: str) -> list[Any]:
    from harbor.models.job.config import DatasetConfig

    name, version = parse_dataset(ref)
    if "/" in name:  # a Harbor hub package: org/name@ref
        config = DatasetConfig(name=name, ref=version or "latest")
    else:
        config = DatasetConfig(name=name, version=version)
    return [c.get_task_id() for c in await config.get_task_configs()]


def resolve_dataset(ref: str) -> int:
    """How many tasks the dataset reference names (metadata only, nothing downloaded)."""
    return len(asyncio.run(_dataset_task_ids(ref)))


def download_dataset(ref: str) -> list[Path]:
    """Download (or reuse from Harbor's cache) every task of a dataset; their local directories."""
    from harbor.tasks.client import TaskClient

    async def run() -> list[Path]:
        return list((await TaskClient().download_tasks(await _dataset_task_ids(ref))).paths)

    return asyncio.run(run())


def split_seed(options: EvalOptions, dataset: str, split: OfficialSplit | None) -> int | str:
    """What :func:`split_tasks` ranks by: the scenario's ``split_seed`` for a public split (or none given), else
    the secret split's keyed stream for this dataset (which tells nothing about another episode's draw)."""
    return options.split_seed if split is None or split.mode == "public" else split.stream(f"remote:{dataset}")


def prepare_splits(options: EvalOptions, dataset: str | None, target: Path,
                   environ: Mapping[str, str] | None = None, split: OfficialSplit | None = None) -> dict[str, Path]:
    """The dev and official split directories (of symlinks to task directories) under ``target``, split by
    ``split`` (see :func:`split_seed`)."""
    if options.tasks:
        return {split: Path(path) for split, path in options.tasks.items()}
    local = options.local_dataset(environ)
    if local:
        root = Path(local)
        paths = sorted(p for p in root.iterdir() if (p / "task.toml").is_file())
    elif dataset:
        paths = download_dataset(dataset)
    else:
        raise ValueError("the scenario names no tasks: set world_options.evaluation.dataset, dataset_path or tasks")
    if len(paths) < 2:
        raise ValueError(f"need at least 2 tasks to split into dev and official, found {len(paths)}")
    splits = split_tasks(paths, options.dev_fraction, split_seed(options, dataset or str(local), split))
    out: dict[str, Path] = {}
    for split, chosen in splits.items():
        folder = target / split
        folder.mkdir(parents=True, exist_ok=True)
        for path in chosen:
            link = folder / path.name
            if not link.exists():
                link.symlink_to(path.resolve(), target_is_directory=True)
        out[split] = folder
    return out


def default_model_url(environment: str) -> str | None:
    """How a trial reaches the proxy on this host: Docker Desktop's host name (on Linux set ``model_url`` to the
    bridge gateway, e.g. ``http://172.17.0.1:{port}/v1``); other environments run elsewhere and need an explicit URL."""
    return "http://host.docker.internal:{port}/v1" if environment == "docker" else None


class RemoteEvalService(HarborEvalService):
    """The shared evaluation service in a Harbor environment, the model behind a network proxy."""

    def __init__(self, *, options: EvalOptions, **kwargs: Any):
        url = options.model_url or default_model_url(options.environment)
        if url is None:
            raise ValueError(f"Harbor's {options.environment!r} environment runs trials off this host: set "
                             "world_options.evaluation.model_url to a URL they can reach (e.g. "
                             "'https://proxy.example.org:{port}/v1')")
        super().__init__(environment=HarborEnvironmentType(options.environment, dict(options.environment_kwargs)),
                         model_endpoint=ModelEndpoint(options.model_host, options.model_port, url),
                         concurrency=options.concurrency, tokens_per_trial=options.tokens_per_trial,
                         agent_timeout_s=options.agent_timeout_s, verifier_timeout_s=options.verifier_timeout_s,
                         **kwargs)


__all__ = ["RemoteEvalService", "default_model_url", "download_dataset", "parse_dataset", "prepare_splits",
           "resolve_dataset", "split_seed", "split_tasks"]
