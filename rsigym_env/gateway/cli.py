"""``rsigym serve``, ``rsigym skills``, ``rsigym export atif`` and ``rsigym export harbor``: the gateway's subcommands.

``register(subparsers)`` adds them to ``rsigym``'s parser (each with ``func(args, console)``);
``register_mcp`` and ``register_openenv`` add ``rsigym mcp`` and ``rsigym openenv``, whose servers
(the ``mcp`` SDK alone takes ~1 s to import) load only when those commands run;
``python -m rsigym_env.gateway.cli`` runs them on their own::

    rsigym serve [--host 127.0.0.1] [--port 8765] [--admin-token-file F] [--state-dir DIR] [--ray ADDRESS]
    rsigym skills --out DIR            rsigym skills --check DIR
    rsigym export atif RUN_DIR [--out trajectory.json]
    rsigym export harbor --scenario NAME --out DIR [--seed N | --no-solution]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

from rich.console import Console

from ..home import state_dir
from .local_runs import add_mcp_arguments, add_openenv_arguments


def _home() -> Path:
    return state_dir()


def _admin_token(args: argparse.Namespace, state_dir: Path, console: Console) -> str | None:
    """The admin token from ``--admin-token-file``, or a new one written to ``<state>/admin-token`` (0600)."""
    from .auth import new_admin_token, read_token_file, write_token_file

    if args.admin_token_file:
        try:
            token, warning = read_token_file(args.admin_token_file)
        except ValueError as exc:
            console.print(f"[red]error:[/] {exc}", highlight=False)
            return None
        if warning:
            console.print(f"[yellow]warning:[/] {warning}", highlight=False)
        return token
    path = state_dir / "admin-token"
    state_dir.mkdir(parents=True, exist_ok=True)
    token = new_admin_token()
    write_token_file(path, token)
    console.print(f"admin token (new): {path}")
    return token


def serve_app(service: Any, *, watch: bool = False, **watch_options: Any) -> Any:
    """The ASGI app ``rsigym serve`` runs: REST, MCP over streamable HTTP at ``/mcp`` (the same run keys)
    and, with ``watch``, the dashboard at ``/watch`` (the admin token sees every run, a run key its own
    run, redacted; anything else is 401: :mod:`rsigym_env.watch.auth`)."""
    from .mcp_server import mcp_http_app
    from .rest import create_app

    mcp_app = mcp_http_app(service.backend_for_key)
    mounts: dict[str, Any] = {"/mcp": mcp_app}
    if watch:
        from ..watch.app import create_app as watch_app
        from ..watch.auth import WatchAuth
        from ..watch.catalog import ServiceSource

        mounts["/watch"] = watch_app([service.runs_dir], live=ServiceSource(service), auth=WatchAuth.for_service(service),
                                     **watch_options)
    return create_app(service, mounts=mounts, lifespan=lambda _: mcp_app.lifespan())


def cmd_serve(args: argparse.Namespace, console: Console) -> int:
    """Run the session service until SIGINT/SIGTERM; open sim runs resume when it starts again."""
    from ..serving.listen import bind, is_loopback, url_of, uvicorn_server
    from .service import SessionService

    if not is_loopback(args.host) and not (args.allow_remote and args.admin_token_file):
        console.print(f"[red]error:[/] {args.host} is not a loopback address: serving beyond this machine needs "
                      "--allow-remote and --admin-token-file (and a TLS-terminating proxy in front)")
        return 2
    if args.watch and not is_loopback(args.host):
        console.print("[red]error:[/] --watch serves the dashboard over plain HTTP: only on a loopback --host")
        return 2
    state_dir = Path(args.state_dir or _home() / "gateway")
    token = _admin_token(args, state_dir, console)
    if token is None:
        return 2
    try:
        sock = bind(args.host, args.port)
    except OSError as exc:
        console.print(f"[red]error:[/] cannot listen on {args.host}:{args.port}: {exc}")
        return 2
    try:
        service = SessionService(state_dir, admin_token=token, idle_timeout_s=args.idle_timeout,
                                 max_active_runs=args.max_runs, ray_address=args.ray)
    except (OSError, ValueError, ConnectionError, RuntimeError) as exc:
        sock.close()
        console.print(f"[red]error:[/] the service could not start: {type(exc).__name__}: {exc}")
        return 2
    runs = service.list_runs()
    states = {s: sum(1 for r in runs if r["state"] == s) for s in ("active", "done", "closed", "interrupted")}
    app = serve_app(service, watch=args.watch)
    server = uvicorn_server(app, args.log_level)
    console.print(f"state {state_dir}: " + ", ".join(f"{n} {s}" for s, n in states.items()), highlight=False)
    print(f"rsigym serve: listening on {url_of(sock)}", flush=True)
    if args.watch:  # the URL without the token itself: the admin token stays out of logs
        token_file = args.admin_token_file or state_dir / "admin-token"
        console.print(f"dashboard: {url_of(sock)}/watch/?token=<the admin token, in {token_file}>", highlight=False)
    try:
        server.run(sockets=[sock])  # handles SIGINT/SIGTERM itself
    finally:
        service.shutdown()
        sock.close()
    return 0


def cmd_skills(args: argparse.Namespace, console: Console) -> int:
    """Write the SKILL.md documents and the standalone client, or check a directory against them."""
    from .skills import check_skills, write_skills

    if args.check:
        problems = check_skills(args.check)
        for problem in problems:
            console.print(f"[red]drift:[/] {problem}", highlight=False)
        if not problems:
            console.print(f"[green]{args.check} matches the tool models[/]")
        return 1 if problems else 0
    if not args.out:
        console.print("[red]error:[/] give --out DIR (or --check DIR)")
        return 2
    written = write_skills(args.out)
    console.print(f"{len(written)} files under {args.out} (the client: {args.out}/rsigym/scripts/rsigym-call)")
    return 0


def cmd_export_atif(args: argparse.Namespace, console: Console) -> int:
    """Print (or write to ``--out``) the ATIF trajectory of a run directory."""
    from ..atif import export_atif

    try:
        trajectory = export_atif(args.run_dir)
    except (ValueError, OSError) as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2
    text = json.dumps(trajectory.to_json_dict(), indent=1, ensure_ascii=False)
    if args.out:
        Path(args.out).write_text(text + "\n")
        console.print(f"{args.out}: {len(trajectory.steps)} steps, reward {trajectory.final_metrics.extra.get('reward')}")
    else:
        print(text)
    return 0


def cmd_export_harbor(args: argparse.Namespace, console: Console) -> int:
    """Write a Harbor task in which a Harbor agent is the researcher of a run of ``--scenario``."""
    from .harbor_task import export_harbor_task

    try:
        task = export_harbor_task(args.out, args.scenario, seed=None if args.no_solution else args.seed,
                                  solution=not args.no_solution, agent_timeout_s=args.agent_timeout,
                                  verifier_timeout_s=args.verifier_timeout, pip_spec=args.pip_spec)
    except (ValueError, OSError) as exc:
        console.print(f"[red]error:[/] {exc}", highlight=False)
        return 2
    solved = (f"; solution/solve.sh: the scripted researcher's {task.solution.steps} calls (seed {task.solution.seed}, "
              f"normalized gain {task.solution.reward:.4f})" if task.solution else "; no oracle solution")
    console.print(f"{task.path}: Harbor task for {task.scenario}{solved}", highlight=False)
    console.print("run it with RSIGYM_URL and RSIGYM_RUN_KEY set to a fresh run of that scenario (docs/agents.md#harbor)",
                  highlight=False)
    return 0


def run_mcp(args: argparse.Namespace, console: Any = None) -> int:
    """``rsigym mcp`` (:func:`~.mcp_server.cmd_mcp`, imported now)."""
    from .mcp_server import cmd_mcp

    return cmd_mcp(args, console)


def register_mcp(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``rsigym mcp`` to ``rsigym``'s subcommands."""
    parser = subparsers.add_parser(
        "mcp", help="serve a research run to an MCP client over stdio (Claude Code, Codex, Cursor, ...)",
        description="Serve one research run over MCP (stdio): an in-process run from the flags (they win over the "
                    "environment), or, with RSIGYM_URL and RSIGYM_RUN_KEY in the environment and no run flags, a run "
                    "of the session service. A server without a run answers every tool call with the reason.")
    add_mcp_arguments(parser)
    parser.set_defaults(func=run_mcp)
    return parser


