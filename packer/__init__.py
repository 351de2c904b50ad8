"""packer: offline packing of multimodal LLM training data into Arrow shards.

``import packer`` is deliberately cheap: it imports nothing heavy. Where things live:

- ``packer.build`` runs a build (stages in ``packer.stages``, run on an engine from
  ``packer.engine``); ``packer.pack`` is the pure planner; ``packer.media`` counts and
  loads images and audio; ``packer.encode`` / ``packer.ingest`` read and tokenize records.
- ``packer.shards`` is the on-disk format (schemas, shard reader / writer, the typed
  ``Manifest``, row statistics): what the loader, ``packer.report``, ``packer.summary``
  and ``packer.verify`` read.
- ``packer.loader`` (imports torch) turns a build into batches for a trainer.
"""

__version__ = "0.1.0"
