"""Engines decide where a stage function runs; the stage functions are the same everywhere.

An engine has ``map(fn, tasks, setup, setup_args, in_process_state=None)``, yielding
``fn(state, task)`` for every task in task order, where ``state`` is built once per worker
by ``setup(*setup_args)`` (with ``in_process_state``, the local engine's own process is one
of the workers), and ``started(setup, setup_args)``, a context in which the workers of that
map are started ahead of it (the local engine's; Ray starts its actors with the map).
``in_process`` says whether ``in_process_state`` is used (the caller need not build it if not).

A build holds :func:`stop_on_signals` while it runs: SIGTERM and SIGINT then kill the
local workers and raise :class:`Interrupted` (a ``KeyboardInterrupt``), so the build's
``finally`` blocks run and no worker writes after the lock is released.
"""

from __future__ import annotations

from packer.engine.local import Interrupted, freeze_collector, kill_workers, stop_on_signals

__all__ = ["Interrupted", "freeze_collector", "get_engine", "kill_workers", "stop_on_signals"]


def get_engine(name: str, workers: int, *, address: str | None = None, cpus_per_task: float = 1.0):
    if name == "local":
        from packer.engine.local import LocalEngine

        return LocalEngine(workers)
    if name == "ray":
        from packer.engine.ray_engine import RayEngine

        return RayEngine(workers, address=address, cpus_per_task=cpus_per_task)
    raise ValueError(f"unknown engine {name!r}")
