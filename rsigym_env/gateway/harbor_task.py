"""A research run as a Harbor task: a Harbor agent (Claude Code, Codex, terminus-2, ...) is the researcher.

:func:`export_harbor_task` (``rsigym export harbor --scenario NAME --out DIR``) writes a task
directory that Harbor runs against a run of the session service (``rsigym serve``); the run is
chosen at ``harbor run`` time by ``RSIGYM_URL`` and ``RSIGYM_RUN_KEY`` in the host's environment,
which Harbor substitutes into ``[environment.env]`` (``${VAR}``, resolved when the trial's
environment is created) and ``[verifier.env]``:

==========================  =================================================================
``task.toml``               timeouts; ``[environment]`` with the run's URL and key, ``skills_dir``,
                            an MCP server (stdio ``rsigym mcp``: Harbor's MCP entries carry no
                            environment, so the key reaches it through the agent's environment),
                            a healthcheck (the run must be new); ``[verifier]`` in a separate
                            environment with a collect hook that ends the run and snapshots its
                            records once the agent is done
``instruction.md``          what the researcher is told: how to call tools, and the briefing
``environment/``            ``/app``: ``skills/`` (the SKILL.md documents and ``rsigym-call``),
                            ``.rsigym/rsigym_verify.py`` and a ``Dockerfile`` for docker/e2b
``tests/``                  ``test.sh`` → ``rsigym_verify.py verify``: the reward is the run's end
                            state read from the service (never a file the agent could write)
``solution/solve.sh``       (sim scenarios) the bundled scripted researcher's actions as
                            ``rsigym-call`` lines, for Harbor's oracle agent
==========================  =================================================================

The oracle's solution is honest because the sim world is deterministic given scenario, seed and
actions: the exporter plays the bundled scripted researcher in process on an env built exactly as
the service builds its runs (:func:`~rsigym_env.gateway.host.research_env`) and writes down what it
did; replayed by ``rsigym-call`` against a service run created with the same scenario and seed, the
service computes the same normalized gain — and it is the service that scores it.

>>> import tempfile
>>> task = export_harbor_task(tempfile.mkdtemp(), "sim-harness-aime-500", seed=3)
>>> sorted(p.name for p in task.path.iterdir())
['environment', 'instruction.md', 'solution', 'task.toml', 'tests']
>>> task.solution.steps, round(task.solution.reward, 4)
(8, 0.375)
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from ..scenario import Scenario
from .service import GatewayError, RunRequest
from .service import resolve_scenario as _resolve

VERIFIER_SOURCE = Path(__file__).with_name("harbor_verifier.py")
VERIFIER_NAME = "rsigym_verify.py"
APP_SKILLS = "/app/skills"
CLIENT = f"{APP_SKILLS}/rsigym/scripts/rsigym-call"
COLLECTED = "/logs/artifacts/rsigym"
AGENT_TIMEOUT_S = 7 * 24 * 3600.0
VERIFIER_TIMEOUT_S = 1800.0
_HEREDOC = "RSIGYM_VERIFY_PY"


def _version() -> str:
    try:
        return version("rsigym-env")
    except PackageNotFoundError:
        return "0.1.0"


@dataclass
class ScriptedSolution:
    """The bundled scripted researcher's episode on ``scenario`` with ``seed``: its calls, in order."""

    scenario: str
    seed: int
    actions: list[dict[str, Any]] = field(default_factory=list)  # {"tool", "args", "ok"}
    reward: float = 0.0
    steps: int = 0
    end: dict[str, Any] = field(default_factory=dict)


@dataclass
class HarborTask:
    """An exported task: its directory, and the oracle's solution when one was written."""

    path: Path
    scenario: str
    solution: ScriptedSolution | None


def resolve_scenario(request: RunRequest) -> Scenario:
    """The scenario as the service resolves it for ``POST /v1/runs``; ``ValueError`` when it is unknown."""
    try:
        return _resolve(request)
    except GatewayError as exc:
        raise ValueError(exc.message) from None


def _as_call(action: Any) -> tuple[str, dict[str, Any]]:
    """A researcher's action as ``(tool, args)``, keeping the args exactly as given when they are a dict."""
    from ..tools import parse_action

    if isinstance(action, str):
        action = json.loads(action)
    if isinstance(action, dict) and isinstance(action.get("args", {}), dict):
        return str(action["tool"]), dict(action.get("args") or {})
    tool = parse_action(action)
    return tool.name, tool.model_dump(mode="json")


