"""Install layers: the build needs no torch, the locks agree, an offline hub name fails fast.

`pip install packer` (requirements-demo.lock, what `make demo` installs) has no torch; the dev
venv has it, so these tests check in a fresh interpreter that the build path never imports it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
import tomllib

import pytest

from conftest import ROOT, TOKENIZER


def _python(code: str, tmp_path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **env, "HF_HOME": str(tmp_path / "hf")})


@pytest.mark.slow  # a subprocess build
def test_build_path_never_imports_torch(tmp_path):
    out = tmp_path / "o"
    r = _python(f"""
        import importlib, pathlib, sys
        import packer.build, packer.report, packer.verify, packer.summary
        assert "torch" not in sys.modules, "importing the build modules imported torch"
        for p in sorted(pathlib.Path("packer").rglob("*.py")):  # every module but the loader's and packer.modeling (torch)
            name = ".".join(p.with_suffix("").parts).removesuffix(".__init__")
            if not name.startswith(("packer.loader", "packer.modeling")) and not name.endswith("__main__"):
                importlib.import_module(name)
                assert "torch" not in sys.modules, f"importing {{name}} imported torch"
        from packer.cli import main
        try:
            main(["build", "--overwrite", "-o", {str(out)!r}], standalone_mode=False)  # the sample job: text, chat, images
        finally:
            leaked = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))[:5]
            print("TORCH", leaked)
        assert not leaked
    """, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "TORCH []" in r.stdout
    assert json.loads((out / "manifest.json").read_text())["stats"]["rows"] > 0


@pytest.mark.slow  # a subprocess build
def test_hub_name_offline_fails_fast_with_the_fix(tmp_path):
    """Not in the (empty) hub cache, hub unreachable, HF_HUB_OFFLINE unset: an error in seconds, not a minute of retries."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT="http://127.0.0.1:9")  # nothing listens on port 9: refused at once
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "packer", "build", "-i", str(ROOT / "sample_data" / "docs.jsonl"),
                        "-o", str(tmp_path / "o"), "--tokenizer", "Qwen/Qwen2.5-7B-Instruct"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    elapsed = time.monotonic() - start
    assert r.returncode == 1, r.stdout + r.stderr
    assert elapsed < 15, f"took {elapsed:.1f} s"
    assert "cannot load tokenizer 'Qwen/Qwen2.5-7B-Instruct': not in the local hub cache and the hub is unreachable" in r.stderr
    assert "offline?" in r.stderr and "Pass a local folder" in r.stderr
    assert "Traceback" not in r.stderr and "Retrying" not in r.stderr


def test_hub_offline_mode_is_named(tmp_path, monkeypatch):
    from packer.encode.tokenizer import load_tokenizer
    from packer.errors import PackerError

    monkeypatch.setattr("huggingface_hub.is_offline_mode", lambda: True)
    monkeypatch.setattr("huggingface_hub.try_to_load_from_cache", lambda *a, **k: None)
    with pytest.raises(PackerError, match="not in the local hub cache and the hub is unreachable .HF_HUB_OFFLINE is set"):
        load_tokenizer("no-such-org/no-such-tokenizer", [])


def test_a_missing_path_is_not_sent_to_the_hub():
    from packer.encode.tokenizer import load_tokenizer
    from packer.errors import PackerError

    with pytest.raises(PackerError, match=r"cannot load tokenizer '/no/such/tokenizer': no such folder"):
        load_tokenizer("/no/such/tokenizer", [])


def test_loader_picks_autotokenizers_class(tmp_path):
    """The torch-free path gives what AutoTokenizer gives: class, vocabulary, template, fingerprint, saved files."""
    from transformers import AutoTokenizer

    from packer.encode.tokenizer import fingerprint, load_tokenizer

    ours = load_tokenizer(str(TOKENIZER), ["<image>", "<audio>", "<video>"])
    ref = AutoTokenizer.from_pretrained(str(TOKENIZER))
    assert type(ours) is type(ref)
    assert ours.chat_template == ref.chat_template and ours("a <image> b")["input_ids"][:2] == ref("a <image> b")["input_ids"][:2]
    assert fingerprint(ours, "t", ["<image>"])["class"] == type(ref).__name__
    ours.save_pretrained(tmp_path / "saved")
    again = load_tokenizer(str(tmp_path / "saved"), ["<image>", "<audio>", "<video>"])
    assert fingerprint(again, "t", ["<image>", "<video>"]) == fingerprint(ours, "t", ["<image>", "<video>"])


def _pins(name: str) -> dict[str, str]:
    pins = {}
    for line in (ROOT / name).read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-r "):
            pins |= _pins(line[3:].strip())
        elif line and not line.startswith("-"):
            pkg, version = line.split("==")
            pins[re.sub(r"\[.*\]", "", pkg).lower().replace("_", "-")] = version
    return pins


def test_locks_and_layers_agree():
    """requirements-demo.lock (make demo) is the torch-free core of requirements.lock (make test), same versions."""
    demo, full = _pins("requirements-demo.lock"), _pins("requirements.lock")
    assert "torch" not in demo and full["torch"] == "2.11.0"
    assert {k: full.get(k) for k in demo} == demo
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {re.split(r"[<>=\[ ]", d)[0].lower().replace("_", "-") for d in project["dependencies"]}
    assert not core & {"torch", "torchvision", "torchaudio", "open-clip-torch", "ray"}
    assert core <= set(demo), core - set(demo)
    extras = {e: {re.split(r"[<>=\[ ]", d)[0].lower().replace("_", "-") for d in ds}
              for e, ds in project["optional-dependencies"].items()}
    assert "torch" in extras["train"] and "torch" in extras["embed"] and "ray" in extras["ray"]
    every = set().union(*extras.values()) - {"packer-multimodal"}
    assert every <= set(full), every - set(full)
