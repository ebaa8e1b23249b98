"""Which process owns something, and whether it still runs: for state a crash could leave behind.

A reservation on the ledger or a sandbox's cgroup and tmpfs records its :class:`Owner`; whoever
finds it later asks :func:`owner_status` whether that owner is gone (then it may be settled or
cleaned up) or still alive (then it is left alone).

>>> owner_status(current_owner())
'alive'
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Literal

OwnerStatus = Literal["alive", "gone", "other_host", "other_pid_namespace", "unknown"]
"""Whether a reservation's owner still runs: ``gone`` is settled by recovery; ``other_host``,
``other_pid_namespace`` and ``unknown`` (no owner recorded, or not checkable from here) are left alone."""


@dataclass(frozen=True)
class Owner:
    """The process that made a reservation.

    ``start`` is its start time in clock ticks after boot (``/proc/<pid>/stat`` field 22), so a pid
    reused by a younger process is not mistaken for it; ``boot_id`` is
    ``/proc/sys/kernel/random/boot_id``; ``pid_ns`` names its pid namespace (``pid:[4026531836]``).
    """

    pid: int
    start: int | None
    boot_id: str | None
    host: str
    pid_ns: str | None


_BOOT_ID: list[str | None] = []  # read once per process tree: a fork does not change it
_OWNER: Owner | None = None  # this process, computed once per pid


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip() or None
    except OSError:
        return None


def _proc_stat(pid: int | str) -> tuple[str, int] | None:
    """``(state, start time in ticks)`` from ``/proc/<pid>/stat``, or ``None`` if there is no such entry."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        fields = data[data.rindex(b")") + 2:].split()  # the command name may hold spaces and parentheses
        return fields[0].decode(), int(fields[19])  # fields 3 (state) and 22 (starttime)
    except (OSError, ValueError, IndexError):
        return None


def current_owner() -> Owner:
    """This process as a reservation owner (cached per pid, so it is right again after a fork)."""
    global _OWNER
    pid = os.getpid()
    owner = _OWNER
    if owner is None or owner.pid != pid:
        if not _BOOT_ID:
            _BOOT_ID.append(_read_text("/proc/sys/kernel/random/boot_id"))
        stat = _proc_stat("self")
        try:
            pid_ns: str | None = os.readlink("/proc/self/ns/pid")
        except OSError:
            pid_ns = None
        owner = _OWNER = Owner(pid, stat[1] if stat else None, _BOOT_ID[0], socket.gethostname(), pid_ns)
    return owner


def owner_status(owner: Owner | None) -> OwnerStatus:
    """Whether ``owner`` still runs, as far as this process can tell.

    ``gone``: same host and boot, and its pid is dead, a zombie or now a process with another start
    time; or same host and a different boot id. ``other_host`` / ``other_pid_namespace``: not
    visible from here. ``unknown``: no owner recorded, or its pid exists but cannot be inspected.

    >>> owner_status(current_owner()), owner_status(None)
    ('alive', 'unknown')
    """
    if owner is None:
        return "unknown"
    me = current_owner()
    if owner.host != me.host:
        return "other_host"
    if owner.boot_id and me.boot_id and owner.boot_id != me.boot_id:
        return "gone"  # the machine rebooted since: every process of that boot is gone
    if owner.pid_ns and me.pid_ns and owner.pid_ns != me.pid_ns:
        return "other_pid_namespace"
    if owner.pid <= 0:
        return "unknown"
    stat = _proc_stat(owner.pid)
    if stat is None:
        try:
            os.kill(owner.pid, 0)  # signal 0: only asks whether the pid exists
        except ProcessLookupError:
            return "gone"
        except OSError:
            return "unknown"
        return "unknown"  # it exists, but /proc does not show it (hidepid, no /proc): cannot check its age
    state, start = stat
    if state in ("Z", "X"):  # dead, not yet reaped
        return "gone"
    if owner.start is None or me.start is None:
        return "unknown"
    return "alive" if start == owner.start else "gone"
