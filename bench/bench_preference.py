"""Preference data packed as pairs vs as trees: tokens computed and training step time (CPU, tiny models).

A generated preference set with chat-like lengths (prompts ~280 tokens, responses ~200, log-normal) is
built twice by ``packer build --preference pairs|tree`` and an epoch of forward + backward (of every
response's summed log-probability) is timed over each build's rows (one row a step, sdpa, the rows' own
length, a 2-layer 128-wide model: the median of ``--epochs``): text records with 2 responses (DPO) and
4 (best-of-n), and records with a 448 x 448 image in the prompt (256 placeholders, Qwen2-VL's counting)
through a tiny Qwen2-VL, whose vision tower runs once per image in a tree and once per response in pairs.

    python bench/bench_preference.py [--records 16] [--epochs 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from packer.build import build  # noqa: E402
from packer.config import resolve  # noqa: E402
from packer.loader import PackedCollator, PackedDataset, model_inputs, packed_logps  # noqa: E402

TOKENIZER = str(ROOT / "sample_data" / "tokenizer")
WORDS = ("the of and to in is that it for on with as was at by an be this from or have not are but which one you "
         "all were we when there can more if no out so said what up its about into than them only other new some "
         "time could these two may then first any like now such make over our even most made after also did many "
         "before must through back years where much your way well down should because each just those people how "
         "too little state good very world still own see men work long get here between both life being under "
         "never day same another know while last might us great old year off come since against go came right "
         "used take three small large number water point").split()
IMAGE = dict(image_token="<|image_pad|>", image_begin="<|vision_start|>", image_end="<|vision_end|>",
             image_tokens=f"dynamic:min_pixels={28 * 28 * 4},max_pixels={28 * 28 * 256}")


def words(rng: np.random.Generator, median: float) -> str:
    n = int(np.clip(rng.lognormal(np.log(median), 0.5), 4, 2 * median))  # a 4-response record stays under 4,096 as pairs
    return " ".join(rng.choice(WORDS, n)).capitalize() + "."


def records(n: int, responses: int, image: str | None, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        text = words(rng, 210)  # ~280 tokens with the template
        content = [{"type": "image", "image": image}, {"type": "text", "text": text}] if image else text
        prompt = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": content}]
        answers = [words(rng, 150) for _ in range(responses)]  # ~200 tokens each
        if responses == 2:
            out.append({"id": f"r{k}", "prompt": prompt, "chosen": answers[0], "rejected": answers[1]})
        else:
            out.append({"id": f"r{k}", "prompt": prompt, "responses": answers})
    return out


def llama(vocab: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=128, intermediate_size=344, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=4, max_position_embeddings=4096)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg)


def qwen2vl(ids: dict[str, int], vocab: int):
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    text = dict(vocab_size=vocab, hidden_size=128, intermediate_size=344, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=4, max_position_embeddings=4096, tie_word_embeddings=False, bos_token_id=None,
                eos_token_id=None, pad_token_id=None,
                rope_parameters={"rope_type": "default", "mrope_section": [4, 6, 6], "rope_theta": 10000.0})
    vision = dict(depth=2, embed_dim=64, hidden_size=128, num_heads=4, mlp_ratio=2, patch_size=14, spatial_merge_size=2,
                  temporal_patch_size=2)
    cfg = Qwen2VLConfig(text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
                        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
                        video_token_id=vocab - 1)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return Qwen2VLForConditionalGeneration(cfg)


def epoch(model, collate, rows: list[dict]) -> float:
    t0 = time.perf_counter()
    for row in rows:
        batch = collate([row])
        if "pixel_values" in batch:
            batch["pixel_values"] = batch["pixel_values"].to(model.dtype)
        out = packed_logps(model(**model_inputs(batch)).logits, batch)
        out.sum.sum().backward()
    return time.perf_counter() - t0


def run(name: str, recs: list[dict], folder: Path, image: bool, epochs: int) -> None:
    source = folder / f"{name}.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in recs))
    results = {}
    for layout in ("pairs", "tree"):
        out = folder / f"{name}-{layout}"
        manifest = build(resolve(None, input=[str(source)], output=str(out), tokenizer=TOKENIZER, preference=layout,
                                 max_length=4096, seed=0, **(IMAGE if image else {})), progress=False)
        ds = PackedDataset(out)
        rows = [ds[i] for i in range(len(ds))]
        stats = ds.row_stats()
        if image:
            from mm_models import qwen2vl_processor

            tok = ds.tokenizer()
            model = qwen2vl(ds.placeholder_ids, len(tok) + 1)
            collate = PackedCollator(attention="sdpa", rope="mrope", processor=qwen2vl_processor(tok))
            collate.media_step.image_processor.size = {"shortest_edge": 28 * 28 * 4, "longest_edge": 28 * 28 * 256}
        else:
            model = llama(len(ds.tokenizer()))
            collate = PackedCollator(attention="sdpa")
        epoch(model, collate, rows[:1])  # warm up
        times = [epoch(model, collate, rows) for _ in range(epochs)]
        spans = sum(len(r["media"]) for r in rows)
        results[layout] = (manifest.stats, stats, statistics.median(times), spans)
    (ps, pst, pt, pm), (ts, tst, tt, tm) = results["pairs"], results["tree"]
    pref = ts["preference"]
    print(f"{name}: {pref['records']} records, {pref['responses']} responses"
          + (f", {pm} images encoded as pairs, {tm} as trees" if image else ""))
    print(f"  {'':6} {'rows':>5} {'tokens':>8} {'attention (sum seg^2)':>22} {'epoch s':>9}")
    for layout, (s, st, t, _) in results.items():
        print(f"  {layout:6} {s['rows']:>5} {s['tokens']:>8,} {st['attention'].sum():>22,.0f} {t:>9.2f}")
    attention = tst["attention"].sum() / pst["attention"].sum()
    print(f"  tree / pairs: tokens {ts['tokens'] / ps['tokens']:.3f}, attention {attention:.3f}, "
          f"step time {tt / pt:.3f} (saved against pairs: {pref['pairs_tokens'] - pref['tree_tokens']:,} tokens, "
          f"{100 * (pref['pairs_tokens'] - pref['tree_tokens']) / pref['pairs_tokens']:.1f}%)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        from PIL import Image

        rng = np.random.default_rng(0)
        Image.fromarray(rng.integers(0, 255, (448, 448, 3), dtype=np.uint8)).save(folder / "image.png")
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; one row a step, sdpa, fp32")
        run("text, 2 responses", records(args.records, 2, None), folder, False, args.epochs)
        run("text, 4 responses", records(args.records, 4, None), folder, False, args.epochs)
        run("image + text, 2 responses", records(args.records, 2, "image.png"), folder, True, args.epochs)


if __name__ == "__main__":
    main()
