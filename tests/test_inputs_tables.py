"""Tables in: parquet, Arrow IPC and ``datasets.save_to_disk`` folders build like the same records as JSONL + files.

Every dataset here is written with ``datasets`` (``Image()`` / ``Audio()`` / ``Video()`` features, the hub's
``{"bytes", "path"}`` cells) from sample_data's media, in the published layouts read with no mapping (TRL's VLM SFT
sets, LLaVA-OneVision-Data, The Cauldron), and built with sample_data's Qwen3-VL (Qwen3-Omni for audio) processor:
the packed ids, labels, boundaries and media spans equal the JSONL build's, and ``verify --against-processor``
re-reads the rows. Then the column mapping, each record's identity (file + 0-based row), the work split by row
group, bad tables and the fingerprint.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import SAMPLE

datasets = pytest.importorskip("datasets")

QWEN3VL = str(SAMPLE / "processors" / "qwen3vl")
QWEN3OMNI = str(SAMPLE / "processors" / "qwen3omni")
IMAGES = ["images/small_224.png", "images/square_336.png", "images/landscape_640x480.jpg"]


def cell(path: str) -> dict:
    """A hub cell: the file's bytes embedded (``datasets`` keeps a path-only cell when cast from a path)."""
    return {"bytes": (SAMPLE / path).read_bytes(), "path": Path(path).name}


def media_folder(tmp_path: Path) -> Path:
    """A folder holding sample_data's images and audio, for the JSONL + files twin of a table."""
    folder = tmp_path / "files"
    for sub in ("images", "audio", "videos"):
        shutil.copytree(SAMPLE / sub, folder / sub)
    return folder


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def build_of(inputs, out: Path, processor: str = QWEN3VL, family: str = "qwen3vl", **settings) -> dict:
    from packer.build import build
    from packer.config import resolve

    settings.setdefault("modalities", ("image",))
    settings.setdefault("workers", 1)
    inputs = [str(i) for i in (inputs if isinstance(inputs, list) else [inputs])]
    return build(resolve(None, input=inputs, output=str(out), family=family, processor=processor, **settings),
                 progress=False).to_dict()


def packed(out: Path) -> list[dict]:
    """The packed rows as training reads them, media spans without their ref (a path or a blob name)."""
    from packer.shards.io import read_shard

    manifest = json.loads((out / "manifest.json").read_text())
    rows = pa.concat_tables([read_shard(out / f["file"]) for f in manifest["files"]["packed"]]).to_pylist()
    keep = ("input_ids", "labels", "cu_seqlens", "segment_modality", "n_tokens")  # a row number is 0-based, a line 1-based
    return [{**{k: r[k] for k in keep}, "media": [{k: v for k, v in m.items() if k != "ref"} for m in r["media"]]}
            for r in rows]


def lines(out: Path) -> list[list[int]]:
    """Each packed row's segments' record numbers (``segment_line``)."""
    from packer.shards.io import read_shard

    manifest = json.loads((out / "manifest.json").read_text())
    return [line for f in manifest["files"]["packed"] for line in read_shard(out / f["file"]).column("segment_line").to_pylist()]


def quarantine(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "quarantine.jsonl").read_text().splitlines() if line.strip()]


def against_processor(out: Path, processor: str = QWEN3VL) -> None:
    from packer.verify.against_processor import verify_against_processor

    mismatches, checked = verify_against_processor(out, processor)
    assert checked and not mismatches, [str(m) for m in mismatches]


# ---------------------------------------------------------------- the published layouts, with no mapping


def trl(k: int) -> tuple[dict, dict]:
    """TRL's VLM SFT sets: ``messages`` with ``{"type": "image", "text": None}`` parts and an ``images`` column."""
    paths = [IMAGES[(k + j) % 3] for j in range(1 + k % 2)]
    messages = [{"role": "user", "content": [*({"type": "image", "text": None} for _ in paths),
                                             {"type": "text", "text": f"What is in picture {k}?"}]},
                {"role": "assistant", "content": [{"type": "text", "text": f"Shapes, {k} of them."}]}]
    return {"messages": messages, "images": [cell(p) for p in paths]}, {"messages": messages, "images": paths}


