"""Media inside the build (``--media embed``): each packed shard's media bytes in ``media/part-K.arrow`` beside it, in
the order its rows use them, once each, sha256-named; the loader reads them from there, verify checks them, repack
rewrites them from stage 1's, and the build folder trains with no other file (moved, or in object storage)."""

from __future__ import annotations

import json
import os
import shutil

import pyarrow as pa
import pytest

pytest.importorskip("av")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from family_assets import FAMILY_ASSETS  # noqa: E402
from media_fixtures import write_images  # noqa: E402

from packer.build import build  # noqa: E402
from packer.config import resolve  # noqa: E402
from packer.errors import ConfigError  # noqa: E402
from packer.io import blobs  # noqa: E402
from packer.loader import PackedCollator, PackedDataset, SampleDataset  # noqa: E402
from packer.shards.manifest import Manifest  # noqa: E402
from packer.verify import verify  # noqa: E402

QWEN3VL = FAMILY_ASSETS["qwen3vl"]
IMAGES = ("plain_300x200.jpg", "photo.webp", "exif6.jpg", "palette_alpha.png")


def _records() -> list[dict]:
    """Text, one image, two images, an image several records share; a record's images in ``images`` order."""
    picks = [[], [0], [1, 2], [0], [3], [], [2, 0], [1], [3, 3], [0, 1, 2], [], [2]]
    out = []
    for k, pick in enumerate(picks):
        content = [{"type": "image", "image": f"img/{IMAGES[i]}"} for i in pick] + [{"type": "text", "text": f"What is {k}?"}]
        out.append({"id": f"r{k}", "messages": [{"role": "user", "content": content},
                                                {"role": "assistant", "content": f"It is {k}, plainly."}]})
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("mshards")
    files = write_images(root / "img")
    for name in set(files) - set(IMAGES):
        files[name].unlink()
    (root / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _records()))
    processor = QWEN3VL.processor(root / "checkpoint")
    return root, processor


def make(root, out, source=None, **settings):
    settings = {"max_length": 256, "chunk_records": 4, "shard_rows": 1, "order": "planner", "max_bad_fraction": 0.0,
                **settings}
    return build(resolve(None, input=[str(source or root / "records.jsonl")], output=str(out), family="qwen3vl",
                         processor=str(root / "checkpoint"), **settings), progress=False)


@pytest.fixture(scope="module")
def builds(data):
    root, _ = data
    return make(root, root / "ref", media="ref"), make(root, root / "embed", media="embed")


def pixels(out, processor) -> dict[str, torch.Tensor]:
    ds = PackedDataset(out)
    batch = PackedCollator(family=ds.family, processor=processor)([ds[i] for i in range(len(ds))])
    return {k: batch[k] for k in ("input_ids", "labels", "position_ids", "pixel_values", "image_grid_thw")}


def sample_pixels(out, processor) -> dict[str, torch.Tensor]:
    """Every stage-1 sample (dropped ones too) collated: ``SampleDataset`` finds an embedded build's blobs by name."""
    ds = SampleDataset(out)
    batch = PackedCollator(family=ds.family, processor=processor)([ds[i] for i in range(len(ds))])
    return {k: batch[k] for k in ("input_ids", "labels", "pixel_values", "image_grid_thw")}


def rows(out) -> list[dict]:
    ds = PackedDataset(out)
    return [ds[i] for i in range(len(ds))]


def read(path) -> pa.Table:
    return pa.ipc.open_stream(pa.memory_map(str(path))).read_all()


