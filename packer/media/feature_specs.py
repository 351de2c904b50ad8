"""The specs of the optional media passes, as the config states them: checked when the config is made.

``audio_features = "whisper[:feature_size=N]"`` is a :class:`FeatureSpec` and ``image_embeddings =
"MODEL[:PRETRAINED]"`` (with ``embed_output``, ``embed_device``, ...) an :class:`EmbedSpec`. They sit on media's
floor, below the config that checks them, so a malformed one fails when the config is made, without media or model
code;
:mod:`packer.media.features` and :mod:`packer.media.embed` run them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from packer.errors import ConfigError
from packer.specs import parse_spec


@dataclass(frozen=True)
class FeatureSpec:
    kind: str = "whisper"
    feature_size: int = 128

    @classmethod
    def parse(cls, spec: str) -> FeatureSpec:
        """``whisper[:feature_size=N]``; anything else is a :class:`ConfigError` that names the fix."""
        if spec.partition(":")[0].strip() == "log-mel":
            raise ConfigError(f"--audio-features {spec!r}: log-mel was removed (an HTK mel without Whisper's Slaney norm "
                              f"or 30 s padding, which no model takes); use whisper:feature_size=128 (Qwen2-Audio, "
                              f"Whisper large-v3) or whisper:feature_size=80 (other Whisper models)")
        kind, kwargs = parse_spec(spec, {"whisper": cls}, what="audio features", exclude=("kind",))
        if kwargs.get("feature_size", 1) < 1:
            raise ConfigError(f"{kind}.feature_size = {kwargs['feature_size']} must be at least 1: 128 for Qwen2-Audio and "
                              f"Whisper large-v3, 80 for the other Whisper models")
        return cls(kind, **kwargs)


@dataclass(frozen=True)
class EmbedSpec:
    model: str
    pretrained: str | None  # None: random weights
    output: str = "pooled"
    device: str = "auto"
    batch_size: int = 32
    layer: int = -2  # hidden-state index for output="tokens" (see the module docstring)

    @classmethod
    def parse(cls, spec: str, *, output: str, device: str, batch_size: int, layer: int = -2) -> EmbedSpec:
        """``MODEL[:PRETRAINED]`` (no ``key=value`` parameters: PRETRAINED is a checkpoint file, a tag, or random)."""
        model, _, pretrained = (s.strip() for s in spec.strip().partition(":"))
        if not model:
            raise ConfigError(f"image embeddings {spec!r}: no MODEL; write MODEL[:PRETRAINED], e.g. ViT-L-14-336:openai "
                              f"(PRETRAINED: a checkpoint file, an open_clip tag, or random)")
        if "=" in pretrained and not Path(pretrained).is_file():
            value = pretrained.partition("=")[2]
            raise ConfigError(f"image embeddings {model}: {pretrained!r} is neither a checkpoint file nor a tag, and "
                              f"MODEL takes no key=value parameters; write {model}:PRETRAINED, e.g. {model}:{value or 'openai'}")
        if output not in ("pooled", "tokens"):
            raise ConfigError(f"embed_output = {output!r} is not one of pooled, tokens")
        return cls(model, None if pretrained in ("", "random", "none") else pretrained, output, device, batch_size, layer)

    @classmethod
    def from_config(cls, config) -> EmbedSpec:
        """The spec a :class:`~packer.config.BuildConfig` asks for."""
        return cls.parse(config.image_embeddings, output=config.embed_output, device=config.embed_device,
                         batch_size=config.embed_batch_size, layer=config.embed_layer)
