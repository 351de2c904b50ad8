"""Videos: count their tokens from the container's headers, and load them the way they were counted.

Probing (:func:`probe_video`, PyAV) reads the container and the first video stream's header:
frame count (``stream.frames``; MKV / WebM store none, so their packets are counted -- the
file is read, nothing is decoded), frame rate (``average_rate``, the rate transformers' PyAV
loader reports, else FFmpeg's guess), duration, coded size, and decodes **one** frame:

- PyAV 18 exposes the display matrix (phone videos are stored landscape with a 90 / 270
  rotation) only on decoded frames (``VideoFrame.rotation``), not on the stream, so the
  rotation costs the first frame's decode. It also proves the codec decodes and that the
  file holds a frame. One keyframe: about what opening the file costs (FFmpeg's stream
  probing decodes too), ~15 ms of CPU for a 720p H.264 clip against ~260 ms for decoding
  its 92 frames (``bench/bench_video.py``, docs/BENCHMARKS.md).
- The size reported is the size *displayed*: 90 / 270 degree rotations swap width and
  height, as images' EXIF orientation does; :func:`load_video` returns upright frames.
- MP4 / MOV index every packet: a file cut after its header (a "faststart" file whose
  index is at the front) is caught by comparing the index's last byte with the file's size.
  A file cut anywhere else loses its index (MP4) or its header and fails to open.

Every claim of the header -- rate, frame size, frame count, duration, pixel volume -- is
held to :mod:`packer.media.limits` before anything is decoded, so a 1 MB file claiming
16000 x 16000 frames, 2^31 fps or days of video costs a header read, not gigabytes.

``check="header"`` (the default; ``--video-check header``) trusts the header's frame count
once it is plausible (at most one frame per byte of the file, within the limits).
``check="decode"`` (``--video-check decode``) decodes every frame and counts the frames that
exist: a file whose header lists another number of frames than decode is refused (damage
inside the stream that the index does not show, or a header that over-promises: the loader,
which reads the header, would sample frames the file does not hold).

Reasons: ``missing_video``, ``corrupt_video`` (not a container FFmpeg reads, truncated,
no frame, no frame rate, a frame that does not decode, more frames claimed than bytes),
``no_video_stream`` (audio only, an image, subtitles), ``unsupported_video`` (a codec this
FFmpeg build cannot decode, a rotation that is not a multiple of 90 degrees; the policy
refusing it: a 1-frame clip, an aspect ratio over 200), ``bad_frame_rate``,
``video_too_large``, ``media_too_long`` (:mod:`packer.media.limits`).

Loading (:func:`load_video`) = ``transformers.video_utils.load_video(path, backend="pyav",
sample_indices_fn=...)`` -- every frame decoded in order, frame ``i`` kept when ``i`` is a
sampled index, ``to_ndarray(format="rgb24")`` -- plus the rotation applied (transformers'
PyAV reader ignores it). The indices come from the policy (``frame_indices``), so the
processor, given these frames with ``do_sample_frames=False``, produces exactly the counted
grid. An index past the last frame that decodes (a header that over-promises) gets the
last frame: the count stays the counted one.

A video may also be a list of frame images (:func:`probe_frames`, :func:`load_frames`): each frame
probed as an image (EXIF applied), all of one size; a video of those frames at the rate the record
states, sampled as a file at that rate would be (what the HF video processor does with the frames
and that ``fps`` in their metadata). A list that states no rate is taken whole, every frame, timed at
the policy's fps (what qwen-vl-utils and ms-swift hand the processor for such a list).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from packer.errors import BadRecord, PackerError
from packer.io import blobs, fs
from packer.media.deps import require
from packer.media.limits import MAX_VIDEO_FRAMES, check_frame_rate, check_frame_size, check_video

VIDEO_CHECKS = ("header", "decode")  # "verify": an older name of "header", still accepted
REENCODE = "re-encode it, e.g. ffmpeg -i IN -vcodec libx264 -pix_fmt yuv420p OUT.mp4"


@dataclass(frozen=True)
class VideoInfo:
    frames: int
    fps: float  # frames per second (the stream's average rate); 0.0 for a frame list that states none
    duration: float  # seconds
    height: int  # as displayed (rotation applied)
    width: int
    rotation: int = 0  # degrees counter-clockwise the stored frames are turned for display: 0, 90, 180, 270
    codec: str = ""


def _open(path: str):
    av = require("av")  # missing: a ConfigError that stops the build, never a record's corrupt_video

    if fs.is_url(path) or blobs.is_blob(path):  # a stream, not a name FFmpeg opens itself
        return av.open(fs.open_binary(path), metadata_errors="ignore")
    return av.open(str(path), metadata_errors="ignore")


def _video_stream(container, path: str):
    streams = container.streams.video
    if not streams:
        kinds = ", ".join(s.type for s in container.streams) or "none"
        raise BadRecord("no_video_stream", f"{path!r} has no video stream (streams: {kinds}); give a video file, or list "
                                           f"the item as audio / image if that is what it is")
    stream = streams[0]
    if stream.codec_context is None:
        tag = getattr(stream, "codec_tag", "") or "unknown"
        raise BadRecord("unsupported_video", f"{path!r}: its video codec ({tag}) has no decoder in this FFmpeg build; {REENCODE}")
    return stream


def probe_video(path: str, check: str = "header") -> VideoInfo:
    """Frames, rate, duration, displayed size and rotation of the video at ``path`` from its
    headers plus one decoded frame; bad files raise :class:`BadRecord` (see the module doc)."""
    check = "header" if check == "verify" else check
    if check not in VIDEO_CHECKS:
        raise ValueError(f"video check {check!r} is not one of {', '.join(VIDEO_CHECKS)}")
    try:
        size = fs.stat(path)[0]
        container = _open(path)
    except FileNotFoundError:
        raise BadRecord("missing_video", f"video file {path!r} not found") from None
    except (MemoryError, PackerError):  # PackerError: PyAV is not installed (the build's, not the file's)
        raise
    except Exception as e:  # noqa: BLE001 -- av.error.InvalidDataError, EOFError (header only), OSError, ...
        raise BadRecord("corrupt_video", f"{path!r} is not a video FFmpeg can read ({type(e).__name__}: {e}); "
                                         f"{REENCODE}") from None
    try:
        with container:
            return _probe(container, path, size, check)
    except BadRecord:
        raise
    except MemoryError:
        raise
    except Exception as e:  # noqa: BLE001 -- decoder errors surface as av.error.* subclasses of OSError / ValueError
        raise BadRecord("corrupt_video", f"{path!r} is damaged: {type(e).__name__}: {e}; {REENCODE}") from None


def _probe(container, path: str, size: int, check: str) -> VideoInfo:
    stream = _video_stream(container, path)
    ctx = stream.codec_context
    ctx.thread_count = 1  # one core per build worker; the first frame gains nothing from threads
    rate = stream.average_rate or stream.guessed_rate
    fps = float(rate) if rate else 0.0
    if fps <= 0:
        raise BadRecord("corrupt_video", f"{path!r} states no frame rate; {REENCODE}")
    what = repr(path)
    check_frame_rate(fps, what)
    check_frame_size(ctx.height, ctx.width, what)  # before a frame is decoded: a 16000x16000 frame is 384 MB of YUV
    index = stream.index_entries
    if index is not None and len(index):
        end = max(e.pos + e.size for e in (index[i] for i in range(max(0, len(index) - 32), len(index))))
        if end > size:
            raise BadRecord("corrupt_video", f"{path!r} is truncated: its index needs {end} bytes, the file has {size}; "
                                             f"fetch it again or drop it")
    stated = max(stream.frames, 0)
    frames = stated
    if frames <= 0 and check != "decode":  # MKV / WebM / some AVI: no count in the header; count packets (no decode)
        frames = sum(1 for _, p in zip(range(MAX_VIDEO_FRAMES + 1), container.demux(stream), strict=False) if p.size)
        container.seek(0)
    if frames > size:
        raise BadRecord("corrupt_video", f"{path!r} claims {frames:,} frames in {size:,} bytes (under one byte a frame): "
                                         f"its header is damaged; {REENCODE}")
    duration = _duration(stream, container, frames, fps)
    check_video(frames, fps, duration, ctx.height, ctx.width, what)  # the header's claims, before decoding
    width, height, rotation = ctx.width, ctx.height, 0
    decoded = 0
    for frame in container.decode(stream):
        if decoded == 0:
            width, height, rotation = frame.width, frame.height, frame.rotation % 360
            check_frame_size(height, width, what)
            if check != "decode":
                decoded = 1
                break
        decoded += 1
        if decoded > max(stated, MAX_VIDEO_FRAMES):
            break  # more frames than the header lists (or than any video may hold): refused below
    if decoded == 0:
        raise BadRecord("corrupt_video", f"{path!r} holds no frame that decodes (zero duration or damaged); {REENCODE}")
    if check == "decode":  # the frames that exist; a header that says otherwise would mislead the loader
        if stated and decoded != stated:
            raise BadRecord("corrupt_video", f"{path!r} decodes {decoded:,}{'+' if decoded > stated else ''} frames, its "
                                             f"header lists {stated:,}; {REENCODE}")
        frames = decoded
        check_video(frames, fps, frames / fps, height, width, what)
    if frames < 1:
        raise BadRecord("corrupt_video", f"{path!r} holds no frames; {REENCODE}")
    if rotation % 90:
        raise BadRecord("unsupported_video", f"{path!r} is rotated {rotation} degrees (not a multiple of 90); {REENCODE} "
                                             f"-vf rotate=... to store it upright")
    if rotation in (90, 270):
        width, height = height, width
    if width < 1 or height < 1:
        raise BadRecord("corrupt_video", f"{path!r} has frame size {width}x{height}; {REENCODE}")
    return VideoInfo(frames, fps, duration if check != "decode" else _duration(stream, container, frames, fps),
                     height, width, rotation, ctx.name)


def _duration(stream, container, frames: int, fps: float) -> float:
    """Seconds, from the stream's header, else the container's, else frames / fps."""
    if stream.duration and stream.time_base:
        return float(stream.duration * stream.time_base)
    if container.duration:
        return container.duration / 1_000_000
    return frames / fps


def probe_frames(paths: Sequence[str], fps: float = 0.0, image_check: str = "verify") -> VideoInfo:
    """A video given as frame images: their count, the stated ``fps`` (0: none stated), and the
    common size after EXIF orientation. Bad frames and mixed sizes raise :class:`BadRecord`."""
    from packer.media.probe import probe_image

    if not paths:
        raise BadRecord("corrupt_video", "the video's frame list is empty; list at least one frame image")
    what = f"the {len(paths)}-frame list starting {paths[0]!r}"
    if fps:
        check_frame_rate(fps, what)
    first = None
    for i, path in enumerate(paths):
        try:
            info = probe_image(path, image_check)
        except BadRecord as e:
            reason = "missing_video" if e.reason == "missing_image" else "corrupt_video"
            raise BadRecord(reason, f"frame {i} of {len(paths)}: {e.detail}") from None
        if first is None:
            first = info
        elif (info.height, info.width) != (first.height, first.width):
            raise BadRecord("unsupported_video", f"frame {i} ({path!r}) is {info.width}x{info.height} but frame 0 "
                                                 f"({paths[0]!r}) is {first.width}x{first.height}: a video's frames share "
                                                 f"one size; resize them")
    duration = len(paths) / fps if fps else 0.0
    check_video(len(paths), fps or 1.0, duration, first.height, first.width, what)
    return VideoInfo(len(paths), float(fps), duration, first.height, first.width)


def count_video(path: str, policy, check: str = "header"):
    """Probe ``path`` and count it with ``policy`` (a video policy); what the policy refuses is
    ``unsupported_video``. Returns ``(VideoInfo, VideoCount)``."""
    info = probe_video(path, check)
    return info, _count(policy, info, repr(path))


def count_frames(paths: Sequence[str], policy, fps: float = 0.0, image_check: str = "verify"):
    """:func:`count_video` for a list of frame images at the stated ``fps`` (0: none stated): counted as the policy
    counts a file of those frames at that rate -- the HF video processors sample a list of frames handed with its
    ``fps`` as they sample a decoded file. Frames that state no rate are taken whole, timed at the policy's fps."""
    info = probe_frames(paths, fps, image_check)
    return info, _count(policy, info, f"the {len(paths)}-frame list starting {paths[0]!r}")


