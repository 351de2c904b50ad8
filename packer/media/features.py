"""Optional: log-mel features for every audio clip, computed once and stored.

``--audio-features log-mel[:n_mels=128]``: decoded with soundfile (mixed to mono),
resampled to 16 kHz with torchaudio, then Whisper's recipe -- 25 ms windows every
10 ms (n_fft 400, hop 160), power mel spectrogram, log10, floor at max - 8, (x + 4) / 4.
Stored float16 as ``[n_mels, frames]``, flattened, with the shape beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from packer.errors import ConfigError, PackerError


@dataclass(frozen=True)
class FeatureSpec:
    kind: str = "log-mel"
    n_mels: int = 80
    sample_rate: int = 16000
    n_fft: int = 400
    hop_length: int = 160

    @classmethod
    def parse(cls, spec: str) -> FeatureSpec:
        kind, _, params = spec.partition(":")
        if kind != "log-mel":
            raise ConfigError(f"unknown audio features {kind!r}; known: log-mel")
        kwargs = {}
        for item in filter(None, params.split(",")):
            key, _, value = item.partition("=")
            if key not in ("n_mels", "sample_rate", "n_fft", "hop_length"):
                raise ConfigError(f"log-mel: unknown parameter {key!r}")
            kwargs[key] = int(value)
        return cls(kind, **kwargs)


class LogMel:
    def __init__(self, spec: FeatureSpec):
        try:
            import torch
            import torchaudio
        except ImportError:
            raise PackerError("--audio-features needs torch and torchaudio") from None
        self.spec, self.torch = spec, torch
        self.resample = torchaudio.functional.resample
        self.mel = torchaudio.transforms.MelSpectrogram(sample_rate=spec.sample_rate, n_fft=spec.n_fft,
                                                        hop_length=spec.hop_length, n_mels=spec.n_mels, power=2.0)

    def describe(self) -> dict[str, Any]:
        return {"kind": self.spec.kind, "n_mels": self.spec.n_mels, "sample_rate": self.spec.sample_rate,
                "n_fft": self.spec.n_fft, "hop_length": self.spec.hop_length, "dtype": "float16", "layout": "n_mels x frames"}

    def features(self, path: str) -> np.ndarray:
        import soundfile as sf

        wave, rate = sf.read(path, dtype="float32", always_2d=True)
        x = self.torch.from_numpy(wave.mean(axis=1))
        if rate != self.spec.sample_rate:
            x = self.resample(x, rate, self.spec.sample_rate)
        spec = self.mel(x)[:, :-1]  # Whisper drops the last frame
        log = self.torch.clamp(spec, min=1e-10).log10()
        log = self.torch.maximum(log, log.max() - 8.0)
        return ((log + 4.0) / 4.0).numpy().astype(np.float16)
