"""Process-wide side effects of the library: importing packer changes nothing in the
process; a build puts back what it changes for its run (signal handlers, the cyclic collector's
freeze) and leaves a freeze the process made itself alone. The CLI is the entry point that may
do more (docs/reliability.md, "Using packer in your own process")."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import textwrap

from conftest import ROOT, TOKENIZER


def test_importing_packer_leaves_the_umask_alone():
    code = """
        import os, sys
        calls = []
        real = os.umask
        os.umask = lambda mask: calls.append(mask) or real(mask)
        import packer.io.files as files, packer.build, packer.loader  # noqa
        assert calls == [], calls
        mask = real(0o027); real(mask)
        os.umask(0o027)
        files.file_mode.cache_clear()
        print(oct(files.file_mode()), calls)
    """
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    mode, calls = r.stdout.split(" ", 1)
    assert mode == oct(0o666 & ~0o027)
    assert calls.strip() == "[23]"  # only the test's own call: reading the mask changed nothing (/proc/self/status)


def test_a_build_puts_back_its_signal_handlers_and_the_collector(tmp_path, monkeypatch):
    from packer.build import build
    from packer.config import BuildConfig

    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"text": "a document"}) + "\n")
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    assert gc.get_freeze_count() == 0
    build(BuildConfig(input=(str(src),), output=str(tmp_path / "a"), tokenizer=TOKENIZER), progress=False)
    assert {s: signal.getsignal(s) for s in handlers} == handlers and gc.get_freeze_count() == 0

    gc.freeze()  # the process froze its objects itself: the build must neither freeze more nor unfreeze them
    try:
        calls = []
        monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
        monkeypatch.setattr(gc, "unfreeze", lambda: calls.append("unfreeze"))
        build(BuildConfig(input=(str(src),), output=str(tmp_path / "b"), tokenizer=TOKENIZER), progress=False)
        assert calls == [] and gc.get_freeze_count() > 0
    finally:
        monkeypatch.undo()
        gc.unfreeze()
