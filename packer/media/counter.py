"""Per-worker media counting: probe the file, apply the policy, remember the answer.

The same image is often referenced by many records (several questions about one
picture); the counter keeps the last ``cache_size`` answers, keyed by path, size and
modification time, so such an image is read once per worker.
"""

from __future__ import annotations

from collections import OrderedDict

from packer.errors import BadRecord
from packer.ingest.records import Part
from packer.io import fs
from packer.media.policies import Count, parse_policy
from packer.media.probe import probe_audio, probe_image


class MediaCounter:
    def __init__(self, image_tokens: str, audio_tokens: str, image_check: str = "verify", cache_size: int = 65536,
                 video_tokens: str = "qwen2vl", video_check: str = "header"):
        self.image_policy = parse_policy(image_tokens, "image")
        self.audio_policy = parse_policy(audio_tokens, "audio")
        self.video_policy = parse_policy(video_tokens, "video")
        self.image_check = image_check
        self.video_check = video_check
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
            return count_video(part.path, self.video_policy, self.video_check)[1]
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
        return result
