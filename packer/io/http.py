"""Media behind ``http(s)://`` URLs, fetched with the standard library: bounded in time, size and redirects.

A record may name its image as ``https://host/a.png``; stage 1 fetches the whole body once (to probe its header and
count it), the loader fetches it again at train time (a ``ref`` build stores the URL). Every way a server or the
network can fail is one record's failure, a :class:`~packer.errors.BadRecord` naming the URL:

=========================================  ====================================================================
what happens                               what it is
=========================================  ====================================================================
404 / 410                                  :class:`Missing` (a ``FileNotFoundError``: ``missing_<kind>``)
any other 4xx                              ``media_fetch_failed`` (``HTTP 403 Forbidden``), not retried
5xx, a refused / reset connection          retried :data:`RETRIES` times (backoff :data:`BACKOFF_S`, doubling),
                                           then ``media_fetch_failed``
no answer for :data:`TIMEOUT_S`            ``media_fetch_timeout`` (retried like a 5xx); a body that trickles in
                                           is cut at :data:`TIMEOUT_S` x 4 in all
over :data:`MAX_REDIRECTS` redirects       ``media_fetch_failed`` (a redirect loop ends there)
a body over :data:`MAX_BYTES`              ``media_too_large``: refused from its Content-Length, or cut while
                                           reading (an endless body stops at the limit)
a scheme other than http / https           ``media_fetch_failed`` (a redirect to ``file://`` is refused too)
=========================================  ====================================================================

The limits are module constants (documented in docs/media.md); tests patch them.
"""

from __future__ import annotations

import http.client
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

from packer.errors import BadRecord

TIMEOUT_S = 30.0  # connect, and each read of the body
TOTAL_TIMEOUTS = 4  # a whole fetch ends after this many TIMEOUT_S (a server that sends a byte a second)
RETRIES = 3  # further tries after a 5xx, a refused / reset connection or a timeout
BACKOFF_S = 0.5  # wait before the first retry; doubled before each next one
MAX_BYTES = 256 * 2**20  # the largest body one medium may have (the data: URL limit: packer.media.inline)
MAX_REDIRECTS = 5
CHUNK = 1 << 20
USER_AGENT = "packer (multimodal data packing; https://github.com)"


def is_http(path) -> bool:
    """True for an ``http://`` or ``https://`` URL."""
    return isinstance(path, str) and path[:8].lower().startswith(("http://", "https://"))


class Missing(FileNotFoundError):
    """The server says the URL names nothing (404, 410): a missing file, as a local path's would be."""


@dataclass(frozen=True)
class Fetched:
    data: bytes
    mtime_ns: int  # from Last-Modified; 0 when the server sends none
    size: int = -1  # the whole object's bytes (a ranged fetch's Content-Range); -1: len(data), the body is whole

    @property
    def whole(self) -> bool:
        return self.size < 0 or self.size == len(self.data)


@dataclass(frozen=True)
class Head:
    size: int
    mtime_ns: int


class _Redirects(urllib.request.HTTPRedirectHandler):
    max_redirections = MAX_REDIRECTS
    max_repeats = 2  # the same URL twice: a loop


def _opener() -> urllib.request.OpenerDirector:
    handler = _Redirects()
    handler.max_redirections = MAX_REDIRECTS  # read at call time, so a patched limit holds
    return urllib.request.build_opener(handler)


def fetch(url: str, max_bytes: int | None = None) -> Fetched:
    """The body of ``url`` (at most ``max_bytes``, :data:`MAX_BYTES` by default), retried as the module says."""
    limit = MAX_BYTES if max_bytes is None else max_bytes
    return _retrying(url, lambda: _get(url, limit))


def fetch_first(url: str, n: int) -> Fetched:
    """The first ``n`` bytes of ``url`` (a ``Range: bytes=0-<n-1>`` request) with the whole object's size from the
    206 answer's Content-Range; a server that ignores Range answers 200 with the whole body, which is kept (held to
    :data:`MAX_BYTES`). An object over :data:`MAX_BYTES` is ``media_too_large`` as a whole fetch would find it."""
    return _retrying(url, lambda: _get(url, MAX_BYTES, first=n))


def head(url: str) -> Head:
    """The size and modification time of ``url`` (a HEAD request; a GET where the server refuses HEAD)."""

    def ask() -> Head:
        request = urllib.request.Request(url, method="HEAD", headers={"User-Agent": USER_AGENT})
        with _opener().open(request, timeout=TIMEOUT_S) as r:
            size = r.headers.get("Content-Length")
            if size is None:  # a chunked answer: the body is the only measure
                raise _NoLength
            return Head(int(size), _mtime(r.headers.get("Last-Modified")))

    try:
        return _retrying(url, ask)
    except (_NoLength, BadRecord) as e:
        if isinstance(e, BadRecord) and "HTTP 405" not in e.detail and "HTTP 501" not in e.detail:
            raise
        body = fetch(url)
        return Head(len(body.data), body.mtime_ns)


