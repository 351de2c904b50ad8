"""Gemma 4 test assets: ``Gemma4Processor`` built in code around the Qwen tokenizer with Gemma 4's tokens (as its
tokenizer declares them: ``image_token`` / ``boi_token`` / ``eoi_token``, ``audio_token`` / ``boa_token`` /
``eoa_token``, the turn tokens, a ``<bos>`` it adds; the processor adds ``<|video|>`` itself), saved into a
checkpoint folder and loaded back; a tiny random ``Gemma4ForConditionalGeneration`` with image, video and audio
towers, a sliding-window layer (window shorter than an image) and a full one, ``use_bidirectional_attention="vision"``.

Budgets are small: 4 px patches (the smallest budget, 70 soft tokens, is ~100 x 100 px), 3 frames a video,
16 mel bins.
"""

from __future__ import annotations

from pathlib import Path

from family_assets import QWEN_TOKENIZER, TEMPLATES, Alone, Equal, FamilyAssets, Sample, _init, _save_and_load, default_of

TOKENS = {"image_token": "<|image|>", "boi_token": "<|image>", "eoi_token": "<image|>", "audio_token": "<|audio|>",
          "boa_token": "<|audio>", "eoa_token": "<audio|>", "sot_token": "<|turn>", "eot_token": "<turn|>"}
PATCH = 4
MEL_BINS = 16
SLIDING_WINDOW = 16


def gemma4_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(QWEN_TOKENIZER, extra_special_tokens=TOKENS, bos_token="<bos>", add_bos_token=True)


def gemma4_processor(folder: Path, **video):
    from transformers import Gemma4AudioFeatureExtractor, Gemma4ImageProcessor, Gemma4Processor, Gemma4VideoProcessor

    ip = Gemma4ImageProcessor(patch_size=PATCH, max_soft_tokens=70)
    vp = Gemma4VideoProcessor(**{"patch_size": PATCH, "max_soft_tokens": 70, "num_frames": 3, **video})
    fe = Gemma4AudioFeatureExtractor(feature_size=MEL_BINS)
    proc = Gemma4Processor(feature_extractor=fe, image_processor=ip, tokenizer=gemma4_tokenizer(), video_processor=vp,
                           chat_template=(TEMPLATES / "gemma4.jinja").read_text())
    return _save_and_load(proc, folder)


def gemma4_config(processor, impl: str = "sdpa"):
    from transformers import Gemma4Config

    tok = processor.tokenizer
    ids = {name: tok.convert_tokens_to_ids(token) for name, token in TOKENS.items()}
    text = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, global_head_dim=8, max_position_embeddings=4096,
                sliding_window=SLIDING_WINDOW, layer_types=["sliding_attention", "full_attention"],
                hidden_size_per_layer_input=4, vocab_size_per_layer_input=len(tok), use_bidirectional_attention="vision",
                pad_token_id=tok.pad_token_id, rms_norm_eps=1e-6)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4,
                  head_dim=8, patch_size=PATCH, pooling_kernel_size=3, position_embedding_size=1024)
    audio = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, subsampling_conv_channels=[MEL_BINS, 8],
                 output_proj_dims=32)
    cfg = Gemma4Config(text_config=text, vision_config=vision, audio_config=audio, image_token_id=ids["image_token"],
                       video_token_id=processor.video_token_id, audio_token_id=ids["audio_token"],
                       boi_token_id=ids["boi_token"], eoi_token_id=ids["eoi_token"], boa_token_id=ids["boa_token"],
                       eoa_token_index=ids["eoa_token"], tie_word_embeddings=False)
    cfg._attn_implementation = impl
    cfg.audio_config._attn_implementation = "eager"  # the audio tower's chunked attention exists in eager only
    return cfg


def gemma4_model(processor, impl: str, seed: int = 0):
    from transformers import Gemma4ForConditionalGeneration

    return _init(Gemma4ForConditionalGeneration(gemma4_config(processor, impl)), seed)


QUARANTINED = {"r13": "audio_too_short"}  # aud/5ms_16k.wav: no position for the audio encoder
HEAVY_AUDIO = ("29.99s_16k.flac", "31s_24k.flac")


def media_parts(record: dict) -> list[dict]:
    return [p for m in record["messages"] if isinstance(m["content"], list) for p in m["content"] if p["type"] != "text"]


def light(record: dict) -> bool:
    """A record of the packed == alone check's build: not the 30 images, not 2 of the 3 clips over 29 s (each row's
    logits are vocabulary-wide)."""
    media = media_parts(record)
    return len(media) < 30 and not any(str(p.get("audio", "")).endswith(HEAVY_AUDIO) for p in media)


def covering(ds) -> list[int]:
    """Short rows that between them hold an image, a video and an audio clip."""
    chosen, seen = [], set()
    for i in sorted(range(len(ds)), key=lambda i: ds[i]["n_tokens"]):
        kinds = {m["kind"] for m in ds[i]["media"]}
        if kinds - seen:
            chosen.append(i)
            seen |= kinds
    assert seen == {"image", "video", "audio"}
    return chosen


