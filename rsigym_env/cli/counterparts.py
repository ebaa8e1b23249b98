"""``rsigym counterparts``: the providers' local counterparts on loopback, until Ctrl-C or SIGTERM.

Prints the ``export`` lines that point the remote world at them (one fresh token unless ``--token``), then
serves; ``--env-file`` also writes them to a file (mode 0600) for another shell to ``source``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import tempfile
import threading
from pathlib import Path
from typing import Any

from rich.console import Console


def cmd_counterparts(args: argparse.Namespace, console: Console) -> int:
    from ..counterparts.stack import Counterparts

    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="rsigym-counterparts-"))
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with Counterparts(root, token=args.token, model_id=args.model_id, base=args.base,
                          benchmark=args.benchmark) as stack:
            lines = [f"export {k}={shlex.quote(v)}" for k, v in stack.environment().items()]
            if args.env_file:
                path = Path(args.env_file)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as fh:
                    fh.write("\n".join(lines) + "\n")
            print("\n".join(lines), flush=True)
            console.print(f"[dim]# counterparts of Tinker ({stack.model_id} served by the local base {args.base}), "
                          f"teachers and E2B on 127.0.0.1, files in {root}; then e.g.\n"
                          "#   rsigym run --scenario remote-counterparts-aime --dry-run\n"
                          "# Ctrl-C or SIGTERM stops them.[/]", highlight=False)
            while not stop.wait(1.0):
                pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    console.print("[dim]# counterparts stopped[/]")
    return 0


def register(sub: Any) -> None:
    """Add this module's command(s) to ``rsigym``'s subparsers."""
    from ..counterparts import DEFAULT_BASE, DEFAULT_BENCHMARK, DEFAULT_MODEL_ID  # constants only: nothing loads

    p = sub.add_parser("counterparts", help="serve local counterparts of Tinker, the teachers' endpoint and E2B "
                                            "(the remote world offline), printing the variables to export")
    p.add_argument("--token", help="the shared secret (default: a fresh random one)")
    p.add_argument("--model-id", default=DEFAULT_MODEL_ID, help="the Tinker model id the local base answers as")
    p.add_argument("--base", default=DEFAULT_BASE, help="the local base model served under it")
    p.add_argument("--benchmark", default=DEFAULT_BENCHMARK, help="whose local tasks RSIGYM_REMOTE_TASKS holds")
    p.add_argument("--dir", help="where their files live (default: a new temporary directory)")
    p.add_argument("--env-file", help="also write the export lines to this file (0600)")
    p.set_defaults(func=cmd_counterparts)
