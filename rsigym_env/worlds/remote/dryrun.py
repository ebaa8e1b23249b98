"""``rsigym run --world remote --dry-run``: every check a remote run needs, without spending anything.

Checks the scenario's ``world_options``, each credential (by name), the price list (Tinker's
``models.json`` and its date, the teacher catalog, E2B's rates), the Harbor dataset reference (resolved
against Harbor's registry: metadata only), the Harbor environment's prerequisites, and that each endpoint
accepts a TCP connection (no request is sent). Nothing is created, trained, sampled or billed.

>>> from rsigym_env.scenario import load_scenario
>>> checks = run_checks(load_scenario("remote-joint-aime"), environ={}, network=False)
>>> [c.name for c in checks if c.status == "missing"][:2]
['credential TINKER_API_KEY', 'credential RSIGYM_TEACHER_API_KEY']
>>> all_ok(checks)
False
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import socket
import urllib.parse
from dataclasses import dataclass
from typing import Literal, Mapping

from pydantic import ValidationError

from ...scenario import Scenario
from .config import BENCHMARKS, HARBOR_ENV_CREDENTIALS, RemoteOptions, docker_available, required_credentials

Status = Literal["ok", "missing", "fail", "skipped"]


@dataclass(frozen=True)
class Check:
    """One line of the dry run's table."""

    name: str
    status: Status
    detail: str


def all_ok(checks: list[Check]) -> bool:
    """True when nothing is missing or failed (skipped checks do not count against it)."""
    return all(c.status in ("ok", "skipped") for c in checks)


def _reachable(url: str, timeout_s: float = 5.0) -> tuple[bool, str]:
    parsed = urllib.parse.urlparse(url)
    host = parsed.hostname
    if not host:
        return False, f"not a URL: {url!r}"
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True, f"{host}:{port} accepts connections"
    except OSError as exc:
        return False, f"{host}:{port} unreachable ({exc})"


def harbor_extra_missing(environment: str) -> list[str]:
    """The requirements of Harbor's ``environment`` extra (``harbor[e2b]``, ``harbor[daytona]``, ...) that are not
    installed: Harbor imports them only when a trial starts, so without this check every trial would fail.

    >>> harbor_extra_missing("docker"), harbor_extra_missing("my.module:Env")
    ([], [])
    """
    from importlib.metadata import PackageNotFoundError, requires, version

    from packaging.requirements import Requirement

    if ":" in environment:
        return []
    missing = []
    for line in requires("harbor") or []:
        req = Requirement(line)
        if req.marker is None or "extra" not in str(req.marker) or not req.marker.evaluate({"extra": environment}):
            continue
        try:
            version(req.name)
        except PackageNotFoundError:
            missing.append(str(req).split(";")[0].strip())
    return missing


def offline_tasks(dirs: list[str]) -> list[str]:
    """The tasks under ``dirs`` whose ``task.toml`` says ``network_mode = "no-network"``: in the remote world the
    harness reaches the model over TCP, so such a trial needs Harbor's allowlist for the proxy's host, which an
    environment class of the scenario's own may not honour."""
    import tomllib
    from pathlib import Path

    found = []
    for root in dirs:
        for toml in sorted(Path(root).glob("*/task.toml")):
            try:
                mode = tomllib.loads(toml.read_text()).get("environment", {}).get("network_mode")
            except (OSError, tomllib.TOMLDecodeError):
                continue
            if mode == "no-network":
                found.append(toml.parent.name)
    return found


