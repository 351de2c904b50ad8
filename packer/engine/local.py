"""The local engine: stage functions in worker processes on this machine.

Results come back in task order whatever the scheduling, which keeps output
byte-identical for any worker count. At most ``2 × workers`` tasks are in flight,
so a producer that reads input lazily keeps memory flat. One worker (or one task)
runs in-process: no start-up cost for small jobs.
"""

from __future__ import annotations

import multiprocessing
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any


class LocalEngine:
    def __init__(self, workers: int = 0):
        self.workers = workers or os.cpu_count() or 1

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
        table) once per worker; ``in_process_state`` reuses one the caller has.
        """
        tasks = iter(tasks)
        first = next(tasks, None)
        if first is None:
            return
        second = next(tasks, None)
        if self.workers == 1 or second is None:
            state = in_process_state if in_process_state is not None else setup(*setup_args)
            for task in _chain(first, second, tasks):
                yield fn(state, task)
            return
        ctx = multiprocessing.get_context("spawn")  # no fork after Rust tokenizers start threads
        with ProcessPoolExecutor(self.workers, mp_context=ctx, initializer=_init, initargs=(setup, setup_args)) as pool:
            pending: deque = deque()
            try:
                for task in _chain(first, second, tasks):
                    pending.append(pool.submit(_call, fn, task))
                    if len(pending) >= 2 * self.workers:
                        yield pending.popleft().result()
                while pending:
                    yield pending.popleft().result()
            finally:  # an error (or an abandoned generator) must not wait for the queue
                for future in pending:
                    future.cancel()


def _chain(first, second, rest):
    yield first
    if second is not None:
        yield second
    yield from rest


_STATE: Any = None


def _init(setup: Callable[..., Any], args: tuple) -> None:
    global _STATE
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _STATE = setup(*args)


def _call(fn: Callable[[Any, Any], Any], task: Any) -> Any:
    return fn(_STATE, task)
