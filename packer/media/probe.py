"""Read just enough of a media file to count its tokens, and catch bad files cheaply.

Images (PIL opens lazily: the header gives the size without decoding pixels):

- ``header``: open and read the size. Catches: missing / unreadable file, not an
  image, unknown format, a damaged header.
- ``verify`` (default): also ``Image.verify()``, which walks the file's structure
  without decoding pixels. Also catches: truncated or damaged PNG (chunk CRCs, missing
  IEND) and GIF. Not caught: damaged or truncated JPEG / WebP pixel data -- JPEG's
  verify checks little beyond the header.
- ``decode``: decode the pixels (``Image.load()``): catches everything PIL can, at the
  cost of a full decode (tens of milliseconds per photo).

Audio (soundfile / libsndfile: WAV, FLAC, OGG, MP3, AIFF, ...): the header gives
frames and sample rate; the last frame is read back, so a file truncated after its
header is caught without decoding it all.
"""

from __future__ import annotations

from dataclasses import dataclass

from packer.errors import BadRecord
from packer.io.fs import open_binary

IMAGE_CHECKS = ("header", "verify", "decode")


@dataclass(frozen=True)
class ImageInfo:
    height: int
    width: int
    format: str


@dataclass(frozen=True)
class AudioInfo:
    frames: int
    sample_rate: int
    channels: int
    format: str

    @property
    def seconds(self) -> float:
        return self.frames / self.sample_rate


def probe_image(path: str, check: str = "verify") -> ImageInfo:
    from PIL import Image, UnidentifiedImageError

    try:
        with open_binary(path) as f, Image.open(f) as img:
            width, height = img.size
            fmt = img.format or "unknown"
            if check == "verify":
                img.verify()
            elif check == "decode":
                img.load()
    except FileNotFoundError:
        raise BadRecord("missing_image", f"image file {path!r} not found") from None
    except UnidentifiedImageError:
        raise BadRecord("corrupt_image", f"{path!r} is not an image PIL can read") from None
    except (OSError, SyntaxError, ValueError) as e:  # PIL reports damage as any of these
        raise BadRecord("corrupt_image", f"{path!r} is damaged or truncated: {e}") from None
    if width < 1 or height < 1:
        raise BadRecord("corrupt_image", f"{path!r} has size {width}x{height}")
    return ImageInfo(height, width, fmt)


def probe_audio(path: str) -> AudioInfo:
    import soundfile as sf

    try:
        with open_binary(path) as raw, sf.SoundFile(raw) as f:
            frames, rate, channels, fmt = f.frames, f.samplerate, f.channels, f.format
            if frames > 0:
                f.seek(frames - 1)
                if len(f.read(1)) != 1:
                    raise BadRecord("corrupt_audio", f"{path!r} is truncated: its header promises {frames} frames")
    except FileNotFoundError:
        raise BadRecord("missing_audio", f"audio file {path!r} not found") from None
    except (sf.LibsndfileError, RuntimeError, OSError) as e:
        raise BadRecord("corrupt_audio", f"{path!r} is not audio soundfile can read: {e}") from None
    if frames < 1 or rate < 1:
        raise BadRecord("corrupt_audio", f"{path!r} holds no audio ({frames} frames at {rate} Hz)")
    return AudioInfo(frames, rate, channels, fmt)
