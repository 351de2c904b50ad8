"""A damaged shard is named, never a crash (verify exit 6, the loader's DamagedShardError), and
``verify --deep`` catches edits whose hashes were updated in the manifest: the packed rows are
re-derived from samples/ + plan.arrow and compared."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pyarrow as pa
import pytest
from click.testing import CliRunner

from conftest import ROOT, TOKENIZER
from packer.cli import main
from packer.shards.io import write_shard
from packer.verify import verify

IGNORE = -100


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def chat(k: int) -> dict:
    return {"id": f"c{k}", "messages": [{"role": "user", "content": f"question {k} " * 3},
                                        {"role": "assistant", "content": f"answer {k} " * 3}]}


PREFERENCE = [
    {"id": "pair", "prompt": "What is 2+2?", "chosen": "It is 4.", "rejected": "It is 5, I think.",
     "score_chosen": 9.0, "score_rejected": 2.0},
    {"id": "many", "prompt": "Count to three.", "responses": ["1 2 3", "one two three", "1, 2, 3."], "rewards": [1, 0.5, 0.25]},
    {"id": "kto", "prompt": "Hi", "completion": "Hello!", "label": False},
    {"id": "pair2", "prompt": "Name a colour.", "chosen": "Blue.", "rejected": "Seven."},
    *[chat(k) for k in range(4)],
]


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """Clean builds: chats over several shards, preference records as pairs and as trees."""
    root = tmp_path_factory.mktemp("integrity")
    chats = root / "chats.jsonl"
    chats.write_text("".join(json.dumps(chat(k)) + "\n" for k in range(30)))
    prefs = root / "prefs.jsonl"
    prefs.write_text("".join(json.dumps(r) + "\n" for r in PREFERENCE))
    out = {}
    for name, data, extra in (("text", chats, ["--shard-rows", 3]), ("pairs", prefs, ["--preference", "pairs"]),
                              ("tree", prefs, ["--preference", "tree"])):
        out[name] = root / name
        r = run("build", "-i", data, "-o", out[name], "--tokenizer", TOKENIZER, "--max-length", 96, *extra)
        assert r.exit_code == 0, r.output
    return out


@pytest.fixture
def copy(builds, tmp_path):
    def make(name):
        shutil.copytree(builds[name], tmp_path / name)
        return tmp_path / name

    return make


def flip(path, at: float) -> None:
    """64 bytes inverted from ``at`` (a fraction of the file), the size unchanged."""
    data = bytearray(path.read_bytes())
    start = int(len(data) * at)
    for i in range(start, min(len(data), start + 64)):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


CHILD = """
import json, sys
from click.testing import CliRunner
from packer.cli import main
from packer.loader import PackedDataset, SampleDataset
for out in sys.argv[1:]:
    r = CliRunner().invoke(main, ["verify", out])
    loaders = {}
    for cls in (PackedDataset, SampleDataset):
        try:
            ds = cls(out)
            for i in range(len(ds)):
                ds[i]
            loaders[cls.__name__] = "read"
        except Exception as e:
            loaders[cls.__name__] = type(e).__name__
    print(json.dumps({"out": out, "code": r.exit_code, "output": r.output, "loaders": loaders}), flush=True)