def llava_onevision(k: int) -> tuple[dict, dict]:
    """LLaVA-OneVision-Data: ``id``, ``conversations`` (from / value, ``<image>``), one ``image``, ``data_source``."""
    conversations = [{"from": "human", "value": f"<image>\nWhat is {k}?"}, {"from": "gpt", "value": f"It is {k}."}]
    row = {"id": f"ov{k}", "conversations": conversations, "data_source": "sample"}
    return {**row, "image": cell(IMAGES[k % 3])}, {**row, "image": IMAGES[k % 3]}


def cauldron(k: int) -> tuple[dict, dict]:
    """The Cauldron: ``images`` and ``texts`` turns ({user, assistant, source}); the images go before the first
    user text."""
    paths = [IMAGES[(k + j) % 3] for j in range(1 + k % 2)]
    texts = [{"user": f"Question {k}?", "assistant": f"Answer {k}.", "source": "s"},
             {"user": "And then?", "assistant": "Nothing.", "source": "s"}]
    messages = []
    for t, turn in enumerate(texts):
        messages += [{"role": "user", "content": [*({"type": "image"} for _ in (paths if t == 0 else ())),
                                                  {"type": "text", "text": turn["user"]}]},
                     {"role": "assistant", "content": turn["assistant"]}]
    return {"images": [cell(p) for p in paths], "texts": texts}, {"messages": messages, "images": paths}


def picture(k: int) -> tuple[dict, dict]:
    """One ``Image()`` column named otherwise (``picture``): found by its feature, read as the record's image."""
    conversations = [{"from": "human", "value": f"<image>\nWhich {k}?"}, {"from": "gpt", "value": "This one."}]
    return {"conversations": conversations, "picture": cell(IMAGES[k % 3])}, {"conversations": conversations,
                                                                             "image": IMAGES[k % 3]}


LAYOUTS = {"trl": (trl, {"images": "list"}), "llava_onevision": (llava_onevision, {"image": "one"}),
           "cauldron": (cauldron, {"images": "list"}), "picture": (picture, {"picture": "one"})}


def dataset(layout: str, n: int = 6):
    """``(datasets.Dataset, JSONL records)`` of ``n`` rows of ``layout``."""
    make, media = LAYOUTS[layout]
    pairs = [make(k) for k in range(n)]
    ds = datasets.Dataset.from_list([row for row, _ in pairs])
    for column, shape in media.items():
        ds = ds.cast_column(column, datasets.List(datasets.Image()) if shape == "list" else datasets.Image())
    return ds, [record for _, record in pairs]


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_published_layout_builds_as_its_records_as_jsonl_and_files_and_verifies_against_the_processor(layout,
                                                                                                        tmp_path):
    ds, records = dataset(layout)
    ds.to_parquet(str(tmp_path / "data.parquet"))
    assert pq.ParquetFile(tmp_path / "data.parquet").schema_arrow.field(next(iter(LAYOUTS[layout][1]))).type == (
        pa.list_(pa.struct({"bytes": pa.binary(), "path": pa.string()})) if LAYOUTS[layout][1] != {"image": "one"}
        and LAYOUTS[layout][1] != {"picture": "one"} else pa.struct({"bytes": pa.binary(), "path": pa.string()}))
    jsonl = write_jsonl(media_folder(tmp_path) / "data.jsonl", records)
    table = build_of(tmp_path / "data.parquet", tmp_path / "table")
    files = build_of(jsonl, tmp_path / "files_out")
    assert table["accounting"]["samples_packed"] == len(records) == files["accounting"]["samples_packed"]
    assert packed(tmp_path / "table") == packed(tmp_path / "files_out")
    assert [[n + 1 for n in r] for r in lines(tmp_path / "table")] == lines(tmp_path / "files_out")
    against_processor(tmp_path / "table")


