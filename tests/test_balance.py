"""Cost model and step balance: the cost derivation against FLOP counts of tiny HF models,
and the balance targets of ``TokenBalancedSampler`` on generated builds (costs, not timings)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from packer.cost import CostModel
from packer.loader import TokenBalancedSampler
from packer.modeling.masks import allowed, segments_and_positions
from packer.schedule.balance import balance, group_steps, imbalance, imbalance_floor

TEXT = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=300, max_position_embeddings=4096, tie_word_embeddings=False)
SEGMENTS = [37, 5, 120, 64]


def flops(fn) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter, torch.no_grad():
        fn()
    return counter.get_total_flops()


def text_stats(segments) -> dict[str, np.ndarray]:
    s = np.asarray(segments, dtype=np.float64)
    zero = np.zeros(1)
    return {"tokens": np.array([s.sum()]), "attention": np.array([(s**2).sum()]), "media_items": zero, "media_tokens": zero,
            **{f"{k}_{t}": zero for k in ("image", "audio") for t in ("items", "tokens", "square")}}


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_llm_cost_is_the_flop_count_of_each_segment_run_alone(model_type):
    """A varlen kernel runs each segment on its own: the packed row's FLOPs are the sum of
    the segments' FLOPs, which eager attention counts as the full s x s square."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(model_type, **TEXT)
    cfg._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(cfg).eval()
    counted = 0
    for s in SEGMENTS:
        counted += flops(lambda s=s: model(torch.arange(s)[None] % TEXT["vocab_size"]))
    full = CostModel.for_model(cfg, causal=False, training=False)
    assert full(text_stats(SEGMENTS))[0] == counted


