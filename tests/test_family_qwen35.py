"""Qwen3.5: Qwen3-VL's processor (ids token for token), a hybrid language model.

Its attention layers and vision tower are exact under packing (packed == alone, like Qwen3-VL). Its
gated-delta-net layers keep segments apart only through kernels this machine does not have: the torch
fallback runs one recurrence and one causal convolution over the whole row. The isolation check proves
that here and refuses packing for such a model with the reason; the collator gives the model what the
kernels need (per-layer-type masks, flattened boundaries) so that the check passes where they are installed.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("av")
pytest.importorskip("torchvision")

from family_harness import conformance  # noqa: E402

from packer.loader import PackedCollator, PackedDataset  # noqa: E402
from packer.loader.isolation import PackingUnsupportedError, check_packed_isolation  # noqa: E402

FAMILY = "qwen35"
TestConformance = conformance(FAMILY)  # one row a batch (a hybrid family's boundaries); SP of linear attention refused


def test_the_manifest_declares_linear_attention(built):
    assert built.manifest["tokenizer"]["family"]["linear_attention"] is True


def test_the_collator_gives_hybrid_layers_their_masks_and_boundaries(built):
    ds = PackedDataset(built.out)
    row = ds[0]
    batch = PackedCollator(attention="sdpa", family=ds.family, pad_to_multiple_of=64)([row])
    mask = batch["attention_mask"]
    assert set(mask) == {"full_attention", "linear_attention"} and mask["linear_attention"] is None
    assert mask["full_attention"].shape[-1] == batch["input_ids"].shape[-1]
    cu = batch["cu_seq_lens_q"].tolist()
    assert cu[: len(row["cu_seqlens"])] == np.asarray(row["cu_seqlens"]).tolist() and cu[-1] == batch["input_ids"].shape[-1]
    with pytest.raises(ValueError, match="batch_size=1"):
        PackedCollator(attention="sdpa", family=ds.family)([row, ds[1]])


def test_gated_delta_net_layers_are_refused_where_the_kernels_do_not_isolate(built):
    model = built.model("sdpa", layer_types=("linear_attention", "full_attention"))
    with pytest.raises(PackingUnsupportedError, match="Qwen3_5GatedDeltaNet layers mix packed segments.*unpacked"):
        check_packed_isolation(model)


def test_the_isolation_check_passes_layers_that_isolate():
    class FakeGatedDeltaNet(torch.nn.Module):  # per token: nothing crosses a boundary
        hidden_size = 8

        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(8, 8)

        def forward(self, hidden_states, **kwargs):
            return self.proj(hidden_states)

    model = torch.nn.Sequential(FakeGatedDeltaNet())
    assert check_packed_isolation(model) == ["FakeGatedDeltaNet"]