class _NoLength(Exception):
    pass


def _retrying(url: str, call):
    shown = _shown(url)
    if not is_http(url):
        raise BadRecord("media_fetch_failed", f"{shown}: packer fetches http:// and https:// URLs only")
    wait, last = BACKOFF_S, None
    for attempt in range(RETRIES + 1):
        if attempt:
            time.sleep(wait)
            wait *= 2
        try:
            return call()
        except urllib.error.HTTPError as e:
            e.close()
            if e.code in (404, 410):
                raise Missing(f"{shown}: HTTP {e.code} {e.reason}") from None
            if 300 <= e.code < 400:  # urllib gives up on a redirect loop or an over-long chain with the 3xx
                raise BadRecord("media_fetch_failed", f"{shown}: more than {MAX_REDIRECTS} redirects, or a redirect "
                                                      f"loop (HTTP {e.code})") from None
            last = BadRecord("media_fetch_failed", f"{shown}: HTTP {e.code} {e.reason}"
                                                   + (f" after {attempt + 1} tries" if e.code >= 500 else ""))
            if e.code < 500:
                raise last from None
        except TimeoutError:
            last = BadRecord("media_fetch_timeout", f"{shown}: no answer within {TIMEOUT_S:g} s ({attempt + 1} tries)")
        except urllib.error.URLError as e:
            reason = e.reason
            if isinstance(reason, TimeoutError):
                last = BadRecord("media_fetch_timeout", f"{shown}: no answer within {TIMEOUT_S:g} s ({attempt + 1} tries)")
            elif isinstance(reason, str) and "redirect" in reason.lower():  # a redirect to file:// / ftp://
                raise BadRecord("media_fetch_failed", f"{shown}: {reason}") from None
            else:
                last = BadRecord("media_fetch_failed", f"{shown}: cannot connect ({reason}; {attempt + 1} tries)")
        except (OSError, http.client.HTTPException) as e:  # reset or cut mid-body, a closed socket
            if isinstance(e, FileNotFoundError):
                raise
            last = BadRecord("media_fetch_failed", f"{shown}: {type(e).__name__}: {e} ({attempt + 1} tries)")
    raise last


def _get(url: str, limit: int, first: int | None = None) -> Fetched:
    headers = {"User-Agent": USER_AGENT} | ({"Range": f"bytes=0-{first - 1}"} if first else {})
    request = urllib.request.Request(url, headers=headers)
    deadline = time.monotonic() + TIMEOUT_S * TOTAL_TIMEOUTS
    with _opener().open(request, timeout=TIMEOUT_S) as r:
        total = -1
        if first and r.status == 206:  # a part: Content-Range "bytes 0-65535/123456" names the whole size
            ranged = (r.headers.get("Content-Range") or "").rpartition("/")[2]
            if not ranged.isdigit():
                raise ConnectionError(f"a 206 answer without the whole size (Content-Range "
                                      f"{r.headers.get('Content-Range')!r})")
            total = int(ranged)
            if total > limit:
                raise BadRecord("media_too_large", f"{_shown(url)}: the server states {total:,} bytes, over the "
                                                   f"{limit:,}-byte limit of one medium")
        stated = r.headers.get("Content-Length")
        if stated is not None and stated.isdigit() and int(stated) > limit:
            raise BadRecord("media_too_large", f"{_shown(url)}: the server states {int(stated):,} bytes, over the "
                                               f"{limit:,}-byte limit of one medium")
        pieces, n = [], 0
        while block := r.read(min(CHUNK, limit + 1 - n)):
            pieces.append(block)
            n += len(block)
            if n > limit:
                raise BadRecord("media_too_large", f"{_shown(url)}: its body goes past the {limit:,}-byte limit of "
                                                   f"one medium (read stopped there)")
            if time.monotonic() > deadline:
                raise TimeoutError
        data = b"".join(pieces)
        if stated is not None and stated.isdigit() and len(data) < int(stated):
            raise ConnectionError(f"the body ended after {len(data):,} of {int(stated):,} bytes")
        return Fetched(data, _mtime(r.headers.get("Last-Modified")), total)


def _mtime(value: str | None) -> int:
    if not value:
        return 0
    try:
        return int(parsedate_to_datetime(value).timestamp() * 1e9)
    except (TypeError, ValueError, OverflowError):
        return 0


def _shown(url: str) -> str:
    return url if len(url) <= 200 else url[:200] + "..."
