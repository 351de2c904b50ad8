"""Per-worker media probing with a small cache, and the generic counter built on it.

The same image is often referenced by many records (several questions about one picture);
:class:`MediaProber` keeps the last ``cache_size`` probes, keyed by path, size and modification
time (and, for a frame list, the frames and the stated rate), so such an image is read once per
worker. What the probe means in tokens is the family's business (:mod:`packer.families`);
:class:`MediaCounter` applies the token-count policies (the generic family's arithmetic) to it.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from packer.errors import BadRecord
from packer.io import blobs, fs
from packer.media.policies import Count, parse_policy, policy_count
from packer.media.probe import probe_audio, probe_image


class MediaProber:
    """``probe(part)``: the header facts of an image (ImageInfo), clip (AudioInfo) or video (VideoInfo).

    ``part`` is a record's media item as :class:`packer.records.Part` holds it: ``kind``, ``ref`` (as
    written), ``path`` (resolved, :func:`packer.media.refs.resolve`), and for a video of frame images its
    ``frames`` and stated ``fps`` (read by attribute: media sits below the record shapes)."""

    def __init__(self, image_check: str = "verify", cache_size: int = 65536, video_check: str = "verify"):
        self.image_check, self.video_check = image_check, video_check
        self.cache: OrderedDict[tuple, Any] = OrderedDict()
        self.cache_size = cache_size

    def probe(self, part: Any) -> Any:
        try:
            size, mtime = fs.stat(part.path)
        except FileNotFoundError as e:  # a URL's says what the server answered (HTTP 404 Not Found)
            said = f" ({e})" if fs.is_url(part.path) and str(e) else ""
            raise BadRecord(f"missing_{part.kind}", f"{part.kind} file {part.ref!r} not found{said}") from None
        except (OSError, ValueError) as e:  # a name too long, a symlink loop, a NUL byte: the path itself is bad
            raise BadRecord("bad_media_path", f"{part.kind} path {part.ref!r} cannot be looked up: "
                                              f"{type(e).__name__}: {e}") from None
        key = (part.kind, part.path, size, mtime, part.ref if part.frames else "", part.fps)
        hit = self.cache.get(key)
        if hit is not None:
            self.cache.move_to_end(key)
            return hit
        result = self._probe(part)
        self.cache[key] = result
        if len(self.cache) > self.cache_size:
            self.cache.popitem(last=False)
        return result

    def prefetch(self, parts, whole: bool = False) -> list[str]:
        """Read the remote files of ``parts`` (s3://, http(s)://; frame lists' frames too) not read yet in this task,
        many at once (:func:`packer.io.fs.prefetch`): their probes then ask no store. Under ``--image-check header``
        an image's first bytes only (a ranged read), unless ``whole`` (a task that embeds them). Returns the URLs
        read, whose bodies :meth:`~packer.io.blobs.Store.release_urls` drops once probed."""
        parts = [part for part in parts if not self._known(part)]
        paths = [p for part in parts for p in (part.frames or (part.path,)) if fs.is_remote_media(p)]
        heads = () if whole or self.image_check != "header" else \
            [part.path for part in parts if part.kind == "image" and not part.frames]
        return fs.prefetch(paths, heads=heads) if paths else []

    def _known(self, part: Any) -> bool:
        """Is ``part``'s probe cached, by what this task already knows of its URL (no request)?"""
        facts = None if part.frames else blobs.STORE.url(part.path)
        return facts is not None and (part.kind, part.path, facts[1], facts[2], "", part.fps) in self.cache

    def _probe(self, part: Any) -> Any:
        if part.kind == "video":
            from packer.media.video import probe_frames, probe_video

            if part.frames:
                return probe_frames(part.frames, part.fps, self.image_check)
            return probe_video(part.path, self.video_check)
        if part.kind == "image":
            return probe_image(part.path, self.image_check)
        return probe_audio(part.path)


class MediaCounter:
    """The generic family's count of one item: probe, then the kind's token-count policy
    (:func:`packer.media.policies.policy_count`, the arithmetic the generic family's expansion uses too)."""

    def __init__(self, image_tokens: str, audio_tokens: str, image_check: str = "verify", cache_size: int = 65536,
                 video_tokens: str = "qwen2vl"):
        self.policies = {"image": parse_policy(image_tokens, "image"), "audio": parse_policy(audio_tokens, "audio"),
                         "video": parse_policy(video_tokens, "video")}
        self.prober = MediaProber(image_check, cache_size)

    def count(self, part: Any) -> Count:
        return policy_count(self.policies[part.kind], part.kind, self.prober.probe(part), part)


def kept_seconds(owner: Any) -> float | None:
    """Seconds of a clip the audio encoder sees (None: all of it), for a family or an audio policy: its
    own ``kept_seconds`` when it states one; a family's audio policy (the generic family's
    ``policies["audio"]``); Qwen2-Audio's ``max_seconds`` under ``long=truncate``, Whisper's window
    under ``windows=one``. Splitting and rate policies keep everything. A clip longer than this is
    cut by the model's processor: the encoder counts it as ``audio_truncated`` (``--long-audio``)."""
    own = getattr(owner, "kept_seconds", None)
    if own is not None:
        return own() if callable(own) else float(own)
    policies = getattr(owner, "policies", None)
    if isinstance(policies, dict) and "audio" in policies:
        return kept_seconds(policies["audio"])
    if getattr(owner, "long", None) == "truncate" and hasattr(owner, "max_seconds"):
        return float(owner.max_seconds)
    if getattr(owner, "windows", None) == "one" and hasattr(owner, "window_seconds"):
        return float(owner.window_seconds)
    return None