def test_causal_cost_counts_the_pairs_the_block_causal_mask_allows():
    cfg = dict(TEXT, model_type="llama")
    causal, full = CostModel.for_model(cfg, training=False), CostModel.for_model(cfg, causal=False, training=False)
    segment, _ = segments_and_positions([np.concatenate([[0], np.cumsum(SEGMENTS)])], sum(SEGMENTS))
    pairs = int(allowed(segment).sum())
    assert pairs == sum(s * (s + 1) // 2 for s in SEGMENTS)
    per_pair = 4 * TEXT["hidden_size"] * TEXT["num_hidden_layers"]  # QKᵀ + AV, every layer
    stats = text_stats(SEGMENTS)
    assert causal(stats)[0] - full(stats)[0] == per_pair * (pairs - stats["attention"][0])
    train = CostModel.for_model(cfg)
    assert train(stats)[0] == 3 * causal(stats)[0]


def test_default_attention_coefficient_is_causal_work_over_dense_work():
    """MHA, MLP 4h, no gate: dense 24h² FLOPs per token and layer; causal attention 2h·s² per
    segment and layer: s² / (12 h) token-equivalents, 1 / 49152 at h = 4096."""
    h = 4096
    cfg = dict(hidden_size=h, intermediate_size=4 * h, num_hidden_layers=2, num_attention_heads=32, hidden_act="gelu",
               model_type="gpt")
    m = CostModel.for_model(cfg, training=False, lm_head=False)
    dense = 24 * h * h * 2
    assert m.attention / dense == pytest.approx(1 / (12 * h)) == pytest.approx(CostModel().attention)
    assert m.token == dense + m.attention  # the causal diagonal: s(s+1)/2 = (s² + s) / 2 pairs


def test_vision_cost_is_the_flop_count_of_a_qwen2_vl_tower():
    from transformers import Qwen2VLConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

    vision = dict(depth=2, embed_dim=32, mlp_ratio=2, num_heads=4, hidden_size=64, patch_size=14, spatial_merge_size=2,
                  temporal_patch_size=2, in_channels=3)
    cfg = Qwen2VLConfig(text_config=dict(TEXT, vocab_size=300), vision_config=vision)
    cfg.vision_config._attn_implementation = "eager"
    tower = Qwen2VisionTransformerPretrainedModel._from_config(cfg.vision_config).eval()
    grids = torch.tensor([[1, 4, 6], [1, 8, 8], [1, 2, 2]])  # patches; placeholder tokens = patches / 4
    patches = int(grids.prod(1).sum())
    pixels = torch.randn(patches, 3 * 2 * 14 * 14)
    counted = flops(lambda: tower(pixels, grid_thw=grids))
    tokens = (grids.prod(1) // 4).double().numpy()
    stats = text_stats([1]) | {"tokens": np.zeros(1), "attention": np.zeros(1), "image_items": np.array([3.0]),
                               "image_tokens": np.array([tokens.sum()]), "image_square": np.array([(tokens**2).sum()])}
    assert CostModel.for_model(cfg, training=False)(stats)[0] == counted


def generated_stats(rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Row stats of a generated 4,096-token build, packed with :func:`packer.pack.plan`:
    SFT-like chat (lognormal), image turns (Qwen2-VL-like 144..1196 image tokens + text)
    and long documents split into full rows."""
    from packer.pack import plan

    rng = np.random.default_rng(seed)
    n = rows * 9
    kind = rng.choice(3, n, p=[0.55, 0.4, 0.05])  # chat, image, long document
    image = np.where(kind == 1, rng.choice([144, 256, 576, 1196], n), 0)
    text = np.where(kind == 2, rng.integers(2000, 12000, n), np.clip(rng.lognormal(5.3, 1.0, n), 16, 3000).astype(np.int64))
    p = plan(text + image, 4096, oversize="split", seed=seed)
    row = np.repeat(np.arange(p.n_bins), np.diff(p.offsets))
    per_row = lambda w: np.bincount(row, np.asarray(w, dtype=np.float64), minlength=p.n_bins)[:rows]  # noqa: E731
    with_image = (image[p.indices] > 0) & (p.starts == 0)  # the image sits in a sample's first piece
    t = np.where(with_image, image[p.indices], 0).astype(np.float64)
    zero = np.zeros(min(rows, p.n_bins))
    assert p.n_bins >= rows
    return {"tokens": per_row(p.lengths), "attention": per_row(p.lengths.astype(np.float64) ** 2),
            "media_items": per_row(with_image), "media_tokens": per_row(t), "image_items": per_row(with_image),
            "image_tokens": per_row(t), "image_square": per_row(t**2), "audio_items": zero, "audio_tokens": zero,
            "audio_square": zero}


class Rows:
    def __init__(self, stats):
        self.stats = stats

    def __len__(self):
        return len(self.stats["tokens"])

    def row_stats(self):
        return self.stats


def random_steps(n: int, ranks: int, per_rank: int, seed: int) -> np.ndarray:
    steps = n // (ranks * per_rank)
    return np.random.default_rng(seed).permutation(n)[: steps * ranks * per_rank].reshape(steps, ranks, per_rank)


QWEN2_VL_7B = {
    "text_config": {"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
                    "num_key_value_heads": 4, "vocab_size": 152064, "hidden_act": "silu"},
    "vision_config": {"depth": 32, "embed_dim": 1280, "mlp_ratio": 4, "num_heads": 16, "hidden_size": 3584, "in_channels": 3,
                      "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2},
}


@pytest.mark.parametrize(("rows", "ranks"), [(265, 8), (2650, 64)])
def test_batch_one_balance_targets(rows, ranks):
    """One row per rank per step. Random order leaves ranks waiting (attention work alone:
    max / mean ~1.95); the default window groups rows of like cost. Under a full cost model
    the target (1.02) holds; attention work alone comes to ~1.05 per step on average (the
    steps that straddle gaps in the cost distribution, and the cheapest step, cannot be
    evened with one row each), 1.03 or less weighted by step time. 64 ranks need steps to
    choose from: 2,650 rows (41 steps); at 265 rows there are 4."""
    stats = generated_stats(rows)
    for cost, target, weighted in ((CostModel(token=0, attention=1), 1.06, 1.03), (CostModel(), 1.02, 1.02),
                                   (CostModel.for_model(QWEN2_VL_7B), 1.02, 1.02)):
        costs = cost(stats)
        sampler = TokenBalancedSampler(Rows(stats), num_replicas=ranks, rank=0, batch_size=1, seed=0, drop_last=True,
                                       cost=cost)
        plan = sampler.assignment()
        random = random_steps(rows, ranks, 1, 0)
        assert imbalance(costs, plan) <= target < imbalance(costs, random)
        assert imbalance(costs, plan, weighted=True) <= weighted < imbalance(costs, random, weighted=True)
        assert len(set(plan.ravel().tolist())) == plan.size == rows // ranks * ranks  # every row at most once


@pytest.mark.parametrize("ranks", [8, 64])
def test_batch_four_balance(ranks):
    stats = generated_stats(2650)
    costs = CostModel(token=0, attention=1)(stats)
    plan = TokenBalancedSampler(Rows(stats), num_replicas=ranks, rank=0, batch_size=4, drop_last=True,
                                cost=CostModel(token=0, attention=1)).assignment()
    assert imbalance(costs, plan) <= 1.02 < imbalance(costs, random_steps(2650, ranks, 4, 0))


def test_group_steps_window_one_is_balance_within_random_steps():
    rng = np.random.default_rng(1)
    costs = rng.random(48)
    order = rng.permutation(48)
    plan = group_steps(order, costs, 4, 3, window=1, rng=rng)
    assert (plan == np.stack([balance(s, costs[s], 4, 3) for s in order.reshape(-1, 12)])).all()
    with pytest.raises(ValueError, match="not whole steps"):
        group_steps(order[:-1], costs, 4, 3, window=2)


def test_group_steps_worked_example():
    costs = np.array([9.0, 1.0, 8.0, 2.0])
    assert imbalance(costs, group_steps(np.arange(4), costs, 2, 1, window=1)) == pytest.approx((1.8 + 1.6) / 2)
    plan = group_steps(np.arange(4), costs, 2, 1, window=2)
    assert [sorted(costs[s.ravel()].tolist()) for s in plan] == [[8.0, 9.0], [1.0, 2.0]]
    assert imbalance(costs, plan, weighted=True) == pytest.approx((9 + 2) / (8.5 + 1.5))


def groups(rows: tuple[int, ...], size: int):
    """Every split of ``rows`` into unordered groups of ``size``."""
    if not rows:
        yield []
        return
    first, rest = rows[0], rows[1:]
    for mates in itertools.combinations(rest, size - 1):
        left = tuple(r for r in rest if r not in mates)
        for tail in groups(left, size):
            yield [(first, *mates), *tail]


def assignments(n: int, ranks: int, per_rank: int):
    """Every ``[steps, ranks, per_rank]`` assignment of rows 0..n-1 (up to the order of steps,
    of ranks in a step and of rows on a rank, which no imbalance figure sees)."""
    for steps in groups(tuple(range(n)), ranks * per_rank):
        for split in itertools.product(*(list(groups(step, per_rank)) for step in steps)):
            yield np.array(split)


def small_costs(n: int, seed: int) -> np.ndarray:
    """Continuous costs for even seeds, few distinct integers (ties) for odd ones."""
    rng = np.random.default_rng(seed)
    return rng.lognormal(0, 1.5, n) if seed % 2 == 0 else rng.integers(1, 5, n).astype(np.float64)


@pytest.mark.parametrize(("n", "ranks"), [(6, 2), (6, 3), (8, 2), (8, 4)])
def test_imbalance_floor_is_the_optimum_at_one_row_per_rank(n, ranks):
    """Against every partition of the rows into steps; the sampler's sort-and-cut over a
    whole-epoch window attains it."""
    for seed in range(30):
        costs = small_costs(n, seed)
        best = min(imbalance(costs, a, weighted=True) for a in assignments(n, ranks, 1))
        assert imbalance_floor(costs, ranks) == pytest.approx(best, rel=1e-12)
        rng = np.random.default_rng(seed)
        plan = group_steps(rng.permutation(n), costs, ranks, 1, window=n // ranks, rng=rng)
        assert imbalance(costs, plan, weighted=True) == pytest.approx(best, rel=1e-12)


@pytest.mark.parametrize(("n", "ranks", "per_rank"), [(8, 2, 2), (8, 4, 2)])
def test_imbalance_floor_bounds_every_assignment_above_one_row_per_rank(n, ranks, per_rank):
    for seed in range(30):
        costs = small_costs(n, seed)
        best = min(imbalance(costs, a, weighted=True) for a in assignments(n, ranks, per_rank))
        assert 1.0 <= imbalance_floor(costs, ranks, per_rank) <= best * (1 + 1e-12)


def test_imbalance_floor_of_the_worked_example_and_its_errors():
    costs = np.array([9.0, 1.0, 8.0, 2.0])  # steps (9, 8) (2, 1): what the window-2 plan above reaches
    assert imbalance_floor(costs, 2) == pytest.approx((9 + 2) / (8.5 + 1.5))
    assert imbalance_floor(costs, 1, 4) == 1.0  # one rank: nothing to wait for
    with pytest.raises(ValueError, match="3 rows are not whole steps of 2 x 1"):
        imbalance_floor(costs[:3], 2)


@pytest.mark.parametrize("ranks", [8, 64])
def test_sampler_with_a_whole_epoch_window_is_at_the_floor_at_one_row_per_rank(ranks):
    """On a generated build (attention work alone: many rows tie at a full segment's cost)."""
    cost = CostModel(token=0, attention=1)
    stats = generated_stats(265)
    plan = TokenBalancedSampler(Rows(stats), num_replicas=ranks, rank=0, drop_last=True, cost=cost,
                                window=10**6).assignment()
    costs = cost(stats)
    floor = imbalance_floor(costs[plan.ravel()], ranks)
    assert imbalance(costs, plan, weighted=True) == pytest.approx(floor, rel=1e-12)
    assert floor < imbalance(costs, random_steps(265, ranks, 1, 0), weighted=True)


def test_vision_cost_is_the_flop_count_of_a_qwen3_vl_tower():
    """Qwen3-VL: plain MLP, a merger per DeepStack level besides the main one."""
    from transformers import Qwen3VLConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=4, patch_size=16, spatial_merge_size=2,
                  temporal_patch_size=2, out_hidden_size=64, num_position_embeddings=64, deepstack_visual_indexes=[0, 1])
    cfg = Qwen3VLConfig(text_config=dict(TEXT, vocab_size=300, head_dim=16), vision_config=vision)
    cfg.vision_config._attn_implementation = "eager"
    tower = Qwen3VLVisionModel._from_config(cfg.vision_config).eval()
    grids = torch.tensor([[1, 4, 6], [1, 8, 8], [1, 2, 2]])
    pixels = torch.randn(int(grids.prod(1).sum()), 3 * 2 * 16 * 16)
    counted = flops(lambda: tower(pixels, grid_thw=grids))
    tokens = (grids.prod(1) // 4).double().numpy()
    stats = text_stats([1]) | {"tokens": np.zeros(1), "attention": np.zeros(1), "image_items": np.array([3.0]),
                               "image_tokens": np.array([tokens.sum()]), "image_square": np.array([(tokens**2).sum()])}
    assert CostModel.for_model(cfg, training=False)(stats)[0] == counted


def test_hybrid_models_pay_pairs_only_in_their_attention_layers():
    """Qwen3.5: a gated delta net per token, no pairs; the attention coefficient counts the attention layers."""
    text = dict(TEXT, model_type="qwen3_5_text", head_dim=16, layer_types=["linear_attention", "full_attention"],
                linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4)
    hybrid = CostModel.for_model(text, training=False)
    full = CostModel.for_model(dict(text, layer_types=["full_attention"] * 2), training=False)
    assert hybrid.attention == full.attention / 2 == 4 * 4 * 16 / 2


@pytest.mark.parametrize("family", ["internvl", "llama4"])
def test_vision_cost_is_the_flop_count_of_a_tiled_tower(family):
    """InternVL / Llama 4: the tower and its projector run on fixed tiles; every placeholder token costs a tile's FLOPs
    over its tokens (tested on 3 tiles, as FlopCounterMode counts the tower, the pixel shuffle and the projector)."""
    if family == "internvl":
        from transformers import InternVLConfig, InternVLModel

        cfg = InternVLConfig(text_config=dict(TEXT, model_type="qwen2"),
                             vision_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                intermediate_size=64, image_size=56, patch_size=14))
        cfg.vision_config._attn_implementation = "eager"
        model = InternVLModel(cfg).eval()
        run = lambda pixels: model.get_image_features(pixels, vision_feature_layer=-1,  # noqa: E731
                                                      vision_feature_select_strategy="default")
    else:
        from transformers import Llama4Config, Llama4ForConditionalGeneration

        cfg = Llama4Config(text_config=dict(TEXT, num_local_experts=2, interleave_moe_layer_step=1),
                           vision_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                                              image_size=56, patch_size=14, pixel_shuffle_ratio=0.5, vision_output_dim=64,
                                              projector_input_dim=64, projector_output_dim=64,
                                              rope_parameters={"rope_type": "default", "rope_theta": 10000.0}))
        cfg.vision_config._attn_implementation = "eager"
        model = Llama4ForConditionalGeneration(cfg).eval()
        run = lambda pixels: model.multi_modal_projector(model.vision_model(pixels).last_hidden_state)  # noqa: E731
    counted = flops(lambda: run(torch.randn(3, 3, 56, 56)))
    tokens = 3 * 4  # 16 patches a tile, pixel-shuffled by 0.5
    stats = text_stats([1]) | {"tokens": np.zeros(1), "attention": np.zeros(1), "image_items": np.array([2.0]),
                               "image_tokens": np.array([float(tokens)]), "image_square": np.array([80.0])}
    assert CostModel.for_model(cfg, training=False)(stats)[0] == pytest.approx(counted, rel=1e-12)