def scripted_solution(scenario: str, seed: int = 0) -> ScriptedSolution:
    """Play the bundled scripted researcher in process on ``scenario`` (a bundled name) with ``seed``, on
    an env built as the service builds its runs, and record its calls.

    ``ValueError`` if the scenario is not a sim one (only the sim world replays identically) or the
    scripted researcher cannot finish it.
    """
    from ..baselines import make_researcher
    from ..episode import run_episode
    from .host import research_env

    resolved = resolve_scenario(RunRequest(scenario=scenario))
    if resolved.world != "sim":
        raise ValueError(f"an oracle solution needs a sim scenario (deterministic given seed and actions); "
                         f"{scenario!r} is of the {resolved.world} world: export it without a solution (--no-solution)")
    env = research_env(resolved)
    calls: list[dict[str, Any]] = []

    def record(step: int, action: Any, obs: dict[str, Any], info: dict[str, Any]) -> None:
        tool, args = _as_call(action)
        calls.append({"tool": tool, "args": args, "ok": bool(info.get("ok", False))})

    try:
        result = run_episode(env, make_researcher("scripted"), seed=seed, on_step=record)
    except Exception as exc:  # the researcher itself broke: no solution rather than a wrong one
        raise ValueError(f"the scripted researcher could not play {scenario!r} as the service runs it "
                         f"({type(exc).__name__}: {exc}); export it without a solution (--no-solution)") from exc
    finally:
        env.close()
    if not result.terminated or "normalized_gain" not in result.info:
        raise ValueError(f"the scripted researcher did not submit in {scenario!r} (seed {seed})")
    end = {k: result.info[k] for k in ("initial_score", "official_score", "normalized_gain", "end_reason")
           if k in result.info}
    return ScriptedSolution(scenario, seed, calls, float(result.info["normalized_gain"]), result.steps, end)


def _briefing(scenario: str) -> str | None:
    """The briefing of a sim scenario (the same for every seed); ``None`` for other worlds, whose envs are
    expensive to build: the researcher reads it with ``rsigym-call observation``."""
    from .host import research_env

    resolved = resolve_scenario(RunRequest(scenario=scenario))
    if resolved.world != "sim":
        return None
    env = research_env(resolved)
    try:
        obs, _ = env.reset(seed=0)
        return str(obs["log"])
    finally:
        env.close()


def _instruction(scenario: str, briefing: str | None) -> str:
    lines = [
        f"# RSIGym research run: {scenario}",
        "",
        "You are the researcher of an RSIGym research run. Improve the target system (model weights plus",
        "its execution harness) on the run's benchmark by calling the run's tools — generate data, train,",
        "infer, edit the harness, run code in a sandbox, evaluate on the dev split — and then `submit` the",
        "best (checkpoint, harness version) you found. Every call is billed to the run's budget before it",
        "runs. Your reward is the normalized gain of what you submit on a held-out split that you never",
        "see: (final - initial) / (1 - initial). It is computed by the service; no file you write counts.",
        "",
        "## How to call tools",
        "",
        "The run is served over HTTP at `$RSIGYM_URL`; your key is `$RSIGYM_RUN_KEY` (both are in your",
        "environment). Any of these reaches the same run:",
        "",
        f"* the shell client: `python3 {CLIENT} TOOL NAME=VALUE ...` (for example",
        f"  `python3 {CLIENT} evaluate k=1`, then `python3 {CLIENT} wait`);",
        f"  `python3 {CLIENT} observation` shows the last observation, `... balance` the money left;",
        f"* the skills in `{APP_SKILLS}/` (one `SKILL.md` per tool: arguments, costs, `curl` examples);",
        "* the MCP server `rsigym` (stdio, `rsigym mcp`) if your agent speaks MCP.",
        "",
        "The episode ends when you call `submit`. If you stop without submitting, the run is ended for you",
        "with the initial system (reward 0). Jobs (`evaluate`, `train`, ...) run in the background: `wait`",
        "for them.",
        "",
        "## Briefing",
        "",
    ]
    if briefing is None:
        lines.append(f"Read it with `python3 {CLIENT} observation` (its `log` is the briefing at the start).")
    else:
        lines += ["```", briefing.rstrip(), "```"]
    return "\n".join(lines) + "\n"


