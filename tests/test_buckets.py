"""Fixed row lengths for compiled training (--row-lengths): the planner's choice is the least
padding any k lengths give (against brute force), the build records them, the collator pads
every batch to one of them (max_seqlen one of them too), and a compiled model over 50 steps
compiles at most one graph per length, against one per distinct row length without them."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from conftest import ROOT
from packer.build import build
from packer.config import resolve
from packer.errors import ConfigError
from packer.loader import PackedCollator, PackedDataset, TokenBalancedSampler, model_inputs, packed_loss
from packer.pack.buckets import choose_lengths, padding, parse


def test_chosen_lengths_pad_least_of_any_choice():
    rng = np.random.default_rng(0)
    for _ in range(200):
        cap, multiple, k = int(rng.integers(64, 3000)), int(rng.choice([1, 8, 64])), int(rng.integers(1, 5))
        tokens = rng.integers(1, cap + 1, rng.integers(1, 25))
        lengths = choose_lengths(tokens, k, cap, multiple)
        assert len(lengths) <= k and lengths.max() >= tokens.max() and all(x % multiple == 0 or x == cap for x in lengths)
        candidates = np.unique(np.minimum(-(-tokens // multiple) * multiple, cap))
        best = min(padding(tokens, sorted(c)) for r in range(1, k + 1) for c in itertools.combinations(candidates, r)
                   if max(c) >= tokens.max())
        assert padding(tokens, lengths) == best
    docstring = np.array([4090, 4071, 3998, 4087, 2210, 4096, 1030, 3977])
    assert choose_lengths(docstring, 3, 4096).tolist() == [1088, 2240, 4096]
    assert padding(docstring, [1088, 2240, 4096]) == 345 and padding(docstring, [4096]) == 5209


def test_parse_and_config_errors():
    assert parse("", 4096) == (None, None) and parse("auto", 4096)[0] == 4 and parse("auto:2", 4096)[0] == 2
    assert parse("2048,1024", 4096)[1].tolist() == [1024, 2048, 4096]  # max_length added: every row fits one
    with pytest.raises(ConfigError, match="up to max_length"):
        resolve(None, row_lengths="8192", max_length=4096)
    with pytest.raises(ConfigError, match="auto:K needs a whole number K >= 1"):
        resolve(None, row_lengths="auto:0")
    for spec in ("x", "1e9", "1024,two"):  # int()'s own words named neither the setting nor what it takes
        with pytest.raises(ConfigError, match=rf"row_lengths '{spec}': give positive whole lengths up to max_length "
                                              r"\(4096\), comma-separated, or auto\[:K\]"):
            resolve(None, row_lengths=spec)
    with pytest.raises(ConfigError, match="row_lengths 'auto:x': auto:K needs a whole number K >= 1"):
        resolve(None, row_lengths="auto:x")


@pytest.fixture(scope="module")
def bucketed(tmp_path_factory):
    out = tmp_path_factory.mktemp("buckets") / "out"
    build(resolve(ROOT / "pipelines" / "sample.toml", output=str(out), max_length=1024, row_lengths="auto:4",
                  max_bad_fraction=1.0), progress=False)
    return out


@pytest.fixture(scope="module")
def bucketed_text(tmp_path_factory):
    """The same, text only: a text model trains on it (model_inputs refuses media spans to a model with no tower)."""
    out = tmp_path_factory.mktemp("buckets_text") / "out"
    build(resolve(ROOT / "pipelines" / "sample.toml", output=str(out), max_length=1024, row_lengths="auto:4",
                  max_bad_fraction=1.0, modalities=[]), progress=False)
    return out


def test_the_build_records_its_lengths_and_the_collator_pads_to_them(bucketed):
    ds = PackedDataset(bucketed)
    lengths, stats = ds.row_lengths, ds.manifest.stats
    tokens = np.array([int(ds[i]["n_tokens"]) for i in range(len(ds))])
    assert lengths == choose_lengths(tokens, 4, 1024).tolist() and len(lengths) == 4 and lengths[-1] == 1024
    assert sum(stats["rows_by_length"]) == len(ds) and stats["row_length_padding"] == padding(tokens, lengths)
    dense = PackedCollator(attention="sdpa", row_lengths=lengths)
    flat = PackedCollator(attention="varlen", row_lengths=lengths)
    for i in range(0, len(ds), 7):
        rows = [ds[i], ds[(i + 1) % len(ds)]]
        b = dense(rows)
        assert b["input_ids"].shape[-1] == min(x for x in lengths if x >= max(r["n_tokens"] for r in rows))
        v = flat(rows)
        assert v["input_ids"].shape[-1] in [2 * x for x in lengths]
        assert isinstance(v["max_seqlen"], int) and v["max_seqlen"] in lengths
        assert int(v["cu_seqlens"].diff().max()) <= v["max_seqlen"] and int(v["cu_seqlens"][-1]) == v["input_ids"].shape[-1]
    with pytest.raises(ValueError, match="without pad_to"):
        PackedCollator(row_lengths=lengths, pad_to=1024)


@pytest.mark.slow
def test_a_compiled_model_compiles_once_per_row_length(bucketed_text):
    """50 steps of one row, torch.compile(dynamic=False), graphs counted by dynamo (the eager backend:
    what is counted is dynamo's recompiles, not code generation). Stated bound: at most one graph per
    row length (auto:4 chose them) over the 50 steps. Without them every new row length compiles again: 16 graphs in
    50 steps (bench/bench_compile.py); here that arm stops once it passes twice the bound."""
    from torch._dynamo.testing import CompileCounter
    from transformers import LlamaConfig, LlamaForCausalLM

    ds = PackedDataset(bucketed_text)
    cfg = LlamaConfig(vocab_size=ds.manifest.tokenizer["vocab_size"], hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024)
    cfg._attn_implementation = "sdpa"
    limit = torch._dynamo.config.recompile_limit
    torch._dynamo.config.recompile_limit = 1000  # count every recompile (the default falls back to eager after 8)
    counted = {}
    try:
        for name, collate in (("longest", PackedCollator(attention="sdpa")),
                              ("lengths", PackedCollator(attention="sdpa", row_lengths=ds.row_lengths))):
            torch._dynamo.reset()
            counter = CompileCounter()
            model = torch.compile(LlamaForCausalLM(cfg), backend=counter, dynamic=False)
            sampler = TokenBalancedSampler(ds, num_replicas=1, rank=0, batch_size=1, seed=0)
            shapes, step, epoch = set(), 0, 0
            while step < 50:
                sampler.set_epoch(epoch)
                for i in sampler:
                    batch = collate([ds[i]])
                    shapes.add(batch["input_ids"].shape[-1])
                    packed_loss(model(**model_inputs(batch, model)).logits, batch).backward()
                    step += 1
                    if step == 50 or (name == "longest" and counter.frame_count > 2 * len(ds.row_lengths)):
                        step = 50
                        break
                epoch += 1
            counted[name] = (counter.frame_count, len(shapes))
    finally:
        torch._dynamo.config.recompile_limit = limit
        torch._dynamo.reset()
    graphs, shapes = counted["lengths"]
    assert graphs <= len(ds.row_lengths) and shapes <= len(ds.row_lengths)
    unbucketed, distinct = counted["longest"]
    assert unbucketed == distinct > 2 * len(ds.row_lengths)  # every new row length compiled again
