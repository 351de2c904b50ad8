"""Train Qwen2-VL on a packed build: each batch's images go through the Qwen2-VL image
processor inside the collator (pixel patches + grids, every count checked against the
build's spans), positions are mRoPE, and every packed record sees only itself (sdpa masks).
Runs on CPU with a tiny random model built from a config, no download; for a real run,
swap in the checkpoint where marked.

    packer build pipelines/qwen2vl.toml -o out/qwen2vl --max-length 2048   # short rows for a CPU run
    python docs/examples/train_qwen2vl.py out/qwen2vl [--steps 20] [--lr 5e-3]

The build counted every image the way Qwen2-VL's processor resizes it (pipelines/qwen2vl.toml:
image_tokens = "dynamic:min_pixels=3136,max_pixels=1003520", the checkpoint's own defaults);
the image processor below uses the same bounds. Another min/max pixels raises
MediaMismatchError at the first batch, naming the file and both counts.
"""

from __future__ import annotations

import argparse
import math

import torch
from torch.utils.data import DataLoader
from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLImageProcessor, Qwen2VLProcessor

from packer.loader import PackedCollator, PackedDataset, TokenBalancedSampler, model_inputs, packed_loss

MIN_PIXELS, MAX_PIXELS = 3136, 1003520  # = the build's image_tokens policy (pipelines/qwen2vl.toml)


def tiny_model_and_processor(ds: PackedDataset):
    """A tiny random Qwen2-VL and its processor, built locally. For a real run, replace with:

        processor = AutoProcessor.from_pretrained("Qwen/Qwen2-VL-2B-Instruct")
        model = Qwen2VLForConditionalGeneration.from_pretrained("Qwen/Qwen2-VL-2B-Instruct", attn_implementation="sdpa")

    and build with that checkpoint's tokenizer (--tokenizer Qwen/Qwen2-VL-2B-Instruct), so the
    build's placeholder ids are the model's (checked in main).
    """
    from transformers import Qwen2VLVideoProcessor

    tok = ds.tokenizer()  # OUT/tokenizer: the build's tokenizer, placeholder tokens included
    ids = ds.placeholder_ids
    vocab = len(tok) + 1  # one spare id for the video token: this build has no video
    cfg = Qwen2VLConfig(
        text_config=dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=ds.max_length, tie_word_embeddings=False,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None,
                         rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0}),
        vision_config=dict(depth=2, embed_dim=32, hidden_size=64, num_heads=4, mlp_ratio=2, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2),
        image_token_id=ids["<|image_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"], video_token_id=vocab - 1)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = Qwen2VLForConditionalGeneration(cfg)
    image_processor = Qwen2VLImageProcessor(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS, patch_size=14, merge_size=2)
    processor = Qwen2VLProcessor(image_processor=image_processor, tokenizer=tok, video_processor=Qwen2VLVideoProcessor())
    return model, processor


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build", help="a packer build folder made with pipelines/qwen2vl.toml")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=5e-3, help="for the tiny model; about 1e-5 for a real checkpoint")
    ap.add_argument("--workers", type=int, default=1, help="DataLoader workers (they load and process the images)")
    args = ap.parse_args()

    ds = PackedDataset(args.build)
    if "<|image_pad|>" not in ds.placeholder_ids:
        raise SystemExit(f"{args.build} has no <|image_pad|> placeholder: build it with pipelines/qwen2vl.toml")
    model, processor = tiny_model_and_processor(ds)
    ids = ds.placeholder_ids
    if model.config.image_token_id != ids["<|image_pad|>"]:
        raise SystemExit(f"the model's image_token_id {model.config.image_token_id} is not the build's "
                         f"{ids['<|image_pad|>']}: build with the model's tokenizer")
    model.train()

    sampler = TokenBalancedSampler(ds, num_replicas=1, rank=0, batch_size=1, seed=0)
    collate = PackedCollator(attention="sdpa", rope="mrope", processor=processor)
    loader = DataLoader(ds, batch_size=1, sampler=sampler, collate_fn=collate, num_workers=args.workers)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    step, epoch = 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for batch in loader:
            loss = packed_loss(model(**model_inputs(batch)).logits, batch)
            if not math.isfinite(loss.item()):
                raise SystemExit(f"step {step}: loss {loss.item()}")
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
            images = 0 if "image_grid_thw" not in batch else len(batch["image_grid_thw"])
            print(f"step {step:3d}  loss {loss.item():.4f}  tokens {int((batch['labels'] != -100).sum()):5d} trained "
                  f"of {batch['input_ids'].numel():5d}  images {images}", flush=True)
            step += 1
            if step == args.steps:
                break
        epoch += 1


if __name__ == "__main__":
    main()
