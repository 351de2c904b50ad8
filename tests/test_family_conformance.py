"""The conformance suite (``tests/family_harness.py``) of every registered family without a test module of its own:
registering a family whose assets are declared (``tests/assets_<module>.py``, inherited by a subclass) is enough for
its ids, collation, packed == alone and sequence-parallel checks to run. The families with a module of their own run
it there, beside their own tests, on the same build."""

from __future__ import annotations

import pytest

pytest.importorskip("av")
pytest.importorskip("torchvision")

from family_harness import unowned_conformance  # noqa: E402

globals().update(unowned_conformance())
