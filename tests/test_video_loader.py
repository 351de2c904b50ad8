"""Videos through the loader: packed rows holding video, image and text segments give
tiny random Qwen2-VL / Qwen2.5-VL models the logits each record gets run alone the plain HF
way (transformers' PyAV loader with the video processor's own sampling, the HF processor,
positions computed by the model); mRoPE positions equal the model's ``get_rope_index``,
Qwen2.5-VL's time-scaled ones included; a processor that disagrees with the stored counts
is named with its file.

The rows are made here from the processors' own outputs (the build's video wiring is
tested where it is written): spans carry what a build stores -- kind, start, length, the
merged grid and the policy's ``second_per_grid_t`` (``count_video``).
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import torch

pytest.importorskip("av")

from mm_models import qwen2vl_model, qwen2vl_processor  # noqa: E402
from test_video import _frame, write_clip  # noqa: E402

from conftest import TOKENIZER  # noqa: E402
from packer.loader import MediaMismatchError, PackedCollator, model_inputs  # noqa: E402
from packer.loader.media import policy_spec, video_policy_for  # noqa: E402
from packer.media.policies import parse_policy  # noqa: E402
from packer.media.video import count_video  # noqa: E402

PLACEHOLDERS = ["<|vision_start|>", "<|image_pad|>", "<|video_pad|>", "<|vision_end|>"]
# at most 16 tokens a frame pair; 4 frames a second, so that a clip of 2 s has more temporal
# steps than its side (text after it then resumes below its last temporal position)
VIDEO_SETTINGS = dict(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16, fps=4.0)
# name -> (width, height, fps, frames), 0.6-2 s: merged grids (4, 2, 2), (4, 3, 4), (2, 2, 3);
# second_per_grid_t 0.5, 0.5 and 0.283 s (fractional time-scaled steps truncate)
CLIPS = {"a.mp4": (64, 48, 24, 48), "b.mp4": (120, 80, 10, 20), "c.mp4": (84, 56, 30, 17)}
IMAGES = {"i1.png": (60, 40), "i2.png": (30, 90)}
VIDEO = "<|vision_start|><|video_pad|><|vision_end|>"
IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
# records: (media in order, the user's text around them); rows: which records share a row
RECORDS = [
    (["a.mp4"], f"{VIDEO}What happens in the clip?"),
    (["i1.png"], f"{IMAGE}Describe the picture."),
    ([], "Just text, no media at all."),
    (["b.mp4", "i2.png"], f"First {VIDEO} then {IMAGE} compare them."),
    (["c.mp4", "a.mp4"], f"{VIDEO}{VIDEO}Two clips."),
]
ROWS = [[0, 1, 3], [2, 4]]


def _chat(user: str, k: int) -> str:
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\nAnswer number {k}.<|im_end|>\n"


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    from PIL import Image

    folder = tmp_path_factory.mktemp("video_loader")
    files = {}
    for name, (w, h, fps, n) in CLIPS.items():
        write_clip(folder / name, w, h, fps, n, "libx264", "yuv420p", {})
        files[name] = str(folder / name)
    for k, (name, (w, h)) in enumerate(IMAGES.items()):
        Image.fromarray(_frame(3 * k + 1, w, h)).save(folder / name)
        files[name] = str(folder / name)
    return files


@pytest.fixture(scope="module")
def tok():
    from packer.encode.tokenizer import load_tokenizer

    return load_tokenizer(TOKENIZER, PLACEHOLDERS)


def _processor(tok, version: str, **video):
    from transformers import Qwen2VLVideoProcessor

    processor = qwen2vl_processor(tok, version)
    processor.video_processor = Qwen2VLVideoProcessor(**{**VIDEO_SETTINGS, **video})
    return processor


def _alone(processor, media_files: dict, k: int):
    """Record ``k`` the plain HF way: transformers' own PyAV loader sampling with the video
    processor's ``sample_frames`` at its fps, the processor expanding the placeholders."""
    from transformers.image_utils import load_image
    from transformers.video_utils import load_video

    names, user = RECORDS[k]
    vp = processor.video_processor
    videos, metadata = [], []
    for n in names:
        if n.endswith(".mp4"):
            frames, meta = load_video(media_files[n], backend="pyav", sample_indices_fn=partial(vp.sample_frames, fps=vp.fps))
            videos.append(frames)
            metadata.append(meta)
    images = [load_image(media_files[n]) for n in names if n.endswith(".png")]
    extra = {}
    if videos:
        extra.update(videos=videos, video_metadata=metadata, do_sample_frames=False)
    if images:
        extra["images"] = images
    return processor(text=[_chat(user, k)], return_tensors="pt", **extra)


