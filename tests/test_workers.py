"""Worker processes die with their build: kill -9, SIGTERM and Ctrl-C of a ``--workers 3``
build (the build's own process and two workers in stage 1) leave no worker running, no shard written after the lock is released, no pipe held
open; SIGTERM and SIGINT stop the build within seconds and a rerun resumes to the same bytes.
An error in a task, or an abandoned ``map``, kills the running tasks instead of waiting for them.

Each test runs ``python -m packer build`` as a subprocess (in its own session, so signals
reach only it) and finds its workers in ``/proc``: Linux only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import TOKENIZER

pytestmark = [pytest.mark.slow,  # subprocess builds killed with signals
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds worker processes in /proc")]

WORDS = "packing rows tokens segments masks positions shards samples media audio image".split()
RECORDS = 6_000
ARGS = ["--tokenizer", TOKENIZER, "--chunk-records", "50", "--shard-rows", "50"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("workers") / "docs.jsonl"
    with path.open("w") as f:
        for i in range(RECORDS):
            f.write(json.dumps({"id": f"d{i}", "text": " ".join(WORDS[(i + k) % len(WORDS)] for k in range(20 + i % 90))}) + "\n")
    return path


@pytest.fixture(scope="module")
def reference(data) -> dict:
    """The manifest of an uninterrupted build (one worker: the bytes do not depend on it)."""
    out = data.parent / "reference"
    done = start(data, out, workers=1, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, err = done.communicate(timeout=300)
    assert done.returncode == 0, err.decode()
    return content(out)


def start(data: Path, out: Path, *, workers: int, stdout, stderr) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "packer", "build", "-i", str(data), "-o", str(out), *ARGS,
                             "--workers", str(workers)], stdout=stdout, stderr=stderr, start_new_session=True,
                            env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})


def content(out: Path) -> dict:
    """What must not depend on interruptions: the manifest without timestamps and execution details
    (it holds every samples / plan / packed file's sha256)."""
    m = json.loads((out / "manifest.json").read_text())
    return {k: v for k, v in m.items() if k not in ("created_at", "execution")}


def stat_fields(pid: int) -> list[str] | None:
    """``/proc/PID/stat`` after the command name: [state, ppid, ...]; None when the process is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return text[text.rindex(")") + 2:].split()


def children(pid: int) -> dict[int, str]:
    """pid -> start time of each child of ``pid`` (its workers and multiprocessing's resource tracker)."""
    kids = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (f := stat_fields(int(entry.name))) and f[1] == str(pid):
            kids[int(entry.name)] = f[19]  # starttime: tells a reused pid apart
    return kids


def workers_of(pid: int) -> list[int]:
    out = []
    for kid in children(pid):
        try:
            if b"spawn_main" in Path(f"/proc/{kid}/cmdline").read_bytes():
                out.append(kid)
        except FileNotFoundError:
            pass
    return out


def alive(kids: dict[int, str]) -> list[int]:
    """The processes of ``kids`` still running (a zombie waiting for a reaper counts as gone)."""
    return [pid for pid, started in kids.items() if (f := stat_fields(pid)) and f[19] == started and f[0] != "Z"]


def wait_mid_stage_1(proc: subprocess.Popen, out: Path, tasks: int = 2) -> dict[int, str]:
    """Wait until the build's two worker processes are up and stage 1 has finished ``tasks`` tasks; its children."""
    deadline = time.time() + 180
    while time.time() < deadline and proc.poll() is None:
        if len(workers_of(proc.pid)) >= 2 and len(list((out / ".state").glob("encode-*.json"))) >= tasks:
            kids = children(proc.pid)
            assert not (out / "manifest.json").exists()
            return kids
        time.sleep(0.02)
    proc.kill()
    raise AssertionError(f"the build did not reach stage 1 with two workers (exit code {proc.poll()})")


def snapshot(out: Path) -> dict[str, tuple[int, int]]:
    """Every file a worker writes (shards and their journal entries, temporaries included)."""
    return {str(p.relative_to(out)): (p.stat().st_mtime_ns, p.stat().st_size)
            for d in ("samples", ".state") for p in (out / d).iterdir()}


def wait_gone(kids: dict[int, str], seconds: float) -> list[int]:
    deadline = time.time() + seconds
    while alive(kids) and time.time() < deadline:
        time.sleep(0.02)
    return alive(kids)


def read_to_eof(stream, done: threading.Event) -> threading.Thread:
    def run():
        while stream.read(65536):
            pass
        done.set()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _pid_dir(path: str) -> Path:
    return Path(path)


def _task(pids: Path, task: int) -> int:
    """Task 0 fails (or returns) at once; every other task would run for a minute."""
    (pids / str(os.getpid())).touch()
    if task == 0:
        if pids.name == "fail":
            raise ValueError("task 0 failed")
        return 0
    time.sleep(60)
    return task


@pytest.mark.parametrize("how", ["fail", "close"])
def test_an_error_or_an_abandoned_map_kills_running_tasks_instead_of_waiting(tmp_path, how):
    """``shutdown(cancel_futures=True)`` leaves running tasks running: the engine kills their processes."""
    from packer.engine.local import LocalEngine

    pids = tmp_path / how
    pids.mkdir()
    results = LocalEngine(2).map(_task, range(6), _pid_dir, (str(pids),))
    began = time.time()
    if how == "fail":
        with pytest.raises(ValueError, match="task 0 failed"):
            next(results)
    else:
        assert next(results) == 0
        while len(list(pids.iterdir())) < 2:  # both workers busy with a one-minute task
            time.sleep(0.02)
        results.close()
    assert time.time() - began < 30
    workers = [int(p.name) for p in pids.iterdir()]
    assert workers and all(stat_fields(pid) is None for pid in workers), "a worker is still running"


def _where(state: str, task: int) -> tuple[int, str, int]:
    return task, state, os.getpid()


def _where_when_ready(state: str, task: int) -> tuple[int, str, int]:
    """Task 0, run by the caller, returns once a worker process has built its state."""
    from packer.engine import local

    if task == 0 and state == "given":
        deadline = time.time() + 60
        while local._LIVE[-1].ready.value < 1 and time.time() < deadline:
            time.sleep(0.01)
    return task, state, os.getpid()


def test_the_callers_process_is_one_of_the_workers_when_it_has_the_state():
    """With ``in_process_state`` this process runs tasks on that state and ``workers - 1`` processes run the
    others (each with the state ``setup`` built) once they have built it, two at a time; results in order."""
    from packer.engine.local import LocalEngine

    got = list(LocalEngine(3).map(_where_when_ready, range(8), str, ("built by setup",), in_process_state="given"))
    assert [t for t, _, _ in got] == list(range(8))
    here = [t for t, state, pid in got if pid == os.getpid()]
    assert here[0] == 0 and all(state == "given" for t, state, _ in got if t in here)  # no worker was ready for task 0
    others = {pid for t, state, pid in got if t not in here}
    assert 1 <= len(others) <= 2 and all(state == "built by setup" for t, state, _ in got if t not in here)


def _slow_setup(release: str) -> str:
    deadline = time.time() + 60
    while not Path(release).exists() and time.time() < deadline:
        time.sleep(0.02)
    return "built by setup"


def test_no_task_waits_for_a_worker_still_starting(tmp_path):
    """Workers that have not built their state get no task: an input smaller than a worker's start-up (a
    tokenizer or a processor to load) is done here, and the map ends without waiting for them."""
    from packer.engine import local

    release = tmp_path / "release"
    began = time.time()
    got = list(local.LocalEngine(3).map(_where, range(8), _slow_setup, (str(release),), in_process_state="given"))
    assert time.time() - began < 30 and local._LIVE == []
    assert got == [(t, "given", os.getpid()) for t in range(8)]
    release.touch()


def _when_setup_failed(state: str, task: int) -> tuple[int, str, int]:
    from concurrent.futures import wait

    from packer.engine import local

    wait(local._LIVE[-1].warm, timeout=60)  # the worker's setup has failed by now
    return task, state, os.getpid()


def _refuse(*args):
    raise ValueError("this setup cannot load its tokenizer")


def test_a_worker_whose_setup_fails_raises_that_error_in_the_caller():
    from packer.engine.local import LocalEngine

    with pytest.raises(ValueError, match="cannot load its tokenizer"):
        list(LocalEngine(2).map(_when_setup_failed, range(4), _refuse, (), in_process_state="given"))


def test_workers_started_ahead_are_taken_by_their_map_or_closed():
    """``started`` starts the map's workers before it; a map with no task or one task (run
    here) closes them at once; leaving ``started`` closes what no map took."""
    from packer.engine import local

    for tasks in ([], [7]):
        engine = local.LocalEngine(3)
        with engine.started(str, ("built by setup",)):
            assert len(local._LIVE) == 1
            assert [t for t, _, _ in engine.map(_where, tasks, str, ("built by setup",), in_process_state="s")] == tasks
            assert engine._early is None and local._LIVE == []
    engine = local.LocalEngine(3)
    with engine.started(str, ("built by setup",)):
        got = list(engine.map(_where, range(6), str, ("built by setup",), in_process_state="s"))
        assert [t for t, _, _ in got] == list(range(6)) and local._LIVE == []
    with engine.started(str, ("never used",)):
        assert len(local._LIVE) == 1
    assert local._LIVE == []


def test_kill_9_of_the_build_kills_its_workers_and_frees_its_pipes(data, tmp_path):
    out = tmp_path / "out"
    proc = start(data, out, workers=3, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    eof = {name: threading.Event() for name in ("stdout", "stderr")}
    for name, ev in eof.items():
        read_to_eof(getattr(proc, name), ev)
    kids = wait_mid_stage_1(proc, out)
    assert len(kids) >= 2
    os.kill(proc.pid, signal.SIGKILL)
    killed = time.time()
    proc.wait()
    assert wait_gone(kids, 3) == [], "workers outlived their parent"
    time.sleep(max(0.0, killed + 1 - time.time()))
    after_1s = snapshot(out)
    assert eof["stdout"].wait(max(0.0, killed + 3 - time.time())), "`packer build | cat` would never end"
    assert eof["stderr"].wait(0.5)
    time.sleep(max(0.0, killed + 3 - time.time()))
    assert snapshot(out) == after_1s, "a shard was written after the build died (and its lock was released)"


def interrupt(data: Path, out: Path, how: str, tmp_path: Path, tasks: int) -> None:
    """Start a ``--workers 3`` build of ``out``, stop it with ``how`` once ``tasks`` stage-1 tasks are done, check it stopped
    at once, workers and all, with the lock free and nothing written after. SIGTERM goes to the build alone; SIGINT to its
    whole process group, as Ctrl-C in a terminal sends it."""
    from packer.stages.state import BuildLock

    log = tmp_path / f"{how}.stderr"
    with log.open("wb") as f:
        proc = start(data, out, workers=3, stdout=subprocess.DEVNULL, stderr=f)
    kids = wait_mid_stage_1(proc, out, tasks)
    sent = time.time()
    if how == "SIGTERM":
        os.kill(proc.pid, signal.SIGTERM)
    else:
        os.killpg(proc.pid, signal.SIGINT)
    try:
        code = proc.wait(timeout=20)
    finally:
        proc.kill()
    took = time.time() - sent
    assert code != 0, log.read_text()
    assert took < (3 if how == "SIGTERM" else 2.5), f"{how} took {took:.1f} s to stop the build"
    assert wait_gone(kids, 1) == [], "workers outlived the build"
    assert not (out / "manifest.json").exists()
    BuildLock(out).release()  # the lock is free: a second build could start
    before = snapshot(out)
    time.sleep(1)
    assert snapshot(out) == before, "a shard was written after the build stopped"


def test_sigterm_and_ctrl_c_stop_the_build_at_once_and_a_rerun_resumes(data, reference, tmp_path):
    """SIGTERM, then a resumed build stopped by Ctrl-C, then one left to finish: the bytes of an uninterrupted build."""
    out = tmp_path / "out"
    interrupt(data, out, "SIGTERM", tmp_path, tasks=2)
    interrupt(data, out, "SIGINT", tmp_path, tasks=len(list((out / ".state").glob("encode-*.json"))) + 2)
    rerun = start(data, out, workers=3, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # a pool that finishes
    _, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err.decode()
    assert content(out) == reference
