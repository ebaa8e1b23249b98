"""Test helpers for the agent surfaces: uvicorn serving an ASGI app on loopback, in a thread."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import sys
from typing import Any, Iterator

from rsigym_env.serving.asgi import ThreadedASGIServer


@contextlib.contextmanager
def serve_in_thread(app: Any, *, timeout_s: float = 10.0) -> Iterator[str]:
    """Serve ``app`` with uvicorn on 127.0.0.1 (a free port, lifespan on, websockets); yield its base URL."""
    server = ThreadedASGIServer(app, name="test-uvicorn", lifespan="on", ws="websockets-sansio", graceful_s=1)
    server.start(timeout_s)
    try:
        yield server.url
    finally:
        server.stop()


def oldest_python() -> str:
    """The oldest Python >= 3.8 on this machine (the client promises 3.8), else this one."""
    found = []
    candidates = [shutil.which(n) for n in ("python3.8", "python3.9", "python3.10")]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.*/bin/python3")))
    for exe in filter(None, candidates):
        done = subprocess.run([exe, "-c", "import sys; print(*sys.version_info[:2], sys.executable)"],
                              capture_output=True, text=True)
        if done.returncode == 0 and done.stdout.strip():
            major, minor, path = done.stdout.split(maxsplit=2)
            if (int(major), int(minor)) >= (3, 8):
                found.append(((int(major), int(minor)), path.strip()))
    return min(found)[1] if found else sys.executable


def listening_url(proc: subprocess.Popen, timeout_s: float) -> str | None:
    """The URL an ``rsigym serve`` child prints on its "listening on URL" line (None if it did not
    say so before ``timeout_s`` or before its output ended)."""
    import time

    deadline = time.monotonic() + timeout_s
    for line in proc.stdout:  # type: ignore[union-attr]
        if "listening on" in line:
            return line.rsplit(" ", 1)[1].strip()
        if time.monotonic() > deadline:
            return None
    return None