def alone_rows(ds, records, impl) -> list[int]:
    """Every row with sdpa, rows holding every kind with eager."""
    return list(range(len(ds))) if impl == "sdpa" else covering(ds)


# processors/gemma4 (pipelines/gemma4.toml): Gemma 4's processor classes' defaults (280-token images, 70-token video
# frames, 16 kHz audio), but 4 frames a video: the class default, 32, is more than any sample clip holds (the processor
# refuses such clips, and so does packer); Gemma's named media tokens, its turn tokens and <bos>
SAMPLE_PROCESSOR = {
    "processor_class": "Gemma4Processor", "image_seq_length": 280, "audio_seq_length": 750, "audio_ms_per_token": 40,
    "image_processor": {"image_processor_type": "Gemma4ImageProcessor", "patch_size": 16, "max_soft_tokens": 280,
                        "pooling_kernel_size": 3, "do_convert_rgb": True, "do_normalize": False, "do_rescale": True,
                        "do_resize": True, "resample": 3, "rescale_factor": 1 / 255, "image_mean": [0.0, 0.0, 0.0],
                        "image_std": [1.0, 1.0, 1.0]},
    "video_processor": {"video_processor_type": "Gemma4VideoProcessor", "patch_size": 16, "max_soft_tokens": 70,
                        "pooling_kernel_size": 3, "num_frames": 4, "do_sample_frames": True, "do_convert_rgb": True,
                        "do_normalize": True, "do_rescale": True, "do_resize": True, "resample": 3,
                        "rescale_factor": 1 / 255, "image_mean": [0.0, 0.0, 0.0], "image_std": [1.0, 1.0, 1.0],
                        "return_metadata": False},
    "feature_extractor": {"feature_extractor_type": "Gemma4AudioFeatureExtractor", "feature_size": 128,
                          "sampling_rate": 16000, "padding_value": 0.0, "return_attention_mask": True,
                          "frame_length": 320, "hop_length": 160, "min_frequency": 0.0, "max_frequency": 8000.0,
                          "preemphasis": 0.0, "preemphasis_htk_flavor": True, "fft_overdrive": False, "dither": 0.0,
                          "input_scale_factor": 1.0, "mel_floor": 0.001, "per_bin_mean": None, "per_bin_stddev": None},
}
SAMPLE_NAMED = {k: TOKENS[k] for k in ("image_token", "boi_token", "eoi_token", "audio_token", "boa_token", "eoa_token")}
SAMPLE = Sample("gemma4", SAMPLE_PROCESSOR, "gemma4.jinja", named=SAMPLE_NAMED,
                tokens=("<bos>", "<|turn>", "<turn|>", "<|video|>"), tokenizer={"bos_token": "<bos>"})

_SIZES = ("patch_size", "max_soft_tokens", "pooling_kernel_size")
# the settings a build reads off the checkpoint: the image and video processors' sizes, the frames sampled (no fps
# set: 0), the feature extractor's rate and frames, the tokenizer's named tokens
SETTINGS = Equal({**{f"image_{k}": f"image_processor.{k}" for k in _SIZES},
                  **{f"video_{k}": f"video_processor.{k}" for k in _SIZES},
                  "video_num_frames": "video_processor.num_frames", "video_fps": lambda p: p.video_processor.fps or 0.0,
                  "video_sample": "video_processor.do_sample_frames",
                  **{f"audio_{k}": f"feature_extractor.{k}" for k in ("sampling_rate", "frame_length", "hop_length")},
                  **{k: f"tokenizer.{k}" for k in ("image_token", "boi_token", "eoi_token", "audio_token", "boa_token",
                                                   "eoa_token")},
                  "video_token": "video_token"})


def _no_fps(hf, settings) -> None:
    assert getattr(hf.Gemma4VideoProcessor(), "fps", None) is None  # the class sets none: video_fps 0.0 (values)


# the classes' defaults: the processors' class attributes, the feature extractor's (an instance's), the clip cap its
# call defaults to
DEFAULTS = Equal({**{f"image_{k}": f"Gemma4ImageProcessor.{k}" for k in _SIZES},
                  **{f"video_{k}": f"Gemma4VideoProcessor.{k}" for k in _SIZES},
                  "video_num_frames": "Gemma4VideoProcessor.num_frames",
                  "video_sample": "Gemma4VideoProcessor.do_sample_frames",
                  **{f"audio_{k}": f"Gemma4AudioFeatureExtractor().{k}" for k in ("sampling_rate", "frame_length", "hop_length")},
                  "audio_max_length": default_of("Gemma4AudioFeatureExtractor", "max_length", "__call__")},
                 values={"video_fps": 0.0}, exception=_no_fps)

ASSETS = FamilyAssets("gemma4", ("image", "video", "audio"), gemma4_processor, gemma4_model, quarantined=QUARANTINED,
                      alone=Alone("small", keep=light, build={"max_length": 1024}), alone_rows=alone_rows,
                      split_runs=True,  # a clip's frames, timestamps between them
                      sample_segments=10, dummy_eager=True, sample=SAMPLE,
                      settings=SETTINGS, defaults=DEFAULTS)