def run_openenv(args: argparse.Namespace, console: Any = None) -> int:
    """``rsigym openenv`` (:func:`~.openenv_server.cmd_openenv`, imported now)."""
    from .openenv_server import cmd_openenv

    return cmd_openenv(args, console)


def register_openenv(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``rsigym openenv`` to ``rsigym``'s subcommands."""
    parser = subparsers.add_parser(
        "openenv", help="serve research runs to OpenEnv clients (WebSocket /ws, one run per session)")
    add_openenv_arguments(parser)
    parser.set_defaults(func=run_openenv)
    return parser


def register(subparsers: Any) -> None:
    """Add ``serve``, ``skills`` and ``export`` to ``rsigym``'s subparsers."""
    serve = subparsers.add_parser(
        "serve", help="the session service: many runs over REST, each with its own run key",
        description="Serve research runs over HTTP. POST /v1/runs (admin token) creates a run and answers its run "
                    "key; researchers call POST /v1/tools/<tool> with it (docs/agents.md). Runs live under "
                    "--state-dir; after a restart earlier runs are listed, open sim runs resume, others are "
                    "interrupted with their reservations released.")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; anything but "
                                                            "loopback needs --allow-remote and --admin-token-file)")
    serve.add_argument("--port", type=int, default=8765, help="port (default 8765; 0: any free one, printed)")
    serve.add_argument("--admin-token-file", help="file holding the admin token (default: a new one in "
                                                  "<state-dir>/admin-token)")
    serve.add_argument("--state-dir", help="where runs are kept (default $RSIGYM_HOME/gateway)")
    serve.add_argument("--idle-timeout", type=float, default=1800.0, help="close a run after this many seconds "
                                                                           "without a call (default 1800)")
    serve.add_argument("--max-runs", type=int, default=32, help="open runs at most (default 32)")
    serve.add_argument("--ray", metavar="ADDRESS", help="run each run in a Ray actor: a cluster address, 'auto', "
                                                        "or 'local' to start a Ray here")
    serve.add_argument("--allow-remote", action="store_true", help="allow a non-loopback --host")
    serve.add_argument("--watch", action="store_true", help="also serve the live dashboard of the runs at /watch "
                                                            "(loopback only; open /watch/?token=<admin token>; a run "
                                                            "key sees its own run only)")
    serve.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
    serve.set_defaults(func=cmd_serve)

    skills = subparsers.add_parser("skills", help="write SKILL.md documents (one per tool) and the rsigym-call client")
    skills.add_argument("--out", help="directory to write into")
    skills.add_argument("--check", metavar="DIR", help="compare DIR with a fresh rendering; exit 1 on any difference")
    skills.set_defaults(func=cmd_skills)

    export = subparsers.add_parser("export", help="export a run")
    export_sub = export.add_subparsers(dest="export_command", required=True)
    atif = export_sub.add_parser("atif", help="a run directory's episode as an ATIF trajectory (Harbor's format)")
    atif.add_argument("run_dir", help="a run directory of `rsigym run` or `rsigym serve` (with steps.jsonl)")
    atif.add_argument("--out", help="write the trajectory here (default: print it)")
    atif.set_defaults(func=cmd_export_atif)
    harbor = export_sub.add_parser("harbor", help="a Harbor task in which a Harbor agent is the researcher of a served run",
                                   description="Write a Harbor task directory: instruction.md (the briefing), the skill "
                                               "documents, an MCP server entry (stdio `rsigym mcp`), [environment.env] "
                                               "with RSIGYM_URL / RSIGYM_RUN_KEY taken from the host when `harbor run` "
                                               "starts, and a verifier that scores the run from the service.")
    harbor.add_argument("--scenario", required=True, help="a bundled scenario (`rsigym scenarios`)")
    harbor.add_argument("--out", required=True, help="the task directory to write (replaced if it exists)")
    harbor.add_argument("--seed", type=int, default=0, help="seed of the runs the oracle's solution is for "
                                                             "(sim scenarios; default 0)")
    harbor.add_argument("--no-solution", action="store_true", help="write no solution/solve.sh")
    harbor.add_argument("--agent-timeout", type=float, default=7 * 24 * 3600.0, help="seconds (default 7 days)")
    harbor.add_argument("--verifier-timeout", type=float, default=1800.0, help="seconds (default 1800)")
    harbor.add_argument("--pip-spec", help="what the Dockerfile installs for `rsigym mcp` "
                                           "(default rsigym-env[agents]==<this version>)")
    harbor.set_defaults(func=cmd_export_harbor)


def main(argv: Sequence[str] | None = None) -> int:
    """The subcommands on their own (``python -m rsigym_env.gateway.cli serve ...``)."""
    parser = argparse.ArgumentParser(prog="rsigym", description="RSIGym gateway commands")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    console = Console() if Console().is_terminal else Console(width=160)
    return int(args.func(args, console))


if __name__ == "__main__":
    sys.exit(main())
