"""Optional: Whisper log-mel features for every audio clip, computed once and stored.

``--audio-features whisper[:feature_size=128]`` stores exactly what the model's own
feature extractor gives the audio tower::

    WhisperFeatureExtractor(feature_size=N)(audio_16k, sampling_rate=16000,
                                            padding="max_length", return_attention_mask=True)

``input_features[0]`` as ``[N, 3000]`` float32 (30 s padded; longer clips cut at 30 s, as
the extractor does) and ``valid_frames`` = ``attention_mask.sum()`` beside it, what
Qwen2-Audio's ``feature_attention_mask`` holds and its token count derives from. N = 128
for Qwen2-Audio and Whisper large-v3, 80 for the other Whisper sizes. The clip is read
with :func:`packer.media.load.load_audio` (mono mean, resampled to 16 kHz), the
convention the token counts were made with. The extractor itself computes the features,
so they equal the HF ones by construction, whichever of its numpy / torch paths it takes.

``log-mel`` (an HTK mel, no Slaney norm, 80 bins, unpadded) was not Whisper's feature and
is gone; asking for it fails with a :class:`ConfigError` naming ``whisper``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from packer.errors import PackerError
from packer.media.feature_specs import FeatureSpec

SAMPLING_RATE = 16000
HOP_LENGTH = 160
N_FFT = 400
CHUNK_SECONDS = 30


class WhisperFeatures:
    """``features(path) -> (input_features [N, 3000] float32, valid_frames)``."""

    def __init__(self, spec: FeatureSpec):
        try:
            from transformers import WhisperFeatureExtractor
        except ImportError:
            raise PackerError("--audio-features whisper needs transformers: pip install transformers") from None
        from packer.media.deps import require

        require("soxr")  # the clips are resampled to 16 kHz: refused before any record is read, not at the first clip
        self.spec = spec
        self.extractor = WhisperFeatureExtractor(feature_size=spec.feature_size, sampling_rate=SAMPLING_RATE,
                                                 hop_length=HOP_LENGTH, n_fft=N_FFT, chunk_length=CHUNK_SECONDS)

    def describe(self) -> dict[str, Any]:
        import transformers

        return {"kind": self.spec.kind, "feature_size": self.spec.feature_size, "sampling_rate": SAMPLING_RATE,
                "n_fft": N_FFT, "hop_length": HOP_LENGTH, "frames": self.extractor.nb_max_frames, "dtype": "float32",
                "layout": "feature_size x frames (padded to 30 s); valid_frames = attention_mask.sum()",
                "extractor": f"transformers {transformers.__version__} WhisperFeatureExtractor"}

    def features(self, path: str) -> tuple[np.ndarray, int]:
        from packer.media.load import load_audio

        wave = load_audio(path, SAMPLING_RATE, max_seconds=CHUNK_SECONDS)  # the extractor keeps 30 s
        out = self.extractor(wave, sampling_rate=SAMPLING_RATE, padding="max_length", return_attention_mask=True,
                             return_tensors="np")
        return np.asarray(out["input_features"][0], dtype=np.float32), int(np.asarray(out["attention_mask"][0]).sum())