"""
OFFSETS = (0.03, 0.2, 0.45, 0.7, 0.9)  # where the 64 flipped bytes start: schema, offsets, ids, labels, strings


@pytest.mark.parametrize("kind", ["packed", "samples"])
def test_a_damaged_shard_is_named_by_verify_and_the_loader_never_a_crash(builds, tmp_path, kind):
    """The reads run in a child process: a segfault fails this test (naming the last folder read) instead of
    killing pytest."""
    folders = []
    for at in OFFSETS:
        out = tmp_path / f"at-{at}"
        shutil.copytree(builds["text"], out)
        flip(sorted((out / kind).glob("part-*.arrow"))[0], at)
        folders.append(str(out))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    child = subprocess.run([sys.executable, "-c", CHILD, *folders], capture_output=True, text=True, timeout=600, env=env,
                           cwd=ROOT)
    results = [json.loads(line) for line in child.stdout.splitlines() if line.startswith("{")]
    assert child.returncode == 0, (child.returncode, results[-1:], child.stderr[-2000:])  # -11: a segfault
    assert len(results) == len(OFFSETS)
    damaged = "PackedDataset" if kind == "packed" else "SampleDataset"
    other = ({"PackedDataset", "SampleDataset"} - {damaged}).pop()
    for result in results:
        assert result["code"] == 6 and "Traceback" not in result["output"], result
        (problem,) = [line for line in result["output"].splitlines() if line.startswith("  ")]  # one line, naming the shard
        assert problem.startswith(f"  {kind}/part-") and "sha256 differs" in problem and "; " in problem, problem
        assert result["loaders"] == {damaged: "DamagedShardError", other: "read"}, result


def test_the_damage_is_named_with_its_row(tmp_path, copy):
    from packer.errors import DamagedShardError
    from packer.loader import PackedDataset

    out = copy("text")
    shard = out / "packed" / "part-00000.arrow"
    table = pa.ipc.open_stream(pa.memory_map(str(shard))).read_all()
    rows = table.to_pylist()
    rows[1]["input_ids"][3] = 10**9  # past the vocabulary: the embedding would fail, or read another row
    write_shard(shard, pa.Table.from_pylist(rows, schema=table.schema), out)
    with pytest.raises(DamagedShardError, match=r"part-00000.arrow row 1: damaged \(a token id outside \[0, \d+\)\)"):
        PackedDataset(out)[0]


# ------------------------------------------------------------------ --deep


def edit(out, file: str, change) -> None:
    """Rewrite ``file`` with ``change(rows)`` applied and its sha256 / size / rows updated in the manifest: only a
    check that re-derives the rows can see it."""
    path = out / file
    table = pa.ipc.open_stream(pa.memory_map(str(path))).read_all()
    rows = table.to_pylist()
    change(rows)
    entry = write_shard(path, pa.Table.from_pylist(rows, schema=table.schema), out)
    manifest = json.loads((out / "manifest.json").read_text())
    for kind, entries in manifest["files"].items():
        for e in entries if isinstance(entries, list) else [entries]:
            if isinstance(e, dict) and e.get("file") == file:
                e.update(sha256=entry.sha256, bytes=entry.bytes, rows=entry.rows)
    (out / "manifest.json").write_text(json.dumps(manifest))


def swap_roles(rows):
    for row in rows:
        roles = row["segment_role"]
        if "chosen" in roles and "rejected" in roles:
            a, b = roles.index("chosen"), roles.index("rejected")
            roles[a], roles[b] = roles[b], roles[a]
            return
    raise AssertionError("no pair")


def flip_label(rows):
    """A trained token untrained, with segment_trained / n_trained fixed: every row invariant holds."""
    row = rows[0]
    k = next(i for i, v in enumerate(row["labels"]) if v != IGNORE)
    row["labels"][k] = IGNORE
    segment = max(j for j, c in enumerate(row["cu_seqlens"][:-1]) if c <= k)
    row["segment_trained"][segment] -= 1
    row["n_trained"] -= 1


def flip_sample_label(rows):
    row = rows[0]
    k = next(i for i, v in enumerate(row["labels"]) if v != IGNORE)
    row["labels"][k] = IGNORE
    row["n_trained"] -= 1


def other_id(rows):
    row = rows[0]
    k = next(i for i, v in enumerate(row["labels"]) if v != IGNORE)
    row["input_ids"][k] = 5 if row["input_ids"][k] != 5 else 6
    row["labels"][k] = row["input_ids"][k]


def swap_sample_roles(rows):
    row = next(r for r in rows if [x["role"] for x in r["responses"]][:2] == ["chosen", "rejected"])
    a, b = row["responses"][:2]
    a["role"], b["role"] = b["role"], a["role"]


def reweigh(rows):
    row = next(r for r in rows if any(w == w for w in r["segment_weight"]))
    k = next(j for j, w in enumerate(row["segment_weight"]) if w == w)
    row["segment_weight"][k] += 1.0


TAMPERINGS = {  # build, file, edit, the file --deep names
    "chosen and rejected swapped (pairs)": ("pairs", "packed/part-00000.arrow", swap_roles, "packed"),
    "chosen and rejected swapped (tree)": ("tree", "packed/part-00000.arrow", swap_roles, "packed"),
    "a response's weight": ("pairs", "packed/part-00000.arrow", reweigh, "packed"),
    "a label flipped, counts fixed": ("text", "packed/part-00001.arrow", flip_label, "packed"),
    "a token id": ("text", "packed/part-00001.arrow", other_id, "packed"),
    "a loss denominator off by one": ("text", "packed/part-00000.arrow", lambda rows: rows[0].update(
        segment_trained=[rows[0]["segment_trained"][0] + 1, *rows[0]["segment_trained"][1:]],
        n_trained=rows[0]["n_trained"] + 1), "packed"),  # the row check names it too
    "a segment's display id": ("text", "packed/part-00000.arrow", lambda rows: rows[0]["segment_ids"].__setitem__(0, "x"),
                               "packed"),
    "a segment's line": ("text", "packed/part-00000.arrow",
                         lambda rows: rows[0]["segment_line"].__setitem__(0, rows[1]["segment_line"][0]), "packed"),
    "two rows swapped": ("text", "packed/part-00000.arrow", lambda rows: rows.__setitem__(slice(0, 2), rows[1::-1]),
                         "packed"),
    "two bins of the plan swapped": ("text", "plan.arrow", lambda rows: rows.__setitem__(slice(0, 2), rows[1::-1]),
                                     "packed"),
    "a segment's start in the plan": ("text", "plan.arrow", lambda rows: rows[0]["starts"].__setitem__(0, 1), "packed"),
    "a sample's label flipped, counts fixed": ("text", "samples/part-00000.arrow", flip_sample_label, "packed"),
    "a sample's token id": ("text", "samples/part-00000.arrow", other_id, "packed"),
    "a sample's chosen and rejected swapped": ("pairs", "samples/part-00000.arrow", swap_sample_roles, "packed"),
}


@pytest.mark.parametrize("name", list(TAMPERINGS))
def test_deep_catches_an_edit_whose_hash_was_updated(copy, name):
    build, file, change, named = TAMPERINGS[name]
    out = copy(build)
    edit(out, file, change)
    problems = verify(out, deep=True)[0]
    assert problems and any(p.file.startswith(named) and "stage 3 derives" in p.message for p in problems), problems
    r = run("verify", out, "--deep")
    assert r.exit_code == 6 and "differs from the row stage 3 derives from samples/ + plan.arrow" in r.output


def edit_manifest(out, change) -> dict:
    """``change(manifest)`` applied to manifest.json, and ``.state/`` removed (its fingerprint would disagree): nothing
    else covers the manifest, so every file check passes and only a check that re-derives the field can see it."""
    manifest = json.loads((out / "manifest.json").read_text())
    change(manifest)
    (out / "manifest.json").write_text(json.dumps(manifest))
    shutil.rmtree(out / ".state", ignore_errors=True)
    return manifest


def longest_row(out) -> int:
    return max(max(pa.ipc.open_stream(pa.memory_map(str(f))).read_all().column("n_tokens").to_pylist())
               for f in (out / "packed").glob("part-*.arrow"))


MANIFEST_TAMPERINGS = {  # the manifest field edited, what --deep names
    "max_length raised": (lambda m, out: m["config"].update(max_length=m["config"]["max_length"] * 2),
                          ("plan.arrow", "differs from the plan stage 2 derives")),
    # here the plan is the same under the lower max_length (stats.max_length edited with it): what it changes is the
    # stats the plan gives under it (fill, lower bound)
    "max_length lowered to the longest row": (
        lambda m, out: (m["config"].update(max_length=longest_row(out)), m["stats"].update(max_length=longest_row(out))),
        ("manifest.json", "its stats fill")),
    "seed changed": (lambda m, out: m["config"].update(seed=m["config"]["seed"] + 1),
                     ("plan.arrow", "differs from the plan stage 2 derives")),
    "tokenizer hash changed": (lambda m, out: m["tokenizer"].update(sha256="0" * 64),
                               ("manifest.json", "tokenizer.sha256 '" + "0" * 64 + "' differs from")),
}


@pytest.mark.parametrize("name", list(MANIFEST_TAMPERINGS))
def test_deep_catches_an_edited_manifest_field(copy, name):
    """A plan setting or the tokenizer hash edited in the manifest (nothing else changed) passes the file check and
    every row invariant (max_length lowered only to the longest row): --deep re-plans the samples' lengths under the
    recorded settings, and fingerprints tokenizer/ as the build did."""
    change, (file, message) = MANIFEST_TAMPERINGS[name]
    out = copy("text")
    assert longest_row(out) < 96  # the build's max_length: lowered to the longest row, every row still fits
    edit_manifest(out, lambda m: change(m, out))
    assert verify(out)[0] == []  # what the file check and the row invariants see
    problems = verify(out, deep=True)[0]
    assert [(p.file, message in p.message) for p in problems] == [(file, True)], problems
    r = run("verify", out, "--deep")
    assert r.exit_code == 6 and message in r.output, r.output


def test_deep_names_the_code_version_not_checkable(copy):
    """No file of a build re-derives the code that made it: --deep prints the recorded version as not checkable (an
    edited one too) rather than claim it verified."""
    out = copy("text")
    edit_manifest(out, lambda m: m["code"].update(packer_code="0123456789ab" + "0" * 52))
    r = run("verify", out, "--deep")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert "every packed row re-derived" in lines[0] and "code" not in lines[0].split(": ok")[1], r.output
    assert any(line.startswith("not checkable: the code version") and "packer_code 0123456789ab" in line for line in lines)
    assert any(line.startswith("not checkable: stage 1's settings") for line in lines), r.output
    assert "not checkable" not in run("verify", out).output  # said by --deep, which re-derives the rest


def test_deep_says_a_difference_may_come_from_other_code_when_other_code_made_the_build(copy):
    """A build made by an older packer records its stats as that code derived them (a lower bound that ignored the
    media caps, say): --deep names the difference and that other code made the build, not only "edited"."""
    out = copy("text")
    edit_manifest(out, lambda m: (m["stats"].update(lower_bound=m["stats"]["lower_bound"] + 1),
                                  m["code"].update(packer_code="0123456789ab" + "0" * 52)))
    problems = verify(out, deep=True)[0]
    assert len(problems) == 1 and "its stats lower_bound" in problems[0].message, problems
    assert "the build was made by other packer code (" in problems[0].message
    assert "packer_code 0123456789ab; this is " in problems[0].message and "rebuild with this version" in problems[0].message
    edit_manifest(out, lambda m: m["code"].update(packer_code=verify_deep_code()))  # this code's: no such sentence
    (problem,) = verify(out, deep=True)[0]
    assert "other packer code" not in problem.message


def verify_deep_code() -> str:
    from packer.stages.state import code_identity

    return code_identity()["packer_code"]


def test_deep_rederives_the_tokenizer_hash_of_a_build_with_its_own_template(tmp_path):
    """A build rendered with a --chat-template file ships that template in tokenizer/, and its recorded tokenizer
    hash covers it: --deep re-derives the hash there and passes the clean build."""
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps(chat(k)) + "\n" for k in range(6)))
    template = tmp_path / "plain.jinja"
    template.write_text("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% if m['role'] == 'assistant' %}"
                        "{{ eos_token }}{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
    out = tmp_path / "out"
    r = run("build", "-i", data, "-o", out, "--tokenizer", TOKENIZER, "--max-length", 96, "--chat-template", template)
    assert r.exit_code == 0, r.output
    assert (out / "tokenizer" / "chat_template.jinja").read_text() == template.read_text()
    assert verify(out, deep=True)[0] == []


@pytest.mark.parametrize("name", ["text", "pairs", "tree"])
def test_deep_passes_clean_builds_byte_for_byte(builds, name, monkeypatch):
    import packer.verify.deep

    def compared_rows(*args):
        raise AssertionError("the re-derived bytes differ from the stored shard's")

    monkeypatch.setattr(packer.verify.deep, "_first_difference", compared_rows)  # only called when the bytes differ
    r = run("verify", builds[name], "--deep")
    assert r.exit_code == 0 and "every packed row re-derived" in r.output, r.output


def test_deep_passes_a_media_build_and_names_an_edited_media_span(sample_build, tmp_path, monkeypatch):
    import packer.verify.deep

    src, _ = sample_build
    out = tmp_path / "media"
    shutil.copytree(src, out)
    with monkeypatch.context() as m:  # byte for byte: the rows are never compared
        m.setattr(packer.verify.deep, "_first_difference", lambda *a: pytest.fail("the re-derived bytes differ"))
        assert verify(out, deep=True)[0] == []
    manifest = json.loads((out / "manifest.json").read_text())
    shard = next(e["file"] for e in manifest["files"]["packed"]
                 if any(r["media"] for r in pa.ipc.open_stream(pa.memory_map(str(out / e["file"]))).read_all().to_pylist()))

    def other_ref(rows):
        row = next(r for r in rows if r["media"])
        row["media"][0]["ref"] = "elsewhere.png"

    edit(out, shard, other_ref)
    problems = verify(out, deep=True)[0]
    assert [(p.file, p.message.split(" differs")[0]) for p in problems] == [(shard, "media")], problems


@pytest.mark.slow  # builds a Qwen3-VL family checkpoint and runs its processor (~20 s)
def test_against_processor_compares_the_packed_rows_too(tmp_path):
    """A packed row edited after the build (hash updated, samples/ intact) differs from the processor's ids."""
    pytest.importorskip("torchvision")
    from family_assets import FAMILY_ASSETS
    from family_harness import build_family
    from media_fixtures import write_images

    from packer.verify.against_processor import verify_against_processor

    images = write_images(tmp_path / "img")
    part = {"type": "image", "image": str(images["photo.webp"].relative_to(tmp_path))}
    records = [{"id": "q0", "prompt": [{"role": "user", "content": [part, {"type": "text", "text": "What is it?"}]}],
                "chosen": "A photo.", "rejected": "A cat."},
               {"id": "c1", "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there."}]}]
    source = tmp_path / "data.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    FAMILY_ASSETS["qwen3vl"].processor(tmp_path / "checkpoint")
    out = tmp_path / "out"
    build_family("qwen3vl", tmp_path / "checkpoint", source, out, preference="tree")
    assert verify_against_processor(out, str(tmp_path / "checkpoint"), sample=2) == ([], 2)

    def answer_changed(rows):
        row = next(r for r in rows if "rejected" in r["segment_role"])
        k = row["segment_role"].index("rejected")
        at = next(i for i in range(row["cu_seqlens"][k], row["cu_seqlens"][k + 1]) if row["labels"][i] != IGNORE)
        row["input_ids"][at] = row["labels"][at] = row["input_ids"][at] + 1

    edit(out, "packed/part-00000.arrow", answer_changed)
    assert verify(out)[0] == []  # every row invariant holds
    mismatches, checked = verify_against_processor(out, str(tmp_path / "checkpoint"), sample=2)
    assert checked == 2 and len(mismatches) == 1 and "q0 in packed/part-00000.arrow row" in str(mismatches[0])
    assert "the packed row differs from its samples/ row" in str(mismatches[0])
    assert any(p.file == "packed/part-00000.arrow" for p in verify(out, deep=True)[0])