def test_an_embedded_build_packs_and_loads_what_the_files_build_does(data, builds):
    root, processor = data
    ref, embed = builds
    assert not ref.files.embedded and embed.files.embedded
    assert len(embed.files.media_shards) == len(embed.files.packed) > 2  # every packed shard has its pair
    assert [e.file for e in embed.files.media_shards] == [e.file.replace("packed/", "media/") for e in embed.files.packed]
    for a, b in zip(rows(root / "ref"), rows(root / "embed"), strict=True):
        for key in ("input_ids", "labels", "cu_seqlens"):
            assert a[key].tolist() == b[key].tolist()
        assert a["segment_ids"] == b["segment_ids"]
        strip = lambda spans: [{k: v for k, v in m.items() if k not in ("ref", "path")} for m in spans]  # noqa: E731
        assert strip(a["media"]) == strip(b["media"])
        assert all(blobs.is_blob(m["ref"]) for m in b["media"]) and not any(blobs.is_blob(m["ref"]) for m in a["media"])
        for m, n in zip(a["media"], b["media"], strict=True):  # the blob is the file's bytes
            assert n["ref"] == blobs.name((root / m["ref"]).read_bytes())
    got, want = pixels(root / "embed", processor), pixels(root / "ref", processor)
    assert want["pixel_values"].shape[0] > 0
    for key in want:
        assert torch.equal(got[key], want[key]), key
    assert embed.files.media is None  # no file to stat: the media index holds none


def test_a_media_shard_holds_its_rows_blobs_once_in_first_use_order(data, builds, tmp_path):
    from packer.pipeline.repack import repack

    root, _ = data
    _, embed = builds
    one = repack(root / "embed", output=str(tmp_path / "one"), shard_rows=1000, progress=False)  # all rows in one shard
    for out, manifest in ((root / "embed", embed), (tmp_path / "one", one)):
        for packed, media in zip(manifest.files.packed, manifest.files.media_shards, strict=True):
            spans = read(out / packed.file).column("media").to_pylist()
            table = read(out / media.file)
            assert table.schema.metadata[b"packer.kind"] == b"media_blobs"
            order = list(dict.fromkeys(m["ref"] for row in spans for m in row))
            assert table.column("name").to_pylist() == order
            for name, data_ in zip(order, table.column("data").to_pylist(), strict=True):
                assert blobs.name(data_) == name
            assert media.rows == len(order) and media.bytes == (out / media.file).stat().st_size
    spans = read(tmp_path / "one" / one.files.packed[0].file).column("media").to_pylist()
    names = read(tmp_path / "one" / one.files.media_shards[0].file).column("name").to_pylist()
    assert len(names) == len(IMAGES) < sum(len(row) for row in spans)  # each image once, though rows name them again
    seen: set[str] = set()
    for row in spans:  # a row's media that no earlier row used are adjacent rows of the media shard
        new = [names.index(r) for r in dict.fromkeys(m["ref"] for m in row) if r not in seen]
        assert new == list(range(new[0], new[0] + len(new))) if new else True
        seen |= {m["ref"] for m in row}


def test_auto_embeds_exactly_when_a_source_has_no_files_and_ref_refuses_it(data, builds, tmp_path):
    root, _ = data
    datasets = pytest.importorskip("datasets")
    ref, _ = builds
    assert make(root, tmp_path / "auto").files.embedded is False  # files: auto keeps refs
    table = datasets.Dataset.from_list([{"id": "p0", "conversations": [{"from": "human", "value": "<image>\nWhat?"},
                                                                       {"from": "gpt", "value": "A picture."}],
                                         "image": {"bytes": (root / "img" / IMAGES[0]).read_bytes(), "path": IMAGES[0]}}])
    table.cast_column("image", datasets.Image()).to_parquet(str(tmp_path / "cells.parquet"))
    auto = make(root, tmp_path / "cells", tmp_path / "cells.parquet")
    assert auto.files.embedded and auto.accounting.samples_packed == 1
    with pytest.raises(ConfigError, match=r"media = 'ref' but the media of .*cells\.parquet are embedded in the input.*"
                                          r"use --media embed \(or auto, the default\)"):
        make(root, tmp_path / "refused", tmp_path / "cells.parquet", media="ref")


