"""Llama 4 test assets: ``Llama4Processor`` built in code around the Qwen tokenizer with Llama 4's special tokens
added (its image and tile tokens, its header / end-of-turn tokens, ``<|begin_of_text|>`` as bos), saved into a
checkpoint folder and loaded back; a tiny random-init ``Llama4ForConditionalGeneration``.

Tiles are 56 px of 14-px patches, so after the 0.5 pixel shuffle each tile is 4 ``<|patch|>`` features; at most
6 tiles an image (plus the global tile). The text model has chunked-attention RoPE layers with 16-position chunks
(every segment crosses chunk boundaries), NoPE full-attention layers with temperature tuning, and MoE layers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from family_assets import QWEN_TOKENIZER, TEMPLATES, Equal, FamilyAssets, Sample, _init, _save_and_load, default_of

TILE = 56
PER_TILE = 4  # (56 / 14)² / 4
CHUNK = 16
IMAGE_TOKENS = ["<|image_start|>", "<|image_end|>", "<|image|>", "<|patch|>", "<|tile_x_separator|>", "<|tile_y_separator|>"]
CHAT_TOKENS = ["<|header_start|>", "<|header_end|>", "<|eot|>"]


def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(QWEN_TOKENIZER, bos_token="<|begin_of_text|>",
                                         extra_special_tokens=[*IMAGE_TOKENS, *CHAT_TOKENS])


def llama4_processor(folder: Path, image: dict[str, Any] | None = None):
    from transformers import Llama4ImageProcessor, Llama4Processor

    ip = Llama4ImageProcessor(**{"size": {"height": TILE, "width": TILE}, "max_patches": 6, **(image or {})})
    proc = Llama4Processor(image_processor=ip, tokenizer=tokenizer(), patch_size=14, pixel_shuffle_ratio=0.5,
                           chat_template=(TEMPLATES / "llama4.jinja").read_text())
    return _save_and_load(proc, folder)


def llama4_config(processor, impl: str, **text: Any):
    from transformers import Llama4Config

    tok = processor.tokenizer
    text = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=64, intermediate_size_mlp=96, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=2, num_experts_per_tok=1,
                interleave_moe_layer_step=2, no_rope_layer_interval=2, attention_chunk_size=CHUNK,
                max_position_embeddings=4096, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                bos_token_id=tok.bos_token_id, eos_token_id=tok.convert_tokens_to_ids("<|eot|>"), pad_token_id=None, **text)
    vision = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, image_size=TILE,
                  patch_size=14, pixel_shuffle_ratio=0.5, vision_output_dim=64, projector_input_dim=64,
                  projector_output_dim=64, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    cfg = Llama4Config(vision_config=vision, text_config=text, image_token_index=tok.convert_tokens_to_ids("<|patch|>"),
                       boi_token_index=tok.convert_tokens_to_ids("<|image_start|>"),
                       eoi_token_index=tok.convert_tokens_to_ids("<|image_end|>"))
    cfg._attn_implementation = impl
    cfg.text_config._attn_implementation = impl
    cfg.vision_config._attn_implementation = impl
    return cfg


def llama4_model(processor, impl: str, seed: int = 0, **text: Any):
    """The tiny model; its vision tower takes the processor's bfloat16 pixels (Llama4ImageProcessor normalises in
    bfloat16) as float32, in the reference and the packed runs alike, and its forward gets past a transformers
    5.24 bug (``Llama4ForConditionalGeneration.forward`` reads ``image_outputs`` from the text model's output, which
    has none: every call raises AttributeError, return_dict=False included)."""
    from transformers import Llama4ForConditionalGeneration

    model = _init(Llama4ForConditionalGeneration(llama4_config(processor, impl, **text)), seed)

    def to_float(module, args, kwargs):
        if kwargs.get("pixel_values") is not None:
            kwargs["pixel_values"] = kwargs["pixel_values"].float()
        return args, kwargs

    def image_outputs(module, args, kwargs, output):  # transformers 5.24: forward reads the text model's (absent)
        output.image_outputs = None                    # image_outputs when it builds its return_dict output
        return output

    model.register_forward_pre_hook(to_float, with_kwargs=True)
    model.language_model.register_forward_hook(image_outputs, with_kwargs=True)
    return model


# processors/llama4 (pipelines/llama4.toml): Llama4Processor's and Llama4ImageProcessor's defaults (336-px tiles of 144
# features, up to 16 tiles + a global one), the image, tile and header tokens, <|begin_of_text|> as bos
SAMPLE_PROCESSOR = {
    "processor_class": "Llama4Processor", "patch_size": 14, "image_token": "<|image|>", "fake_image_token": "<|image|>",
    "image_processor": {"image_processor_type": "Llama4ImageProcessor", "size": {"height": 336, "width": 336},
                        "max_patches": 16, "resize_to_max_canvas": False, "do_convert_rgb": True, "do_normalize": True,
                        "do_rescale": True, "do_resize": True, "resample": 2, "rescale_factor": 1 / 255,
                        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]},
}
SAMPLE = Sample("llama4", SAMPLE_PROCESSOR, "llama4.jinja", tokens=("<|begin_of_text|>", *IMAGE_TOKENS, *CHAT_TOKENS),
                tokenizer={"bos_token": "<|begin_of_text|>"})

def _shuffle(processor, s) -> None:
    """The processor keeps the pixel shuffle as its downsample ratio (1 / ratio²)."""
    assert round(1 / s.pixel_shuffle_ratio**2) == processor.downsample_ratio


# the settings a build reads off the checkpoint: the square tile, the tile count, the canvas rule, the patch and the
# shuffle, the image token
SETTINGS = Equal({"tile_size": ("image_processor.size.height", "image_processor.size.width"),
                  "max_patches": "image_processor.max_patches", "resize_to_max_canvas": "image_processor.resize_to_max_canvas",
                  "patch_size": "patch_size", "image_token": "image_token"},
                 values={"tokens_per_tile": PER_TILE}, exception=_shuffle)
DEFAULTS = Equal({"tile_size": ("Llama4ImageProcessor().size.height", "Llama4ImageProcessor().size.width"),
                  "max_patches": "Llama4ImageProcessor().max_patches",
                  "resize_to_max_canvas": "Llama4ImageProcessor().resize_to_max_canvas",
                  **{k: default_of("Llama4Processor", k) for k in ("patch_size", "pixel_shuffle_ratio", "image_token")}},
                 values={"tokens_per_tile": 144})

# the packed == alone check leaves out the row of the 30-image record (1,200 tokens of vocabulary-wide logits; its
# ids are checked); under sequence parallelism a tiled image's <|patch|> runs (separators between them) are cut
# anywhere, and the per-layer-type masks stay global
ASSETS = FamilyAssets("llama4", ("image",), llama4_processor, llama4_model, towers=("vision_model", "multi_modal_projector"),
                      max_images=3, split_runs=True, sample_segments=10, dummy_eager=True, sample=SAMPLE,
                      settings=SETTINGS, defaults=DEFAULTS)
