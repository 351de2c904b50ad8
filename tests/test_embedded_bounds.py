"""Embedded media are held to the bounds of files: the hostile media of :mod:`hostile_media` (images whose headers
claim 100,000 x 100,000 pixels in six formats, a PNG cut in half, a 16000 x 16000 video in a few hundred bytes,
frame rates of 2**31 and 1 / 2**31, an AVI claiming 10**9 frames, a WAV at 1 Hz, seven hours of silent FLAC, MP3s
truncated, headless or with a lying frame count) written as parquet cells, a ``save_to_disk`` folder, WebDataset tar
members and ``data:`` URLs end each record exactly as the same bytes as files do: the same quarantine reason, the
record named by file and row or tar key, never a crash or a packed sample.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hostile_media import (
    IMAGE_FORMATS,
    claim_size,
    image_bytes,
    mp3_bytes,
    truncated_png,
    write_avi,
    write_png,
    write_silent_flac,
    write_wav,
    write_y4m,
    xing_frames,
)
from inputs_corpus import LISTS, write_formats

from conftest import TOKENIZER
from packer.build import build
from packer.config import BuildConfig

pytest.importorskip("av")

FORMATS = ("jsonl", "parquet", "disk", "tar", "dataurl")
TAR_KINDS = {".png", ".bmp", ".jpeg", ".gif", ".tiff", ".avi", ".wav", ".flac", ".mp3"}  # webdataset's KINDS among ours


def hostile_media(d: Path) -> list[tuple[str, str, str, str | None]]:
    """Writes the media under ``d``; (record id, kind, file name, reason or None: it packs)."""
    cases = []
    for fmt in IMAGE_FORMATS:
        good = image_bytes(fmt, mode="P" if fmt == "GIF" else "RGB")
        (d / f"bomb.{fmt.lower()}").write_bytes(claim_size(fmt, good, 100_000, 100_000))
        cases.append((f"bomb_{fmt.lower()}", "image", f"bomb.{fmt.lower()}", "corrupt_image"))
    truncated_png(d / "cut.png")
    write_y4m(d / "huge.y4m", 16000, 16000, frames=1, stored=(16, 16))
    write_y4m(d / "fast.y4m", 64, 48, rate="2147483647:1")
    write_y4m(d / "slow.y4m", 64, 48, rate="1:2147483647")
    write_avi(d / "claims.avi", claim=10**9)
    write_wav(d / "one_hz.wav", 1, 16_000)
    write_silent_flac(d / "silence.flac", 7 * 3600)
    mp3 = mp3_bytes()
    (d / "truncated.mp3").write_bytes(mp3[: len(mp3) // 3])
    (d / "damaged.mp3").write_bytes(xing_frames(mp3, 1))  # libmpg123 then reports 2**63 - 1 frames
    (d / "overlong.mp3").write_bytes(xing_frames(mp3, 1_000_000))
    (d / "headless.mp3").write_bytes(b"\0" * 64 + mp3[64:])
    write_png(d / "ok.png"), write_wav(d / "ok.wav", 16000, 16000), write_avi(d / "ok.avi")
    return cases + [
        ("truncated_png", "image", "cut.png", "corrupt_image"),
        ("video_16000x16000", "video", "huge.y4m", "video_too_large"),
        ("video_2e31_fps", "video", "fast.y4m", "bad_frame_rate"),
        ("video_1_over_2e31_fps", "video", "slow.y4m", "bad_frame_rate"),
        ("avi_claims_1e9_frames", "video", "claims.avi", "corrupt_video"),
        ("wav_at_1hz", "audio", "one_hz.wav", "bad_sample_rate"),
        ("flac_7h_of_silence", "audio", "silence.flac", "media_too_long"),
        *((f"{name}_mp3", "audio", f"{name}.mp3", "corrupt_audio") for name in ("truncated", "damaged", "overlong",
                                                                                  "headless")),
        ("good_image", "image", "ok.png", None), ("good_audio", "audio", "ok.wav", None),
        ("good_video", "video", "ok.avi", None),
    ]


def record(rid: str, kind: str, name: str) -> dict:
    """The corpus's canonical shape: a media part without its path, the medium in the record's list of its kind."""
    user = [{"type": kind, "text": None}, {"type": "text", "text": "What is it?"}]
    return {"id": rid, "messages": [{"role": "user", "content": user},
                                    {"role": "assistant", "content": [{"type": "text", "text": "Something."}]}],
            **{key: [name] if k == kind else [] for k, key in LISTS.items()}}


@pytest.fixture(scope="module")
def quarantines(tmp_path_factory) -> tuple[list, dict[str, tuple[Path, list[dict]]]]:
    """(the cases, format -> (the input, its quarantine entries)) after a build of each format."""
    folder = tmp_path_factory.mktemp("embedded-bounds")
    (folder / "media").mkdir()
    cases = hostile_media(folder / "media")
    rows = [record(rid, kind, name) for rid, kind, name, _ in cases]
    kinds = ("image", "video", "audio")
    inputs = write_formats(folder / "in", rows, kinds, formats=tuple(f for f in FORMATS if f != "tar"),
                           root=folder / "media")
    # a tar names a medium by its member's extension: the kinds WebDataset knows (not .tga, not .y4m)
    inputs |= write_formats(folder / "in-tar", [r for r, (_, _, name, _) in zip(rows, cases, strict=True)
                                                if Path(name).suffix in TAR_KINDS],
                            kinds, formats=("tar",), root=folder / "media")
    shutil.rmtree(folder / "media")  # the embedded builds read their own bytes only
    out = {}
    for fmt in FORMATS:
        config = BuildConfig(input=(str(inputs[fmt]),), output=str(folder / f"out-{fmt}"), tokenizer=TOKENIZER,
                             max_length=8192, image_tokens="dynamic", max_bad_fraction=1.0, workers=1)
        build(config, progress=False)
        text = (folder / f"out-{fmt}" / "quarantine.jsonl").read_text(encoding="utf-8")
        out[fmt] = (inputs[fmt], [json.loads(line) for line in text.splitlines()])
    return cases, out


@pytest.mark.parametrize("fmt", FORMATS)
def test_hostile_embedded_media_end_as_the_same_bytes_as_files_do(quarantines, fmt):
    cases, out = quarantines
    _, entries = out[fmt]
    got = {e["id"]: e["reason"] for e in entries}
    want = {rid: reason for rid, _, name, reason in cases
            if reason is not None and (fmt != "tar" or Path(name).suffix in TAR_KINDS)}
    assert got == want
    assert all(e["detail"] for e in entries)


def test_each_embedded_hostile_record_is_named_by_its_file_and_row_or_key(quarantines):
    _, out = quarantines
    for fmt in ("parquet", "tar"):
        source, entries = out[fmt]
        for e in entries:
            assert e["where"] == ("row" if fmt == "parquet" else "member"), e
            if fmt == "parquet":
                assert e["file"] == str(source)
            else:
                assert Path(e["file"]).parent == source.parent and e["member"] == e["id"], e
