"""Refuse a mask form the model's attention implementation would silently ignore.

Each attention implementation isolates packed segments only with its own mask form
(``docs/loader.md``): a flattened batch (``varlen``, ``position_ids``) only under a
flash-attention kernel, which reads ``cu_seq_lens_q/k``; under SDPA or eager every token then
attends to all the rows and segments before it and nothing fails (measured: the loss moves in
the third decimal). A bool mask under eager, which *adds* its mask to the scores, leaks the
same way. These pairs raise, naming the fix; the others (``sdpa``, ``eager``'s additive mask
under SDPA, ``flex``) are exact.

The model facts these rules read live here too -- its attention implementation and its rope
(:func:`model_rope`) -- so the batch checks (:mod:`packer.loader.model_fit`) and the collator a
build implies (:mod:`packer.loader.derive`) both read them from below.
"""

from __future__ import annotations

from typing import Any

import torch


def implementation(model) -> str | None:
    """The attention implementation of ``model``'s language model (an HF model or config), or None."""
    config = getattr(model, "config", model)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(text, "_attn_implementation", None) or getattr(config, "_attn_implementation", None)


def model_rope(model) -> str:
    """``mrope`` where the model's text config has an ``mrope_section`` (Qwen2-VL-style 3-D positions)."""
    config = getattr(model, "config", model)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for key in ("rope_parameters", "rope_scaling"):
        value = getattr(text, key, None)
        if isinstance(value, dict) and value.get("mrope_section"):
            return "mrope"
    return "default"


# packer's sequence-parallel attentions (packer.loader.sp_attention) and the collator forms each takes, first the default
SP_FORMS = {"packer_ulysses": ("sdpa", "eager", "flex", "varlen"), "packer_ring": ("varlen",),
            "packer_hybrid": ("varlen",)}


def default_attention(model) -> str:
    """The collator's mask form for the model's attention implementation."""
    impl = implementation(model) or "sdpa"
    if impl in SP_FORMS:
        return SP_FORMS[impl][0]
    return "varlen" if "flash" in impl else "flex" if "flex" in impl else "eager" if impl == "eager" else "sdpa"


def attention_form(batch: dict[str, Any]) -> str:
    """The mask form a collated batch carries: ``flex``, ``sdpa`` (bool), ``eager`` (additive) or
    ``varlen`` (flattened, no mask: ``varlen`` and ``position_ids`` alike)."""
    mask = batch.get("attention_mask")
    if isinstance(mask, dict):  # a mask per layer type (Gemma, Llama 4, Qwen3.5): the form of its masks
        mask = next((m for m in mask.values() if m is not None), None)
    if mask is None:
        return "varlen"
    if not isinstance(mask, torch.Tensor):
        return "flex"
    return "sdpa" if mask.dtype == torch.bool else "eager"


def check_attention(model, attention: str) -> None:
    """Raise when ``attention`` (a :class:`~packer.loader.PackedCollator` form) does not isolate
    segments under ``model``'s attention implementation; an unknown implementation passes."""
    impl = implementation(model)
    if impl is None:
        return
    if impl in SP_FORMS:
        if attention not in SP_FORMS[impl]:
            raise ValueError(f"{type(model).__name__} runs packer's sequence-parallel attention {impl!r}, which takes a "
                             f"batch of PackedCollator(attention={' or '.join(map(repr, SP_FORMS[impl]))}), got "
                             f"attention={attention!r}: build the collator with attention={SP_FORMS[impl][0]!r} "
                             f"(sp.collator_attention)")
        return
    flash = "flash" in impl
    fix = None
    if attention in ("varlen", "position_ids") and not flash:
        fix = (f"attention={attention!r} flattens the rows into one sequence whose segments only a flash-attention kernel "
               f"keeps apart; under {impl!r} every token would attend to all the rows and segments before it. Use "
               f"PackedCollator(attention={'eager' if impl == 'eager' else 'flex' if 'flex' in impl else 'sdpa'!r}), or load "
               f"the model with attn_implementation='flash_attention_2'")
    elif attention == "sdpa" and impl == "eager":
        fix = ("attention='sdpa' gives a bool mask, and the eager implementation adds its mask to the scores: segments "
               "would see each other. Use PackedCollator(attention='eager') (an additive mask)")
    elif attention == "flex" and "flex" not in impl:
        fix = (f"attention='flex' gives a FlexAttention BlockMask, which {impl!r} cannot read. Use PackedCollator("
               f"attention='sdpa'), or load the model with attn_implementation='flex_attention'")
    elif attention in ("sdpa", "eager", "flex") and flash:
        fix = (f"{impl!r} ignores a 4-D mask: packed segments would see each other. Use PackedCollator(attention='varlen'), "
               f"which hands it cu_seq_lens_q/k")
    if fix:
        raise ValueError(f"{type(model).__name__} runs attention {impl!r}, which does not isolate packed segments given "
                         f"attention={attention!r}: {fix}")
