"""Running a test's ranks as processes of their own: the launcher (test side) and each rank's loop over its cases.

:func:`launch` starts a rank script (``torch.multiprocessing.spawn`` inside it, or ``torchrun``) in a session of its
own, one thread per process, nothing from the hub; a mismatched collective hangs, so past ``timeout`` the whole
session is killed and the result's ``returncode`` is None. :func:`run_cases` is a spawned rank's body: the gloo group
over a file store, every case in turn, a failing case's error written for the test to name (``NAME.error``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def launch(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    """Run ``args`` from the repository root; stderr kept (for the assertion message), stdout dropped."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=err, text=True, env=env, cwd=ROOT,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the launcher and its ranks
            proc.wait()
            code = None
        err.seek(0)
        return subprocess.CompletedProcess(args, code, "", err.read())


def run_cases(rank: int, world: int, store: str, cases: list[dict], out: str, run: Callable[[dict], None]) -> None:
    """A spawned rank: join the gloo group of ``world`` over the file ``store`` and ``run`` each case; a case that
    raises has its error written to ``out/NAME.error`` (by rank 0) and stops the rank."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        for case in cases:
            try:
                run(case)
            except Exception as e:  # noqa: BLE001 -- reported to the test, which names the case
                if rank == 0:
                    (Path(out) / f"{case['name']}.error").write_text(f"{type(e).__name__}: {e}")
                raise
    finally:
        dist.destroy_process_group()
