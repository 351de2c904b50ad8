"""Stage 1b: turn a parsed record into a :class:`~packer.shards.schema.Sample` (ids, labels, media)."""

from packer.encode.encoder import Encoder, EncoderSpec

__all__ = ["Encoder", "EncoderSpec"]
