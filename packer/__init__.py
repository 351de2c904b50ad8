"""packer: offline packing of multimodal LLM training data into Arrow shards.

``import packer`` is deliberately cheap: it imports nothing heavy. The stages live in
``packer.build`` (the pipeline), ``packer.pack`` (the planner) and ``packer.inspect``.
"""

__version__ = "0.1.0"
