"""Does a model keep packed segments apart in every layer? Checked once, before training.

Attention layers are isolated by the masks the collator builds. Layers with state along the sequence --
the gated delta nets of Qwen3.5 / Qwen3-Next, Mamba mixers -- see segment boundaries only through
``cu_seq_lens_q`` (and ``seq_idx``), which transformers passes to the flash-linear-attention / causal-conv1d
kernels when they are installed; its torch fallback ignores them, and a segment then reads the state of the
segment before it. :func:`check_packed_isolation` runs each such layer class of ``model`` once on two
segments packed into one row (with the boundaries) and on each alone, and raises
:class:`PackingUnsupportedError` naming the layer, the difference and the fix when they differ.
"""

from __future__ import annotations

from typing import Any

import torch

STATEFUL = ("GatedDeltaNet", "MambaMixer")  # class-name markers of layers with state along the sequence


class PackingUnsupportedError(RuntimeError):
    """The model cannot keep packed segments apart with the kernels installed here."""


def stateful_layers(model: Any) -> dict[str, torch.nn.Module]:
    """One module of each class with state along the sequence, by class name."""
    found: dict[str, torch.nn.Module] = {}
    for module in model.modules():
        name = type(module).__name__
        if any(marker in name for marker in STATEFUL) and name not in found and hasattr(module, "forward"):
            found[name] = module
    return found


@torch.no_grad()
def check_packed_isolation(model: Any, *, lengths: tuple[int, int] = (7, 9), tolerance: float = 1e-5) -> list[str]:
    """Raise :class:`PackingUnsupportedError` unless every stateful layer of ``model`` gives two packed segments
    (``cu_seq_lens_q`` = their boundaries) what it gives each alone; returns the layer classes checked."""
    checked = []
    for name, layer in stateful_layers(model).items():
        param = next(layer.parameters())
        hidden = getattr(layer, "hidden_size", None) or model.config.get_text_config().hidden_size
        gen = torch.Generator(device="cpu").manual_seed(0)
        a = torch.randn(1, lengths[0], hidden, generator=gen).to(param)
        b = torch.randn(1, lengths[1], hidden, generator=gen).to(param)
        alone = torch.cat([layer(a), layer(b)], dim=1)
        cu = torch.tensor([0, lengths[0], sum(lengths)], dtype=torch.int32, device=param.device)
        seq_idx = torch.cat([torch.zeros(lengths[0]), torch.ones(lengths[1])]).to(torch.int32)[None].to(param.device)
        fix = ("Install the flash-linear-attention and causal-conv1d kernels (CUDA), or train this model unpacked "
               "(packer.loader.SampleDataset), or with one sample per row (packer repack OUT --max-segments 1 -o OUT1)")
        try:
            packed = layer(torch.cat([a, b], dim=1), cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max(lengths),
                           max_length_k=max(lengths), seq_idx=seq_idx)
        except (ValueError, NotImplementedError) as e:  # transformers' own refusal (its fallback knows it cannot)
            raise PackingUnsupportedError(f"{name} layers mix packed segments here: transformers refuses packed rows "
                                          f"with the kernels installed ({e}). {fix}.") from None
        diff = float((packed - alone).abs().max() / alone.abs().max().clamp(min=1e-12))
        if diff > tolerance:
            raise PackingUnsupportedError(
                f"{name} layers mix packed segments here: two segments packed into one row differ from each run "
                f"alone by {diff:.1e} (relative). The installed kernels ignore the segment boundaries "
                f"(cu_seq_lens_q / seq_idx): transformers' torch fallback for these layers runs one recurrence and one "
                f"causal convolution over the whole row. {fix}.")
        checked.append(name)
    return checked
