"""bench/bench_scale.py's driver-memory part: the simulated stage-1 columns are plan_columns' own (the
preference columns once broke it with ``KeyError: 'responses'``), and a failed simulation says whether it
was killed (memory) or failed (a bug), never one for the other."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from conftest import ROOT


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        spec = importlib.util.spec_from_file_location("bench_scale", ROOT / "bench" / "bench_scale.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "bench"))
    return module


def test_the_driver_memory_simulation_runs_on_plan_columns_schema(bench):
    m = bench.driver_memory(20_000)
    assert m is not None and m["n"] == 20_000 and m["rows"] > 0 and m["peak"] > 0


def test_a_failed_simulation_is_named_an_error_and_a_killed_one_memory(bench, monkeypatch, capsys):
    monkeypatch.setattr(bench, "MEMORY", "raise KeyError('responses')")
    assert bench.driver_memory(10) is None
    said = capsys.readouterr().out
    assert "failed with exit 1, an error, not memory" in said and "KeyError: 'responses'" in said
    assert "killed" not in said and "smaller --simulate" not in said
    monkeypatch.setattr(bench, "MEMORY", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert bench.driver_memory(10) is None
    said = capsys.readouterr().out
    assert "was killed by SIGKILL (most likely the OOM killer); rerun with a smaller --simulate" in said