@pytest.mark.slow  # an S3 server (moto) in a subprocess
def test_a_damaged_shard_of_a_remote_build_is_named_too(builds, tmp_path):
    """The issue's S3 case: a build in a bucket, 64 bytes of a packed shard flipped there; --deep on a clean one."""
    pytest.importorskip("s3fs")
    pytest.importorskip("moto")
    from s3_server import S3Server

    with S3Server() as server:
        fs = server.filesystem()
        fs.mkdir("builds")
        src = builds["text"]
        for path in sorted(p for p in src.rglob("*") if p.is_file()):
            fs.pipe(f"builds/b/{path.relative_to(src).as_posix()}", path.read_bytes())
        env = {**os.environ, **server.env, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
               "PACKER_CACHE": str(tmp_path / "cache")}
        clean = subprocess.run([sys.executable, "-m", "packer", "verify", "s3://builds/b", "--deep"], capture_output=True,
                               text=True, timeout=300, env=env, cwd=ROOT)
        assert clean.returncode == 0 and "every packed row re-derived" in clean.stdout, clean.stdout + clean.stderr
        shard = tmp_path / "shard.arrow"
        shard.write_bytes(fs.cat("builds/b/packed/part-00001.arrow"))
        flip(shard, 0.6)
        fs.pipe("builds/b/packed/part-00001.arrow", shard.read_bytes())
        child = subprocess.run([sys.executable, "-c", CHILD, "s3://builds/b"], capture_output=True, text=True, timeout=300,
                               env={**env, "PACKER_CACHE": str(tmp_path / "cache2")}, cwd=ROOT)
    assert child.returncode == 0, (child.returncode, child.stderr[-2000:])  # -11: a segfault
    (result,) = [json.loads(line) for line in child.stdout.splitlines() if line.startswith("{")]
    (problem,) = [line for line in result["output"].splitlines() if line.startswith("  ")]
    assert result["code"] == 6 and problem.startswith("  packed/part-00001.arrow: sha256 differs"), result
    assert result["loaders"] == {"PackedDataset": "DamagedShardError", "SampleDataset": "read"}, result