def test_audio_and_video_features_named_otherwise_build_and_verify_against_the_processor(tmp_path):
    """``Audio()`` and ``Video()`` cells (datasets 5.2's storage: {bytes, path} structs) in columns named ``sound``
    and ``clip``: each the record's one audio / video, equal to the same record with files."""
    audio = ["audio/tone_a4_1s.wav", "audio/tone_c5_2s.flac"]
    content = [{"type": "audio", "text": None}, {"type": "video", "text": None}, {"type": "text", "text": "What?"}]
    messages = [{"role": "user", "content": content}, {"role": "assistant", "content": [{"type": "text", "text": "A tone."}]}]
    video = "videos/orbit_96x64_2s.mp4"
    rows = [{"messages": messages, "sound": cell(audio[k % 2]), "clip": cell(video)} for k in range(3)]
    ds = datasets.Dataset.from_list(rows).cast_column("sound", datasets.Audio()).cast_column("clip", datasets.Video())
    ds.to_parquet(str(tmp_path / "av.parquet"))
    jsonl = write_jsonl(media_folder(tmp_path) / "av.jsonl",
                        [{"messages": messages, "audio": audio[k % 2], "video": video} for k in range(3)])
    kinds = dict(processor=QWEN3OMNI, family="qwen3omni", modalities=("image", "audio", "video"))
    assert build_of(tmp_path / "av.parquet", tmp_path / "table", **kinds)["accounting"]["samples_packed"] == 3
    build_of(jsonl, tmp_path / "files_out", **kinds)
    assert packed(tmp_path / "table") == packed(tmp_path / "files_out")
    assert {m["kind"] for r in packed(tmp_path / "table") for m in r["media"]} == {"audio", "video"}
    against_processor(tmp_path / "table", QWEN3OMNI)


def test_a_bytes_path_struct_column_named_images_reads_without_features(tmp_path):
    """A parquet written by pyarrow alone (no ``huggingface`` metadata): an ``images`` list of {bytes, path}
    structs is the record's images by its name."""
    ds, records = dataset("trl")
    table = ds.data.table.replace_schema_metadata(None)
    assert table.schema.metadata is None
    pq.write_table(table, tmp_path / "plain.parquet")
    build_of(tmp_path / "plain.parquet", tmp_path / "table")
    build_of(write_jsonl(media_folder(tmp_path) / "data.jsonl", records), tmp_path / "files_out")
    assert packed(tmp_path / "table") == packed(tmp_path / "files_out")


def with_features(table: pa.Table, features: dict) -> pa.Table:
    return table.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": features}})})


def test_a_media_column_of_a_feature_packer_cannot_decode_is_one_config_error_before_any_record(tmp_path):
    """A ``Pdf`` feature (or an ``Audio()`` one) read as the record's images: every row would fail alike, so the
    input is refused when its tasks are made, naming the column, its type and the fix."""
    from packer.errors import ConfigError

    ds, _ = dataset("trl", 2)
    messages = {"feature": {"role": {"dtype": "string", "_type": "Value"}}, "_type": "List"}
    for feature, named in ([{"feature": {"_type": "Pdf"}, "_type": "List"}, "'Pdf' feature"],
                           [{"feature": {"_type": "Audio"}, "_type": "List"}, "Audio()"]):
        pq.write_table(with_features(ds.data.table, {"messages": messages, "images": feature}), tmp_path / "pdf.parquet")
        with pytest.raises(ConfigError, match=rf"pdf.parquet: column 'images', read as the record's images, is an? "
                                              rf"{named}.*columns="):
            build_of(tmp_path / "pdf.parquet", tmp_path / "out")
        assert not (tmp_path / "out" / "samples").exists()


# ---------------------------------------------------------------- the column mapping


def renamed(tmp_path: Path) -> tuple[Path, list[dict]]:
    """TRL rows whose columns are called ``dialog`` and ``image_list``."""
    ds, records = dataset("trl", 4)
    ds = ds.rename_columns({"messages": "dialog", "images": "image_list"})
    ds.to_parquet(str(tmp_path / "renamed.parquet"))
    return tmp_path / "renamed.parquet", records


