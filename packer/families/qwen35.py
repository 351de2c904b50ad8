"""Qwen3.5 (and its MoE): Qwen3-VL's processor (``Qwen3VLProcessor``: the same images, videos, timestamps and
budgets), a hybrid language model whose gated-delta-net (linear attention) layers carry a recurrent state
and a causal convolution along the sequence.

Packed rows are exact for the full-attention layers through the 4-D mask; the linear-attention layers see
segment boundaries only through ``cu_seq_lens_q`` (transformers hands them to the ``chunk_gated_delta_rule``
kernel of flash-linear-attention) -- the torch fallback ignores them, and its causal ``conv1d`` runs across
the whole row. So the collator gives the model its per-layer-type mask mapping
(``{"full_attention": mask, "linear_attention": None}``) and flattened boundaries, and
:func:`packer.loader.isolation.check_packed_isolation` runs each linear-attention layer on two packed
segments against each alone before training: where the installed kernels do not isolate them (every CPU,
or CUDA without the kernels) it refuses packing with the reason instead of letting segments leak into each
other (ms-swift #9565, transformers #44867: packed vs padded differ by 8e-3).
"""

from __future__ import annotations

from packer.families.qwen3vl import Qwen3VL


class Qwen35(Qwen3VL):
    name = "qwen35"
    processor_class = "Qwen3VLProcessor"
    model_types = ("qwen3_5", "qwen3_5_moe")
    towers = {t: Qwen3VL.towers["qwen3_vl"] for t in model_types}
    linear_attention = True  # the collator adds cu_seq_lens and a per-layer-type mask mapping