def test_verify_recounts_the_segments_the_manifest_states(copy):
    out = copy("text")
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["stats"]["segments"] += 1
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert [str(p) for p in verify(out)[0]] == [f"manifest.json: shards hold {manifest['stats']['segments'] - 1} segments, "
                                                f"the manifest says {manifest['stats']['segments']}"]


@pytest.mark.parametrize("family, message", [
    ({"name": "bogus"}, "tokenizer.family.name = 'bogus' is not one of generic, qwen3vl"),
    ({"name": None}, "tokenizer.family.name = None is not one of generic"),
    ({"name": "qwen3vl", "modalities": ["image"], "settings": None},
     "tokenizer.family.settings = None is not an object of qwen3vl's settings"),
    ({"name": "qwen3vl", "modalities": None, "settings": {}}, "tokenizer.family.modalities = None is not a list of image"),
    ({"name": "qwen3vl", "modalities": ["image"], "settings": {"colour": 1}},
     r"tokenizer.family.settings names colour, which qwen3vl lacks \(its settings: image_patch_size, "),
    ({"name": "llava_onevision", "modalities": ["image"], "settings": {}},
     "tokenizer.family: llava_onevision: the processor checkpoint has no num_image_tokens"),
])
def test_collate_names_a_recorded_family_no_build_writes(copy, family, message):
    """verify --collate rebuilds the family from the manifest: an unknown one, null, a setting it lacks is a problem
    of manifest.json naming the field (exit 6), never a KeyError or TypeError traceback."""
    import re

    out = copy("text")
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["tokenizer"]["family"] = family
    (out / "manifest.json").write_text(json.dumps(manifest))
    problems = [str(p) for p in verify(out, collate=True)[0]]
    assert any(re.match(rf"manifest.json: {message}.*; --collate cannot judge the rows$", p) for p in problems), problems
    r = CliRunner().invoke(main, ["verify", str(out), "--collate"])
    assert r.exit_code == 6 and "Traceback" not in r.output, r.output


def test_a_recorded_family_that_is_no_object_is_a_damaged_manifest(copy):
    out = copy("text")
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["tokenizer"]["family"] = "qwen3vl"
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert [str(p) for p in verify(out, collate=True)[0]] == [
        f"manifest.json: {out}/manifest.json is damaged or not a packer manifest (tokenizer.family = 'qwen3vl', not an "
        f"object); rebuild"]
