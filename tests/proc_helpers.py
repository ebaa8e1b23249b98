"""The host's view of a process tree, from ``/proc`` (``tests/security``)."""

from __future__ import annotations

import os
from pathlib import Path


def process_tree(pid: int) -> set[int]:
    """``pid`` and every live process below it, from each ``/proc/<pid>/stat``'s parent id."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    found, stack = set(), [pid]
    while stack:
        p = stack.pop()
        found.add(p)
        stack.extend(children.get(p, []))
    return found
