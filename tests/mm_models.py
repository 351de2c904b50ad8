"""Tiny random-init transformers VLM / audio-LM models and their HF processors, built here
(no download), for the multimodal equivalence tests and the examples' tests.

Each family pairs the packer build settings with the model and the processor that
match them: a build made with ``FAMILIES[name].build`` is what ``model`` expects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

TEXT = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False,
            bos_token_id=None, eos_token_id=None, pad_token_id=None)
QWEN_PIXELS = dict(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 48)  # at most 48 tokens an image: small and fast


@dataclass
class Family:
    name: str
    build: dict[str, Any]  # packer build settings
    kinds: tuple[str, ...]  # media the model encodes
    model: Any = None  # (placeholder ids, vocab size, attn impl) -> model
    processor: Any = None  # tokenizer -> HF processor
    extra: dict[str, Any] = field(default_factory=dict)


def _init(model, seed: int):
    torch.manual_seed(seed)
    for p in model.parameters():  # a wider init than HF's default: differences show
        torch.nn.init.normal_(p, std=0.08)
    return model.float().eval()


def qwen2vl_model(ids: dict[str, int], vocab: int, impl: str, version: str = "2", seed: int = 0):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2VLConfig, Qwen2VLForConditionalGeneration

    text = dict(TEXT, vocab_size=vocab, rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3],
                                                         "rope_theta": 10000.0})
    vision = dict(depth=2, hidden_size=64, num_heads=4, patch_size=14, spatial_merge_size=2, temporal_patch_size=2)
    tokens = dict(image_token_id=ids["<|image_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
                  vision_end_token_id=ids["<|vision_end|>"], video_token_id=ids.get("<|video_pad|>", vocab - 1))
    if version == "2":
        cfg = Qwen2VLConfig(text_config=text, vision_config=dict(vision, embed_dim=32, mlp_ratio=2), **tokens)
        cls = Qwen2VLForConditionalGeneration
    else:
        cfg = Qwen2_5_VLConfig(text_config=text, vision_config=dict(vision, intermediate_size=64, out_hidden_size=64,
                                                                     window_size=56, fullatt_block_indexes=[1]), **tokens)
        cls = Qwen2_5_VLForConditionalGeneration
    cfg._attn_implementation = impl
    return _init(cls(cfg), seed)


def qwen2vl_processor(tok, version: str = "2"):
    from transformers import Qwen2_5_VLProcessor, Qwen2VLImageProcessor, Qwen2VLProcessor

    ip = Qwen2VLImageProcessor(size={"shortest_edge": QWEN_PIXELS["min_pixels"], "longest_edge": QWEN_PIXELS["max_pixels"]})
    cls = Qwen2VLProcessor if version == "2" else Qwen2_5_VLProcessor
    return cls(image_processor=ip, tokenizer=tok, video_processor=_qwen_video_processor())


def _qwen_video_processor():
    from transformers import Qwen2VLVideoProcessor

    return Qwen2VLVideoProcessor()


def llava_model(ids: dict[str, int], vocab: int, impl: str, seed: int = 0):
    from transformers import LlavaConfig, LlavaForConditionalGeneration

    cfg = LlavaConfig(text_config=dict(TEXT, model_type="qwen2", vocab_size=vocab),
                      vision_config=dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4, image_size=56, patch_size=14),
                      image_token_id=ids["<image>"], vision_feature_layer=-2, vision_feature_select_strategy="default")
    cfg._attn_implementation = impl
    return _init(LlavaForConditionalGeneration(cfg), seed)


def llava_processor(tok):
    from transformers import CLIPImageProcessor, LlavaProcessor

    ip = CLIPImageProcessor(size={"shortest_edge": 56}, crop_size={"height": 56, "width": 56})
    return LlavaProcessor(image_processor=ip, tokenizer=tok, patch_size=14, vision_feature_select_strategy="default",
                          num_additional_image_tokens=1)


PINPOINTS = [[56, 112], [112, 56], [112, 112]]


def llava_next_model(ids: dict[str, int], vocab: int, impl: str, seed: int = 0):
    from transformers import LlavaNextConfig, LlavaNextForConditionalGeneration

    cfg = LlavaNextConfig(text_config=dict(TEXT, model_type="qwen2", vocab_size=vocab),
                          vision_config=dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=2, num_attention_heads=4, image_size=56, patch_size=14),
                          image_token_id=ids["<image>"], image_grid_pinpoints=PINPOINTS, vision_feature_layer=-2,
                          vision_feature_select_strategy="default")
    cfg._attn_implementation = impl
    return _init(LlavaNextForConditionalGeneration(cfg), seed)


def llava_next_processor(tok):
    from transformers import LlavaNextImageProcessor, LlavaNextProcessor

    ip = LlavaNextImageProcessor(size={"shortest_edge": 56}, crop_size={"height": 56, "width": 56},
                                 image_grid_pinpoints=PINPOINTS)
    return LlavaNextProcessor(image_processor=ip, tokenizer=tok, patch_size=14, vision_feature_select_strategy="default",
                              num_additional_image_tokens=1)


def qwen2audio_model(ids: dict[str, int], vocab: int, impl: str, seed: int = 0):
    from transformers import Qwen2AudioConfig, Qwen2AudioForConditionalGeneration

    cfg = Qwen2AudioConfig(text_config=dict(TEXT, model_type="qwen2", vocab_size=vocab),
                           audio_config=dict(d_model=32, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=64,
                                             num_mel_bins=128, max_source_positions=1500),
                           audio_token_id=ids["<|AUDIO|>"])
    cfg._attn_implementation = impl
    return _init(Qwen2AudioForConditionalGeneration(cfg), seed)


def qwen2audio_processor(tok):
    from transformers import Qwen2AudioProcessor, WhisperFeatureExtractor

    return Qwen2AudioProcessor(feature_extractor=WhisperFeatureExtractor(feature_size=128), tokenizer=tok)


def qwen25omni_model(ids: dict[str, int], vocab: int, impl: str, seed: int = 0):
    """A tiny Qwen2.5-Omni thinker (audio tower, then the vision tower, in its forward)."""
    from transformers import Qwen2_5OmniThinkerConfig, Qwen2_5OmniThinkerForConditionalGeneration

    cfg = Qwen2_5OmniThinkerConfig(
        text_config=dict(TEXT, vocab_size=vocab, rope_scaling={"rope_type": "default", "mrope_section": [2, 3, 3]}),
        vision_config=dict(depth=2, hidden_size=64, intermediate_size=64, num_heads=4, patch_size=14, spatial_merge_size=2,
                           temporal_patch_size=2, out_hidden_size=64, fullatt_block_indexes=[1], window_size=56),
        audio_config=dict(d_model=32, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=64, num_mel_bins=128,
                          output_dim=64, n_window=50),
        image_token_index=ids["<|image_pad|>"], audio_token_index=ids["<|AUDIO|>"], video_token_index=ids["<|video_pad|>"])
    cfg._attn_implementation = impl
    return _init(Qwen2_5OmniThinkerForConditionalGeneration(cfg), seed)


QWEN_IMAGE = dict(image_token="<|image_pad|>", image_begin="<|vision_start|>", image_end="<|vision_end|>",
                  image_tokens=f"dynamic:min_pixels={QWEN_PIXELS['min_pixels']},max_pixels={QWEN_PIXELS['max_pixels']}")

FAMILIES = {
    "qwen2vl": Family("qwen2vl", QWEN_IMAGE, ("image",), qwen2vl_model, qwen2vl_processor),
    "qwen2_5vl": Family("qwen2_5vl", QWEN_IMAGE, ("image",), lambda i, v, a: qwen2vl_model(i, v, a, version="2.5"),
                        lambda t: qwen2vl_processor(t, version="2.5")),
    "llava": Family("llava", dict(image_token="<image>", image_tokens="fixed:image_size=56,patch_size=14"), ("image",),
                    llava_model, llava_processor),
    "llava_next": Family("llava_next", dict(image_token="<image>", image_tokens="anyres:image_size=56,patch_size=14,"
                                            "pinpoints=56x112/112x56/112x112"), ("image",),
                         llava_next_model, llava_next_processor),
    "qwen2audio": Family("qwen2audio", dict(audio_token="<|AUDIO|>", audio_begin="<|audio_bos|>", audio_end="<|audio_eos|>",
                                            audio_tokens="qwen2-audio"), ("audio",), qwen2audio_model, qwen2audio_processor),
}