def _count(policy, info: VideoInfo, what: str):
    try:
        return policy.count(info.frames, info.fps, info.height, info.width)
    except ValueError as e:
        raise BadRecord("unsupported_video", f"{what} ({info.frames} frames at {info.fps:g} fps, {info.width}x{info.height}): "
                                             f"{e} (video policy {policy.name!r})") from None


# ---------------------------------------------------------------- loading (train time)


def load_video(path: str, indices: Sequence[int] | None = None, *, threads: int = 0) -> np.ndarray:
    """Upright RGB frames ``[T, H, W, 3]`` uint8 of the video at ``path``: the frames at decode
    ``indices`` (all when None), rotation applied. See the module doc for the convention."""
    av = require("av")

    with _open(path) as container:
        stream = _video_stream(container, path)
        stream.codec_context.thread_count = threads
        if threads != 1:
            stream.codec_context.thread_type = "AUTO"
        wanted = None if indices is None else sorted(set(int(i) for i in indices))
        last = None if wanted is None else wanted[-1]
        kept: dict[int, np.ndarray] = {}
        rotation = 0
        keep = set(wanted) if wanted is not None else None
        try:
            for i, frame in enumerate(container.decode(stream)):
                if i == 0:
                    rotation = frame.rotation % 360
                if keep is None or i in keep:
                    kept[i] = frame.to_ndarray(format="rgb24")
                if last is not None and i >= last:
                    break
        except av.error.InvalidDataError:
            if not kept:
                raise
    if not kept:
        raise ValueError(f"{path!r} holds no frame that decodes")
    order = range(len(kept)) if indices is None else [int(j) for j in indices]
    final = kept[max(kept)]  # an index past the last frame that decodes: the last frame (the count stays)
    video = np.stack([kept.get(j, final) for j in order])
    if rotation:
        video = np.ascontiguousarray(np.rot90(video, k=rotation // 90, axes=(1, 2)))
    return video


def load_frames(paths: Sequence[str], indices: Sequence[int] | None = None) -> np.ndarray:
    """``[T, H, W, 3]`` uint8 of a frame-list video (each frame as :func:`packer.media.load.load_image`)."""
    from packer.media.load import load_image

    chosen = range(len(paths)) if indices is None else indices
    return np.stack([np.asarray(load_image(paths[j])) for j in chosen])


def video_metadata(info: VideoInfo, policy) -> dict:
    """The ``video_metadata`` to pass the HF processor beside the frames loaded with
    ``policy.frame_indices`` (``VideoMetadata(**d)``), so that Qwen2.5-VL's ``second_per_grid_ts``
    is the counted one: the processor's own sampled indices, at the video's rate (a frame list that
    states none: every frame, timed at the policy's fps)."""
    rate = info.fps or policy.fps
    return {"total_num_frames": info.frames, "fps": rate, "width": info.width, "height": info.height,
            "duration": info.frames / rate, "video_backend": "pyav",
            "frames_indices": policy.sample_indices(info.frames, info.fps)}