def test_media_shards_are_the_same_bytes_with_one_or_two_workers_and_resume(data, builds, tmp_path):
    root, _ = data
    _, embed = builds
    two = make(root, tmp_path / "two", media="embed", workers=2)
    assert [e.sha256 for e in two.files.media_shards] == [e.sha256 for e in embed.files.media_shards]
    assert two.files.unpacked_media == embed.files.unpacked_media and two.files.sample_media == []
    for e in two.files.media_shards:  # a rerun: every shard and media shard reused, the same bytes
        (tmp_path / "two" / e.file).unlink()
    again = make(root, tmp_path / "two", media="embed", workers=2)
    assert [e.sha256 for e in again.files.media_shards] == [e.sha256 for e in embed.files.media_shards]


def test_verify_checks_the_media_shards(data, builds, tmp_path):
    root, _ = data
    out = tmp_path / "copy"
    shutil.copytree(root / "embed", out)
    problems, checked = verify(out, media="stat", deep=True)
    assert problems == [] and checked["media"] == sum(e.rows for e in Manifest.read(out).files.blob_store)
    manifest = Manifest.read(out)
    first = manifest.files.media_shards[0]
    table = read(out / first.file)
    # bytes that are not their name's, the manifest's sha256 updated with them: only --media sees it
    forged = pa.table({"name": table.column("name"), "data": pa.array([b"x" * 10] + table.column("data").to_pylist()[1:],
                                                                      pa.large_binary())}, schema=table.schema)
    entry = _rewrite(out, first.file, forged)
    assert verify(out)[0] == []
    problems = verify(out, media="stat")[0]
    assert [(p.file, p.row) for p in problems] == [(first.file, 0)] and "under the name sha256:" in problems[0].message
    # a span whose blob its media shard lacks (the shard cut short, hash updated): --media names the row, --deep the order
    _rewrite(out, first.file, table.slice(0, table.num_rows - 1))
    problems = verify(out, media="stat", deep=True)[0]
    assert any(p.file == manifest.files.packed[0].file and "does not hold" in p.message for p in problems)
    assert any(p.file == first.file and "not the media shard stage 3 writes" in p.message for p in problems)
    (out / first.file).write_bytes(b"damaged")  # plain verify: named like a packed shard
    problems = verify(out)[0]
    assert problems[0].file == first.file and "size" in problems[0].message
    del entry


def _rewrite(out, file: str, table: pa.Table):
    """Write ``table`` as ``out/file`` and put its size and sha256 in the manifest (an edit only content checks see)."""
    import dataclasses

    from packer.shards.io import write_shard

    entry = write_shard(out / file, table, out)
    manifest = Manifest.read(out)
    manifest.files.media_shards = [entry if e.file == file else e for e in manifest.files.media_shards]
    manifest.write(out)
    return dataclasses.asdict(entry)


def test_repack_writes_new_media_shards_without_the_sources(data, builds, tmp_path):
    root, processor = data
    src = tmp_path / "src"
    shutil.copytree(root / "embed", src)
    moved = tmp_path / "gone"
    shutil.copytree(root / "img", moved)
    shutil.rmtree(root / "img")  # the sources are gone while repack runs
    try:
        from packer.pipeline.repack import repack

        m = repack(src, output=str(tmp_path / "wide"), max_length=2048, progress=False)
        assert m.files.embedded and len(m.files.packed) != len(Manifest.read(src).files.packed)
        assert verify(tmp_path / "wide", media="stat", deep=True)[0] == []
        got = pixels(tmp_path / "wide", processor)
    finally:
        shutil.copytree(moved, root / "img")
    want = pixels(root / "ref", processor)
    # other rows, the same images: the same pixels per image, in another order
    assert sorted(got["image_grid_thw"].tolist()) == sorted(want["image_grid_thw"].tolist())
    assert torch.isclose(got["pixel_values"].sum(), want["pixel_values"].sum(), rtol=1e-5)


