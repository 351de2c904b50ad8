"""Qwen3.5 test assets: Qwen3-VL's processor (``assets_qwen3vl``) and a tiny random-init
``Qwen3_5ForConditionalGeneration`` (hybrid: ``layer_types`` picks gated-delta-net or attention layers). The harness
builds its images only (the video path is Qwen3-VL's, tested there); rows do not run through the model (``forward``
False: the model refuses packed rows of gated-delta-net layers on a CPU), the packed == alone check takes one row at
a time (the collator's boundaries for a hybrid family) and sequence parallelism of the linear-attention layers is
refused."""

from __future__ import annotations

from assets_qwen3vl import qwen3vl_processor
from family_assets import FamilyAssets, _init


def qwen35_model(processor, impl: str, seed: int = 0, layer_types: tuple[str, ...] = ("full_attention", "full_attention")):
    """A tiny Qwen3.5 (hybrid): ``layer_types`` picks gated-delta-net (``linear_attention``) or attention layers."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    tok = processor.tokenizer
    ids = {t: tok.convert_tokens_to_ids(t) for t in ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")}
    text = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=len(layer_types),
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096, rms_norm_eps=1e-6,
                linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
                linear_num_value_heads=4, layer_types=list(layer_types),
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3],
                                 "mrope_interleaved": True, "partial_rotary_factor": 1.0},
                tie_word_embeddings=False)
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=4, patch_size=16, spatial_merge_size=2,
                  temporal_patch_size=2, out_hidden_size=64, num_position_embeddings=64)
    cfg = Qwen3_5Config(text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
                        video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
                        vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=False)
    cfg._attn_implementation = impl
    return _init(Qwen3_5ForConditionalGeneration(cfg), seed)


ASSETS = FamilyAssets("qwen35", ("image",), qwen3vl_processor, qwen35_model, rope="mrope", forward=False, dummy="plain",
                      rows_per_batch=1, sp_refused="linear-attention layers .* not supported")
