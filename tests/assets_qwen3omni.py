"""Qwen3-Omni (thinker) test assets, built here (no download): ``Qwen3OmniMoeProcessor`` around the Qwen tokenizer
with the family's tokens declared as its tokenizer declares them (``image_token`` ``<|image_pad|>``, ``audio_token``
``<|audio_pad|>``, ``audio_bos_token`` ``<|audio_start|>``, ...), saved into a checkpoint folder and loaded back, and a
tiny random-init ``Qwen3OmniMoeThinkerForConditionalGeneration``: 2 layers, a mixture of 2 experts, a 2-layer vision
tower (patch 16, merge 2, DeepStack at layer 0) and a 2-layer audio encoder (128 mel bins, 100-frame blocks).

Images take 4 to 48 tokens (32 px each); videos are sampled at 2 frames a second, at most 8 frames, at the size the
processor imposes on every call (128 to 768 tokens a frame pair); audio at 16 kHz, whole (no 30 s cut).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from family_assets import QWEN_TOKENIZER, TEMPLATES, Alone, Equal, FamilyAssets, Sample, Verify, _init, _save_and_load

SPECIAL = {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>", "audio_token": "<|audio_pad|>",
           "vision_bos_token": "<|vision_start|>", "vision_eos_token": "<|vision_end|>",
           "audio_bos_token": "<|audio_start|>", "audio_eos_token": "<|audio_end|>"}
IMAGE_SIZE = {"shortest_edge": 32 * 32 * 4, "longest_edge": 32 * 32 * 48}


def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(QWEN_TOKENIZER, extra_special_tokens=SPECIAL)


def processor(folder: Path, **video):
    from transformers import Qwen2VLImageProcessor, Qwen2VLVideoProcessor, Qwen3OmniMoeProcessor, WhisperFeatureExtractor

    ip = Qwen2VLImageProcessor(patch_size=16, merge_size=2, size=IMAGE_SIZE, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    vp = Qwen2VLVideoProcessor(patch_size=16, merge_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3,
                               **({"do_sample_frames": True, "fps": 2, "max_frames": 8, "cap_pixels_per_frame": False} | video))
    fe = WhisperFeatureExtractor(feature_size=128)
    proc = Qwen3OmniMoeProcessor(image_processor=ip, video_processor=vp, feature_extractor=fe, tokenizer=tokenizer(),
                                 chat_template=(TEMPLATES / "qwen3omni.jinja").read_text())
    return _save_and_load(proc, folder)


def model(processor, impl: str, seed: int = 0, position_id_per_seconds: int = 13):
    from transformers import Qwen3OmniMoeThinkerConfig, Qwen3OmniMoeThinkerForConditionalGeneration

    tok = processor.tokenizer
    ids = {k: tok.convert_tokens_to_ids(v) for k, v in SPECIAL.items()}
    text = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, moe_intermediate_size=32, num_experts=2, num_experts_per_tok=2,
                max_position_embeddings=8192, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                               "mrope_section": [2, 3, 3], "interleaved": True})
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=4, patch_size=16, spatial_merge_size=2,
                  temporal_patch_size=2, out_hidden_size=64, num_position_embeddings=64, deepstack_visual_indexes=[0])
    audio = dict(num_mel_bins=128, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=64, d_model=32,
                 output_dim=64, downsample_hidden_size=16, n_window=50, n_window_infer=400)
    cfg = Qwen3OmniMoeThinkerConfig(text_config=text, vision_config=vision, audio_config=audio,
                                    image_token_id=ids["image_token"], video_token_id=ids["video_token"],
                                    audio_token_id=ids["audio_token"], audio_start_token_id=ids["audio_bos_token"],
                                    vision_start_token_id=ids["vision_bos_token"],
                                    position_id_per_seconds=position_id_per_seconds)
    cfg._attn_implementation = impl
    for sub in (cfg.text_config, cfg.vision_config, cfg.audio_config):
        sub._attn_implementation = impl
    return _init(Qwen3OmniMoeThinkerForConditionalGeneration(cfg), seed)


REFUSED = {"5ms_16k.wav": "audio_too_short", '["img/plain_300x200.jpg", "img/plain_300x200.jpg", "img/plain_300x200.'
           'jpg", "img/plain_300x200.jpg", "img/plain_300x200.jpg"]': "unsupported_video"}


def refused_for(record: dict) -> str | None:
    """Why the processor refuses a harness record (None: it takes it)."""
    text = json.dumps(record)
    return next((reason for key, reason in REFUSED.items() if key in text and '"fps"' not in text), None)


def extra_records(root: Path) -> list[dict]:
    """The short clip alone and beside a longer one; an image, a video and two clips in one record."""
    import soundfile as sf

    rng = np.random.default_rng(0)
    sf.write(root / "aud" / "short_1300.wav", rng.uniform(-0.5, 0.5, 1300).astype(np.float32), 16000)
    clip = lambda name: {"type": "audio", "audio": f"aud/{name}"}  # noqa: E731
    users = [[clip("short_1300.wav")], [clip("1s_48k_stereo.wav"), clip("short_1300.wav")],
             [{"type": "image", "image": "img/photo.webp"}, clip("2s_44k.mp3"), {"type": "video", "video": "vid/odd_17f.mp4"},
              clip("short_1300.wav")]]
    return [{"id": f"x{k}", "messages": [{"role": "user", "content": [*u, {"type": "text", "text": "What is it?"}]},
                                         {"role": "assistant", "content": "Noise and a gradient."}]}
            for k, u in enumerate(users)]


def records(root: Path, written: list[dict]) -> tuple[list[dict], list[dict]]:
    """The harness's records the processor takes, and the extra ones; the two it refuses apart (left out)."""
    refused = [r for r in written if refused_for(r)]
    assert sorted(refused_for(r) for r in refused) == sorted(REFUSED.values())
    return [r for r in written if not refused_for(r)] + extra_records(root), refused