def test_a_column_mapping_reads_renamed_columns_from_the_input_spec_and_from_a_sources_table(tmp_path):
    path, records = renamed(tmp_path)
    build_of(write_jsonl(media_folder(tmp_path) / "data.jsonl", records), tmp_path / "files_out")
    build_of(f"{path}#columns=messages=dialog,images=image_list", tmp_path / "spec")
    assert packed(tmp_path / "spec") == packed(tmp_path / "files_out")
    pipeline = tmp_path / "p.toml"
    pipeline.write_text(f'[[sources]]\ninput = "{path}"\ncolumns = {{messages = "dialog", images = "image_list"}}\n')
    from packer.build import build
    from packer.config import resolve

    build(resolve(pipeline, output=str(tmp_path / "table"), family="qwen3vl", processor=QWEN3VL, modalities=("image",),
                  workers=1), progress=False)
    assert packed(tmp_path / "table") == packed(tmp_path / "files_out")


def test_a_mapped_column_the_table_lacks_is_one_config_error_before_any_record(tmp_path):
    from packer.errors import ConfigError

    path, _ = renamed(tmp_path)
    with pytest.raises(ConfigError, match=r"renamed.parquet: the column mapping images=pictures names column\(s\) the "
                                          r"file does not have \(its columns: dialog, image_list\); fix columns="):
        build_of(f"{path}#columns=messages=dialog,images=pictures", tmp_path / "out")
    assert not (tmp_path / "out" / "samples").exists()


def test_two_sources_reading_one_file_differently_are_refused(tmp_path):
    from packer.errors import ConfigError

    path, _ = renamed(tmp_path)
    with pytest.raises(ConfigError, match=r"named by two sources of different settings.*columns=messages=dialog"):
        build_of([f"{path}#columns=messages=dialog,images=image_list", f"{path}#format=parquet"], tmp_path / "out")


# ---------------------------------------------------------------- identity: file + 0-based row


def test_a_table_record_is_named_by_file_and_row_in_quarantine_dropped_segments_and_inspect(tmp_path):
    """Row 1's image is not an image (quarantined, ``where: row``, ``line: 1``); row 3 is over max_length (dropped,
    ``where: row``, ``line: 3``); the packed segments of rows without an id are ``FILE row N``, in ``inspect``
    too."""
    from packer.loader.row_detail import row_detail

    ds, _ = dataset("trl", 5)
    rows = ds.with_format(None).cast_column("images", datasets.List(datasets.Image(decode=False))).to_list()
    rows[1]["images"] = [{"bytes": b"not an image at all", "path": "x.png"} for _ in rows[1]["images"]]
    rows[3]["messages"][1]["content"][0]["text"] = "word " * 3000
    datasets.Dataset.from_list(rows).cast_column("images", datasets.List(datasets.Image())).to_parquet(
        str(tmp_path / "t.parquet"))
    out = tmp_path / "out"
    manifest = build_of(tmp_path / "t.parquet", out, max_length=2048, oversize="drop", max_bad_fraction=1.0)
    assert manifest["accounting"]["samples_packed"] == 3
    (bad,) = quarantine(out)
    assert (bad["where"], bad["line"], bad["reason"], bad["file"]) == ("row", 1, "corrupt_image", str(tmp_path / "t.parquet"))
    (drop,) = [json.loads(line) for line in (out / "dropped.jsonl").read_text().splitlines()]
    assert (drop["where"], drop["line"], drop["id"]) == ("row", 3, f"{tmp_path / 't.parquet'} row 3")
    ids = {s["id"] for r in range(len(packed(out))) for s in row_detail(out, r)["segments"]}
    assert ids == {f"{tmp_path / 't.parquet'} row {k}" for k in (0, 2, 4)}
    assert sorted(line for row in lines(out) for line in row) == [0, 2, 4]


def test_a_jsonl_drop_stays_a_line(tmp_path):
    """dropped.jsonl's ``where`` is written for rows and members only: a JSONL build's entries are as before."""
    records = [{"text": "word " * 3000}, {"text": "short"}]
    manifest = build_of(write_jsonl(tmp_path / "d.jsonl", records), tmp_path / "out", max_length=2048, oversize="drop",
                        max_bad_fraction=1.0, modalities=())
    assert manifest["accounting"]["dropped"] == 1
    (drop,) = [json.loads(line) for line in (tmp_path / "out" / "dropped.jsonl").read_text().splitlines()]
    assert "where" not in drop and drop["line"] == 1


# ---------------------------------------------------------------- the work split


