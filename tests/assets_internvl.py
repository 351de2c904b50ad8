"""InternVL3 / 3.5 test assets: ``InternVLProcessor`` built in code around the Qwen tokenizer (InternVL's text
models are Qwen2.5 / Qwen3) with InternVL's named special tokens, saved into a checkpoint folder and loaded back;
a tiny random-init ``InternVLForConditionalGeneration`` (Qwen2 text model).

Tiles are 56 px of 14-px patches, so after the 0.5 pixel shuffle each tile (and each video frame) is 4
``<IMG_CONTEXT>`` features (``image_seq_length``); at most 6 tiles an image (plus the thumbnail).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from family_assets import QWEN_TOKENIZER, TEMPLATES, Equal, FamilyAssets, Sample, _init, _save_and_load, default_of

TILE = 56
SEQ = 4  # (56 / 14)² x 0.5²
# InternVL's tokenizer declares these as named extra special tokens (InternVLProcessor reads them as attributes).
SPECIAL = {"start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>",
           "video_token": "<video>"}


def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(QWEN_TOKENIZER, extra_special_tokens=dict(SPECIAL))


def internvl_processor(folder: Path, image: dict[str, Any] | None = None, video: dict[str, Any] | None = None):
    """The processor saved into ``folder`` and loaded back; ``image`` / ``video`` override the sub-processors'
    settings (the default video processor samples 3 frames, centred: every fixture clip has at least 3)."""
    from transformers import GotOcr2ImageProcessor, InternVLProcessor, InternVLVideoProcessor

    ip = GotOcr2ImageProcessor(**{"size": {"height": TILE, "width": TILE}, "max_patches": 6, **(image or {})})
    vp = InternVLVideoProcessor(**{"size": {"height": TILE, "width": TILE}, "do_sample_frames": True, "num_frames": 3,
                                   **(video or {})})
    proc = InternVLProcessor(image_processor=ip, tokenizer=tokenizer(), video_processor=vp, image_seq_length=SEQ,
                             chat_template=(TEMPLATES / "internvl.jinja").read_text())
    return _save_and_load(proc, folder)


def internvl_model(processor, impl: str, seed: int = 0):
    from transformers import InternVLConfig, InternVLForConditionalGeneration

    tok = processor.tokenizer
    text = dict(model_type="qwen2", vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, rms_norm_eps=1e-6,
                tie_word_embeddings=False)
    vision = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=TILE,
                  patch_size=14)
    cfg = InternVLConfig(vision_config=vision, text_config=text, image_token_id=tok.convert_tokens_to_ids("<IMG_CONTEXT>"),
                         image_seq_length=SEQ, downsample_ratio=0.5, tie_word_embeddings=False)
    cfg._attn_implementation = impl
    return _init(InternVLForConditionalGeneration(cfg), seed)


# processors/internvl3 (pipelines/internvl3.toml): InternVL3's published settings (448-px tiles of 256 features,
# 1-12 tiles and a thumbnail, ImageNet normalisation); the video processor's class defaults (every frame one tile)
IMAGENET = {"image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]}
SAMPLE_PROCESSOR = {
    "processor_class": "InternVLProcessor", "image_seq_length": 256,
    "image_processor": {"image_processor_type": "GotOcr2ImageProcessor", "size": {"height": 448, "width": 448},
                        "crop_to_patches": False, "min_patches": 1, "max_patches": 12, "do_convert_rgb": True,
                        "do_normalize": True, "do_rescale": True, "do_resize": True, "resample": 3,
                        "rescale_factor": 1 / 255, **IMAGENET},
    "video_processor": {"video_processor_type": "InternVLVideoProcessor", "size": {"height": 448, "width": 448},
                        "do_sample_frames": False, "initial_shift": True, "do_convert_rgb": True, "do_normalize": True,
                        "do_rescale": True, "do_resize": True, "resample": 3, "rescale_factor": 1 / 255,
                        "return_metadata": False, **IMAGENET},
}

# the settings a build reads off the checkpoint: the tile and its features, the tile counts, the tiling the processor
# forces at every call (its images_kwargs), the video frames, the tokenizer's named tokens
SETTINGS = Equal({"image_seq_length": "image_seq_length", "tile_height": "image_processor.size.height",
                  "tile_width": "image_processor.size.width", "min_patches": "image_processor.min_patches",
                  "max_patches": "image_processor.max_patches", "crop_to_patches": "images_kwargs[crop_to_patches]",
                  "video_sample": "video_processor.do_sample_frames", "video_num_frames": "video_processor.num_frames",
                  "image_token": "tokenizer.context_image_token", "start_image_token": "tokenizer.start_image_token",
                  "end_image_token": "tokenizer.end_image_token", "video_token": "tokenizer.video_token"},
                 values={"image_seq_length": SEQ, "crop_to_patches": True, "video_initial_shift": "true"})


def _no_frame_rule(hf, s) -> None:
    """The video processor samples by neither a count nor a rate (None: the settings' 0), and shifts the first frame."""
    vp = hf.InternVLVideoProcessor()
    assert (s.video_num_frames or None, s.video_fps or None) == (vp.num_frames, vp.fps)
    assert s.initial_shift() is vp.initial_shift is True


DEFAULTS = Equal({**{k: f"GotOcr2ImageProcessor().{path}" for k, path in (
                      ("tile_height", "size.height"), ("tile_width", "size.width"), ("min_patches", "min_patches"),
                      ("max_patches", "max_patches"))},
                  "video_sample": "InternVLVideoProcessor().do_sample_frames",
                  "image_seq_length": default_of("InternVLProcessor", "image_seq_length")},
                 exception=_no_frame_rule)

# the packed == alone check leaves out the row of the 30-image record (1,200 tokens of 151k-wide logits; its ids are
# checked); under sequence parallelism the images' tiles and the videos' frames share one placeholder (<IMG_CONTEXT>)
ASSETS = FamilyAssets("internvl", ("image", "video"), internvl_processor, internvl_model,
                      towers=("vision_tower", "multi_modal_projector"), max_images=3, sp_modes=("ulysses", "ring"),
                      sample_segments=10, sample=Sample("internvl3", SAMPLE_PROCESSOR, "internvl.jinja", named=SPECIAL),
                      settings=SETTINGS, defaults=DEFAULTS)
