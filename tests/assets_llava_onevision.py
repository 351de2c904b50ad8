"""LLaVA-OneVision test assets, built here (no download): ``LlavaOnevisionProcessor`` around the Qwen tokenizer
with the family's ``<image>`` / ``<video>`` tokens added (as its tokenizer declares them), saved into a checkpoint
folder and loaded back, and a tiny random-init ``LlavaOnevisionForConditionalGeneration`` (SigLIP tower + Qwen2).

Scaled down, the geometry is the real one: 32 px tiles of 8 px patches (4 x 4 = 16 features a tile, the role of
SigLIP's 27 x 27 = 729), grid pinpoints up to 3 x 3 tiles, and ``anyres_max_4`` so that grids of over 4.84 tiles'
worth of features are interpolated down (the real ``anyres_max_9`` over 6 x 6 tiles does the same at 729).
Videos are sampled to 3 frames (``num_frames``), so every batch's videos stack into one tensor.
"""

from __future__ import annotations

from pathlib import Path

from family_assets import QWEN_TOKENIZER, TEMPLATES, Equal, FamilyAssets, Sample, Verify, _init, _save_and_load, default_of

TILE, PATCH = 32, 8
PINPOINTS = [[32 * a, 32 * b] for a in range(1, 4) for b in range(1, 4)]
SPECIAL = {"image_token": "<image>", "video_token": "<video>"}


def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(QWEN_TOKENIZER, extra_special_tokens=SPECIAL)


def processor(folder: Path, *, aspect: str = "anyres_max_4", strategy: str = "full", **video):
    from transformers import LlavaOnevisionImageProcessor, LlavaOnevisionProcessor, LlavaOnevisionVideoProcessor

    ip = LlavaOnevisionImageProcessor(size={"height": TILE, "width": TILE}, image_grid_pinpoints=PINPOINTS)
    vp = LlavaOnevisionVideoProcessor(size={"height": TILE, "width": TILE}, **({"do_sample_frames": True, "num_frames": 3}
                                                                              | video))
    proc = LlavaOnevisionProcessor(image_processor=ip, tokenizer=tokenizer(), video_processor=vp,
                                   num_image_tokens=(TILE // PATCH) ** 2 + (strategy == "default"),
                                   vision_feature_select_strategy=strategy, vision_aspect_ratio=aspect,
                                   chat_template=(TEMPLATES / "llava_onevision.jinja").read_text())
    return _save_and_load(proc, folder)


def model(processor, impl: str, seed: int = 0):
    from transformers import LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration

    tok = processor.tokenizer
    vision = dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, image_size=TILE, patch_size=PATCH, vision_use_head=False)
    text = dict(model_type="qwen2", vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192, tie_word_embeddings=False)
    cfg = LlavaOnevisionConfig(vision_config=vision, text_config=text, image_token_index=tok.convert_tokens_to_ids("<image>"),
                               video_token_index=tok.convert_tokens_to_ids("<video>"), image_grid_pinpoints=PINPOINTS,
                               vision_aspect_ratio=processor.vision_aspect_ratio,
                               vision_feature_select_strategy=processor.vision_feature_select_strategy,
                               vision_feature_layer=-1)
    cfg._attn_implementation = impl
    cfg.text_config._attn_implementation = impl
    cfg.vision_config._attn_implementation = impl
    return _init(LlavaOnevisionForConditionalGeneration(cfg), seed)


def alone_rows(ds, records, impl) -> list[int]:
    """The row of r0: a tiled image (anyres), a record of two images (base + newline each), videos."""
    rows = [i for i in range(len(ds)) if "r0" in ds[i]["segment_ids"]]
    spans = ds[rows[0]]["media"]
    assert {m["tokens"] for m in spans if m["kind"] == "image"} >= {17, 72} and any(m["kind"] == "video" for m in spans)
    return rows


def sample_processor(tokenizer_folder: str, chat_template: str):
    """processors/llava_onevision (pipelines/llava_onevision.toml): LlavaOnevisionProcessor at its classes' defaults
    (384 px tiles, 36 grid pinpoints, anyres_max_9, every video frame) with SigLIP's 729 features a tile, around the
    sample tokenizer (``<image>`` / ``<video>`` added)."""
    from transformers import AutoTokenizer, LlavaOnevisionImageProcessor, LlavaOnevisionProcessor, LlavaOnevisionVideoProcessor

    tok = AutoTokenizer.from_pretrained(tokenizer_folder, extra_special_tokens=dict(SPECIAL))
    return LlavaOnevisionProcessor(image_processor=LlavaOnevisionImageProcessor(), tokenizer=tok,
                                   video_processor=LlavaOnevisionVideoProcessor(), num_image_tokens=729,
                                   vision_feature_select_strategy="full", chat_template=chat_template)


def _pinpoints(image_processor) -> str:
    return "/".join(f"{h}x{w}" for h, w in image_processor.image_grid_pinpoints)


# the settings a build reads off the checkpoint (also the sample checkpoint's, test_family_llava_onevision): the square
# tile, the pinpoints, the features a tile and the anyres cap, the video frames (none set: 0), the media tokens
SETTINGS = Equal({"image_size": ("image_processor.size[height]", "image_processor.size[width]"),
                  "pinpoints": lambda p: _pinpoints(p.image_processor),
                  **{k: k for k in ("num_image_tokens", "vision_feature_select_strategy", "vision_aspect_ratio",
                                    "image_token", "video_token")},
                  "video_sample": "video_processor.do_sample_frames",
                  "video_num_frames": lambda p: p.video_processor.num_frames or 0,
                  "video_fps": lambda p: p.video_processor.fps or 0.0},
                 values={"image_size": 32, "video_num_frames": 3})


def _unset(hf, settings) -> None:
    """What the classes leave unset: no crop, no frame count or rate, no features a tile, no feature strategy."""
    ip, vp = hf.LlavaOnevisionImageProcessor(), hf.LlavaOnevisionVideoProcessor()
    assert ip.crop_size is None and (vp.num_frames, vp.fps) == (None, None)
    unset = [default_of("LlavaOnevisionProcessor", k)(hf) for k in ("num_image_tokens", "vision_feature_select_strategy")]
    assert unset == [None, None]


DEFAULTS = Equal({"image_size": ("LlavaOnevisionImageProcessor().size[height]", "LlavaOnevisionImageProcessor().size[width]"),
                  "pinpoints": lambda hf: _pinpoints(hf.LlavaOnevisionImageProcessor()),
                  "video_sample": "LlavaOnevisionVideoProcessor().do_sample_frames",
                  **{k: default_of("LlavaOnevisionProcessor", k) for k in ("vision_aspect_ratio", "image_token", "video_token")}},
                 exception=_unset)

# a record's images reach the processor as one list (apply_chat_template's way); verify: another anyres cap (a 3 x 3
# grid no longer interpolated) and another frame count
ASSETS = FamilyAssets("llava_onevision", ("image", "video"), processor, model, nest_images=True, alone_rows=alone_rows,
                      verify=Verify(sample=8, other={"aspect": "anyres_max_9", "num_frames": 2}, other_sample=14,
                                    other_image_size=None),
                      dummy_settings={"num_image_tokens": 16},
                      sample=Sample("llava_onevision", sample_processor, "llava_onevision.jinja"),
                      settings=SETTINGS, defaults=DEFAULTS)