def sample_processor(tokenizer_folder: str, chat_template: str):
    """processors/qwen3omni (pipelines/qwen3omni.toml): Qwen3OmniMoeProcessor at its classes' defaults but Qwen3-Omni's
    16 px patches (Qwen2-VL image and video processors, a 128-bin Whisper feature extractor), around the sample
    tokenizer with the thinker's tokens added."""
    from transformers import (
        AutoTokenizer,
        Qwen2VLImageProcessor,
        Qwen2VLVideoProcessor,
        Qwen3OmniMoeProcessor,
        WhisperFeatureExtractor,
    )

    tok = AutoTokenizer.from_pretrained(tokenizer_folder, extra_special_tokens=dict(SPECIAL))
    return Qwen3OmniMoeProcessor(image_processor=Qwen2VLImageProcessor(patch_size=16),
                                 video_processor=Qwen2VLVideoProcessor(patch_size=16, cap_pixels_per_frame=False),
                                 feature_extractor=WhisperFeatureExtractor(feature_size=128), tokenizer=tok,
                                 chat_template=chat_template)


_SIZES = ("patch_size", "merge_size")
_FRAMES = ("temporal_patch_size", "min_frames", "max_frames")


def _own_video_size(processor, settings) -> None:
    """The video pixel bounds are the processor's (its videos_kwargs, passed at every call), not its video processor's."""
    vp, size = processor.video_processor, processor.videos_kwargs["size"]
    assert (vp.size["shortest_edge"], vp.size["longest_edge"]) != (size["shortest_edge"], size["longest_edge"])


# the settings a build reads off the checkpoint (also the sample checkpoint's, test_family_qwen3omni): the image and
# video budgets, the frame rule (none set: 0), the processor's own video bounds and audio rate, the audio hop and
# window, the media and boundary tokens
SETTINGS = Equal({**{f"image_{k}": f"image_processor.{k}" for k in _SIZES},
                  "image_min_pixels": "image_processor.size[shortest_edge]",
                  "image_max_pixels": "image_processor.size[longest_edge]",
                  **{f"video_{k}": f"video_processor.{k}" for k in (*_SIZES, *_FRAMES)},
                  "video_sample": "video_processor.do_sample_frames", "video_fps": lambda p: p.video_processor.fps or 0.0,
                  "video_num_frames": lambda p: p.video_processor.num_frames or 0,
                  "cap_pixels_per_frame": lambda p: bool(p.video_processor.cap_pixels_per_frame),
                  "max_video_tokens": "video_processor.max_video_tokens",
                  "video_min_pixels": "videos_kwargs[size][shortest_edge]",
                  "video_max_pixels": "videos_kwargs[size][longest_edge]",
                  "sampling_rate": "audio_kwargs[sampling_rate]", "hop_length": "feature_extractor.hop_length",
                  **{k: k for k in ("n_window", "position_id_per_seconds", "image_token", "video_token", "audio_token")},
                  "vision_start": "vision_bos_token", "vision_end": "vision_eos_token", "audio_start": "audio_bos_token",
                  "audio_end": "audio_eos_token"},
                 values={"video_fps": 2, "image_patch_size": 16}, exception=_own_video_size)


def _no_frame_rule(hf, settings) -> None:
    """The video processor samples by neither a rate nor a count."""
    vp = hf.Qwen2VLVideoProcessor()
    assert (vp.fps, vp.num_frames) == (None, None)


DEFAULTS = Equal({**{f"image_{k}": f"Qwen2VLImageProcessor().{k}" for k in _SIZES},
                  "image_min_pixels": "Qwen2VLImageProcessor().size[shortest_edge]",
                  "image_max_pixels": "Qwen2VLImageProcessor().size[longest_edge]",
                  **{f"video_{k}": f"Qwen2VLVideoProcessor().{k}" for k in (*_SIZES, *_FRAMES)},
                  "video_sample": "Qwen2VLVideoProcessor().do_sample_frames",
                  "cap_pixels_per_frame": lambda hf: bool(hf.Qwen2VLVideoProcessor().cap_pixels_per_frame),
                  "max_video_tokens": "Qwen2VLVideoProcessor().max_video_tokens",
                  "video_min_pixels": "Qwen3OmniMoeProcessor.videos_kwargs[size][shortest_edge]",
                  "video_max_pixels": "Qwen3OmniMoeProcessor.videos_kwargs[size][longest_edge]",
                  "sampling_rate": "Qwen3OmniMoeProcessor.audio_kwargs[sampling_rate]",
                  "hop_length": "WhisperFeatureExtractor().hop_length",
                  **{k: f"Qwen3OmniMoeProcessor.{k}" for k in ("n_window", "position_id_per_seconds")}},
                 exception=_no_frame_rule)

# the packed == alone check on a second build of a few records (an image alone; the short clip alone and beside a
# longer one; an image, a video and two clips in one record), each alone given the processor's attention_mask (the
# thinker computes its 3-D positions only when given one); verify: fewer frames of a long clip, another max_pixels
ASSETS = FamilyAssets("qwen3omni", ("image", "audio", "video"), processor, model, rope="mrope", records=records,
                      alone=Alone("small", keep=lambda r: r["id"] in ("x0", "x1", "x2", "r0"), build={"max_segments": 3}),
                      reference_mask=True, verify=Verify(sample=10, other={"max_frames": 4}, other_sample=24),
                      sample=Sample("qwen3omni", sample_processor, "qwen3omni.jinja"), settings=SETTINGS, defaults=DEFAULTS)
