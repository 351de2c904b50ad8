"""What a model call needs that the families and the loader both compute, below both of them.

``spans``: a media span's file, probe, planned frames and count check (:class:`MediaMismatchError`);
``masks``: per-token segments, positions and the masks derived from them; ``mrope``: Qwen-style 3-D
positions; ``towers``: the dummy media a family's towers run on. Imports run one way:
``modeling`` <- ``families`` <- ``loader``; nothing here imports either (tested:
tests/test_family_interface.py).
"""
