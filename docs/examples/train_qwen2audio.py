"""Train Qwen2-Audio on a packed build: each batch's clips go through the Whisper feature
extractor inside the collator (128-bin log-mel, 30 s padded, with the frame mask the
encoder's length comes from; every count checked against the build's spans), and every
packed record sees only itself (sdpa masks). Runs on CPU with a tiny random model built
from a config, no download; for a real run, swap in the checkpoint where marked.

    packer build pipelines/qwen2audio.toml -o out/qwen2audio --max-length 2048   # short rows for a CPU run
    python docs/examples/train_qwen2audio.py out/qwen2audio [--steps 20] [--lr 5e-3]

The build counted every clip as Qwen2-Audio's encoder shortens it (pipelines/qwen2audio.toml:
audio_tokens = "qwen2-audio": Whisper's 100 frames/s, a stride-2 conv and a 2x pool, 30 s
kept); the feature extractor below is the checkpoint's (128 mel bins, 16 kHz). Another one
raises MediaMismatchError at the first batch, naming the file and both counts.
"""

from __future__ import annotations

import argparse
import math

import torch
from torch.utils.data import DataLoader
from transformers import Qwen2AudioConfig, Qwen2AudioForConditionalGeneration, Qwen2AudioProcessor, WhisperFeatureExtractor

from packer.loader import PackedCollator, PackedDataset, TokenBalancedSampler, model_inputs, packed_loss


def tiny_model_and_processor(ds: PackedDataset):
    """A tiny random Qwen2-Audio and its processor, built locally. For a real run, replace with:

        processor = AutoProcessor.from_pretrained("Qwen/Qwen2-Audio-7B-Instruct")
        model = Qwen2AudioForConditionalGeneration.from_pretrained("Qwen/Qwen2-Audio-7B-Instruct", attn_implementation="sdpa")

    and build with that checkpoint's tokenizer (--tokenizer Qwen/Qwen2-Audio-7B-Instruct), so the
    build's placeholder ids are the model's (checked in main).
    """
    tok = ds.tokenizer()  # OUT/tokenizer: the build's tokenizer, placeholder tokens included
    cfg = Qwen2AudioConfig(
        text_config=dict(model_type="qwen2", vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=ds.max_length, tie_word_embeddings=False,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None),
        audio_config=dict(d_model=32, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=64, num_mel_bins=128,
                          max_source_positions=1500),
        audio_token_id=ds.placeholder_ids["<|AUDIO|>"])
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = Qwen2AudioForConditionalGeneration(cfg)
    processor = Qwen2AudioProcessor(feature_extractor=WhisperFeatureExtractor(feature_size=128), tokenizer=tok)
    return model, processor


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build", help="a packer build folder made with pipelines/qwen2audio.toml")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=5e-3, help="for the tiny model; about 1e-5 for a real checkpoint")
    ap.add_argument("--workers", type=int, default=1, help="DataLoader workers (they load and featurise the audio)")
    args = ap.parse_args()

    ds = PackedDataset(args.build)
    if "<|AUDIO|>" not in ds.placeholder_ids:
        raise SystemExit(f"{args.build} has no <|AUDIO|> placeholder: build it with pipelines/qwen2audio.toml")
    model, processor = tiny_model_and_processor(ds)
    if model.config.audio_token_id != ds.placeholder_ids["<|AUDIO|>"]:
        raise SystemExit(f"the model's audio_token_id {model.config.audio_token_id} is not the build's "
                         f"{ds.placeholder_ids['<|AUDIO|>']}: build with the model's tokenizer")
    model.train()

    sampler = TokenBalancedSampler(ds, num_replicas=1, rank=0, batch_size=1, seed=0)
    collate = PackedCollator(attention="sdpa", processor=processor)
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
            clips = 0 if "input_features" not in batch else len(batch["input_features"])
            print(f"step {step:3d}  loss {loss.item():.4f}  tokens {int((batch['labels'] != -100).sum()):5d} trained "
                  f"of {batch['input_ids'].numel():5d}  clips {clips}", flush=True)
            step += 1
            if step == args.steps:
                break
        epoch += 1


if __name__ == "__main__":
    main()
