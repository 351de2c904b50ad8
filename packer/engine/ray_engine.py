"""The Ray engine: the same stage functions, run by Ray Data on a cluster.

``engine.map`` turns the tasks (small: a byte range of an input file, or a range of
plan rows) into a Ray Dataset of one row per task and runs ``map_batches`` with a
callable class, so each Ray worker builds the stage's state (tokenizer, memory maps)
once and then processes many tasks. ``preserve_order`` keeps results in task order, which
keeps the output byte-identical to the local engine's. Workers read their inputs and
write their shards and journal entries straight to the output -- a shared folder, or an
fsspec URL (``s3://``...) that each worker writes directly -- and the driver only
collects the small results. A worker process that dies is restarted and its task
retried by Ray; a stage Ray gives up on (a lost node) is run again for its unfinished
tasks; an error raised by the stage itself (``--strict``) comes back to the driver unchanged.

Without ``address`` a local Ray is started (``ray.init(num_cpus=workers)``); with
``address="auto"`` (inside a cluster) or ``ray://host:10001`` the driver joins it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from packer.errors import PackerError

RERUNS = 3  # times a stage is started again after Ray lost part of it (its finished tasks are reused)


class RayEngine:
    in_process = False  # the driver runs no task: in_process_state is not used

    def __init__(self, workers: int = 0, *, address: str | None = None, cpus_per_task: float = 1.0):
        try:
            import ray
        except ImportError:
            raise PackerError("--engine ray needs Ray Data: pip install 'packer-multimodal[ray]' (or 'ray[data]')") from None
        self.ray = ray
        self.cpus_per_task = cpus_per_task
        if not ray.is_initialized():
            env = {"env_vars": {"TOKENIZERS_PARALLELISM": "false"}}
            if address:
                ray.init(address=address, runtime_env=env, log_to_driver=False)
            else:
                ray.init(num_cpus=workers or os.cpu_count(), include_dashboard=False, log_to_driver=False,
                         runtime_env=env, configure_logging=False)
        logging.getLogger("ray.data").setLevel(logging.WARNING)
        total = int(ray.cluster_resources().get("CPU", 1))
        self.workers = workers or max(1, int(total // max(cpus_per_task, 1e-9)))

    def started(self, setup: Callable[..., Any], setup_args: tuple = (), *, tasks: int | None = None):
        """Nothing to start ahead: Ray Data starts its actors with the map."""
        return contextlib.nullcontext()

    def run_once(self, fn: Callable[..., Any], *args: Any, num_gpus: float = 0) -> Any:
        """One task on a worker with ``num_gpus`` GPUs (the embedding pass)."""
        return self.ray.get(self.ray.remote(num_gpus=num_gpus, num_cpus=self.cpus_per_task)(fn).remote(*args))

    def map(self, fn: Callable[[Any, Any], Any], tasks: Iterable[Any], setup: Callable[..., Any], setup_args: tuple = (),
            *, in_process_state: Any = None) -> Iterator[Any]:
        """``fn(state, task)`` for each task, in order. A run that Ray gives up on (a node lost
        with results Ray Data cannot rebuild) is started again for the tasks not yet
        returned, up to ``RERUNS`` times: their finished shards are reused through the
        journal, so a rerun costs the lost work only."""
        items = [{"task": pickle.dumps(t)} for t in tasks]
        done = reruns = 0
        while done < len(items):
            try:
                for value in self._run(fn, items[done:], setup, setup_args):
                    yield value
                    done += 1
            except PackerError:
                raise
            except Exception as e:  # noqa: BLE001 -- Ray's system errors; the stage's own come back as PackerError
                reruns += 1
                if reruns > RERUNS:
                    raise
                logging.getLogger("packer").warning("Ray lost part of a stage (%s: %s); running its %d unfinished "
                                                    "task(s) again", type(e).__name__, e, len(items) - done)

    def _run(self, fn, items: list[dict], setup, setup_args) -> Iterator[Any]:
        ctx = self.ray.data.DataContext.get_current()  # the process's own: what this map sets is put back when it ends
        before = ctx.execution_options.preserve_order, ctx.enable_progress_bars
        ctx.execution_options.preserve_order = True
        ctx.enable_progress_bars = False
        try:
            yield from self._map(fn, items, setup, setup_args)
        finally:
            ctx.execution_options.preserve_order, ctx.enable_progress_bars = before

    def _map(self, fn, items, setup, setup_args) -> Iterator[Any]:
        ray = self.ray
        ds = ray.data.from_items(items, override_num_blocks=len(items))
        # Ray Data restarts a dead actor and retries its task (actor max_restarts / max_task_retries
        # default to unlimited for system failures), so a lost worker costs time, not records.
        out = ds.map_batches(
            _Stage, fn_constructor_args=(fn, setup, setup_args, os.getcwd()), batch_size=1, batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(min_size=1, max_size=min(self.workers, len(items))),
            num_cpus=self.cpus_per_task,
        )
        for row in out.iter_rows():
            status, value = pickle.loads(row["result"])
            if status == "error":
                raise value
            yield value


class _Stage:
    """One per Ray worker: the stage's state, built once, then one task per batch."""

    def __init__(self, fn, setup, setup_args, cwd: str | None = None):
        # A node's workers start in the folder its `ray start` ran in. Where the driver's folder exists here too
        # (a shared disk mounted at the same path), a relative local input or media path means what it means on
        # the driver; the tokenizer and a template file come in setup_args (packer.encode.shipped) either way.
        if cwd and os.path.isdir(cwd):
            os.chdir(cwd)
        self.fn = fn
        self.state = setup(*setup_args)

    def __call__(self, batch: dict) -> dict:
        results = []
        for blob in batch["task"]:
            try:
                results.append(pickle.dumps(("ok", self.fn(self.state, pickle.loads(blob)))))
            except PackerError as e:  # a stage's own error (e.g. --strict) goes back to the driver as it is
                results.append(pickle.dumps(("error", e)))
        return {"result": results}
