"""Loading media the way the HF processors expect it: one convention for build and train.

Counting (:mod:`packer.media.probe`, at build time) and loading (the loader's media
step, at train time) must agree on what an image or a clip *is*, or the model raises
"image features and image tokens do not match" (or, worse, gets a transposed mRoPE grid
and says nothing). Both follow transformers' own loaders:

- :func:`load_image` = ``transformers.image_utils.load_image``: EXIF orientation applied
  (``ImageOps.exif_transpose``), then ``convert("RGB")`` (CMYK, 16-bit, palette +
  transparency and the first frame of an animation all become 8-bit RGB).
- :func:`load_audio` = ``transformers.audio_utils.load_audio(backend="soundfile")``
  (= ``librosa.load``): soundfile decode, channels averaged to mono, ``soxr_hq``
  resampling, padded / trimmed to ``ceil(samples * rate / source_rate)`` -- the length
  the audio token policies count with.

Paths may be local or fsspec URLs.
"""

from __future__ import annotations

import math

import numpy as np

from packer.io.fs import open_binary


def load_image(path: str):
    """The upright RGB ``PIL.Image`` of ``path``."""
    from PIL import Image, ImageOps

    with open_binary(path) as f, Image.open(f) as img:
        upright = ImageOps.exif_transpose(img)
        return upright.convert("RGB")


class MediaLoadError(ValueError):
    """A media file that cannot be loaded at train time: names the file, the stored ref and the cause."""

    def __init__(self, kind: str, path: str, ref: str, cause: BaseException):
        self.path = path
        super().__init__(f"{kind} file {path} (ref {ref!r}) cannot be loaded: {type(cause).__name__}: {cause}. It may have "
                         f"changed since the build: packer verify --media OUT checks every media file of a build")


RESAMPLE_MARGIN_S = 1.0  # read past a cut: soxr_hq's output up to the cut is then bit-identical to the whole file's


def load_audio(path: str, sampling_rate: int, max_seconds: float | None = None) -> np.ndarray:
    """Mono float32 samples of ``path`` at ``sampling_rate``; with ``max_seconds``, only its first
    ``ceil(max_seconds * sampling_rate)`` samples (what a Whisper feature extractor keeps of a clip:
    30 s), equal to the whole file's first samples but without decoding the rest -- a 1 MB FLAC of
    silence can hold hours. The header is held to :mod:`packer.media.limits` first (a rate of
    1 Hz resamples 32 KB into 2 GB): ``ValueError`` naming the file."""
    import soundfile as sf

    from packer.errors import BadRecord
    from packer.media.limits import check_audio

    with open_binary(path) as raw, sf.SoundFile(raw) as f:
        source_rate = f.samplerate
        try:
            check_audio(f.frames, source_rate, f.channels, str(path))
        except BadRecord as e:
            raise ValueError(f"{e.detail}; packer verify --media OUT checks every media file of a build") from None
        frames = -1 if max_seconds is None else math.ceil((max_seconds + RESAMPLE_MARGIN_S) * source_rate)
        wave = f.read(frames, dtype="float32", always_2d=True).T
    wave = wave.mean(axis=0) if wave.shape[0] > 1 else wave[0]
    if source_rate != sampling_rate:
        from packer.media.deps import require

        soxr = require("soxr")  # missing: a ConfigError naming the install line
        n = math.ceil(wave.shape[-1] * sampling_rate / source_rate)
        wave = soxr.resample(wave, source_rate, sampling_rate, quality="soxr_hq")
        wave = np.pad(wave, (0, max(0, n - len(wave))))[:n]
    if max_seconds is not None:
        wave = wave[: math.ceil(max_seconds * sampling_rate)]
    return np.ascontiguousarray(wave, dtype=np.float32)