def test_an_embedded_build_moved_without_its_media_trains_and_verifies(data, builds, tmp_path):
    from transformers import TrainingArguments

    from packer.loader import PackedTrainer

    root, processor = data
    out = tmp_path / "moved"
    shutil.copytree(root / "embed", out)
    want = pixels(root / "ref", processor)
    moved = tmp_path / "img"
    shutil.move(root / "img", moved)
    shutil.move(root / "records.jsonl", tmp_path / "records.jsonl")
    try:
        ds = PackedDataset(out)
        problems, _ = verify(out, media="stat", deep=True)
        assert problems == []
        assert torch.equal(pixels(out, processor)["pixel_values"], want["pixel_values"])
        model = QWEN3VL.model(processor, "sdpa")
        args = TrainingArguments(output_dir=str(tmp_path / "t"), per_device_train_batch_size=1, max_steps=1, report_to=[],
                                 use_cpu=True, save_strategy="no", dataloader_num_workers=0, disable_tqdm=True)
        before = [p.detach().clone() for p in model.parameters()]
        result = PackedTrainer(model=model, args=args, train_dataset=ds).train()
        assert np.isfinite(result.training_loss)
        assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    finally:
        shutil.move(moved, root / "img")
        shutil.move(tmp_path / "records.jsonl", root / "records.jsonl")


def test_an_embedded_build_in_object_storage_trains_and_verifies_there(data, builds, tmp_path_factory):
    """The embedded build uploaded to the local S3 server, the records and images it was built from moved away:
    verify --media --deep passes there, the loader gives the files build's pixels, and a PackedTrainer step trains."""
    pytest.importorskip("s3fs")
    pytest.importorskip("moto")
    import s3fs
    from s3_server import S3Server
    from transformers import TrainingArguments

    from packer.loader import PackedTrainer

    root, processor = data
    want = pixels(root / "ref", processor)
    away = tmp_path_factory.mktemp("away")
    shutil.move(root / "img", away / "img")
    shutil.move(root / "records.jsonl", away / "records.jsonl")
    saved = dict(os.environ)
    with S3Server() as server:
        try:
            os.environ.update(server.env)
            os.environ["PACKER_CACHE"] = str(tmp_path_factory.mktemp("packer-cache"))
            s3fs.S3FileSystem.clear_instance_cache()
            fs = server.filesystem()
            fs.mkdir("builds")
            fs.put(str(root / "embed"), "builds/embed", recursive=True)
            assert verify("s3://builds/embed", media="stat", deep=True)[0] == []
            got = pixels("s3://builds/embed", processor)
            model = QWEN3VL.model(processor, "sdpa")
            args = TrainingArguments(output_dir=str(away / "t"), per_device_train_batch_size=1, max_steps=1, report_to=[],
                                     use_cpu=True, save_strategy="no", dataloader_num_workers=0, disable_tqdm=True)
            result = PackedTrainer(model=model, args=args, train_dataset=PackedDataset("s3://builds/embed")).train()
            assert np.isfinite(result.training_loss)
        finally:
            s3fs.S3FileSystem.clear_instance_cache()
            os.environ.clear()
            os.environ.update(saved)
            shutil.move(away / "img", root / "img")
            shutil.move(away / "records.jsonl", root / "records.jsonl")
    assert torch.equal(got["pixel_values"], want["pixel_values"])


@pytest.mark.slow  # starts Ray: a minute or more on 2 cores
def test_the_ray_engine_writes_the_local_engines_media_shards(data, builds, tmp_path):
    ray = pytest.importorskip("ray")
    root, _ = data
    _, embed = builds
    try:
        on_ray = make(root, tmp_path / "ray", media="embed", engine="ray", workers=2)
    finally:
        ray.shutdown()
    for mine, local in ((on_ray.files.media_shards, embed.files.media_shards),
                        ([on_ray.files.unpacked_media], [embed.files.unpacked_media])):
        assert [e and (e.file, e.sha256) for e in mine] == [e and (e.file, e.sha256) for e in local]


