"""Sampling from the local world's models in worker processes, so evaluations use every core.

An evaluation's trials ask the model for a reply several times each; in one process those requests
queue behind one another and behind Harbor's own work (one GIL). :class:`InferencePool` runs them in
``workers`` processes instead, each with its own copy of the weights (the base model and the
checkpoints, read from the run's ``tinker`` directory on first use). A worker runs exactly the code
the in-process sampler runs, on the same inputs, with one BLAS thread: the same tokens come back
for the same request and seed, whichever worker serves it.

:meth:`InferencePool.client` gives an object with the sampling client's interface (``sample(...)``
returns a future of a ``tinker.types.SampleResponse``; ``get_tokenizer()``), which
:func:`~.chat.chat_model` serves like any other. Base models registered with a callable (tests'
in-memory models) are not poolable: :meth:`poolable` says so and the caller samples in-process.

Prefills are shared here, not per worker: a request with a ``prefill_scope`` (the local world: one
per evaluation) carries the prefill blocks of its prompt that the pool holds in that scope (the keys
and values of a beginning it has seen: :class:`~.model.PrefillCache`; the samples are the same) to
whichever worker serves it, and the worker sends back the blocks it computed. So the k attempts at a
task share their first prompt, and each turn of a conversation computes only what the turn before
did not (its reply, the command's output, the next prompt's header).

A worker sends a scoped request's new blocks back as soon as its prompt is prefilled, before it
decodes (a frame of its own), and the requests waiting for that prompt (the other attempts at a task
start with the same one) are dispatched then: they wait for the prefill, not for the whole reply.

A worker also keeps the blocks it computed or was sent (up to ``worker_block_bytes``, least recently
used first out), and the pool keeps a record of which: a block the serving worker holds is named, not
sent (a conversation's earlier turns are megabytes of keys and values that were pickled and piped to a
worker on every turn). The pool decides what each worker forgets (the request carries it), so its record
is the worker's store; a block named but not found is computed again, with the same floats.

>>> pool = InferencePool(Path("/nonexistent"), workers=1)
>>> pool.poolable("rsigym-base"), pool.poolable("no-such-model")
(True, False)
>>> pool.close()
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable

from . import tinker_client
from .model import PrefillCache, prefill_ends

# in each worker: the service clients (one per run directory) and the sampling clients they made
_SERVICES: dict[str, Any] = {}
_CLIENTS: dict[tuple[str, str | None, str | None], Any] = {}
_CLIENTS_MAX = 8
_HELD: dict[int, Any] = {}  # in each worker: the prefill blocks it keeps, by the pool's number for them
WORKER_BLOCK_BYTES = 96 << 20
"""How many bytes of prefill blocks each worker keeps by default (the pool's shared store holds 192 MB)."""


def _sample(root: str, bases: dict[str, str], model_path: str | None, base_model: str | None,
            tokens: list[int], num_samples: int, params: dict[str, Any], scope: str | None = None,
            blocks: list[tuple[int, int, Any]] = (), drop: list[int] = (),
            keep: dict[int, int] | None = None, *,
            early: Callable[[Any], None] | None = None) -> tuple[str, Any] | tuple[str, Any, Any]:
    """Run one request in a worker: ``("ok", SampleResponse)`` or ``("error", (class name, message))``;
    with a ``scope``, ``("ok", SampleResponse, new blocks)``. A block is ``(keys, values, logits)``, the
    prompt's prefill block ending at ``end``: ``blocks`` are ``(end, number, block)``, kept under their
    number, or ``(end, number, None)`` for one kept before; then the numbers in ``drop`` are forgotten (the
    pool's record of this store says so); the new blocks come back as ``(end, block)``, kept under
    ``keep[end]``. With ``early``, the new blocks are handed to it as ``("blocks", new blocks)`` the moment
    the prompt is prefilled (before decoding), and the answer then carries none."""
    from tinker import types

    given: dict[int, Any] = {}
    for end, number, block in blocks:
        if block is None:
            block = _HELD.get(number)  # (never missing by construction; if it were, it is computed again)
        else:
            _HELD[number] = block
        if block is not None:
            given[end] = block
    for number in drop:  # last: the store is now what the pool's record of it says
        _HELD.pop(number, None)
    try:
        tinker_client.register_bases(bases)
        service = _SERVICES.get(root)
        if service is None:
            service = _SERVICES[root] = tinker_client.LocalServiceClient(root_dir=root)
        key = (root, model_path, base_model)
        client = _CLIENTS.get(key)
        if client is None:
            if len(_CLIENTS) >= _CLIENTS_MAX:
                _CLIENTS.pop(next(iter(_CLIENTS)))
            client = _CLIENTS[key] = service.create_sampling_client(model_path=model_path, base_model=base_model).result()
        if scope is None:
            return "ok", client.sample(types.ModelInput.from_ints(tokens), num_samples,
                                       types.SamplingParams(**params)).result()
        identity = (client.prefill_identity, scope)
        carrier = _Carrier(identity, tokens, given, early)  # this request's prefill blocks, in and out
        response = client.sample_scoped(types.ModelInput.from_ints(tokens), num_samples, types.SamplingParams(**params),
                                        scope, prefill_cache=carrier).result()
        computed = carrier.new_blocks()
        new = [] if carrier.handed else computed  # handed early: already sent
        for end, block in computed:
            if keep and end in keep:
                _HELD[keep[end]] = block
        return "ok", response, new
    except Exception as exc:  # noqa: BLE001 - raised again in the caller, by kind
        return "error", (type(exc).__name__, str(exc))


class _Carrier(PrefillCache):
    """One request's prefill blocks in a worker: the ones it was given, then the ones its prefill computes.
    When the last block the prompt lacked is put (its prefill is done; decoding has not begun), the new
    blocks go to ``early`` at once, so the requests waiting for this prompt need not wait for the reply."""

    def __init__(self, identity: Any, tokens: list[int], given: dict[int, Any],
                 early: Callable[[Any], None] | None):
        super().__init__(max_bytes=1 << 40)
        self.identity, self.tokens, self.early, self.handed = identity, tokens, early, False
        self.ends = [end for end in prefill_ends(len(tokens)) if end not in given]  # what the prefill computes
        self.missing = set(self.ends)
        for end, block in given.items():
            super().put((identity, tuple(tokens[:end])), *block)

    def new_blocks(self) -> list[tuple[int, Any]]:
        """The blocks computed here, as ``(end, block)``."""
        return [(end, block) for end in self.ends if (block := self.get((self.identity, tuple(self.tokens[:end])))) is not None]

    def put(self, key: Any, k: list[Any], v: list[Any], logits: Any) -> None:
        super().put(key, k, v, logits)
        self.missing.discard(len(key[1]))
        if not self.missing and self.early is not None and not self.handed:
            self.handed = True
            self.early(("blocks", self.new_blocks()))


def _raise(kind: str, message: str) -> None:
    from .model import ContextOverflowError

    known = {"ContextOverflowError": ContextOverflowError,
             "CheckpointNotFoundError": tinker_client.CheckpointNotFoundError,
             "UnknownModelError": tinker_client.UnknownModelError}
    raise known.get(kind, RuntimeError)(message if kind in known else f"{kind}: {message}")


class _Response:
    """The future :meth:`PooledSamplingClient.sample` returns (``result()`` as Tinker's ``APIFuture``)."""

    def __init__(self, future: cf.Future):
        self._future = future

    def result(self, timeout: float | None = None) -> Any:
        status, value = self._future.result(timeout)[:2]
        if status != "ok":
            _raise(*value)
        return value


class PooledSamplingClient:
    """A sampling client whose requests run in the pool's workers (see the module docstring)."""

    supports_prefill_scope = True

    def __init__(self, pool: "InferencePool", model_path: str | None, base_model: str | None, tokenizer: Any):
        self.pool, self.model_path, self.base_model, self.tokenizer = pool, model_path, base_model, tokenizer

    def sample(self, prompt: Any, num_samples: int, sampling_params: Any, **unsupported: Any) -> _Response:
        return self.sample_scoped(prompt, num_samples, sampling_params, None, **unsupported)

    def sample_scoped(self, prompt: Any, num_samples: int, sampling_params: Any, prefill_scope: str | None,
                      **unsupported: Any) -> _Response:
        """:meth:`sample`; requests with the same ``prefill_scope`` share prefills (module docstring)."""
        if any(unsupported.values()):
            raise NotImplementedError("a pooled sampler returns sequences only (no prompt or top-k logprobs)")
        params = sampling_params.model_dump(exclude_none=True)
        return _Response(self.pool.submit(self.model_path, self.base_model, prompt.to_ints(), num_samples, params,
                                          scope=prefill_scope))

    def get_tokenizer(self) -> Any:
        return self.tokenizer


def _block_bytes(block: Any) -> int:
    keys, values, logits = block
    return sum(a.nbytes for a in keys) + sum(a.nbytes for a in values) + logits.nbytes


class _Worker:
    """One worker process (``python -m rsigym_env.worlds.local.lm.inference_pool``) and the thread that
    feeds it requests from the pool's queue: pickled frames over its stdin and stdout. ``held`` is the
    record of the prefill blocks the process keeps (block key → (number, bytes), least recently used
    first); ``sent`` and ``named`` count the blocks sent to it and those named because it held them."""

    def __init__(self, pool: "InferencePool", index: int, prestart: bool = False):
        self.pool, self.index, self.prestart = pool, index, prestart
        self.proc: subprocess.Popen | None = None
        self.held: OrderedDict[tuple, tuple[int, int]] = OrderedDict()
        self.held_bytes = 0
        self.drop: list[int] = []  # numbers the process is to forget with the next request
        self.numbers = itertools.count()
        self.sent = self.named = 0
        self.thread = threading.Thread(target=self._serve, name=f"rsigym-sampler-{index}", daemon=True)
        self.thread.start()

    def _start(self) -> subprocess.Popen:
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        proc = subprocess.Popen([sys.executable, "-m", "rsigym_env.worlds.local.lm.inference_pool"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        for stream in (proc.stdin, proc.stdout):
            widen_pipe(stream)
        return proc

    def _serve(self) -> None:
        if self.prestart:  # the process imports while this one still starts up (a failure: started at the request)
            try:
                self.proc = self._start()
            except OSError:
                self.proc = None
        while True:
            item = self.pool._queue.get()
            if item is None:
                break
            args, future = item
            try:
                if future.set_running_or_notify_cancel():
                    self._run(args, future)
            finally:
                self.pool._release(future)
        self.stop()

    def _hold(self, key: tuple, number: int, size: int) -> None:
        """Record that the process keeps a block; the least recently used go once over the budget."""
        self.held[key] = (number, size)
        self.held_bytes += size
        while self.held_bytes > self.pool.worker_block_bytes:
            _, (gone, freed) = self.held.popitem(last=False)
            self.held_bytes -= freed
            self.drop.append(gone)

    def _frame(self, args: tuple) -> tuple[tuple, dict[int, int]]:
        """What to send for a request (the pool's arguments: see :meth:`InferencePool.submit`): a scoped
        one's blocks that this process holds are named, not sent, and so is any other block of its prompt
        it holds; its other blocks get numbers to be kept under. Returns the frame and ``keep``."""
        if len(args) < 9:
            return args, {}
        blocks, tokens, out = dict(args[8]), args[4], []
        keep: dict[int, int] = {}
        for end in prefill_ends(len(tokens)):
            key = self.pool.block_key(args, end)
            held = self.held.get(key)
            if held is not None:
                self.held.move_to_end(key)
                out.append((end, held[0], None))
                self.named += 1
            elif end in blocks:
                number = next(self.numbers)
                out.append((end, number, blocks[end]))
                self._hold(key, number, _block_bytes(blocks[end]))
                self.sent += 1
            else:
                keep[end] = next(self.numbers)
        drop, self.drop = self.drop, []
        return args[:8] + (out, drop, keep), keep

    def _run(self, args: tuple, future: cf.Future) -> None:
        for attempt in (1, 2):  # a request is pure: a worker that died is replaced and the request re-sent once
            try:
                if self.proc is None or self.proc.poll() is not None:
                    self.proc = self._start()
                    self.held.clear()  # a new process holds nothing
                    self.held_bytes, self.drop = 0, []
                frame, keep = self._frame(args)
                write_frame(self.proc.stdin, frame)
                answer = read_frame(self.proc.stdout)
                if answer[0] == "blocks":  # the prompt is prefilled: whoever waits for it can go now
                    self._take(args, answer[1], keep)
                    self.pool._release(future)
                    answer = read_frame(self.proc.stdout)
                self._take(args, answer[2] if len(answer) == 3 else (), keep)
                future.set_result(answer[:2])
                return
            except Exception as exc:  # noqa: BLE001 - the pipe broke: the worker died
                self.stop()
                if attempt == 2:
                    future.set_exception(RuntimeError(f"the sampling worker failed twice: {type(exc).__name__}: {exc}"))

    def _take(self, args: tuple, new: Any, keep: dict[int, int]) -> None:
        """New blocks from the process: into the pool's store (later requests may use them), and into
        the record of this process's store where it keeps them."""
        for end, block in new:
            key = self.pool.block_key(args, end)
            self.pool.prefills.put(key, *block)
            if end in keep:
                self._hold(key, keep[end], _block_bytes(block))

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            try:
                proc.stdin.close()  # type: ignore[union-attr]
                proc.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait(5)


PIPE_BYTES = 1 << 20
"""The pipes to and from a worker hold this much (Linux's default 64 KB made a frame of prefill blocks,
~0.2-0.6 MB, cross in a dozen wake-ups of the reader and the writer)."""


def widen_pipe(stream: Any, size: int = PIPE_BYTES) -> int | None:
    """Ask the kernel for a pipe buffer of ``size`` bytes (``fcntl.F_SETPIPE_SZ``) for ``stream``'s pipe;
    returns the size granted, or None where it cannot (not Linux, not a pipe, over the system's limit:
    the pipe stays as it was, which changes nothing but speed).

    >>> import os
    >>> r, w = os.pipe()
    >>> widen_pipe(w, 1 << 16) in (1 << 16, None)
    True
    >>> os.close(r); os.close(w)
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not a POSIX system
        return None
    flag = getattr(fcntl, "F_SETPIPE_SZ", None)
    try:
        fd = stream if isinstance(stream, int) else stream.fileno()
        return None if flag is None else fcntl.fcntl(fd, flag, size)
    except (OSError, ValueError, AttributeError):
        return None


def write_frame(stream: Any, value: Any) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack(">I", len(data)) + data)
    stream.flush()


def read_frame(stream: Any) -> Any:
    head = stream.read(4)
    if len(head) < 4:
        raise EOFError("the worker closed its pipe")
    (size,) = struct.unpack(">I", head)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("the worker closed its pipe")
    return pickle.loads(data)


class InferencePool:
    """``workers`` sampling processes over the checkpoints under ``root_dir`` (started on first use, or ahead by :meth:`start`)."""

    def __init__(self, root_dir: Path, workers: int = 2, worker_block_bytes: int = WORKER_BLOCK_BYTES):
        self.root_dir = Path(root_dir)
        self.workers = max(1, int(workers))
        self.worker_block_bytes = int(worker_block_bytes)  # prefill blocks each worker keeps (module docstring)
        self._queue: queue.Queue = queue.Queue()
        self.prefills = PrefillCache(192 << 20)  # blocks by (checkpoint, base, scope, prompt): see the module docstring
        self._computing: dict[tuple, list[tuple[tuple, cf.Future]]] = {}  # prompt key -> requests waiting for it
        self._owners: dict[cf.Future, tuple] = {}  # request -> the prompt key it is prefilling
        self.reused = 0  # requests that skipped some of their prompt's prefill
        self._threads: list[_Worker] = []
        self._lock = threading.Lock()
        self._closed = False

    def poolable(self, base_model: str) -> bool:
        """Can workers load ``base_model``? (:func:`~.tinker_client.loadable_elsewhere`)"""
        return tinker_client.loadable_elsewhere(base_model)

    @staticmethod
    def prefill_key(args: tuple, end: int | None = None) -> tuple:
        """Which prefill a request's arguments (see :meth:`submit`) need: weights, scope and prompt
        (up to ``end``)."""
        root, bases, model_path, base_model, tokens, _, _, scope = args[:8]
        return root, model_path, base_model, bases.get(base_model or ""), scope, tuple(tokens[:end])

    block_key = prefill_key  # the key of the prefill block ending at ``end``

    def submit(self, model_path: str | None, base_model: str | None, tokens: list[int], num_samples: int,
               params: dict[str, Any], scope: str | None = None) -> cf.Future:
        future: cf.Future = cf.Future()
        self._start_workers()
        args: tuple = (str(self.root_dir), tinker_client.registered_bases(), model_path, base_model, tokens, num_samples, params)
        if scope is None:
            self._queue.put((args, future))
        else:
            self._dispatch(args + (scope,), future)
        return future

    def start(self, workers: int | None = None) -> "InferencePool":
        """Start ``workers`` of the worker processes (default: all) now rather than at the first request: a worker's
        interpreter spends ~0.6 s of CPU importing NumPy and the model before it can sample, which a world starting
        up on one core can overlap with its own start on the cores it leaves idle. The others start at the first
        request, as before. The same workers, requests and samples either way; a second call starts nothing.

        >>> pool = InferencePool(Path("/nonexistent"), workers=2).start(1)
        >>> [w.prestart for w in pool._threads], pool.start() is pool
        ([True, False], True)
        >>> pool.close()
        """
        self._start_workers(self.workers if workers is None else max(0, int(workers)))
        return self

    def _start_workers(self, prestart: int = 0) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("the sampling pool is closed")
            if not self._threads:
                self._threads = [_Worker(self, i, i < prestart) for i in range(self.workers)]

    def _dispatch(self, args: tuple, future: cf.Future) -> None:
        """Queue a scoped request with the prefill blocks of its prompt the pool holds; while the same
        prompt is being prefilled by another request, wait for that one (:meth:`_release`)."""
        key, tokens = self.prefill_key(args), args[4]
        ends = prefill_ends(len(tokens))
        with self._lock:
            if key in self._computing:
                self._computing[key].append((args, future))
                return
            blocks = [(end, block) for end in ends if (block := self.prefills.get(self.block_key(args, end))) is not None]
            if len(blocks) < len(ends):
                self._computing[key], self._owners[future] = [], key
            if blocks:
                self.reused += 1
        self._queue.put((args + (blocks,), future))

    def _release(self, future: cf.Future) -> None:
        """A request is done: the requests that waited for its prompt's prefill are dispatched again
        (they find its blocks, or if none were kept the first of them computes them)."""
        with self._lock:
            key = self._owners.pop(future, None)
            waiting = self._computing.pop(key, []) if key is not None else []
        for args, waiter in waiting:
            self._dispatch(args, waiter)

    def client(self, *, model_path: str | None = None, base_model: str | None = None, tokenizer: Any) -> PooledSamplingClient:
        return PooledSamplingClient(self, model_path, base_model, tokenizer)

    def close(self) -> None:
        """Stop the workers (running requests finish first). Safe to call twice."""
        with self._lock:
            self._closed = True
            threads, self._threads = self._threads, []
        for _ in threads:
            self._queue.put(None)
        for worker in threads:
            worker.thread.join(30)
            worker.stop()


def _main() -> None:
    """A worker: requests in on stdin, answers out on stdout, until stdin closes."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but frames goes to the pipe
    while True:
        try:
            args = read_frame(stdin)
        except EOFError:
            return
        write_frame(stdout, _sample(*args, early=lambda blocks: write_frame(stdout, blocks)))


if __name__ == "__main__":
    _main()


__all__ = ["InferencePool", "PooledSamplingClient"]