def _rows(encs: list, media_files: dict, ids: dict, processor) -> list[dict]:
    """Packed rows from the per-record processor outputs, spans as a build stores them."""
    policy = video_policy_for(processor.video_processor)
    merge = processor.video_processor.merge_size
    rows = []
    for members in ROWS:
        input_ids, cu, spans = [], [0], []
        for seg, k in enumerate(members):
            row_ids = encs[k]["input_ids"][0].tolist()
            names = iter(RECORDS[k][0])
            grids = {"image": iter(encs[k].get("image_grid_thw", torch.zeros(0, 3)).tolist()),
                     "video": iter(encs[k].get("video_grid_thw", torch.zeros(0, 3)).tolist())}
            pos = 0
            while pos < len(row_ids):
                kind = {ids["<|image_pad|>"]: "image", ids["<|video_pad|>"]: "video"}.get(row_ids[pos])
                if kind is None:
                    pos += 1
                    continue
                end = pos
                while end < len(row_ids) and row_ids[end] == row_ids[pos]:
                    end += 1
                name = next(names)
                t, h, w = next(grids[kind])
                span = {"segment": seg, "kind": kind, "start": len(input_ids) + pos, "length": end - pos, "ref": name,
                        "path": media_files[name], "llm_grid": [t, h // merge, w // merge], "second_per_grid_t": 0.0}
                if kind == "video":
                    _, count = count_video(media_files[name], policy)
                    assert count.grid == tuple(span["llm_grid"]) and count.length == span["length"]
                    span["second_per_grid_t"] = float(np.float32(count.second_per_grid_t))  # stored as float32
                spans.append(span)
                pos = end
            input_ids += row_ids
            cu.append(len(input_ids))
        arr = np.asarray(input_ids, dtype=np.int64)
        rows.append({"input_ids": arr, "labels": arr.copy(), "cu_seqlens": np.asarray(cu), "n_tokens": len(arr),
                     "media": spans})
    return rows


def _setup(tok, media_files, version: str):
    ids = {t: tok.convert_tokens_to_ids(t) for t in PLACEHOLDERS}
    processor = _processor(tok, version)
    encs = [_alone(processor, media_files, k) for k in range(len(RECORDS))]
    return ids, processor, encs, _rows(encs, media_files, ids, processor)


def _segment_starts(rows):
    return {k: (r, int(row["cu_seqlens"][seg]), int(row["cu_seqlens"][seg + 1]))
            for r, (members, row) in enumerate(zip(ROWS, rows, strict=True)) for seg, k in enumerate(members)}


@pytest.mark.parametrize("version, tokens_per_second", [("2", None), ("2.5", None), ("2.5", 2), ("2.5", 25)])
def test_mrope_positions_equal_get_rope_index(tok, media, version, tokens_per_second):
    """Video, image and text segments packed together: every segment's positions are the
    model's own ``get_rope_index`` on the record alone (Qwen2.5-VL: the config's
    tokens_per_second, and 2 and 25 -- where the fractional steps truncate differently)."""
    ids, processor, encs, rows = _setup(tok, media, version)
    model = qwen2vl_model(ids, len(tok) + 1, "sdpa", version=version)
    timed = version == "2.5"
    if timed and tokens_per_second is not None:
        model.config.vision_config.tokens_per_second = tokens_per_second
    tps = model.config.vision_config.tokens_per_second if timed else None
    batch = PackedCollator(rope="mrope", tokens_per_second=tps, pad_to_multiple_of=64)(rows)
    assert batch["position_ids"].shape == (3, len(rows), batch["input_ids"].shape[1])
    for k, (r, a, b) in _segment_starts(rows).items():
        enc = encs[k]
        extra = {"second_per_grid_ts": enc["second_per_grid_ts"]} if timed and "second_per_grid_ts" in enc else {}
        want, _ = model.model.get_rope_index(enc["input_ids"], enc["mm_token_type_ids"], enc.get("image_grid_thw"),
                                             enc.get("video_grid_thw"), **extra)
        assert torch.equal(batch["position_ids"][:, r, a:b], want[:, 0]), (version, k)
    if timed:  # the time scaling really shows: a video's temporal steps are not 0, 1, 2, ...
        r, a, _ = _segment_starts(rows)[0]
        video = next(m for m in rows[r]["media"] if m["kind"] == "video")
        t_axis = batch["position_ids"][0, r, video["start"] : video["start"] + video["length"]].unique()
        step = np.float32(video["second_per_grid_t"]) * np.float32(tps)
        assert t_axis.tolist() == [video["start"] - a + int(i * step) for i in range(video["llm_grid"][0])]
        assert t_axis.max() > video["start"] - a + max(video["llm_grid"][1:])  # the text after it resumes lower


@pytest.mark.parametrize("version", ["2", "2.5"])
def test_packed_video_rows_equal_each_record_alone(tok, media, version):
    """The issue's claim: packed rows holding video, image and text segments, through
    ``model(**model_inputs(batch))``, equal each record alone (1e-4 relative logits, sdpa)."""
    ids, processor, encs, rows = _setup(tok, media, version)
    model = qwen2vl_model(ids, len(tok) + 1, "sdpa", version=version)
    timed = version == "2.5"
    tps = model.config.vision_config.tokens_per_second if timed else None
    collate = PackedCollator(attention="sdpa", rope="mrope", tokens_per_second=tps, pad_to_multiple_of=64, processor=processor)
    batch = collate(rows)
    inputs = model_inputs(batch)
    assert ("second_per_grid_ts" in inputs) == timed  # Qwen2-VL's forward takes none

    # the media keys are the processors' own, in scatter order (row, start)
    order = [k for members in ROWS for k in members]
    for key in ("pixel_values_videos", "video_grid_thw", "pixel_values", "image_grid_thw"):
        want = torch.cat([encs[k][key] for k in order if key in encs[k]])
        assert torch.equal(batch[key], want), key
    if timed:
        want = torch.cat([encs[k]["second_per_grid_ts"] for k in order if "second_per_grid_ts" in encs[k]])
        assert batch["second_per_grid_ts"].dtype == torch.float32 and torch.equal(batch["second_per_grid_ts"], want)

    with torch.no_grad():
        logits = model(**inputs).logits
        for k, (r, a, b) in _segment_starts(rows).items():
            enc = dict(encs[k])
            enc.pop("attention_mask", None)
            ref = model(**enc, use_cache=False).logits[0]
            diff = (logits[r, a:b] - ref).abs().max() / ref.abs().max()
            assert diff <= 1e-4, f"{version}: record {k} (row {r} at {a}): relative logit difference {diff:.2e}"


def test_video_count_mismatch_names_the_file(tok, media):
    _, processor, _, rows = _setup(tok, media, "2")
    bigger = _processor(tok, "2", min_pixels=28 * 28 * 16, max_pixels=28 * 28 * 64)
    with pytest.raises(MediaMismatchError, match=r"a\.mp4: the build gave this video 16 placeholder positions but "
                                                 r"Qwen2VLVideoProcessor .* produces \d+ features .*--video-tokens"):
        PackedCollator(rope="mrope", processor=bigger)(rows)

    wrong = [{**row, "media": [{**m, "llm_grid": [m["llm_grid"][0], m["llm_grid"][2], m["llm_grid"][1]]} if m["ref"] == "b.mp4" else m
                               for m in row["media"]]} for row in rows]
    with pytest.raises(MediaMismatchError, match=r"b\.mp4: the build stored llm_grid \(4, 4, 3\) .* makes \(4, 3, 4\)"):
        PackedCollator(processor=processor)(wrong)

    late = [{**row, "media": [{**m, "second_per_grid_t": 0.5} if m["ref"] == "c.mp4" else m for m in row["media"]]}
            for row in rows]
    with pytest.raises(MediaMismatchError, match=r"c\.mp4: the build stored second_per_grid_t 0\.5 s but .* 0\.283"):
        PackedCollator(processor=processor)(late)

    gone = [{**row, "media": [{**m, "path": m["path"] + ".moved"} if m["ref"] == "a.mp4" else m for m in row["media"]]}
            for row in rows]
    with pytest.raises(FileNotFoundError, match=r"video file .*a\.mp4\.moved \(ref 'a\.mp4'\) not found.*media_root"):
        PackedCollator(processor=processor)(gone)


def test_time_scaled_mrope_is_asked_for_explicitly(tok, media):
    _, processor, _, rows = _setup(tok, media, "2.5")
    with pytest.raises(ValueError, match="no tokens_per_second: pass PackedCollator.*vision_config.tokens_per_second"):
        PackedCollator(rope="mrope", processor=processor)(rows)
    PackedCollator(rope="mrope", processor=processor)([rows[0] | {"media": [m for m in rows[0]["media"]
                                                                            if m["kind"] != "video"]}])  # images: fine
    with pytest.raises(ValueError, match="Qwen2VLProcessor takes no second_per_grid_ts"):
        PackedCollator(rope="mrope", tokens_per_second=2, processor=_processor(tok, "2"))
    with pytest.raises(ValueError, match="use it with rope='mrope'"):
        PackedCollator(tokens_per_second=2)
    no_times = [{**row, "media": [{**m, "second_per_grid_t": 0.0} for m in row["media"]]} for row in rows]
    with pytest.raises(ValueError, match=r"video .*a\.mp4 has no second_per_grid_t"):
        PackedCollator(rope="mrope", tokens_per_second=2)(no_times)


def test_video_policy_follows_the_processor(tok):
    from transformers import Qwen2VLVideoProcessor

    vp = Qwen2VLVideoProcessor(min_pixels=3136, max_pixels=50000, min_frames=2, max_frames=10, fps=1.0,
                               cap_pixels_per_frame=True, max_video_tokens=400)
    p = video_policy_for(vp)
    assert (p.min_pixels, p.max_pixels, p.min_frames, p.max_frames, p.fps, p.cap_pixels_per_frame, p.max_video_tokens,
            p.sample) == (3136, 50000, 2, 10, 1.0, True, 400, True)
    assert policy_spec(p) == "qwen2vl:fps=1,min_frames=2,max_frames=10,min_pixels=3136,max_pixels=50000," \
                             "cap_pixels_per_frame=true,max_video_tokens=400"
    assert parse_policy(policy_spec(p), "video") == p
    assert policy_spec(video_policy_for(Qwen2VLVideoProcessor())) == "qwen2vl"


# ------------------------------------------------------------------ cost and report


def test_video_tower_cost_is_its_flop_count():
    """Videos cost the vision tower what images do per merged patch, and its attention runs
    within each temporal step: Σ tokens² / t (FlopCounterMode on a tiny Qwen2-VL tower)."""
    from test_balance import flops, text_stats
    from transformers import Qwen2VLConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

    from packer.cost import CostModel

    vision = dict(depth=2, embed_dim=32, mlp_ratio=2, num_heads=4, hidden_size=64, patch_size=14, spatial_merge_size=2,
                  temporal_patch_size=2, in_channels=3)
    cfg = Qwen2VLConfig(text_config=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, vocab_size=300), vision_config=vision)
    cfg.vision_config._attn_implementation = "eager"
    tower = Qwen2VisionTransformerPretrainedModel._from_config(cfg.vision_config).eval()
    images, videos = torch.tensor([[1, 4, 6]]), torch.tensor([[4, 4, 6], [3, 8, 8]])  # patches; tokens = patches / 4
    grids = torch.cat([images, videos])
    pixels = torch.randn(int(grids.prod(1).sum()), 3 * 2 * 14 * 14)
    counted = flops(lambda: tower(pixels, grid_thw=grids))
    image_tokens, video_tokens = (images.prod(1) // 4).double().numpy(), (videos.prod(1) // 4).double().numpy()
    steps = videos[:, 0].double().numpy()
    stats = text_stats([1]) | {"tokens": np.zeros(1), "attention": np.zeros(1), "image_items": np.array([1.0]),
                               "image_tokens": np.array([image_tokens.sum()]), "image_square": np.array([(image_tokens**2).sum()]),
                               "video_items": np.array([2.0]), "video_tokens": np.array([video_tokens.sum()]),
                               "video_square": np.array([(video_tokens**2 / steps).sum()])}
    model = CostModel.for_model(cfg, training=False)
    assert (model.video_item, model.video_token, model.video_square) == (model.image_item, model.image_token, model.image_square)
    assert model(stats)[0] == counted
    without = {k: v for k, v in stats.items() if not k.startswith("video_")}  # older stats: video left out, not misread
    assert model(without)[0] < counted


def test_shard_stats_count_video_per_kind(tmp_path):
    from packer.shards.io import write_shard
    from packer.shards.schema import PACKED_SCHEMA, MediaSpan, PackedRow, to_table
    from packer.shards.stats import shard_stats

    def row(media, n=40):
        return PackedRow(input_ids=tuple(range(n)), labels=tuple(range(n)), cu_seqlens=(0, 20, n), segment_ids=("a", "b"),
                         segment_source=(0, 0), segment_line=(1, 2), segment_start=(0, 0), segment_modality=("video", "image"),
                         segment_parent=(-1, -1), segment_group=(0, 1), segment_role=("", ""),
                         segment_weight=(float("nan"),) * 2, media=tuple(media), n_tokens=n)

    video = MediaSpan(segment=0, kind="video", start=2, length=12, tokens=12, ref="v.mp4", llm_grid=(3, 2, 2), second_per_grid_t=0.5)
    image = MediaSpan(segment=1, kind="image", start=22, length=6, tokens=6, ref="i.png", llm_grid=(1, 2, 3))
    rows = [row([video, image]), row([]), row([video, MediaSpan(1, "video", 21, 4, 4, "w.mp4", (1, 2, 2), 1.0)])]
    write_shard(tmp_path / "packed-00000.arrow", to_table(rows, PACKED_SCHEMA), tmp_path)
    stats = shard_stats(tmp_path / "packed-00000.arrow")
    assert stats.array("row_video_items").tolist() == [1, 0, 2]
    assert stats.array("row_video_tokens").tolist() == [12, 0, 16]
    assert stats.array("row_video_square").tolist() == [12**2 / 3, 0, 12**2 / 3 + 4**2]
    assert stats.array("row_image_square").tolist() == [36, 0, 0]
    assert stats.array("row_media_tokens").tolist() == [18, 0, 16]
    merged = stats.merge(stats)
    assert merged.array("row_video_square").tolist() == 2 * [12**2 / 3, 0, 12**2 / 3 + 4**2]
