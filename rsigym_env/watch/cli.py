"""``rsigym watch``: serve the dashboard over run and sweep directories (and a session service's runs).

``register(subparsers)`` adds it to ``rsigym``'s parser (``func(args, console)``);
``python -m rsigym_env.watch.cli`` runs it on its own::

    rsigym watch [DIR ...] [--port 8766] [--host 127.0.0.1] [--stall-after 300] [--token-file F]
                 [--serve-url http://127.0.0.1:8765 --admin-token-file F] [--archives DIR]

The dashboard needs a token (the pages show every run's steps, seeds and paths): ``--token-file``'s, or
the one kept in ``$RSIGYM_HOME/watch-token`` (created 0600 on first use). It prints its URL with
``?token=...``, as Jupyter does: opening it sets a cookie, and the pages need nothing more.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

from rich.console import Console

from .model import STALL_AFTER_S


TOKEN_FILE = "watch-token"
"""The dashboard's token, under ``$RSIGYM_HOME`` (when no ``--token-file`` is given)."""


def dashboard_token(args: argparse.Namespace, console: Console) -> str | None:
    """``--token-file``'s token, or the one in ``$RSIGYM_HOME/watch-token`` (made, 0600, if there is none)."""
    from ..home import state_dir
    from .tokens import load_or_create_token, new_token, read_token_file

    try:
        if args.token_file:
            token, warning = read_token_file(args.token_file)
        else:
            path = state_dir(TOKEN_FILE)
            token, created, warning = load_or_create_token(path, lambda: new_token("rsw_"))
            if created:
                console.print(f"dashboard token (new): {path}", highlight=False)
    except (OSError, ValueError) as exc:
        console.print(f"[red]error:[/] {exc}", highlight=False)
        return None
    if warning:
        console.print(f"[yellow]warning:[/] {warning}", highlight=False)
    return token


def cmd_watch(args: argparse.Namespace, console: Console) -> int:
    """Serve the dashboard until SIGINT/SIGTERM."""
    from ..serving.listen import bind, is_loopback, url_of, uvicorn_server
    from .app import create_app
    from .catalog import URLSource

    if not is_loopback(args.host) and not args.allow_remote:
        console.print(f"[red]error:[/] {args.host} is not a loopback address: the dashboard shows every run's steps, "
                      "seeds and paths to whoever holds its token, over plain HTTP; pass --allow-remote to serve it "
                      "beyond this machine anyway (behind a TLS-terminating proxy)")
        return 2
    token = dashboard_token(args, console)
    if token is None:
        return 2
    dirs = [Path(d) for d in (args.dirs or ["runs"])]
    missing = [str(d) for d in dirs if not d.exists()]
    if missing:
        console.print(f"[yellow]warning:[/] not there (yet): {', '.join(missing)}; watched as they appear")
    live = None
    if args.serve_url:
        if not args.admin_token_file:
            console.print("[red]error:[/] --serve-url needs --admin-token-file (GET /v1/runs is an admin route)")
            return 2
        from .tokens import read_token_file

        try:
            service_token, _ = read_token_file(args.admin_token_file)
        except ValueError as exc:
            console.print(f"[red]error:[/] {exc}", highlight=False)
            return 2
        live = URLSource(args.serve_url, service_token)
    try:
        sock = bind(args.host, args.port)
    except OSError as exc:
        console.print(f"[red]error:[/] cannot listen on {args.host}:{args.port}: {exc}")
        return 2
    app = create_app(dirs, stall_after_s=args.stall_after, live=live, admin_token=token, archives=args.archives)
    server = uvicorn_server(app, args.log_level)
    server.config.timeout_graceful_shutdown = 1  # live pages hold streams open: do not wait for them
    console.print(f"watching {', '.join(map(str, dirs))}" + (f" and the runs of {args.serve_url}" if live else ""),
                  highlight=False)
    print(f"rsigym watch: {url_of(sock)}/?token={token}", flush=True)  # as Jupyter: open it once, a cookie does the rest
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    return 0


def register(subparsers: Any) -> None:
    """Add ``watch`` to ``rsigym``'s subparsers."""
    watch = subparsers.add_parser(
        "watch", help="a live web dashboard of run directories and sweeps",
        description="Serve a web page over run directories of `rsigym run` and `rsigym serve` and sweep output "
                    "directories (results.json): the runs list, each run's steps, spend, dev scores, jobs, datasets, "
                    "harness versions and result, each sweep's Figure-2 table and curves. Pages update live. Every "
                    "page needs the dashboard's token: open the URL printed at start (it ends in ?token=...) once.")
    watch.add_argument("dirs", nargs="*", metavar="DIR", help="run directories, sweep directories or folders holding "
                                                             "them, e.g. runs/ or a service's state dir (default runs/)")
    watch.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    watch.add_argument("--port", type=int, default=8766, help="port (default 8766; 0: any free one, printed)")
    watch.add_argument("--allow-remote", action="store_true", help="allow a non-loopback --host")
    watch.add_argument("--stall-after", type=float, default=STALL_AFTER_S, metavar="SECONDS",
                       help=f"show a running run with no step for this long as stalled (default {STALL_AFTER_S:g})")
    watch.add_argument("--token-file", help="the dashboard's token (default: $RSIGYM_HOME/watch-token, created 0600 "
                                            "on first use); the URL printed at start carries it")
    watch.add_argument("--serve-url", help="also list the live runs of `rsigym serve` at this URL")
    watch.add_argument("--admin-token-file", help="the service's admin token (with --serve-url)")
    watch.add_argument("--archives", metavar="DIR", help="the folder of archives of candidate researchers the "
                                                         "lineage pages show (default: $RSIGYM_HOME/archives)")
    watch.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
    watch.set_defaults(func=cmd_watch)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m rsigym_env.watch.cli [DIR ...]``."""
    parser = argparse.ArgumentParser(prog="rsigym", description="RSIGym watch")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["watch", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args, Console()))


if __name__ == "__main__":
    sys.exit(main())
