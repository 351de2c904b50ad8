"""How many placeholder positions a media item occupies.

Foundation behaviour: every image or audio clip is one placeholder position and has no
grid. The token-count policies of the vision / audio encoders (``fixed``, ``dynamic``,
``anyres``, ``whisper``, ...) replace :func:`placeholder_count` without touching the
encoder, which only asks for a count and a grid per item.
"""

from __future__ import annotations

from packer.ingest.records import Part


def placeholder_count(part: Part) -> tuple[int, tuple[int, ...]]:
    """(positions, grid) for one media part."""
    return 1, ()
