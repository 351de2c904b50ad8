"""What one media file may claim before packer refuses it: a stated bound on every per-file cost.

A header is data like any other: a 1 MB file can claim a 16000 x 16000 frame, a rate of
2^31 frames per second, 10^9 frames or a sample rate of 1 Hz, and each claim turns into
memory or time somewhere (the probe's first decoded frame, ``second_per_grid_t`` and the
mRoPE positions, the tokens counted, the loader's resampled waveform). So every claim is
checked against the ranges below from the header alone, before anything is decoded, and
a file outside them is quarantined with a named reason:

==========================  ====================================  ==================
claim                       allowed                               reason
==========================  ====================================  ==================
pixels of one video frame   <= MAX_FRAME_PIXELS (89,478,485:      ``video_too_large``
                            PIL's MAX_IMAGE_PIXELS for images)
frames x height x width     <= MAX_VIDEO_PIXELS (2^40: 4 h of     ``video_too_large``
                            1080p at 30 fps is 9.0e11)
frames of one video         <= MAX_VIDEO_FRAMES (2^20) and at     ``media_too_long`` /
                            most one per byte of the file         ``corrupt_video``
duration (audio, video)     <= MAX_MEDIA_SECONDS (6 h), from the  ``media_too_long``
                            header and from frames / rate
video frame rate            finite, in FPS_RANGE (0.01-1000)      ``bad_frame_rate``
audio sample rate           in SAMPLE_RATE_RANGE (1 kHz-768 kHz)  ``bad_sample_rate``
audio channels              <= MAX_AUDIO_CHANNELS (64)            ``corrupt_audio``
==========================  ====================================  ==================

A rate stated in a record (a frame list's ``fps``) is held to the same range, so neither
``Infinity`` nor 1e308 reaches a stored ``ref`` or ``second_per_grid_t``. The same bounds
guard the loader (:func:`packer.media.load.load_audio` refuses what the build would).

The values are constants (not settings): a build's workers are separate processes, so a
value changed in one process would not reach them. Images keep PIL's own bound
(``PIL.Image.MAX_IMAGE_PIXELS``; over twice it, ``corrupt_image``).
"""

from __future__ import annotations

import math

from packer.errors import BadRecord

MAX_FRAME_PIXELS = 89_478_485
MAX_VIDEO_PIXELS = 2**40
MAX_VIDEO_FRAMES = 2**20
MAX_MEDIA_SECONDS = 6 * 3600.0
FPS_RANGE = (0.01, 1000.0)
SAMPLE_RATE_RANGE = (1000, 768_000)
MAX_AUDIO_CHANNELS = 64


def check_frame_rate(fps: float, what: str) -> float:
    """``fps`` as a float when finite and within :data:`FPS_RANGE`, else ``bad_frame_rate``."""
    low, high = FPS_RANGE
    if not (isinstance(fps, (int, float)) and math.isfinite(fps) and low <= fps <= high):
        raise BadRecord("bad_frame_rate", f"{what} states {fps!r} frames per second, outside the {low:g}-{high:g} packer "
                                          f"accepts (packer.media.limits); re-encode it at a real rate")
    return float(fps)


def check_frame_size(height: int, width: int, what: str) -> None:
    if height * width > MAX_FRAME_PIXELS:
        raise BadRecord("video_too_large", f"{what} has {width}x{height} frames ({height * width:,} pixels each), over "
                                           f"{MAX_FRAME_PIXELS:,} (PIL's MAX_IMAGE_PIXELS); downscale it")


def check_video(frames: int, fps: float, duration: float, height: int, width: int, what: str) -> None:
    """Frame count, duration and pixel volume a video header claims (after :func:`check_frame_rate`)."""
    check_frame_size(height, width, what)
    seconds = max(duration if math.isfinite(duration) else math.inf, frames / fps)
    if frames > MAX_VIDEO_FRAMES or seconds > MAX_MEDIA_SECONDS:
        raise BadRecord("media_too_long", f"{what} claims {frames:,} frames at {fps:g} fps ({_span(seconds)}), over "
                                          f"{MAX_VIDEO_FRAMES:,} frames or {_span(MAX_MEDIA_SECONDS)} (packer.media.limits); "
                                          f"cut it into clips, or check it is not damaged")
    if frames * height * width > MAX_VIDEO_PIXELS:
        raise BadRecord("video_too_large", f"{what} holds {frames:,} frames of {width}x{height}, "
                                           f"{frames * height * width:.3g} pixels in all, over {MAX_VIDEO_PIXELS:.3g}; "
                                           f"cut or downscale it")


def check_audio(frames: int, sample_rate: int, channels: int, what: str) -> None:
    """Sample rate, channels and duration an audio header claims."""
    low, high = SAMPLE_RATE_RANGE
    if not low <= sample_rate <= high:
        raise BadRecord("bad_sample_rate", f"{what} states a sample rate of {sample_rate:,} Hz, outside the {low:,}-{high:,} "
                                           f"Hz packer accepts (packer.media.limits); resample it")
    if channels > MAX_AUDIO_CHANNELS:
        raise BadRecord("corrupt_audio", f"{what} states {channels:,} channels, over {MAX_AUDIO_CHANNELS}")
    seconds = frames / sample_rate
    if seconds > MAX_MEDIA_SECONDS:
        raise BadRecord("media_too_long", f"{what} lasts {_span(seconds)}, over {_span(MAX_MEDIA_SECONDS)} "
                                          f"(packer.media.limits); cut it into clips")


def _span(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "an unbounded time"
    if seconds >= 86400:
        return f"{seconds / 86400:,.1f} days"
    return f"{seconds / 3600:,.1f} h" if seconds >= 3600 else f"{seconds:,.1f} s"