def run_checks(scenario: Scenario, environ: Mapping[str, str] | None = None, network: bool = True,
               timeout_s: float = 20.0) -> list[Check]:
    """The dry run's checks for ``scenario`` (``network=False``: skip registry and endpoint checks)."""
    env = os.environ if environ is None else environ
    checks: list[Check] = []
    if scenario.world != "remote":
        return [Check("scenario", "ok", f"{scenario.name}: world {scenario.world!r} needs no credentials")]
    try:
        options = RemoteOptions.model_validate(scenario.world_options)
    except ValidationError as exc:
        return [Check("scenario world_options", "fail", str(exc).replace("\n", " "))]
    checks.append(Check("scenario", "ok", f"{scenario.name}: {scenario.track} track, {scenario.benchmark}, "
                                          f"${scenario.budget_usd:g}, {scenario.time_limit_h:g} h"))

    for cred in required_credentials(options, scenario.permissions.teachers, scenario.tools()):
        present = bool(env.get(cred.variable))
        extra = ""
        if present and cred.variable == "TINKER_API_KEY" and not env[cred.variable].startswith(("tml-", "eyJ")):
            checks.append(Check(f"credential {cred.variable}", "fail", "set, but Tinker keys start with 'tml-'"))
            continue
        checks.append(Check(f"credential {cred.variable}", "ok" if present else "missing",
                            f"{cred.purpose}{extra}" + ("" if present else f" — export {cred.variable}=...")))

    from .pricing import E2B_RATES, context_tokens, load_tinker_models, model_price, price_source

    path, meta = price_source()
    try:
        rows = load_tinker_models(path)
        price = model_price(options.base_model, rows)
        method = str(meta.get("method", "")).split(":")[0]
        checks.append(Check("price list", "ok", f"{path} ({meta.get('retrieved', 'undated')}; {method})"))
        checks.append(Check(f"price {options.base_model}", "ok",
                            f"$/M tokens: prefill {price.prefill:g}, cached {price.cached:g}, sample {price.sample:g}, "
                            f"train {price.train:g}; context {context_tokens(options.base_model, rows)} tokens"))
    except (KeyError, ValueError, OSError) as exc:
        checks.append(Check(f"price {options.base_model}", "fail", str(exc)))
    allowed = [t for t in scenario.permissions.teachers]
    if "generate_data" in scenario.tools():
        unpriced = [t for t in allowed if t not in options.teachers]
        checks.append(Check("teacher catalog", "fail" if unpriced else "ok",
                            f"no price/endpoint for {', '.join(unpriced)}" if unpriced else
                            ", ".join(f"{t} ${options.teachers[t].input:g}/${options.teachers[t].output:g}"
                                      for t in allowed)))
    checks.append(Check("E2B rates", "ok", f"${E2B_RATES.vcpu_second:g}/vCPU-s, ${E2B_RATES.gib_second:g}/GiB-s"))

    e = options.evaluation
    local_dirs: list[str] = []
    if e.tasks:
        missing = [p for p in e.tasks.values() if not os.path.isdir(p)]
        checks.append(Check("tasks", "fail" if missing else "ok",
                            f"missing directories: {missing}" if missing else f"splits {sorted(e.tasks)}"))
        local_dirs = [p for p in e.tasks.values() if os.path.isdir(p)]
    elif e.dataset_path or e.dataset_path_env:
        path = e.local_dataset(env)
        if path is None:
            checks.append(Check("tasks", "missing", f"export {e.dataset_path_env}=<a directory of Harbor tasks>"))
        else:
            checks.append(Check("tasks", "ok" if os.path.isdir(path) else "fail", path))
            local_dirs = [path] if os.path.isdir(path) else []
    else:
        bench = BENCHMARKS.get(scenario.benchmark)
        ref = e.dataset or (bench.dataset if bench else None)
        if ref is None:
            checks.append(Check("dataset", "fail", f"no Harbor dataset for benchmark {scenario.benchmark!r}: set "
                                                   "world_options.evaluation.dataset"))
        elif not network:
            checks.append(Check(f"dataset {ref}", "skipped", "not resolved (network checks off)"))
        else:
            from .evaluation import resolve_dataset

            with cf.ThreadPoolExecutor(1) as pool:
                future = pool.submit(resolve_dataset, ref)
                try:
                    n = future.result(timeout=timeout_s)
                    checks.append(Check(f"dataset {ref}", "ok", f"{n} tasks in Harbor's registry"))
                except cf.TimeoutError:
                    checks.append(Check(f"dataset {ref}", "fail", f"Harbor's registry did not answer in {timeout_s:g} s"))
                except Exception as exc:  # noqa: BLE001 - every failure is a line of the table
                    cause = exc.__cause__ or exc.__context__
                    why = f" (because {type(cause).__name__}: {str(cause)[:120]})" if cause is not None else ""
                    checks.append(Check(f"dataset {ref}", "fail", f"cannot resolve: {type(exc).__name__}: "
                                                                  f"{str(exc)[:160]}{why}"))
    if local_dirs and ("evaluate" in scenario.tools() or "submit" in scenario.tools()):
        offline = offline_tasks(local_dirs)
        if not offline:
            checks.append(Check("task network", "ok", "every task lets its harness reach the model proxy"))
        elif ":" in e.environment:  # an environment class of its own: it decides whether an allowlist opens a route
            checks.append(Check("task network", "fail",
                                f"{len(offline)} task(s) declare network_mode no-network (e.g. {offline[0]}) and "
                                f"{e.environment} may give their harness no route to the model proxy"))
        else:
            checks.append(Check("task network", "ok",
                                f"{len(offline)} task(s) declare network_mode no-network (e.g. {offline[0]}): their agent "
                                "phase gets an allowlist holding only the model proxy's host (Harbor's "
                                "extra_allowed_hosts)"))
    if "evaluate" in scenario.tools() or "submit" in scenario.tools():
        if e.environment == "docker":
            checks.append(Check("harbor environment docker", "ok" if docker_available() else "fail",
                                "docker CLI found" if docker_available() else "the docker CLI is not on PATH"))
        elif e.environment not in HARBOR_ENV_CREDENTIALS:
            checks.append(Check(f"harbor environment {e.environment}", "ok", "credentials per Harbor's own docs"))
        missing_extra = harbor_extra_missing(e.environment)
        if missing_extra:
            checks.append(Check(f"harbor environment {e.environment} packages", "fail",
                                f"Harbor's {e.environment} environment needs {', '.join(missing_extra)}: "
                                f"pip install 'harbor[{e.environment}]'"))
        if e.model_url is None and e.environment != "docker":
            checks.append(Check("model proxy URL", "fail", f"trials in {e.environment} run off this host: set "
                                                           "world_options.evaluation.model_url"))

    if network:
        endpoints = {"Tinker": options.tinker_url(env), "inference": options.inference_base_url(env),
                     "E2B": env.get("E2B_API_URL") or f"https://api.{env.get('E2B_DOMAIN') or 'e2b.app'}"}
        if env.get("E2B_SANDBOX_URL"):
            endpoints["E2B sandboxes"] = env["E2B_SANDBOX_URL"]
        for t in allowed:
            spec = options.teachers.get(t)
            url = spec.resolved_url(environ=env) if spec else None
            if spec is not None and url:
                endpoints[f"teacher {t}"] = url
        for label, url in endpoints.items():
            ok, detail = _reachable(url)
            checks.append(Check(f"endpoint {label}", "ok" if ok else "fail", f"{url}: {detail}"))
    return checks


def render(checks: list[Check]) -> "object":
    """A rich table of the checks."""
    from rich.table import Table

    table = Table(title="remote world dry run (nothing is spent)")
    table.add_column("check", style="bold")
    table.add_column("status")
    table.add_column("detail", overflow="fold")
    colour = {"ok": "green", "missing": "red", "fail": "red", "skipped": "yellow"}
    for c in checks:
        table.add_row(c.name, f"[{colour[c.status]}]{c.status}[/]", c.detail)
    return table


__all__ = ["Check", "all_ok", "harbor_extra_missing", "offline_tasks", "render", "run_checks"]
