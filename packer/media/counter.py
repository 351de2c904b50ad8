"""Per-worker media counting: probe the file, apply the policy, remember the answer.

The same image is often referenced by many records (several questions about one
picture); the counter keeps the last ``cache_size`` answers, keyed by path, size and
modification time, so such an image is read once per worker.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from packer.errors import BadRecord
from packer.ingest.records import Part
from packer.io import fs
from packer.media.policies import Count, parse_policy
from packer.media.probe import probe_audio, probe_image


@dataclass(frozen=True)
class CutCount(Count):
    """The count of a clip longer than the encoder's window: only its first ``kept`` seconds are seen."""

    seconds: float = 0.0
    kept: float = 0.0


def kept_seconds(policy) -> float | None:
    """Seconds of a clip the audio policy's encoder sees (None: all of it): a policy's own
    ``kept_seconds``, else Qwen2-Audio's ``max_seconds`` under ``long=truncate`` and Whisper's
    window under ``windows=one``; splitting and rate policies keep everything."""
    own = getattr(policy, "kept_seconds", None)
    if own is not None:
        return own() if callable(own) else own
    if getattr(policy, "long", None) == "truncate":
        return float(policy.max_seconds)
    if getattr(policy, "windows", None) == "one":
        return float(policy.window_seconds)
    return None


class MediaCounter:
    def __init__(self, image_tokens: str, audio_tokens: str, image_check: str = "verify", cache_size: int = 65536,
                 video_tokens: str = "qwen2vl", long_audio: str = "truncate"):
        if long_audio not in ("truncate", "drop"):
            raise ValueError(f"long_audio must be truncate or drop, got {long_audio!r}")
        self.long_audio = long_audio
        self.image_policy = parse_policy(image_tokens, "image")
        self.audio_policy = parse_policy(audio_tokens, "audio")
        self.video_policy = parse_policy(video_tokens, "video")
        self.image_check = image_check
        self.cache: OrderedDict[tuple, Count] = OrderedDict()
        self.cache_size = cache_size

    def count(self, part: Part) -> Count:
        try:
            size, mtime = fs.stat(part.path)
        except FileNotFoundError:
            raise BadRecord(f"missing_{part.kind}", f"{part.kind} file {part.ref!r} not found") from None
        except (OSError, ValueError) as e:  # a name too long, a symlink loop, a NUL byte: the path itself is bad
            raise BadRecord("bad_media_path", f"{part.kind} path {part.ref!r} cannot be looked up: "
                                              f"{type(e).__name__}: {e}") from None
        key = (part.kind, part.path, size, mtime, part.ref if part.frames else "", part.fps)
        hit = self.cache.get(key)
        if hit is not None:
            self.cache.move_to_end(key)
            return hit
        result = self._count(part)
        self.cache[key] = result
        if len(self.cache) > self.cache_size:
            self.cache.popitem(last=False)
        return result

    def _count(self, part: Part) -> Count:
        if part.kind == "video":
            from packer.media.video import count_frames, count_video

            if part.frames:
                return count_frames(part.frames, self.video_policy, part.fps, self.image_check)[1]
            return count_video(part.path, self.video_policy)[1]
        if part.kind == "image":
            info = probe_image(part.path, self.image_check)
            try:
                return self.image_policy.count(info.height, info.width)
            except ValueError as e:
                raise BadRecord("unsupported_image", f"{part.ref!r} ({info.width}x{info.height}): {e}") from None
        info = probe_audio(part.path)
        result = self.audio_policy.count(info.frames, info.sample_rate)
        if result.length < 1:
            raise BadRecord("audio_too_short", f"{part.ref!r} is {1000 * info.seconds:.1f} ms: the encoder produces 0 positions "
                                               f"under audio policy {self.audio_policy.name!r}; drop the clip or pad it")
        kept = kept_seconds(self.audio_policy)
        if kept is not None and info.frames > kept * info.sample_rate:  # the model sees the first window only
            if self.long_audio == "drop":
                raise BadRecord("audio_too_long", f"{part.ref!r} is {info.seconds:.1f} s; audio policy "
                                                  f"{self.audio_policy.name!r} keeps {kept:g} s (--long-audio drop)")
            return CutCount(result.length, result.grid, seconds=info.seconds, kept=kept)
        return result
