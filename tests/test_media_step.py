"""The collator's media step around the model: count checks with a useful error, scatter
order, DataLoader workers, ``model_inputs``, media paths that survive a moved build."""

from __future__ import annotations

import json
import pickle
import shutil

import pytest
import torch
from media_fixtures import write_audio, write_images
from mm_models import FAMILIES, qwen2vl_processor

from conftest import TOKENIZER
from packer.build import build
from packer.config import resolve
from packer.loader import MediaMismatchError, PackedCollator, PackedDataset, model_inputs
from packer.loader.collate import MODEL_KEYS


def _build(tmp_path, family: str, records: list[dict], **overrides):
    src = tmp_path / "data" / f"{family}.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / f"out-{family}"
    settings = {**FAMILIES[family].build, **overrides}
    build(resolve(None, input=[str(src)], output=str(out), tokenizer=TOKENIZER, max_length=1024, order="planner",
                  **settings), progress=False)
    return out


def _chat(kind: str, refs: list[str], k: int) -> dict:
    parts = [{"type": kind, kind: r} for r in refs]
    return {"id": f"r{k}", "messages": [{"role": "user", "content": [*parts, {"type": "text", "text": f"question {k}"}]},
                                        {"role": "assistant", "content": f"answer {k}"}]}


@pytest.fixture
def image_build(tmp_path):
    files = write_images(tmp_path / "data" / "img")
    names = ["plain_300x200.jpg", "exif6.jpg", "photo.webp", "cmyk.jpg"]
    records = [_chat("image", [f"img/{n}" for n in names[k : k + 2]], k) for k in range(3)]
    return _build(tmp_path, "qwen2vl", records), files


def test_a_processor_that_disagrees_with_the_build_names_the_file_both_counts_and_the_fix(image_build):
    out, _ = image_build
    ds = PackedDataset(out)
    from transformers import Qwen2VLImageProcessor

    processor = qwen2vl_processor(ds.tokenizer())
    processor.image_processor = Qwen2VLImageProcessor(size={"shortest_edge": 3136, "longest_edge": 28 * 28 * 16})
    with pytest.raises(MediaMismatchError, match=r"plain_300x200.jpg: the build gave this image \d+ placeholder positions "
                                                 r"but Qwen2VLImageProcessor produces \d+ features .* rebuild for"):
        PackedCollator(processor=processor, rope="mrope")([ds[i] for i in range(len(ds))])


def test_llava_fixed_count_is_checked_against_the_processors_pixels(tmp_path):
    write_images(tmp_path / "data" / "img")
    out = _build(tmp_path, "llava", [_chat("image", ["img/one_1x1.png"], 0)], image_tokens="fixed:image_size=336,patch_size=14")
    ds = PackedDataset(out)
    processor = FAMILIES["llava"].processor(ds.tokenizer())  # 56 px: 16 positions, the build wrote 576
    with pytest.raises(MediaMismatchError, match=r"576 placeholder positions but CLIPImageProcessor \(patch 14\) produces 16"):
        PackedCollator(processor=processor)([ds[0]])