def three_groups(tmp_path: Path, n: int = 6) -> tuple[Path, list[dict]]:
    ds, records = dataset("llava_onevision", n)
    pq.write_table(ds.data.table, tmp_path / "groups.parquet", row_group_size=n // 3)
    assert pq.ParquetFile(tmp_path / "groups.parquet").metadata.num_row_groups == 3
    return tmp_path / "groups.parquet", records


def test_a_parquet_file_is_cut_by_row_group_from_its_footer_alone(tmp_path, monkeypatch):
    from packer.stages.encode import make_tasks

    path, _ = three_groups(tmp_path)

    def refused(*args, **kwargs):
        raise AssertionError("the driver read a row group")

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", refused)
    monkeypatch.setattr(pq.ParquetFile, "read", refused)
    tasks = list(make_tasks([path], 2, {}, readings=[("parquet", ())]))
    assert [(t.start, t.end, t.first_line, t.records) for t in tasks] == [(0, 1, 0, 2), (1, 2, 2, 2), (2, 3, 4, 2)]
    assert [(t.start, t.end) for t in make_tasks([path], 4, {}, readings=[("parquet", ())])] == [(0, 2), (2, 3)]
    monkeypatch.setattr("packer.ingest.units.MAX_TABLE_TASK_BYTES", 1)  # the memory bound: a group a task, at least one
    assert [(t.start, t.end) for t in make_tasks([path], 100, {}, readings=[("parquet", ())])] == [(0, 1), (1, 2), (2, 3)]


def files_hashes(out: Path) -> dict[str, str]:
    """Every file of a build and its sha256, the manifest without its execution details (the report, which names
    the folder and the time, aside)."""
    hashes = {}
    for f in sorted(p for p in out.rglob("*") if p.is_file() and ".state" not in p.parts and p.name != ".packer.lock"
                    and not p.name.startswith("report.")):
        data = f.read_bytes()
        if f.name == "manifest.json":
            m = json.loads(data)
            data = json.dumps({k: v for k, v in m.items() if k not in ("created_at", "execution")}, sort_keys=True).encode()
        hashes[str(f.relative_to(out))] = hashlib.sha256(data).hexdigest()
    return hashes


def test_one_and_two_workers_write_the_same_bytes_from_row_groups(tmp_path):
    path, records = three_groups(tmp_path)
    one = build_of(path, tmp_path / "one", chunk_records=2)
    build_of(path, tmp_path / "two", chunk_records=2, workers=2)
    assert len(one["files"]["samples"]) == 3
    assert files_hashes(tmp_path / "one") == files_hashes(tmp_path / "two")
    build_of(write_jsonl(media_folder(tmp_path) / "d.jsonl", records), tmp_path / "files_out")
    assert packed(tmp_path / "one") == packed(tmp_path / "files_out")


def test_save_to_disk_folders_of_two_shards_and_of_splits_and_arrow_ipc_files_build_alike(tmp_path):
    from packer.config.inputs import saved_dataset_files

    ds, records = dataset("llava_onevision", 6)
    build_of(write_jsonl(media_folder(tmp_path) / "d.jsonl", records), tmp_path / "files_out")
    expected = packed(tmp_path / "files_out")
    ds.save_to_disk(str(tmp_path / "saved"), num_shards=2)
    assert len(saved_dataset_files(tmp_path / "saved")) == 2
    build_of(tmp_path / "saved", tmp_path / "from_saved")
    assert packed(tmp_path / "from_saved") == expected
    datasets.DatasetDict({"train": ds.select(range(4)), "test": ds.select(range(4, 6))}).save_to_disk(
        str(tmp_path / "splits"))
    build_of(tmp_path / "splits", tmp_path / "from_splits")
    assert packed(tmp_path / "from_splits") == expected
    with pa.ipc.new_file(tmp_path / "data.arrow", ds.data.table.schema) as writer:
        for batch in ds.data.table.to_batches(max_chunksize=2):
            writer.write_batch(batch)
    manifest = build_of(tmp_path / "data.arrow", tmp_path / "from_ipc", chunk_records=2)
    assert len(manifest["files"]["samples"]) == 3
    assert packed(tmp_path / "from_ipc") == expected


# ---------------------------------------------------------------- bad tables


def test_a_parquet_file_cut_short_is_one_config_error_naming_it_and_the_fix(tmp_path):
    from click.testing import CliRunner

    from packer.cli import main

    path, _ = three_groups(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])
    result = CliRunner().invoke(main, ["build", "-i", str(path), "-o", str(tmp_path / "out"), "--family", "qwen3vl",
                                       "--processor", QWEN3VL, "--tokenizer", QWEN3VL, "--modalities", "image"])
    assert result.exit_code == 2, result.output
    assert f"input {path}: cannot read it as parquet" in result.output
    assert "check that the file is whole" in result.output


