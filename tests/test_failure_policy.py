"""How a build fails: a worker killed by the kernel is one ``packer: error`` line that says
what probably happened and that the same command resumes; never more worker processes than tasks,
and tasks cut so every worker has work, with the output bytes independent of the worker count."""

from __future__ import annotations

import json
import os
import signal

import pytest
from click.testing import CliRunner

from conftest import TOKENIZER
from packer.build import build
from packer.config import BuildConfig
from packer.engine.local import LocalEngine, WorkerDied
from packer.errors import PackerError
from packer.stages import encode


def _setup():
    return None


def _double(state, task):
    return 2 * task


def _pid(state, task):
    return os.getpid()


def _die(state, task):
    if task == 3:
        os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's out-of-memory killer does
    return task


@pytest.mark.slow  # worker processes
def test_a_killed_worker_is_one_error_that_names_the_cause(monkeypatch):
    engine = LocalEngine(3)
    with pytest.raises(WorkerDied) as e:
        list(engine.map(_die, range(8), _setup))
    message = str(e.value)
    assert "a worker process died (killed by SIGKILL: most likely the kernel's out-of-memory killer" in message
    assert "run the same command again to resume" in message and "fewer --workers" in message
    assert isinstance(e.value, PackerError) and e.value.exit_code == 1


@pytest.mark.slow  # two builds with worker processes
def test_a_killed_worker_in_a_build_exits_1_without_a_traceback(tmp_path, monkeypatch):
    """A worker SIGKILLed mid-build (as the out-of-memory killer does): exit 1, one ``packer: error``
    line, and the same command then resumes to a finished build."""
    import multiprocessing

    from packer.cli import main
    from packer.progress import Stage

    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": f"document {i}"}) + "\n" for i in range(400)))
    real_advance, killed = Stage.advance, []

    def advance(self, *args, **kwargs):  # after the first finished task: kill the worker process
        for child in multiprocessing.active_children():
            if not killed:
                os.kill(child.pid, signal.SIGKILL)
                killed.append(child.pid)
        return real_advance(self, *args, **kwargs)

    monkeypatch.setattr(Stage, "advance", advance)
    args = ["build", "-i", str(src), "-o", str(tmp_path / "out"), "--tokenizer", TOKENIZER, "--workers", "2",
            "--chunk-records", "25"]
    result = CliRunner().invoke(main, args)
    assert killed
    assert result.exit_code == 1, (result.output, result.exception)
    assert "packer: error: a worker process died (killed by SIGKILL" in result.output and "Traceback" not in result.output
    monkeypatch.undo()
    again = CliRunner().invoke(main, args)  # the same command resumes
    assert again.exit_code == 0, again.output


@pytest.mark.slow  # worker processes
def test_never_more_worker_processes_than_tasks(monkeypatch):
    import packer.engine.local as local

    opened, real = [], local._open_pool
    monkeypatch.setattr(local, "_open_pool", lambda n, *a: opened.append(n) or real(n, *a))
    engine = LocalEngine(4)
    assert sorted(engine.map(_double, range(2), _setup)) == [0, 2] and opened == [2]  # two tasks: two processes, not four
    assert set(engine.map(_pid, [0], _setup)) == {os.getpid()} and opened == [2]  # one task: run here, none started
    pids = list(engine.map(_pid, range(3), _setup, in_process_state=object()))
    assert pids[0] == os.getpid() and opened == [2, 2]  # this process is one of the three workers
    assert list(engine.map(_double, range(9), _setup)) == [2 * k for k in range(9)] and opened[-1] == 4


@pytest.mark.slow  # a worker process
def test_started_workers_are_capped_by_the_tasks():
    import multiprocessing

    engine = LocalEngine(4)
    with engine.started(_setup, (), tasks=2):
        assert len(multiprocessing.active_children()) <= 1  # workers - 1 when this process is one: 1 for 2 tasks
        assert engine._early is not None and engine._early[2].size == 1


def test_small_inputs_are_cut_so_every_worker_has_work(tmp_path):
    """5,000 short records used to be one task (chunk_records 10,000): the second worker only loaded a
    tokenizer. Tasks now also end at task_bytes (the input cut into up to 64 tasks of at least 64 KiB),
    a function of the input alone."""
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": f"document number {i} " * 4}) + "\n" for i in range(5000)))
    size = src.stat().st_size
    tasks = list(encode.make_tasks([src], 10_000, {}, max_task_bytes=encode.task_bytes(size)))
    assert len(tasks) >= 2 and sum(t.records for t in tasks) == 5000
    assert all(t.end - t.start >= encode.MIN_TASK_BYTES for t in tasks[:-1])
    assert encode.task_bytes(10**12) == -(-10**12 // encode.TARGET_TASKS) and encode.task_bytes(1) == encode.MIN_TASK_BYTES


@pytest.mark.slow  # three builds with worker processes
def test_the_output_bytes_do_not_depend_on_the_worker_count(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": str(i), "text": f"document number {i} " * (1 + i % 7)}) + "\n"
                           for i in range(5000)))
    digests = []
    for workers in (1, 2, 3):
        out = tmp_path / f"w{workers}"
        m = build(BuildConfig(input=(str(src),), output=str(out), tokenizer=TOKENIZER, workers=workers, max_length=512),
                  progress=False)
        digests.append([(e.file, e.sha256) for e in (*m.files.samples, *m.files.packed, m.files.plan)])
    assert len(digests[0]) > 3 and digests[0] == digests[1] == digests[2]