def test_images_come_in_scatter_order_and_the_collator_pickles_into_workers(image_build):
    out, _ = image_build
    ds = PackedDataset(out)
    collate = PackedCollator(processor=qwen2vl_processor(ds.tokenizer()), rope="mrope")
    rows = [ds[i] for i in range(len(ds))]
    batch = collate(rows)
    order = sorted(batch["media"], key=lambda m: (m["batch"], m["start"]))
    grids = batch["image_grid_thw"]
    assert [tuple(m["llm_grid"]) for m in order] == [(t, h // 2, w // 2) for t, h, w in grids.tolist()]
    assert batch["pixel_values"].shape[0] == int((grids[:, 0] * grids[:, 1] * grids[:, 2]).sum())
    again = pickle.loads(pickle.dumps(collate))(rows)
    torch.testing.assert_close(again["pixel_values"], batch["pixel_values"])
    loader = torch.utils.data.DataLoader(ds, batch_size=len(ds), collate_fn=collate, num_workers=2)
    (from_worker,) = list(loader)
    torch.testing.assert_close(from_worker["pixel_values"], batch["pixel_values"])
    torch.testing.assert_close(from_worker["position_ids"], batch["position_ids"])


def test_model_inputs_hold_only_what_the_model_takes_and_varlen_runs_through_qwen2vl(image_build):
    out, _ = image_build
    ds = PackedDataset(out)
    tok = ds.tokenizer()
    collate = PackedCollator(attention="varlen", rope="mrope", processor=qwen2vl_processor(tok))
    batch = collate([ds[i] for i in range(len(ds))])
    inputs = model_inputs(batch)
    assert set(inputs) - {"use_cache"} <= set(MODEL_KEYS)
    assert not {"labels", "media", "seq_idx", "loss_weights", "cu_seqlens", "max_seqlen"} & set(inputs)
    assert {"cu_seq_lens_q", "pixel_values", "image_grid_thw", "position_ids"} <= set(inputs)
    model = FAMILIES["qwen2vl"].model(ds.placeholder_ids, len(tok) + 1, "sdpa")
    with torch.no_grad():  # before: the tower took the rows' cu_seqlens as its own ("split_with_sizes")
        logits = model(**inputs).logits
    assert logits.shape[:2] == batch["input_ids"].shape


def test_a_moved_build_keeps_working_and_moved_media_take_a_new_root(image_build, tmp_path):
    out, files = image_build
    moved = tmp_path / "elsewhere" / "build"
    shutil.move(str(out), moved)
    ds = PackedDataset(moved)
    collate = PackedCollator(processor=qwen2vl_processor(ds.tokenizer()), rope="mrope")
    assert collate([ds[0]])["pixel_values"].numel()
    new_root = tmp_path / "media-copy"
    shutil.move(str(tmp_path / "data"), new_root)
    with pytest.raises(FileNotFoundError, match=r"PackedDataset\(out, media_root=NEW_ROOT\)"):
        collate([ds[0]])
    relocated = PackedDataset(moved, media_root=new_root)
    assert relocated[0]["media"][0]["path"].startswith(str(new_root))
    assert collate([relocated[0]])["pixel_values"].numel()


def test_audio_features_and_mask_come_from_the_whisper_extractor(tmp_path):
    write_audio(tmp_path / "data" / "aud")
    out = _build(tmp_path, "qwen2audio", [_chat("audio", ["aud/1s_48k_stereo.wav", "aud/45s_8k.flac"], 0)])
    ds = PackedDataset(out)
    batch = PackedCollator(processor=FAMILIES["qwen2audio"].processor(ds.tokenizer()))([ds[0]])
    assert batch["input_features"].shape == (2, 128, 3000)
    assert batch["feature_attention_mask"].sum(-1).tolist() == [100, 3000]  # 1 s; 45 s cut at 30 s
    assert [m["length"] for m in ds[0]["media"]] == [25, 750]


def test_no_processor_for_a_kind_in_the_batch_is_a_clear_error(image_build):
    out, _ = image_build
    ds = PackedDataset(out)
    from transformers import WhisperFeatureExtractor

    with pytest.raises(ValueError, match=r"holds \d+ image\(s\) but the collator has no image processor"):
        PackedCollator(feature_extractor=WhisperFeatureExtractor(feature_size=128))([ds[0]])


def test_stored_audio_features_stand_in_for_the_extractor(tmp_path):
    from packer.loader import StoredFeatures

    write_audio(tmp_path / "data" / "aud")
    out = _build(tmp_path, "qwen2audio", [_chat("audio", ["aud/3s_22k.ogg", "aud/31s_24k.flac"], 0)],
                 audio_features="whisper:feature_size=128")
    ds = PackedDataset(out)
    live = PackedCollator(processor=FAMILIES["qwen2audio"].processor(ds.tokenizer()))([ds[0]])
    stored = PackedCollator(audio_features=StoredFeatures(out, "audio_features"))([ds[0]])
    torch.testing.assert_close(stored["input_features"], live["input_features"], atol=1e-5, rtol=0)
    assert torch.equal(stored["feature_attention_mask"].long(), live["feature_attention_mask"].long())


def test_stored_image_embeddings_come_in_scatter_order(tmp_path):
    from packer.loader import StoredFeatures

    write_images(tmp_path / "data" / "img")
    records = [_chat("image", ["img/photo.webp", "img/exif6.jpg"], 0), _chat("image", ["img/cmyk.jpg"], 1)]
    out = _build(tmp_path, "llava", records, image_embeddings="ViT-B-32:random", embed_output="tokens")
    ds, store = PackedDataset(out), StoredFeatures(out, "embeddings")
    rows = [ds[i] for i in range(len(ds))]
    batch = PackedCollator(image_embeddings=store)(rows)
    order = [m["ref"] for m in sorted(batch["media"], key=lambda m: (m["batch"], m["start"]))]
    assert batch["image_embeds"].shape == (3, 50, 768)  # class token + 7 x 7 patches, penultimate block
    for k, ref in enumerate(order):
        torch.testing.assert_close(batch["image_embeds"][k], torch.tensor(store[ref].astype("float32")))