def _solve_sh(solution: ScriptedSolution) -> str:
    """The scripted researcher's calls as ``rsigym-call`` lines (arguments as JSON on stdin, exactly as it
    gave them). A refused call is replayed too (it is a step of the episode); only an unreachable
    service stops the script."""
    lines = [
        "#!/bin/sh",
        f"# The bundled scripted researcher's {solution.steps} calls on {solution.scenario} with seed {solution.seed}",
        "# (rsigym export harbor), replayed through rsigym-call. Against a run created with the same",
        f"# scenario and seed the service scores it {solution.reward!r} (normalized gain).",
        "call() {",
        f"    python3 {CLIENT} \"$@\"",
        "    status=$?",
        "    if [ \"$status\" -eq 3 ]; then echo \"solve.sh: the service cannot be reached\" >&2; exit 3; fi",
        "    return 0",
        "}",
    ]
    for n, action in enumerate(solution.actions, 1):
        note = "" if action["ok"] else "  # refused in process too"
        lines += [f"# step {n}{note}", f"call {shlex.quote(action['tool'])} - <<'RSIGYM_ARGS'",
                  json.dumps(action["args"], sort_keys=True), "RSIGYM_ARGS"]
    return "\n".join(lines) + "\n"


def _dockerfile(pip_spec: str) -> str:
    return "\n".join([
        "# The research run's environment for Harbor's docker / e2b environments (the local bubblewrap",
        "# environment ignores this file and uses the host's /usr). RSIGYM_URL must be reachable from the",
        "# container: e.g. `rsigym serve --host 0.0.0.0 --allow-remote --admin-token-file F` and",
        "# RSIGYM_URL=http://host.docker.internal:8765 (docker) or a public HTTPS URL (e2b).",
        "FROM python:3.12-slim",
        "RUN apt-get update && apt-get install -y --no-install-recommends tmux \\",
        "    && rm -rf /var/lib/apt/lists/*",
        "# `rsigym mcp`, the task's MCP server (with RSIGYM_URL and RSIGYM_RUN_KEY it drives the served run)",
        f"RUN pip install --no-cache-dir {shlex.quote(pip_spec)}",
        "WORKDIR /app",
        "COPY . /app/",
        f'ENV PATH="{APP_SKILLS}/rsigym/scripts:${{PATH}}"',
        "",
    ])


def _test_sh(scenario: str, deadline_s: float) -> str:
    return "\n".join([
        "#!/bin/sh",
        "# The verifier: ends the run if the agent did not (initial system, reward 0), then writes the",
        "# service's reward for it to /logs/verifier/reward.txt and fresh copies of the run's records to",
        "# /logs/verifier/rsigym/, compared with those collected after the agent (/logs/artifacts/rsigym).",
        f"exec python3 -I /tests/{VERIFIER_NAME} verify --scenario {shlex.quote(scenario)} --out /logs/verifier \\",
        f"    --collected {COLLECTED} --deadline-s {deadline_s:g}",
        "",
    ])


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string is a TOML basic string


def _task_toml(scenario: str, seed: int | None, agent_timeout_s: float, verifier_timeout_s: float,
               url_var: str, key_var: str, script: str) -> str:
    if "'''" in script:
        raise ValueError("the verifier script must not contain ''' (it is embedded as a TOML literal string)")
    env = f"RSIGYM_URL = {_toml_str('${' + url_var + '}')}\nRSIGYM_RUN_KEY = {_toml_str('${' + key_var + '}')}\n"
    deadline = max(30.0, verifier_timeout_s - 120.0)
    hook = (f"python3 -I - collect --out {COLLECTED} --deadline-s {deadline:g} <<'{_HEREDOC}'\n"
            f"{script.rstrip()}\n{_HEREDOC}\n")
    meta = {"rsigym_version": _version(), "scenario": scenario}
    if seed is not None:
        meta["solution_seed"] = seed
    meta_lines = "".join(f"{k} = {_toml_str(str(v)) if isinstance(v, str) else v}\n" for k, v in meta.items())
    return "".join([
        "# A research run of RSIGym as a Harbor task (rsigym export harbor). The run is the one of the session\n",
        f"# service at ${url_var} with the key ${key_var} in the host's environment when `harbor run` starts.\n",
        'schema_version = "1.4"\n\n',
        "[task]\n",
        f"name = {_toml_str('rsigym/' + scenario)}\n",
        f"description = {_toml_str('RSIGym research run ' + scenario + ': the agent is the researcher')}\n",
        'keywords = ["rsigym", "research", "self-improvement"]\n\n',
        "[metadata]\n", meta_lines, "\n",
        "[agent]\n",
        f"timeout_sec = {agent_timeout_s:g}\n\n",
        "[verifier]\n",
        f"timeout_sec = {verifier_timeout_s:g}\n",
        '# a fresh environment of its own: nothing the agent changed or left running is there\n',
        'environment_mode = "separate"\n\n',
        "[verifier.env]\n", env, "\n",
        "# After the agent: end the run if it is still open and keep its records as artifacts. The script is\n",
        "# given here, not read from /app (which the agent could have changed).\n",
        "[[verifier.collect]]\n",
        f"timeout_sec = {verifier_timeout_s:g}\n",
        f"command = '''\n{hook}'''\n\n",
        "[environment]\n",
        'network_mode = "public"  # the service must be reachable\n',
        f'skills_dir = "{APP_SKILLS}"\n\n',
        "[environment.env]\n", env, "\n",
        "# Each trial needs a run of its own: one that already took steps is refused before the agent starts.\n",
        "[environment.healthcheck]\n",
        f"command = {_toml_str(f'python3 -I /app/.rsigym/{VERIFIER_NAME} fresh --scenario {shlex.quote(scenario)}')}\n",
        "interval_sec = 1.0\ntimeout_sec = 60.0\nretries = 1\n\n",
        "# Harbor's MCP entries carry no environment: `rsigym mcp` inherits RSIGYM_URL and RSIGYM_RUN_KEY\n",
        "# from the agent's environment ([environment.env]) and drives the served run over REST.\n",
        "[[environment.mcp_servers]]\n",
        'name = "rsigym"\ntransport = "stdio"\ncommand = "rsigym"\nargs = ["mcp"]\n',
    ])