def _blob_names(out, entries) -> list[list[str]]:
    return [read(out / e.file).column("name").to_pylist() for e in entries]


def _sample_blobs(out) -> set[str]:
    manifest = Manifest.read(out)
    return {m["ref"] for e in manifest.files.samples for spans in read(out / e.file).column("media").to_pylist()
            for m in spans if blobs.is_blob(m["ref"])}


def test_the_build_folder_holds_each_blob_once(data, tmp_path):
    """Stage 1's media shards are gone once the build is finished; the blobs of samples no packed row uses (dropped
    over a media cap here) are in the leftover shard, once, and in no packed media shard; a repack that packs them
    reads them there, and gives a fresh build's pixels."""
    root, processor = data
    picks = [[0], [1, 2], [3], [2, 1], [0, 3], [3]]  # images 1 and 2: only in the samples max_images=1 drops
    shutil.copytree(root / "img", tmp_path / "img")
    lines = []
    for k, pick in enumerate(picks):
        content = [{"type": "image", "image": f"img/{IMAGES[i]}"} for i in pick] + [{"type": "text", "text": f"Say {k}."}]
        lines.append(json.dumps({"id": f"o{k}", "messages": [{"role": "user", "content": content},
                                                              {"role": "assistant", "content": f"{k}, then."}]}))
    (tmp_path / "once.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "once"
    m = make(root, out, tmp_path / "once.jsonl", media="embed", max_images=1, shard_rows=2, max_bad_fraction=1.0)
    assert m.accounting.dropped_by_reason == {"over_media_cap": 3}
    assert m.files.sample_media == [] and not list((out / "samples").glob("media-part-*"))
    assert {f.name for f in (out / "samples").iterdir() if f.name.startswith("media-")} == {"media-unpacked.arrow"}
    packed = _blob_names(out, m.files.media_shards)
    [leftover] = _blob_names(out, [m.files.unpacked_media])
    own = {blobs.name((root / "img" / IMAGES[i]).read_bytes()) for i in (1, 2)}
    assert sorted(leftover) == sorted(own)  # each once, and none a packed row uses
    assert all(len(names) == len(set(names)) for names in packed) and not own & {n for ns in packed for n in ns}
    assert {n for ns in packed for n in ns} | set(leftover) == _sample_blobs(out)
    assert verify(out, media="stat", deep=True)[0] == []
    _check_leftover_verified(out, tmp_path / "edited")

    from packer.pipeline.repack import repack

    ref = make(root, tmp_path / "ref", tmp_path / "once.jsonl", media="ref", max_images=1, shard_rows=2,
               max_bad_fraction=1.0)
    want_samples = sample_pixels(tmp_path / "ref", processor)
    shutil.move(tmp_path / "img", tmp_path / "gone")  # the sources are gone while repack runs
    got_samples = sample_pixels(out, processor)  # every sample, the dropped ones' blobs from the leftover shard
    for key in want_samples:
        assert torch.equal(got_samples[key], want_samples[key]), key
    assert ref.accounting.dropped_by_reason == m.accounting.dropped_by_reason
    again = repack(out, output=str(tmp_path / "all"), max_images=3, progress=False)  # the dropped samples packed
    assert again.accounting.samples_packed == len(picks) and again.files.unpacked_media is None
    assert verify(tmp_path / "all", media="stat", deep=True)[0] == []
    shutil.move(tmp_path / "gone", tmp_path / "img")
    fresh = make(root, tmp_path / "fresh", tmp_path / "once.jsonl", media="embed", max_images=3, shard_rows=2)
    assert [e.sha256 for e in again.files.packed] == [e.sha256 for e in fresh.files.packed]
    assert [e.sha256 for e in again.files.media_shards] == [e.sha256 for e in fresh.files.media_shards]
    got, want = pixels(tmp_path / "all", processor), pixels(tmp_path / "fresh", processor)
    for key in want:
        assert torch.equal(got[key], want[key]), key


def _check_leftover_verified(out, copy) -> None:
    """verify --media names a sample's blob the leftover shard lost; --deep a blob it holds that media/ holds too."""
    from packer.shards.io import write_shard

    shutil.copytree(out, copy)
    manifest = Manifest.read(copy)
    leftover = read(copy / manifest.files.unpacked_media.file)
    packed = read(copy / manifest.files.media_shards[0].file)
    for table, problem, deep in ((leftover.slice(1), "name 1 blob(s) no media shard holds", False),
                                 (pa.concat_tables([leftover, packed.slice(0, 1)]), "a packed shard's media shard holds too",
                                  True)):
        manifest.files.unpacked_media = write_shard(copy / manifest.files.unpacked_media.file, table, copy)
        manifest.write(copy)
        problems = verify(copy, media="stat", deep=deep)[0]
        assert problems and all(problem in p.message for p in problems), problems
    shutil.rmtree(copy)


def _colors(folder, n: int) -> list[str]:
    from PIL import Image

    folder.mkdir()
    paths = []
    for k in range(n):
        path = folder / f"c{k}.png"
        Image.new("RGB", (96 + 16 * k, 64), (20 * k, 255 - 20 * k, 7 * k)).save(path)
        paths.append(str(path))
    return paths


def test_a_weighted_sources_skipped_samples_blobs_survive_into_a_repack_with_another_seed(data, tmp_path):
    """A weight=0.5 source keeps about half its records, chosen with the seed; the others' blobs go to the leftover
    shard, so a repack with another seed (other records chosen) packs them from there, the sources gone, to a fresh
    build's rows and pixels."""
    root, processor = data
    images = _colors(tmp_path / "colors", 8)
    (tmp_path / "half.jsonl").write_text("".join(json.dumps({"id": f"h{k}", "messages": [
        {"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": f"Color {k}?"}]},
        {"role": "assistant", "content": f"Color {k}."}]}) + "\n" for k, image in enumerate(images)))

    def build_(out, seed):
        return build(resolve(None, input=[str(root / "records.jsonl"), f"{tmp_path / 'half.jsonl'}#weight=0.5"],
                             output=str(out), family="qwen3vl", processor=str(root / "checkpoint"), max_length=256,
                             chunk_records=4, shard_rows=3, order="planner", media="embed", seed=seed), progress=False)

    def keys(out) -> set[str]:
        ds = PackedDataset(out)
        return {k for i in range(len(ds)) for k in ds[i]["segment_ids"]} if len(ds) else set()

    first = build_(tmp_path / "s0", 0)
    assert first.files.unpacked_media is not None and first.files.unpacked_media.rows >= 1
    want = build_(tmp_path / "s1", 1)
    shutil.move(tmp_path / "colors", tmp_path / "gone")  # the sources are gone while repack runs
    shutil.move(root / "img", tmp_path / "img")
    try:
        from packer.pipeline.repack import repack

        got = repack(tmp_path / "s0", output=str(tmp_path / "r1"), seed=1, progress=False)
        assert verify(tmp_path / "r1", media="stat", deep=True)[0] == []
        assert [e.sha256 for e in got.files.packed] == [e.sha256 for e in want.files.packed]
        assert [e.sha256 for e in got.files.media_shards] == [e.sha256 for e in want.files.media_shards]
        assert got.files.unpacked_media == want.files.unpacked_media
        new = keys(tmp_path / "r1") - keys(tmp_path / "s0")
        assert new  # samples the first build skipped, packed by the repack from the leftover shard
        pixels_got, pixels_want = pixels(tmp_path / "r1", processor), pixels(tmp_path / "s1", processor)
    finally:
        shutil.move(tmp_path / "img", root / "img")
    for key in pixels_want:
        assert torch.equal(pixels_got[key], pixels_want[key]), key
