"""Gemma 3 test assets: ``Gemma3Processor`` built in code around the Qwen tokenizer with Gemma 3's tokens (as
its tokenizer declares them: ``boi_token`` / ``image_token`` / ``eoi_token``, ``<start_of_turn>`` /
``<end_of_turn>``, a ``<bos>`` it adds), saved into a checkpoint folder and loaded back; a tiny random
``Gemma3ForConditionalGeneration`` (a sliding-window layer and a full one, the window shorter than an image).

Budgets are small: 16 x 16 px images, 4 soft tokens an image (2 x 2 patches of 8 px, pooled 1 x 1).
"""

from __future__ import annotations

from pathlib import Path

from family_assets import QWEN_TOKENIZER, TEMPLATES, Alone, Equal, FamilyAssets, Sample, _init, _save_and_load, default_of

TOKENS = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
IMAGE_SEQ_LENGTH = 4
SLIDING_WINDOW = 3  # shorter than an image's 4 tokens: the window cuts into the bidirectional blocks
SCAN_CALL = {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 8}
SCAN_OPTIONS = "do_pan_and_scan=true,pan_and_scan_min_crop_size=8"


def gemma3_tokenizer():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(QWEN_TOKENIZER, extra_special_tokens=TOKENS, bos_token="<bos>",
                                        add_bos_token=True)
    tok.add_tokens(["<start_of_turn>", "<end_of_turn>"], special_tokens=True)
    return tok


def gemma3_processor(folder: Path):
    from transformers import Gemma3ImageProcessor, Gemma3Processor

    ip = Gemma3ImageProcessor(size={"height": 16, "width": 16}, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    proc = Gemma3Processor(image_processor=ip, tokenizer=gemma3_tokenizer(), image_seq_length=IMAGE_SEQ_LENGTH,
                           chat_template=(TEMPLATES / "gemma3.jinja").read_text())
    return _save_and_load(proc, folder)


def gemma3_config(processor, impl: str = "sdpa"):
    from transformers import Gemma3Config

    tok = processor.tokenizer
    text = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, max_position_embeddings=4096, sliding_window=SLIDING_WINDOW,
                layer_types=["sliding_attention", "full_attention"], rms_norm_eps=1e-6)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, image_size=16,
                  patch_size=8, vision_use_head=False)
    cfg = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=IMAGE_SEQ_LENGTH,
                       image_token_index=tok.image_token_id, boi_token_index=tok.boi_token_id,
                       eoi_token_index=tok.convert_tokens_to_ids(tok.eoi_token), tie_word_embeddings=False)
    cfg._attn_implementation = impl
    return cfg


def gemma3_model(processor, impl: str, seed: int = 0):
    from transformers import Gemma3ForConditionalGeneration

    return _init(Gemma3ForConditionalGeneration(gemma3_config(processor, impl)), seed)


# processors/gemma3 (pipelines/gemma3.toml): Gemma3Processor's and Gemma3ImageProcessor's published settings (896-px
# images, 256 soft tokens an image), Gemma's named image tokens, its turn tokens and <bos>
SAMPLE_PROCESSOR = {
    "processor_class": "Gemma3Processor", "image_seq_length": 256,
    "image_processor": {"image_processor_type": "Gemma3ImageProcessor", "size": {"height": 896, "width": 896},
                        "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True, "resample": 2,
                        "rescale_factor": 1 / 255, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]},
}
SAMPLE = Sample("gemma3", SAMPLE_PROCESSOR, "gemma3.jinja", named=TOKENS, tokens=("<bos>", "<start_of_turn>", "<end_of_turn>"),
                tokenizer={"bos_token": "<bos>"})

# the settings a build reads off the checkpoint: the soft tokens an image, Gemma's named image tokens and the pan and
# scan options the processor passes at every call (its images_kwargs, not the image processor's own)
SETTINGS = Equal({"image_seq_length": "image_seq_length", "boi_token": "tokenizer.boi_token",
                  "image_token": "tokenizer.image_token", "eoi_token": "tokenizer.eoi_token",
                  **{k: f"images_kwargs[{k}]" for k in ("do_pan_and_scan", "pan_and_scan_min_crop_size",
                                                         "pan_and_scan_max_num_crops", "pan_and_scan_min_ratio_to_activate")}},
                 values={"image_seq_length": IMAGE_SEQ_LENGTH})
DEFAULTS = Equal({"image_seq_length": default_of("Gemma3Processor", "image_seq_length")})

# the packed == alone check on the records built with pan and scan on (an image's runs split by its crops' text), as
# training would call processor(..., do_pan_and_scan=True, pan_and_scan_min_crop_size=8)
ASSETS = FamilyAssets("gemma3", ("image",), gemma3_processor, gemma3_model,
                      alone=Alone("scan", build={"processor_options": SCAN_OPTIONS}, call=SCAN_CALL),
                      split_runs=True,  # an image's crops, text between them
                      sample_segments=10, dummy_eager=False, sample=SAMPLE,
                      settings=SETTINGS, defaults=DEFAULTS)
