"""A bubblewrap Harbor environment whose agent-phase commands share one long-lived sandbox.

:class:`~rsigym_env.worlds.local.harbor.environment.BubblewrapEnvironment` runs every ``exec`` in a fresh
sandbox with its own PID namespace and ``/tmp``, so nothing a command starts outlives it. Harbor's
terminus-2 agent needs the opposite: it starts a tmux server in one ``exec`` and drives it with
``tmux send-keys`` / ``capture-pane`` in the next ones, as a container would allow. This subclass
adds exactly that, for the **agent phase only**:

* the first agent-phase ``exec`` starts a *session*: one sandbox (the same mounts, limits, network
  and sandbox group as any agent-phase command) running a small stdlib command server that connects
  back to a unix socket the host listens on (host-owned, mounted read-only at
  :data:`SESSION_SOCKET`, so nothing in the sandbox can redirect the host to another socket);
* every later agent-phase ``exec`` is a ``/bin/sh -c`` child of that server: a tmux server, ``/tmp``
  and shell state persist between commands (a session whose mounts became stale — ``/solution``
  uploaded by Harbor's oracle — is replaced by a new one);
* the session is killed — and with it every process the agent left — as soon as the agent phase
  ends: when Harbor uploads the agent logs back (``/logs/agent``, right after the agent's run in
  Harbor 0.25), when anything is uploaded under ``/tests`` (the verifier phase) and at ``stop()``.
  From then on every command is a fresh sandbox again, exactly as in the parent class.

Use it where the parent is used::

    EnvironmentConfig(import_path="rsigym_env.gateway.harbor_session_env:SessionBubblewrapEnvironment",
                      kwargs={"network": True})

The sandbox needs ``python3`` on its ``PATH`` (the host's ``/usr`` is shown read-only). Only
single-step tasks keep their session across the agent phase (a multi-step trial uploads the agent
logs between steps, which ends the session; the next step gets a new one).

>>> SESSION_SOCKET
'/run/rsigym/session.sock'
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from harbor.environments.base import ExecResult

from ..worlds.local.sandbox import isolation
from ..worlds.local.harbor.environment import BubblewrapEnvironment, sandbox_path_parts, scrub
from ..worlds.local.sandbox.isolation import Limits, Mount

SESSION_SOCKET = "/run/rsigym/session.sock"
SESSION_IMPORT_PATH = "rsigym_env.gateway.harbor_session_env:SessionBubblewrapEnvironment"
_CONNECT_TIMEOUT_S = 20.0
_REPLY_GRACE_S = 15.0
_MAX_LINE = 16 << 20

# The command server, run by the sandbox's python3 (stdlib only, Python >= 3.8). It reads one JSON
# request per line ({"id", "command", "cwd", "env", "timeout"}), runs each command in its own session
# and process group, keeps at most CAP bytes of each stream, and answers {"id", "rc", "out", "err",
# "timed_out"}. A command that times out has its whole process group killed (exit code 124).
SERVER = r'''
import json, os, signal, socket, subprocess, sys, threading
path, cap = sys.argv[1], int(sys.argv[2])
conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
conn.connect(path)
lock = threading.Lock()
def send(obj):
    data = (json.dumps(obj) + "\n").encode()
    with lock:
        conn.sendall(data)
def drain(stream, keep):
    n = 0
    while True:
        chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
        if not chunk:
            return
        if n < cap:
            keep.append(chunk[:cap - n])
            n += len(keep[-1])
def run(req):
    env = dict(os.environ)
    env.update(req.get("env") or {})
    try:
        p = subprocess.Popen(["/bin/sh", "-c", req["command"]], cwd=req.get("cwd") or "/app", env=env,
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             start_new_session=True)
    except OSError as exc:
        send({"id": req["id"], "rc": 127, "out": "", "err": "%s: %s\n" % (type(exc).__name__, exc), "timed_out": False})
        return
    out, err = [], []
    readers = [threading.Thread(target=drain, args=(p.stdout, out), daemon=True),
               threading.Thread(target=drain, args=(p.stderr, err), daemon=True)]
    for t in readers:
        t.start()
    timed_out = False
    try:
        rc = p.wait(timeout=req.get("timeout"))
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        rc = p.wait()
    for t in readers:
        t.join(2.0)  # a background child that kept the pipes open does not hold the reply back
    rc = 124 if timed_out else (128 - rc if rc < 0 else rc)
    send({"id": req["id"], "rc": rc, "out": b"".join(out).decode("utf-8", "replace"),
          "err": b"".join(err).decode("utf-8", "replace"), "timed_out": timed_out})
for line in conn.makefile("rb"):
    threading.Thread(target=run, args=(json.loads(line),), daemon=True).start()
'''


class SessionBubblewrapEnvironment(BubblewrapEnvironment):
    """:class:`BubblewrapEnvironment` with one persistent sandbox for the agent phase (see the module docstring).

    Extra keyword (``EnvironmentConfig.kwargs``): ``session_wall_s`` — the longest a session may live
    (default 7 days, Harbor's longest agent timeout for a research run); it is killed then.
    """

    def __init__(self, *args: Any, session_wall_s: float = 7 * 24 * 3600.0, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._session_wall_s = float(session_wall_s)
        self._session: isolation.IsolatedProcess | None = None
        self._session_server: asyncio.AbstractServer | None = None
        self._session_dir: Path | None = None
        self._session_writer: asyncio.StreamWriter | None = None
        self._session_reader_task: asyncio.Task[None] | None = None
        self._session_pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._session_ids = itertools.count(1)
        self._session_start_lock = asyncio.Lock()
        self._session_mounts: list[tuple[str, str, bool]] | None = None
        self._agent_phase_over = False

    # ---- the session ------------------------------------------------------------------------------

    @property
    def session_alive(self) -> bool:
        """True while an agent-phase session sandbox runs."""
        return self._session is not None and self._session.running and self._session_writer is not None

    async def _start_session(self) -> None:
        self._session_dir = Path(tempfile.mkdtemp(prefix="rsigym-se-"))  # short: unix socket paths are limited
        socket_path = self._session_dir / "s.sock"
        connected: asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = \
            asyncio.get_running_loop().create_future()

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            if connected.done():  # one connection per session: anything later is turned away
                writer.close()
                return
            connected.set_result((reader, writer))

        self._session_server = await asyncio.start_unix_server(accept, path=str(socket_path), limit=_MAX_LINE)
        os.chmod(socket_path, 0o666)  # the sandbox's own uid must be able to connect
        base = self._limits
        limits = Limits(wall_s=self._session_wall_s, cpu_s=base.cpu_s, memory_mb=base.memory_mb,
                        processes=base.processes, output_bytes=1 << 16, file_mb=base.file_mb)
        self._session_mounts = self._mount_key()
        mounts = self._with_skeleton([*self._mounts_now(), Mount(socket_path, SESSION_SOCKET)])
        self._session = await isolation.IsolatedProcess.start(
            ["python3", "-I", "-c", SERVER, SESSION_SOCKET, str(base.output_bytes)], workdir=self.app_dir,
            cwd=self.task_env_config.workdir or isolation.APP, mounts=mounts, env=self._merge_env(None),
            network=self.network_enabled, limits=limits, require_isolation=self._require_isolation, group=self.group)
        waiter = asyncio.ensure_future(self._session.wait())
        try:
            done, _ = await asyncio.wait({connected, waiter}, timeout=_CONNECT_TIMEOUT_S,
                                         return_when=asyncio.FIRST_COMPLETED)
            if connected not in done:
                why = (waiter.result().stderr[-500:] if waiter in done else f"no connection in {_CONNECT_TIMEOUT_S:g} s")
                raise RuntimeError(f"the agent-phase session sandbox did not start (python3 needed inside): {why}")
        except BaseException:
            waiter.cancel()
            await self._end_session()
            raise
        reader, self._session_writer = connected.result()
        self._session_reader_task = asyncio.ensure_future(self._read_replies(reader))

    async def _read_replies(self, reader: asyncio.StreamReader) -> None:
        try:
            while line := await reader.readline():
                try:
                    reply = json.loads(line)
                    future = self._session_pending.pop(int(reply["id"]), None)
                except (ValueError, KeyError, TypeError):
                    continue  # the sandbox's side is untrusted: a bad line is dropped
                if future is not None and not future.done():
                    future.set_result(reply)
        except (ConnectionError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            for future in self._session_pending.values():
                if not future.done():
                    future.set_exception(ConnectionError("the agent-phase session ended"))
            self._session_pending.clear()
            self._session_writer = None

    async def _end_session(self) -> None:
        """Kill the session sandbox and everything in it; later commands are fresh sandboxes."""
        session, self._session = self._session, None
        if session is not None:
            session.kill()
            try:
                await asyncio.wait_for(session.wait(), 10)
            except (asyncio.TimeoutError, Exception):  # noqa: BLE001 - it is killed; do not hang the trial
                pass
        if self._session_writer is not None:
            self._session_writer.close()
            self._session_writer = None
        if self._session_reader_task is not None:
            self._session_reader_task.cancel()
            self._session_reader_task = None
        if self._session_server is not None:
            self._session_server.close()
            self._session_server = None
        if self._session_dir is not None:
            shutil.rmtree(self._session_dir, ignore_errors=True)
            self._session_dir = None

    def _mount_key(self) -> list[tuple[str, str, bool]]:
        return [(str(m.host), m.target, m.writable) for m in self._mounts_now()]

    def _in_session(self) -> bool:
        return not (self._verifying or self._agent_phase_over or self.record is None)

    # ---- Harbor's interface -----------------------------------------------------------------------

    async def exec(self, command: str, cwd: str | None = None, env: dict[str, str] | None = None,
                   timeout_sec: int | float | None = None, user: str | int | None = None) -> ExecResult:
        """In the agent phase: run ``command`` in the session; afterwards as the parent does."""
        if not self._in_session():
            return await super().exec(command, cwd=cwd, env=env, timeout_sec=timeout_sec, user=user)
        fast = self._on_host(command)
        if fast is not None:
            return fast
        async with self._session_start_lock:
            if not self.session_alive or self._session_mounts != self._mount_key():
                await self._end_session()  # gone, or its mounts are stale (e.g. Harbor's oracle uploaded /solution)
                await self._start_session()
        assert self.record is not None
        timeout = float(timeout_sec) if timeout_sec is not None else self._limits.wall_s
        request_id = next(self._session_ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._session_pending[request_id] = future
        where = cwd or self.task_env_config.workdir or isolation.APP
        request = {"id": request_id, "command": command, "env": self._merge_env(env) or {}, "timeout": timeout,
                   "cwd": os.path.normpath(where if where.startswith("/") else f"{isolation.APP}/{where}")}
        started = time.monotonic()
        try:
            writer = self._session_writer
            if writer is None:
                raise ConnectionError("the session closed")
            writer.write(json.dumps(request).encode() + b"\n")
            await writer.drain()
            reply = await asyncio.wait_for(future, timeout + _REPLY_GRACE_S)
        except (asyncio.TimeoutError, ConnectionError) as exc:
            self._session_pending.pop(request_id, None)
            await self._end_session()  # a session that stopped answering is not trusted with more commands
            reply = {"rc": 124 if isinstance(exc, asyncio.TimeoutError) else 1, "out": "", "timed_out": True,
                     "err": f"[session] the agent-phase session did not answer ({type(exc).__name__})\n"}
        duration = time.monotonic() - started
        self.record.commands += 1
        self.record.command_seconds += duration
        self.record.timed_out += int(bool(reply.get("timed_out")))
        for d in self._log_dirs.values():
            scrub(d)
        rc = reply.get("rc")
        return ExecResult(stdout=str(reply.get("out", "")), stderr=str(reply.get("err", "")),
                          return_code=rc if isinstance(rc, int) and not isinstance(rc, bool) else 1)

    async def _note_upload(self, target: str) -> None:
        top = sandbox_path_parts(target)[:2]
        if top[:1] == ("tests",) or top == ("logs", "agent"):
            self._agent_phase_over = True  # Harbor uploads the agent logs back once the agent's run is over
            await self._end_session()
        await super()._note_upload(target)

    async def stop(self, delete: bool) -> None:
        await self._end_session()
        await super().stop(delete)


__all__ = ["SESSION_IMPORT_PATH", "SESSION_SOCKET", "SessionBubblewrapEnvironment"]