def export_harbor_task(out: str | os.PathLike[str], scenario: str, *, seed: int | None = 0, solution: bool = True,
                       agent_timeout_s: float = AGENT_TIMEOUT_S, verifier_timeout_s: float = VERIFIER_TIMEOUT_S,
                       pip_spec: str | None = None, url_var: str = "RSIGYM_URL",
                       key_var: str = "RSIGYM_RUN_KEY") -> HarborTask:
    """Write the Harbor task of a research run of ``scenario`` (a bundled name) into ``out``.

    Args:
        seed: the seed of the runs the oracle's solution is for (create them with ``"seed": seed``);
            ``None`` writes no solution.
        solution: write ``solution/solve.sh`` (sim scenarios only; see :func:`scripted_solution`).
        agent_timeout_s / verifier_timeout_s: Harbor's timeouts (the verifier may have to wait for an
            official evaluation on a wall-clock world).
        pip_spec: what the Dockerfile installs for ``rsigym mcp`` (default ``rsigym-env[agents]==<this version>``).
        url_var / key_var: the host variables Harbor substitutes for ``RSIGYM_URL`` / ``RSIGYM_RUN_KEY``.

    ``ValueError`` for an unknown scenario or a solution that cannot be made; ``out`` is replaced.
    """
    from .skills import write_skills

    resolve_scenario(RunRequest(scenario=scenario))  # an unknown name fails before anything is written
    made = scripted_solution(scenario, seed) if solution and seed is not None else None
    root = Path(out)
    if root.exists():
        shutil.rmtree(root)
    (root / "environment" / ".rsigym").mkdir(parents=True)
    (root / "tests").mkdir()
    script = VERIFIER_SOURCE.read_text()
    write_skills(root / "environment" / "skills")
    (root / "environment" / ".rsigym" / VERIFIER_NAME).write_text(script)
    (root / "environment" / "Dockerfile").write_text(_dockerfile(pip_spec or f"rsigym-env[agents]=={_version()}"))
    (root / "instruction.md").write_text(_instruction(scenario, _briefing(scenario)))
    (root / "tests" / VERIFIER_NAME).write_text(script)
    test_sh = root / "tests" / "test.sh"
    test_sh.write_text(_test_sh(scenario, max(30.0, verifier_timeout_s - 60.0)))
    test_sh.chmod(0o755)
    (root / "task.toml").write_text(_task_toml(scenario, seed if made else None, agent_timeout_s, verifier_timeout_s,
                                               url_var, key_var, script))
    if made is not None:
        (root / "solution").mkdir()
        solve = root / "solution" / "solve.sh"
        solve.write_text(_solve_sh(made))
        solve.chmod(0o755)
    _check(root)
    return HarborTask(root, scenario, made)


def _check(root: Path) -> None:
    """Harbor's own models must accept what was written (``ValueError`` otherwise)."""
    from harbor.models.task.config import TaskConfig

    try:
        TaskConfig.model_validate_toml((root / "task.toml").read_text())
    except Exception as exc:
        raise ValueError(f"the written task.toml is not a valid Harbor task: {exc}") from exc


__all__ = ["HarborTask", "ScriptedSolution", "export_harbor_task", "scripted_solution"]
