"""Read just enough of a media file to count its tokens, and catch bad files cheaply.

Images (PIL opens lazily: the header gives the size without decoding pixels). The size
reported is the size *after* EXIF orientation, as ``transformers.image_utils.load_image``
(and :func:`packer.media.load.load_image`) produce it: orientations 5-8 (transpose,
rotate 90 / 270, transverse) swap width and height. The orientation is read from the
EXIF (or XMP) metadata in the header; a PNG whose eXIf chunk comes after its pixel data
is only seen with ``decode`` (PIL finds such chunks by decoding).

- ``header``: open and read the size. Catches: missing / unreadable file, not an
  image, unknown format, a damaged header.
- ``verify`` (default): also ``Image.verify()``, which walks the file's structure
  without decoding pixels. Also catches: truncated or damaged PNG (chunk CRCs, missing
  IEND); WebP cut anywhere (the header checks its RIFF size). Not caught: truncated or
  damaged JPEG and GIF pixel data -- their verify checks little beyond the header (a
  GIF cut to 30% passes; tests pin it).
- ``decode``: decode the pixels (``Image.load()``): catches everything PIL can in what
  a loader uses (a GIF's first frame), at the cost of a full decode (tens of
  milliseconds per photo).

Audio (soundfile / libsndfile: WAV, FLAC, OGG, MP3, AIFF, ...): the header gives
frames and sample rate, held to :mod:`packer.media.limits` (a 32 KB WAV at 1 Hz is nine
hours that a loader would resample to 2 GB: ``bad_sample_rate``); the last frame is read
back, so a file truncated after its header is caught without decoding it all.
"""

from __future__ import annotations

from dataclasses import dataclass

from packer.errors import BadRecord
from packer.io.fs import drop_header, open_binary, open_header
from packer.media.limits import check_audio


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


TRANSPOSING_ORIENTATIONS = (5, 6, 7, 8)  # EXIF values whose transform swaps width and height
ORIENTATION_TAG = 0x0112


def probe_image(path: str, check: str = "verify") -> ImageInfo:
    """Size (after EXIF orientation) and format of the image at ``path``; any failure PIL
    reports -- a missing file, not an image, a damaged header, a decompression bomb --
    is a :class:`BadRecord`, so one bad file never stops a build. Under ``header`` a remote image may have been read
    in part (its first bytes, :func:`packer.io.fs.prefetch`): whatever PIL says of a part -- a header cut short -- the
    whole is read and probed again, so a part never gives an answer the whole would not."""
    from PIL import Image, UnidentifiedImageError

    part = False
    try:
        opened, part = open_header(path) if check == "header" else (open_binary(path), False)
        with opened as f, Image.open(f) as img:
            width, height = img.size
            fmt = img.format or "unknown"
            if check == "decode":
                img.load()
            if _orientation(img, decoded=check == "decode") in TRANSPOSING_ORIENTATIONS:
                width, height = height, width
            if check == "verify":
                img.verify()
    except FileNotFoundError:
        raise BadRecord("missing_image", f"image file {path!r} not found") from None
    except UnidentifiedImageError:
        if part:  # cut before PIL could tell its format
            drop_header(path)
            return probe_image(path, check)
        raise BadRecord("corrupt_image", f"{path!r} is not an image PIL can read") from None
    except Image.DecompressionBombError as e:
        raise BadRecord("corrupt_image", f"{path!r} is implausibly large ({e}); if it is real, raise "
                                         f"PIL.Image.MAX_IMAGE_PIXELS in the build process") from None
    except MemoryError:
        raise
    except Exception as e:  # noqa: BLE001 -- PIL reports damage as OSError, SyntaxError, ValueError, struct.error, ...
        if part:
            drop_header(path)
            return probe_image(path, check)
        raise BadRecord("corrupt_image", f"{path!r} is damaged or truncated: {type(e).__name__}: {e}") from None
    if width < 1 or height < 1:
        raise BadRecord("corrupt_image", f"{path!r} has size {width}x{height}")
    return ImageInfo(height, width, fmt)


def _orientation(img, *, decoded: bool) -> int:
    """The EXIF orientation ``ImageOps.exif_transpose`` would apply (1 when none).

    ``Image.Image.getexif`` reads the metadata PIL found while opening (EXIF, or XMP's
    tiff:Orientation) without decoding; PNG's own ``getexif`` would decode the pixels to
    look for late chunks, so it is only used once the image is decoded anyway."""
    from PIL import Image

    exif = img.getexif() if decoded else Image.Image.getexif(img)
    value = exif.get(ORIENTATION_TAG, 1)
    return value if isinstance(value, int) else 1


def probe_audio(path: str) -> AudioInfo:
    """Frames, rate, channels and format of the audio at ``path``; any failure soundfile
    reports -- libsndfile errors, and the ValueError / TypeError / SystemError its MP3
    and OGG decoders raise on damaged frames -- is a :class:`BadRecord`."""
    import soundfile as sf

    try:
        with open_binary(path) as raw, sf.SoundFile(raw) as f:
            frames, rate, channels, fmt = f.frames, f.samplerate, f.channels, f.format
            if frames > 0:
                f.seek(frames - 1)
                if len(f.read(1)) != 1:
                    raise BadRecord("corrupt_audio", f"{path!r} is truncated: its header promises {frames} frames")
            if frames > 0 and rate > 0:
                check_audio(frames, rate, channels, repr(path))  # the header's claims; one frame read, none decoded
    except FileNotFoundError:
        raise BadRecord("missing_audio", f"audio file {path!r} not found") from None
    except BadRecord:
        raise
    except MemoryError:
        raise
    except Exception as e:  # noqa: BLE001 -- LibsndfileError, RuntimeError, OSError, ValueError, TypeError, SystemError, ...
        raise BadRecord("corrupt_audio", f"{path!r} is not audio soundfile can read: {type(e).__name__}: {e}") from None
    if frames < 1 or rate < 1:
        raise BadRecord("corrupt_audio", f"{path!r} holds no audio ({frames} frames at {rate} Hz)")
    return AudioInfo(frames, rate, channels, fmt)
