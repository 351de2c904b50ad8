"""What a worker builds its :class:`~packer.encode.encoder.Encoder` from: a small picklable spec.

The driver resolves the family and the cost model and (for workers elsewhere) reads the tokenizer's files into it,
so the local and the Ray engine construct their encoders the same way, from the same values.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from packer.encode.shipped import Shipped, ship
from packer.families import make_family


@dataclass(frozen=True)
class EncoderSpec:
    """What a worker needs to build its :class:`Encoder`: the build config, the folder stored media refs
    are relative to, and the family as the driver resolved it (None: resolved from the config here)."""

    config: Any  # packer.config.BuildConfig
    media_base: str = ""
    family: dict[str, Any] | None = None  # its Family.record(): what the manifest records
    shipped: Shipped | None = None  # the tokenizer's files (and a template file), read on the driver
    # packer.cost.resolve_cost_model's record, resolved once on the driver (from_config, of) and shipped to every
    # worker, which never resolves it itself; None: an Encoder alone, which needs none (stage 1 refuses it)
    cost_model: dict[str, Any] | None = None

    @classmethod
    def from_config(cls, config: Any, media_base: str = "", *, ship_files: bool = False) -> EncoderSpec:
        """``ship_files``: carry the tokenizer folder and a ``.jinja`` template file in the spec (workers on
        other machines, or in another folder, load them from there: :mod:`packer.encode.shipped`). The cost model
        is resolved here, on the driver: workers get its coefficients, never its files."""
        spec = cls(config, media_base, make_family(config).record(), cost_model=_cost_model(config))
        return dataclasses.replace(spec, shipped=ship(spec.tokenizer, config.chat_template)) if ship_files else spec

    @classmethod
    def of(cls, media_base: str = "", **settings: Any) -> EncoderSpec:
        """A spec from config keys (tests, notebooks): ``EncoderSpec.of(tokenizer=PATH, train_on="all")``; its cost
        model resolved here, as :meth:`from_config` does (the family is left to the :class:`Encoder`)."""
        from packer.config import BuildConfig

        config = BuildConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in settings.items()})
        return cls(config, media_base, cost_model=_cost_model(config))

    @property
    def tokenizer(self) -> str:
        return self.config.tokenizer or self.config.processor

    @property
    def tags(self) -> dict[str, str]:
        """Media markers in the input text (LLaVA's ``<image>``)."""
        c = self.config
        return {"image": c.image_tag, "audio": c.audio_tag, "video": c.video_tag}


def _cost_model(config: Any) -> dict[str, Any]:
    """The build's ``cost_model`` setting resolved (:func:`packer.cost.resolve_cost_model`), against its processor then
    its tokenizer: on the driver only, when the spec is made."""
    from packer.cost import resolve_cost_model

    return resolve_cost_model(config.cost_model, (config.processor, config.tokenizer))
