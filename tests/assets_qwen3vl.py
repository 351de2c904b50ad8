"""Qwen3-VL test assets: ``Qwen3VLProcessor`` built in code around the Qwen tokenizer (patch 16, merge 2, small
budgets, 4 fps video sampling, at most 12 frames), saved into a checkpoint folder and loaded back, and a tiny
random-init ``Qwen3VLForConditionalGeneration`` (DeepStack at layer 0)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from family_assets import QWEN_TOKENIZER, TEMPLATES, Equal, FamilyAssets, Sample, Verify, _init, _save_and_load

QWEN3VL_IMAGE = {"shortest_edge": 32 * 32 * 4, "longest_edge": 32 * 32 * 48}  # at most 48 tokens an image
QWEN3VL_VIDEO = {"shortest_edge": 32 * 32 * 8, "longest_edge": 32 * 32 * 240}  # one t*h*w budget a clip


def qwen3vl_processor(folder: Path, **video: Any):
    from transformers import AutoTokenizer, Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    tok = AutoTokenizer.from_pretrained(QWEN_TOKENIZER)
    ip = Qwen2VLImageProcessor(patch_size=16, size=QWEN3VL_IMAGE, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    settings = {"size": QWEN3VL_VIDEO, "cap_pixels_per_frame": False, "fps": 4, "max_frames": 12, **video}
    vp = Qwen3VLVideoProcessor(**settings)
    proc = Qwen3VLProcessor(image_processor=ip, tokenizer=tok, video_processor=vp,
                            chat_template=(TEMPLATES / "qwen3vl.jinja").read_text())
    return _save_and_load(proc, folder)


def qwen3vl_model(processor, impl: str, seed: int = 0):
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    tok = processor.tokenizer
    ids = {t: tok.convert_tokens_to_ids(t) for t in ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")}
    text = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, max_position_embeddings=4096, rms_norm_eps=1e-6,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3],
                                 "mrope_interleaved": True}, tie_word_embeddings=False)
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=4, patch_size=16, spatial_merge_size=2,
                  temporal_patch_size=2, out_hidden_size=64, num_position_embeddings=64, deepstack_visual_indexes=[0])
    cfg = Qwen3VLConfig(text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
                        video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
                        vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=False)
    cfg._attn_implementation = impl
    return _init(Qwen3VLForConditionalGeneration(cfg), seed)


SAMPLE_PROCESSOR = {  # Qwen3-VL's published budgets (patch 16 x merge 2 = 32 px per token); the video processor's defaults
    "processor_class": "Qwen3VLProcessor",
    "image_processor": {"image_processor_type": "Qwen2VLImageProcessor", "patch_size": 16, "merge_size": 2,
                        "temporal_patch_size": 2, "size": {"shortest_edge": 65536, "longest_edge": 16777216},
                        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_convert_rgb": True,
                        "do_normalize": True, "do_rescale": True, "do_resize": True, "resample": 3},
    "video_processor": {"video_processor_type": "Qwen3VLVideoProcessor", "patch_size": 16, "merge_size": 2,
                        "temporal_patch_size": 2, "size": {"shortest_edge": 131072, "longest_edge": 786432},
                        "fps": 2, "min_frames": 4, "max_frames": 768, "do_sample_frames": True,
                        "cap_pixels_per_frame": False, "max_video_tokens": 768,
                        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]},
}
# processors/qwen3vl (pipelines/qwen3vl.toml, and qwen35.toml: Qwen3.5 takes Qwen3-VL's processor)
SAMPLE = Sample("qwen3vl", SAMPLE_PROCESSOR, "qwen3vl.jinja",
                tokens=("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"))

# the settings a build reads off the checkpoint (the image patch, the video pixel bound and rate) and the test
# processor's budgets
SETTINGS = Equal({"image_patch_size": "image_processor.patch_size", "video_max_pixels": "video_processor.size.longest_edge",
                  "video_fps": "video_processor.fps"},
                 values={"image_patch_size": 16, "video_max_frames": 12})
# without --processor the family counts videos with Qwen3VLVideoProcessor's own defaults; the image processor class is
# Qwen2-VL's (patch 14), so the family's image defaults are Qwen3-VL's published 16 x 2 instead (values)
DEFAULTS = Equal({**{f"video_{k}": f"Qwen3VLVideoProcessor().{k}" for k in (
                      "patch_size", "merge_size", "temporal_patch_size", "fps", "min_frames", "max_frames")},
                  "video_min_pixels": "Qwen3VLVideoProcessor().size.shortest_edge",
                  "video_max_pixels": "Qwen3VLVideoProcessor().size.longest_edge",
                  "max_video_tokens": "Qwen3VLVideoProcessor().max_video_tokens",
                  "video_sample": "Qwen3VLVideoProcessor().do_sample_frames",
                  "cap_pixels_per_frame": lambda hf: bool(hf.Qwen3VLVideoProcessor().cap_pixels_per_frame)},
                 values={"image_patch_size": 16, "image_merge_size": 2})

ASSETS = FamilyAssets("qwen3vl", ("image", "video"), qwen3vl_processor, qwen3vl_model, rope="mrope", dummy="plain",
                      sp_modes=("ulysses", "ring"), split_runs=True,  # a clip's runs, timestamps between them
                      verify=Verify(sample=6, other={"fps": 2}, other_sample=12, cli=True),  # fps 2: other frames
                      sample=SAMPLE, settings=SETTINGS, defaults=DEFAULTS)
