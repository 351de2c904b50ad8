"""Media written into the record itself: RFC 2397 ``data:`` URLs (OpenAI's ``image_url`` parts carry images so).

``data:[<mediatype>][;base64],<data>``: the bytes are decoded and held as a blob (:mod:`packer.io.blobs`), so the
probes and decoders read them as they read a file. Only base64 is media (percent-encoded text is not an image);
the decoded size is held to :data:`MAX_INLINE_BYTES` before it is decoded.
"""

from __future__ import annotations

import base64
import binascii

from packer.errors import BadRecord
from packer.io import blobs

MAX_INLINE_BYTES = 256 * 2**20  # the largest medium one data: URL may decode to


def data_url(ref: str, kind: str, max_bytes: int | None = None) -> str:
    """The blob name of a ``data:`` URL's decoded bytes (held in :data:`packer.io.blobs.STORE`); a URL that is not
    base64, or not valid base64, or decodes to nothing or to more than ``max_bytes``, is a bad record."""
    shown = ref if len(ref) <= 48 else ref[:48] + "..."
    max_bytes = MAX_INLINE_BYTES if max_bytes is None else max_bytes  # read at call time: a patched limit holds
    header, comma, payload = ref.partition(",")
    if not comma:
        raise BadRecord("bad_data_url", f"{kind} {shown!r} is a data: URL without the ',' that starts its data")
    if not header.lower().endswith(";base64"):
        raise BadRecord("bad_data_url", f"{kind} {shown!r} is a data: URL that is not base64 (its header is "
                                        f"{header[:60]!r}); media must be written data:<type>;base64,<data>")
    payload = payload.strip()
    if len(payload) // 4 * 3 > max_bytes:
        raise BadRecord("media_too_large", f"{kind} data: URL decodes to about {len(payload) // 4 * 3:,} bytes, over "
                                           f"the {max_bytes:,}-byte limit of one inline medium")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as e:
        try:  # URL-safe alphabet (- and _), as some writers use
            data = base64.b64decode(payload, altchars=b"-_", validate=True)
        except (binascii.Error, ValueError):
            raise BadRecord("bad_data_url", f"{kind} {shown!r}: its base64 data does not decode ({e})") from None
    if not data:
        raise BadRecord("bad_data_url", f"{kind} {shown!r} holds no data")
    return blobs.STORE.put(data)
