"""The local engine: stage functions in worker processes on this machine.

Results come back in task order whatever the scheduling, which keeps output
byte-identical for any worker count. At most ``2 × workers`` tasks are in flight,
so a producer that reads input lazily keeps memory flat. One worker (or one task)
runs in-process: no start-up cost for small jobs.

Workers never outlive the build that started them. A worker that ran on after its
parent died would keep writing shards into a folder whose lock is already released
(and hold the parent's stdout, so ``packer build … | cat`` never ends). So:

- each worker asks the kernel for SIGKILL when its parent dies (``PR_SET_PDEATHSIG``,
  Linux; elsewhere a thread polls ``os.getppid()``), which covers ``kill -9``;
- an error, Ctrl-C or an abandoned result generator kills the workers at once instead
  of waiting for their running tasks (a killed task is simply redone on resume);
- :func:`stop_on_signals`, held by a build, turns SIGTERM and SIGINT into
  :class:`Interrupted` after killing the workers, so the build's ``finally`` blocks
  (the lock's release among them) run only once no worker is left to write.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import multiprocessing
import os
import signal
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from packer.errors import PackerError

KILL_JOIN_S = 2.0  # how long a killed worker may take to be reaped before we move on


class Interrupted(KeyboardInterrupt):
    """A build stopped by SIGINT or SIGTERM; its workers are already dead.

    A ``KeyboardInterrupt`` so that code which handles Ctrl-C handles SIGTERM the same
    way; ``exit_code`` is the shell's convention (130 for SIGINT, 143 for SIGTERM).
    """

    def __init__(self, signum: int):
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(f"interrupted by {signal.Signals(signum).name}")


class LocalEngine:
    in_process = True  # map(..., in_process_state=) makes this process one of the workers

    def __init__(self, workers: int = 0):
        self.workers = workers or os.cpu_count() or 1
        self._early: tuple | None = None  # (setup, setup_args, ctx, pool) started ahead of its map

    @contextlib.contextmanager
    def started(self, setup: Callable[..., Any], setup_args: tuple = (), *, tasks: int | None = None):
        """Start now the worker processes of the next ``map(..., setup, setup_args,
        in_process_state=...)``, so that they build their state while this process builds
        its own (stage 1: each loads the tokenizer, ~2 s of a small build's wall time):
        ``workers - 1`` of them, or ``tasks - 1`` when the map has only ``tasks`` tasks.
        Whatever ``map`` did not take is killed on leaving (an error before stage 1, a
        refused output folder)."""
        n = min(self.workers, tasks if tasks is not None else self.workers) - 1
        try:
            if n > 0:
                ctx, pool = _open_pool(n, setup, setup_args)
                self._early = (setup, setup_args, ctx, pool)
            yield
        finally:
            if self._early is not None:
                _close_pool(*self._early[2:], finished=False)
                self._early = None

    def _take_early(self, setup: Callable[..., Any], setup_args: tuple):
        """``(ctx, pool)`` started by :meth:`started` for this setup, now the caller's; else None."""
        if self._early is None or self._early[0] is not setup or self._early[1] != setup_args:
            return None
        early, self._early = self._early[2:], None
        return early

    def run_once(self, fn: Callable[..., Any], *args: Any, num_gpus: float = 0) -> Any:
        """One task, here (the local engine has no placement to choose)."""
        return fn(*args)

    def map(
        self,
        fn: Callable[[Any, Any], Any],
        tasks: Iterable[Any],
        setup: Callable[..., Any],
        setup_args: tuple = (),
        *,
        in_process_state: Any = None,
    ) -> Iterator[Any]:
        """Yield ``fn(state, task)`` for each task, in order.

        ``setup(*setup_args)`` builds the per-process state (a tokenizer, an open
        table) once per worker; ``in_process_state`` reuses one the caller has. With it,
        this process is one of the ``workers`` and ``workers - 1`` processes are started,
        so the state it already built is not built again. A task goes to a worker process
        only once that process has built its state, one at a time (the next the moment
        the last is done); every other task this process runs itself whenever it would
        otherwise wait. So a worker's start-up (stage 1: a tokenizer or a processor to load, ~2 s)
        never holds a task back: an input smaller than that start-up is encoded here
        while the workers start, and a larger one is shared out as each worker comes up.
        Which process runs a task never changes its result. A signal reaches this
        process between two Python steps, so while it runs a task of its own, Ctrl-C or
        SIGTERM waits for the native call in progress (a chunk's tokenizer call, a shard's
        write: well under a second at the default sizes) before the workers are killed.
        """
        tasks = iter(tasks)
        head = list(itertools.islice(tasks, self.workers))  # fewer tasks than workers: only as many workers as tasks
        workers = len(head) if len(head) < self.workers else self.workers
        here = in_process_state is not None
        early = self._take_early(setup, setup_args)  # another stage's is left for its own map (or for ``started``)
        if early is not None and (workers < 2 or not here or early[0].size != workers - 1):  # not the pool these tasks need
            _close_pool(*early, finished=False)
            early = None
        if not head:
            return
        if workers == 1:
            state = in_process_state if here else setup(*setup_args)
            for task in itertools.chain(head, tasks):
                yield fn(state, task)
            return
        ctx, pool = early or _open_pool(workers - 1 if here else workers, setup, setup_args)
        finished = False
        queue = None
        try:
            queue = _Queue(pool, ctx, fn, in_process_state) if here else None
            pending: deque = deque()  # futures; with ``here``, _Queue entries
            for task in itertools.chain(head, tasks):
                pending.append(queue.add(task) if here else _submit(pool, ctx, fn, task))
                if len(pending) >= 2 * workers:
                    yield queue.result(pending.popleft()) if here else _result(pending.popleft(), ctx)
            while pending:
                yield queue.result(pending.popleft()) if here else _result(pending.popleft(), ctx)
            finished = True
        finally:  # an error, an interrupt or an abandoned generator must not wait for running tasks
            if queue is not None:
                queue.close()
            # nor a map this process took part in, once it is done: every result is in, so a worker is idle or still
            # building its state, which nothing waits for
            _close_pool(ctx, pool, finished and not here)


def _open_pool(processes: int, setup: Callable[..., Any], setup_args: tuple):
    ctx = _TrackingContext(processes)  # spawn: no fork after Rust tokenizers start threads
    ctx.ready = ctx.Value("i", 0)  # processes that have built their state (or failed to)
    pool = ProcessPoolExecutor(processes, mp_context=ctx, initializer=_init,
                               initargs=(os.getpid(), setup, setup_args, ctx.ready))
    _LIVE.append(ctx)
    ctx.warm = [pool.submit(_call, _idle, None) for _ in range(processes)]  # processes start on demand: one submit each
    return ctx, pool


def _close_pool(ctx: _TrackingContext, pool: ProcessPoolExecutor, finished: bool) -> None:
    if not finished:
        ctx.kill_all()
    pool.shutdown(wait=finished, cancel_futures=True)
    _LIVE.remove(ctx)


def _idle(state: Any, task: Any) -> None:
    """The task that makes a pool start a process (which builds its state first)."""


class _Queue:
    """The tasks of a map whose caller is one of its workers (``in_process_state``), in task order.

    A worker process gets a task only once it has built its state, and one at a time: the next is
    given the moment its previous one is done (a future's callback, on the pool's own thread). The
    caller runs the next task nobody has taken whenever the result it must yield is not ready, so it
    never waits while there is work, and no task waits for a worker still starting.
    """

    def __init__(self, pool: ProcessPoolExecutor, ctx: _TrackingContext, fn: Callable[[Any, Any], Any], state: Any):
        self.pool, self.ctx, self.fn, self.state = pool, ctx, fn, state
        self.lock = threading.RLock()  # the caller and the pool's thread (callbacks) both give tasks
        self.waiting: deque[_Entry] = deque()  # nobody has them yet
        self.given = 0  # the pool's tasks not yet done
        self.error: BaseException | None = None  # met on the pool's thread, raised on the caller's
        self.closed = False
        for f in ctx.warm:
            f.add_done_callback(self._on_done)

    def add(self, task: Any) -> _Entry:
        entry = _Entry(task)
        with self.lock:
            self.waiting.append(entry)
            self._give()
        return entry

    def result(self, entry: _Entry) -> Any:
        """``entry``'s result; until a worker has it ready, this process runs the tasks nobody has taken."""
        while True:
            with self.lock:
                self._raise()
                if entry.done:
                    return entry.value
                if entry.future is None:  # nobody took it: run it here
                    self.waiting.remove(entry)
                    mine = entry
                elif entry.future.done() or not self.waiting:
                    mine = None
                else:  # a worker's, not ready: run the next task nobody has taken meanwhile
                    mine = self.waiting.popleft()
            if mine is None:
                return _result(entry.future, self.ctx)
            value = self.fn(self.state, mine.task)
            if mine is entry:
                return value
            mine.value, mine.done = value, True

    def close(self) -> None:
        with self.lock:
            self.closed = True

    def _give(self) -> None:
        """Hand waiting tasks to the workers that are ready and idle (under the lock)."""
        if self.closed or self.error is not None:
            return
        try:
            while self.waiting and self.given < self.ctx.ready.value:
                entry = self.waiting.popleft()
                entry.future = _submit(self.pool, self.ctx, self.fn, entry.task)
                self.given += 1
                entry.future.add_done_callback(self._on_done)
        except BaseException as e:  # noqa: BLE001 -- a callback's error would be logged and lost: raised by the caller
            self.error = e

    def _on_done(self, future) -> None:
        with self.lock:
            if future not in self.ctx.warm:
                self.given -= 1
            elif not future.cancelled() and future.exception() is not None:  # a worker whose setup failed
                self.error = self.error or future.exception()
            self._give()

    def _raise(self) -> None:
        if self.error is not None:
            error, self.error = self.error, None
            if isinstance(error, BrokenProcessPool):
                raise WorkerDied(self.ctx.death()) from None
            raise error


class _Entry:
    __slots__ = ("task", "future", "value", "done")

    def __init__(self, task: Any):
        self.task, self.future, self.value, self.done = task, None, None, False


class _TrackingContext(type(multiprocessing.get_context("spawn"))):
    """The spawn context, remembering every process it makes, so that they can be killed.

    ``ProcessPoolExecutor.shutdown(cancel_futures=True)`` only drops queued tasks; running
    ones finish (and write their shards) unless their processes are killed, and the pool
    offers no public way to reach them.
    """

    def __init__(self, size: int = 0):
        super().__init__()
        self.size = size  # the pool's number of processes
        self.processes: list = []

    def Process(self, *args: Any, **kwargs: Any):  # multiprocessing's name for it
        p = super().Process(*args, **kwargs)
        self.processes.append(p)
        return p

    def death(self) -> str:
        """The likely cause of a broken pool, from its processes' exit codes (reaped for up to
        ``KILL_JOIN_S``: the pool notices a death before the dead process is waited for)."""
        import time

        deadline = time.monotonic() + KILL_JOIN_S
        while time.monotonic() < deadline and all(p.exitcode in (None, 0) for p in list(self.processes)):
            time.sleep(0.02)
        codes = [p.exitcode for p in list(self.processes) if p.exitcode not in (None, 0)]
        killed = [c for c in codes if c == -signal.SIGKILL]
        if killed:
            return "killed by SIGKILL: most likely the kernel's out-of-memory killer (see dmesg)"
        if codes:
            code = codes[0]
            return f"killed by {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals() else \
                f"exit status {code}"
        return "it ended without a result"

    def kill_all(self) -> None:
        started = [p for p in list(self.processes) if p.pid is not None]
        for p in started:
            with contextlib.suppress(Exception):
                p.kill()
        for p in started:  # reaped, so that nothing of theirs is still running when we return
            with contextlib.suppress(Exception):
                p.join(KILL_JOIN_S)


_LIVE: list[_TrackingContext] = []  # contexts of the pools now running, for the signal handler


def kill_workers() -> None:
    """Kill every worker of every running local pool (this process's)."""
    for ctx in list(_LIVE):
        ctx.kill_all()


@contextlib.contextmanager
def stop_on_signals():
    """While held (a build runs), SIGTERM and SIGINT kill the workers and raise :class:`Interrupted`.

    Python's default SIGINT raises ``KeyboardInterrupt`` too, but only between bytecodes of
    the main thread and with the workers still running; the default SIGTERM ends the
    process without running any ``finally``. Killing the workers in the handler, before
    anything unwinds, means no worker writes after the build releases its lock. The
    previous handlers come back on exit. Outside the main thread (where handlers cannot
    be set) this does nothing. Usable as a decorator.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signums = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.getsignal(s) for s in signums}
    for s in signums:
        signal.signal(s, _on_signal)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)


def _on_signal(signum: int, frame: Any) -> None:
    kill_workers()
    raise Interrupted(signum)


def _result(future, ctx: _TrackingContext) -> Any:
    """A pool future's result. A worker that died (the kernel's out-of-memory killer, most
    often) is a :class:`WorkerDied`, not a traceback."""
    try:
        return future.result()
    except BrokenProcessPool:
        raise WorkerDied(ctx.death()) from None


def _submit(pool: ProcessPoolExecutor, ctx: _TrackingContext, fn: Callable[[Any, Any], Any], task: Any):
    try:
        return pool.submit(_call, fn, task)
    except BrokenProcessPool:  # a worker died while earlier tasks ran
        raise WorkerDied(ctx.death()) from None


class WorkerDied(PackerError):
    """A worker process ended without returning its task (killed, or crashed in native code)."""

    def __init__(self, cause: str):
        hint = " (with fewer --workers, or a lower --max-line-bytes, if memory is short)" if "memory" in cause else ""
        super().__init__(f"a worker process died ({cause}); finished shards are kept: run the same command again to "
                         f"resume{hint}")


_STATE: Any = None


class _SetupFailed:
    """A worker whose ``setup`` raised: every task re-raises that error, so it reaches the
    caller with the map's result (an initializer that raises would break the pool instead,
    with the traceback logged by every worker and only "a process terminated" returned)."""

    def __init__(self, error: BaseException):
        self.error = error


def _init(parent: int, setup: Callable[..., Any], args: tuple, ready) -> None:
    global _STATE
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the parent decides
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        _STATE = setup(*args)
    except Exception as e:  # noqa: BLE001 -- re-raised by the first task, in the caller
        _STATE = _SetupFailed(e)
    else:
        freeze_collector()
    with ready.get_lock():  # the caller gives this process tasks from now on
        ready.value += 1


def _die_with_parent(parent: int) -> None:
    """Make this worker die when ``parent`` does, ``kill -9`` included.

    Linux: ``prctl(PR_SET_PDEATHSIG, SIGKILL)``. The kernel sends it when the *thread*
    that spawned us exits; the pool spawns from the thread that consumes ``map``, which
    lives as long as the map. If the parent died before this call, the signal will never
    come: hence the ``getppid`` check after it. Elsewhere a daemon thread polls.
    """
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(1, signal.SIGKILL, 0, 0, 0) == 0:  # 1 = PR_SET_PDEATHSIG
                if os.getppid() != parent:
                    os._exit(1)
                return
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent,), name="packer-parent-watch", daemon=True).start()


def _watch_parent(parent: int) -> None:
    import time

    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def _call(fn: Callable[[Any, Any], Any], task: Any) -> Any:
    if isinstance(_STATE, _SetupFailed):
        raise _STATE.error
    return fn(_STATE, task)


def freeze_collector() -> bool:
    """Move every object alive now out of reach of Python's cyclic collector (``gc.freeze``).

    Stage 1 makes millions of short-lived lists and tuples (token ids, offsets), and each
    collection they trigger walks every object the collector tracks: the tokenizer's,
    transformers' and jinja's, alive for the whole process (~12% of stage 1, measured).
    Frozen, they are never walked again. A worker freezes after its setup, for good; a build
    freezes its own process for its duration and unfreezes at the end (``gc.unfreeze``),
    so that a process which runs many builds (a notebook, a test session) still collects
    the cycles of the earlier ones. A process that froze objects itself is left alone (an
    unfreeze would undo its freeze too): False, nothing frozen."""
    if gc.get_freeze_count():
        return False
    gc.freeze()
    return True