def test_a_cell_over_the_byte_limit_and_a_null_image_cell_are_their_rows_quarantine(tmp_path, monkeypatch):
    from packer.ingest import layouts

    ds, _ = dataset("llava_onevision", 4)
    rows = ds.with_format(None).cast_column("image", datasets.Image(decode=False)).to_list()
    rows[1]["image"] = cell("images/photo_1024x768.jpg")  # the one image over the limit below
    rows[2]["image"] = None
    datasets.Dataset.from_list(rows).cast_column("image", datasets.Image()).to_parquet(str(tmp_path / "t.parquet"))
    monkeypatch.setattr(layouts, "MAX_CELL_BYTES", max(len(cell(p)["bytes"]) for p in IMAGES))
    build_of(tmp_path / "t.parquet", tmp_path / "out", max_bad_fraction=1.0)
    found = {(q["line"], q["where"], q["reason"]) for q in quarantine(tmp_path / "out")}
    assert found == {(1, "row", "media_too_large"), (2, "row", "image_count_mismatch")}


# ---------------------------------------------------------------- the fingerprint


def test_an_edited_parquet_input_is_noticed_on_a_rerun(tmp_path):
    """The fingerprint holds each table file's size and modification time: a rerun over an edited file is refused
    (as for an edited JSONL file), never resumed from the old samples."""
    from packer.errors import ConfigError

    path, _ = three_groups(tmp_path)
    build_of(path, tmp_path / "out")
    fingerprint = json.loads((tmp_path / "out" / ".state" / "fingerprint.json").read_text())
    assert [(i["path"], i["size"]) for i in fingerprint["inputs"]] == [(str(path), path.stat().st_size)]
    ds, _ = dataset("llava_onevision", 5)
    pq.write_table(ds.data.table, path, row_group_size=2)
    with pytest.raises(ConfigError, match="input files"):
        build_of(path, tmp_path / "out")


def test_a_parquet_input_in_object_storage_builds_and_a_same_size_rewrite_is_noticed_by_its_etag(tmp_path, monkeypatch):
    """A parquet file on the local S3 server builds as the local one does; the fingerprint holds its ETag, so the
    same object rewritten with as many bytes within its modification time's second is still refused."""
    pytest.importorskip("moto")
    import s3fs
    from s3_server import S3Server

    from packer.errors import ConfigError

    path, _ = three_groups(tmp_path)
    build_of(path, tmp_path / "local")
    monkeypatch.setenv("PACKER_CACHE", str(tmp_path / "cache"))
    with S3Server() as server:
        for key, value in server.env.items():
            monkeypatch.setenv(key, value)
        s3fs.S3FileSystem.clear_instance_cache()
        try:
            fs = server.filesystem()
            fs.mkdir("data")
            data = path.read_bytes()
            fs.pipe("data/groups.parquet", data)
            build_of("s3://data/groups.parquet", tmp_path / "remote")
            assert packed(tmp_path / "remote") == packed(tmp_path / "local")
            (entry,) = json.loads((tmp_path / "remote" / ".state" / "fingerprint.json").read_text())["inputs"]
            assert entry["tag"].startswith("ETag:") and entry["size"] == len(data)
            middle = len(data) // 2
            fs.pipe("data/groups.parquet", data[:middle] + bytes([data[middle] ^ 1]) + data[middle + 1:])
            monkeypatch.setattr("packer.io.fs.stat", lambda f: (entry["size"], entry["mtime_ns"]))  # the same second
            with pytest.raises(ConfigError, match="changed: input files"):
                build_of("s3://data/groups.parquet", tmp_path / "remote")
        finally:
            s3fs.S3FileSystem.clear_instance_cache()
