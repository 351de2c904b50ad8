"""What a user installs: a distribution name of our own, a LICENSE with its SPDX expression,
one version (pyproject.toml's, read from the metadata), py.typed; no module that shadows the standard
library; config validation that loads no media or model code; CI that lints and installs the build
layer alone."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib

from conftest import ROOT

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_distribution_name_license_and_single_version():
    import packer

    project = PROJECT["project"]
    assert project["name"] == packer.DISTRIBUTION == "packer-multimodal"  # `packer` on the public index is another project
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License\n                           Version 2.0")
    assert packer.__version__ == project["version"]
    assert project["scripts"] == {"packer": "packer.cli:main"}
    assert all(not extra.startswith("packer[") for extra in project["optional-dependencies"]["all"])
    sources = [p for p in (ROOT / "packer").rglob("*.py")]
    assert not [p for p in sources if "__version__ = \"" in p.read_text()]  # written once, in pyproject.toml


def test_py_typed_ships_with_the_package():
    assert (ROOT / "packer" / "py.typed").is_file()
    assert "py.typed" in PROJECT["tool"]["setuptools"]["package-data"]["packer"]


def test_no_module_shadows_the_standard_library():
    """``python packer/cli.py`` puts packer/ first on sys.path: a packer/inspect.py there broke click's import."""
    names = {p.stem for p in (ROOT / "packer").iterdir() if p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists())}
    assert names & set(sys.stdlib_module_names) - {"io"} == set()  # packer.io: io is built in, loaded before sys.path
    r = subprocess.run([sys.executable, "packer/cli.py", "--help"], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0 and "inspect" in r.stdout, r.stderr


def test_config_validation_loads_no_media_or_model_code():
    code = """
        import sys
        from packer.config import resolve
        c = resolve(image_tokens="fixed:model=ViT-L-14-336", video_tokens="qwen2vl:fps=1", audio_features="whisper",
                    image_embeddings="ViT-L-14-336:random", tokenizer="t")
        heavy = sorted(m for m in ("torch", "open_clip", "av", "transformers", "PIL", "soundfile") if m in sys.modules)
        print(heavy)
    """
    import textwrap

    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_ci_lints_and_installs_the_build_layer_alone():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make lint" in ci and "make test" in ci and "make demo-check" in ci
    makefile = (ROOT / "Makefile").read_text()
    assert "ruff check ." in makefile and "-r requirements-demo.lock" in makefile and "--no-deps ." in makefile
    pins = [line.split("#")[0].strip() for line in (ROOT / "requirements.lock").read_text().splitlines()]
    assert any(p.startswith("ruff==") for p in pins)
