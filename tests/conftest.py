"""Shared fixtures: the sample tokenizer, JSONL writers, and one build of sample_data."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_data"
TOKENIZER = str(SAMPLE / "tokenizer")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):  # one of `make test`'s workers: a core each, not every core each
    os.environ.setdefault("OMP_NUM_THREADS", "1")
# torch's CPU tensors of 2 MB or more on huge pages (madvise): the equivalence tests' vocabulary-wide logits are
# gigabytes, and faulting them in 4 KB pages costs a fifth of their time
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")


def pytest_collection_modifyitems(config, items):
    """The order of the test files (``make test`` keeps it: ``--no-loadscope-reorder``): files marked ``early`` first
    (a Ray cluster: its tests mostly wait, and the other worker's tests fill the cores meanwhile), then files of more
    tests before files of fewer, pytest-xdist's own order; the collection's order among equals."""
    files: dict[Path, list] = {}
    for item in items:
        files.setdefault(item.path, []).append(item)
    order = sorted(files, key=lambda path: (files[path][0].get_closest_marker("early") is None, -len(files[path])))
    items[:] = [item for path in order for item in files[path]]


@pytest.fixture(autouse=True)
def _fresh_flex_compile(request):
    """Each FlexAttention test compiles its own kernels: transformers compiles ``flex_attention`` once per
    process without ``dynamic=False``, so a second test's shapes recompile it with dynamic shapes, and
    torch 2.11's CPU template for those emits C++ that does not compile (``cur_qSplitSize1`` undeclared)."""
    if "flex" in request.node.name:
        import torch

        torch._dynamo.reset()
    yield


@pytest.fixture(scope="session")
def tok():
    from packer.encode.tokenizer import load_tokenizer

    return load_tokenizer(TOKENIZER, ["<image>", "<audio>"])


@pytest.fixture
def write_jsonl(tmp_path):
    """write_jsonl(name, records) -> path; a record is a dict (dumped) or a raw str/bytes line."""

    def write(name: str, records: list, *, newline: bytes = b"\n") -> Path:
        path = tmp_path / name
        lines = []
        for r in records:
            if isinstance(r, bytes):
                lines.append(r)
            elif isinstance(r, str):
                lines.append(r.encode())
            else:
                lines.append(json.dumps(r).encode())
        path.write_bytes(newline.join(lines) + newline)
        return path

    return write


@pytest.fixture(scope="module")  # module-scoped fixtures of a family's module build on it (Llama 4's small_rows)
def built(request, tmp_path_factory):
    """A family's test module's (``FAMILY = "<name>"``) build of the family harness's records, once a session
    (``family_harness.family_build``), shared with its conformance suite."""
    from family_harness import family_build

    return family_build(request.module.FAMILY, tmp_path_factory)


@pytest.fixture(scope="module")
def alone(request, tmp_path_factory):
    """The family's packed == alone build (``family_harness.alone_build``): ``built`` where it declares none."""
    from family_harness import alone_build

    return alone_build(request.module.FAMILY, tmp_path_factory)


@pytest.fixture(scope="session")
def sample_build(tmp_path_factory):
    """sample_data built once with the default pipeline into a temporary folder."""
    from packer.build import build
    from packer.config import resolve

    out = tmp_path_factory.mktemp("sample") / "out"
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        config = resolve(ROOT / "pipelines" / "sample.toml", output=str(out))
        manifest = build(config, progress=False).to_dict()
    finally:
        os.chdir(cwd)
    return out, manifest
