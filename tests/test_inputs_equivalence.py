"""The same records in every input format build to the same rows.

One corpus (:mod:`inputs_corpus`: text, one and two images, videos, an image beside a video; audio for an audio
family) is written as JSONL + media files, parquet with ``datasets`` ``Image`` / ``Video`` / ``Audio`` features, a
``save_to_disk`` folder, WebDataset tars and JSONL with ``data:`` URLs. Each is built with the same settings; the
packed rows must be equal column for column -- ids, labels, segment boundaries and ids, media spans (kind, place,
length, grids, timing) -- everything but what names the input (a media span's ref: a file path or a content name;
a segment's line: a JSONL line number or a row / tar sample number). The loader then gives every build the same
batch, tensor for tensor: ids, labels, positions, and the pixels / audio features the processor makes of the media
(read from files for the JSONL build, from the build's own media shards for the others).
"""

from __future__ import annotations

import glob
from pathlib import Path

import pyarrow as pa
import pytest
from inputs_corpus import records, write_formats

from packer.build import build
from packer.config import resolve

pytestmark = pytest.mark.slow  # ten builds and their loaders: over a minute

ROOT = Path(__file__).resolve().parents[1]
FORMATS = ("jsonl", "parquet", "disk", "tar", "dataurl")
FAMILIES = {  # pipeline, media kinds, records
    "qwen3vl": ("qwen3vl.toml", ("image", "video"), 200),
    "qwen3omni": ("qwen3omni.toml", ("image", "audio"), 80),  # the audio family: its processor's features
}
NAMING = {"segment_line", "segment_source"}  # columns that name the input (line or row; which file), not the content


def packed(out: Path) -> pa.Table:
    tables = [pa.ipc.open_stream(pa.memory_map(p)).read_all() for p in sorted(glob.glob(str(out / "packed" / "*.arrow")))
              if not Path(p).name.startswith("media")]
    return pa.concat_tables(tables)


def content(table: pa.Table) -> dict:
    """Every column but the ones naming the input; media spans without their ref."""
    out = {}
    for name in table.column_names:
        if name in NAMING:
            continue
        values = table.column(name).to_pylist()
        if name == "media":
            values = [[{k: v for k, v in span.items() if k != "ref"} for span in row] for row in values]
        out[name] = _nan_free(values)
    return out


def _nan_free(value):
    """NaN (an unweighted segment's weight) as a string, so equal columns compare equal."""
    if isinstance(value, float) and value != value:
        return "nan"
    if isinstance(value, list):
        return [_nan_free(v) for v in value]
    if isinstance(value, dict):
        return {k: _nan_free(v) for k, v in value.items()}
    return value


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def builds(request, tmp_path_factory) -> dict[str, Path]:
    pipeline, kinds, n = FAMILIES[request.param]
    folder = tmp_path_factory.mktemp(f"formats-{request.param}")
    inputs = write_formats(folder / "in", records(n, kinds), kinds)
    outs = {}
    for fmt in FORMATS:
        out = folder / f"out-{fmt}"
        config = resolve(ROOT / "pipelines" / pipeline, input=[str(inputs[fmt])], output=str(out), max_length=2048,
                         chunk_records=64)
        manifest = build(config, progress=False)
        assert manifest.accounting.quarantined == 0, (fmt, (out / "quarantine.jsonl").read_text()[:2000])
        assert manifest.accounting.samples_packed == n, fmt
        outs[fmt] = out
    return outs


def batch(out: Path) -> dict:
    """Every row of the build through the collator its build implies (the build's processor), as one batch."""
    from packer.loader import PackedCollator, PackedDataset

    ds = PackedDataset(out)
    return PackedCollator.for_build(ds)([ds[i] for i in range(len(ds))])


@pytest.mark.parametrize("fmt", FORMATS[1:])
def test_every_format_loads_the_tensors_of_jsonl_and_files(builds, fmt):
    torch = pytest.importorskip("torch")
    expected, got = batch(builds["jsonl"]), batch(builds[fmt])
    media = [k for k in expected if k.startswith(("pixel_values", "input_features", "audio", "video", "image_grid"))]
    assert media, sorted(expected)  # the batch holds media tensors to compare
    assert set(got) == set(expected)
    for key, value in expected.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(got[key], value), f"{fmt}: {key} differs from the JSONL + files build"


@pytest.mark.parametrize("fmt", FORMATS[1:])
def test_every_format_packs_the_rows_of_jsonl_and_files(builds, fmt):
    expected, got = content(packed(builds["jsonl"])), content(packed(builds[fmt]))
    assert set(got) == set(expected)
    for name in expected:
        assert got[name] == expected[name], f"{fmt}: column {name} differs from the JSONL + files build"


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_build_verifies_with_its_media_and_deep(builds, fmt):
    from packer.verify import verify

    problems, checked = verify(builds[fmt], media="stat", deep=True)  # blobs: hashed against their names
    assert not problems, [str(p) for p in problems[:5]]


def test_segment_lines_name_rows_and_samples(builds):
    """A JSONL record is its line (1-based); a table row and a tar sample their number in the file (0-based)."""
    lines = packed(builds["jsonl"]).column("segment_line").to_pylist()
    rows = packed(builds["parquet"]).column("segment_line").to_pylist()
    assert [[n - 1 for n in row] for row in lines] == rows


def test_tables_and_tars_on_ray_write_the_local_engines_bytes(tmp_path):
    """A parquet file, a save_to_disk folder and WebDataset tars as one build: on Ray (2 workers, each task reading its
    own row groups / tar) every samples, media and packed file is the same bytes as with the local engine."""
    ray = pytest.importorskip("ray")
    kinds = ("image", "video")
    inputs = write_formats(tmp_path / "in", records(24, kinds), kinds, formats=("parquet", "disk", "tar"))
    manifests = {}
    for engine, workers in (("local", 1), ("ray", 2)):
        config = resolve(ROOT / "pipelines" / "qwen3vl.toml", input=[str(inputs[f]) for f in ("parquet", "disk", "tar")],
                         output=str(tmp_path / engine), max_length=2048, chunk_records=4, engine=engine, workers=workers)
        try:
            manifests[engine] = build(config, progress=False)
        finally:
            if engine == "ray":
                ray.shutdown()
    files = {engine: m.files for engine, m in manifests.items()}
    for kind in ("samples", "packed", "media_shards"):
        local, on_ray = getattr(files["local"], kind), getattr(files["ray"], kind)
        assert local and [(e.file, e.sha256) for e in on_ray] == [(e.file, e.sha256) for e in local], kind
    assert files["ray"].unpacked_media == files["local"].unpacked_media and not files["ray"].sample_media
