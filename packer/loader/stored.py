"""Stored image embeddings and audio features, read back by media ref at train time.

A build run with ``--image-embeddings`` / ``--audio-features`` holds one row per distinct
media file in ``OUT/embeddings/*.arrow`` / ``OUT/audio_features/*.arrow``, listed in
``manifest.json`` under ``embeddings.files`` / ``audio_features.files``. The trainer
looks them up by the ``ref`` of a media span::

    emb = StoredFeatures("out/llava", "embeddings")
    span = row["media"][0]                       # {"kind": "image", "ref": "cat.png", ...}
    x = emb[span["ref"]]                         # float16 [577, 1024] (ViT-L-14-336, layer -2)

    mel = StoredFeatures("out/qwen2audio", "audio_features")
    feats = mel["clip.wav"]                      # float32 [128, 3000]
    n = mel.valid_frames("clip.wav")             # attention_mask.sum() -> feature_attention_mask

Arrays are read-only views of the memory-mapped shards (copy one to write into it). Only
the build's path crosses into DataLoader workers (``__getstate__``); each worker maps
the shards on first use, as :mod:`packer.loader.dataset` does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from packer.shards.io import read_shard
from packer.shards.manifest import Manifest

SECTIONS = {"embeddings": "--image-embeddings MODEL[:PRETRAINED]", "audio_features": "--audio-features whisper"}


class StoredFeatures:
    """``ref -> np.ndarray`` (the stored shape and dtype) over one section of a build."""

    def __init__(self, out: str | Path, section: str):
        if section not in SECTIONS:
            raise ValueError(f"section must be one of {', '.join(SECTIONS)}, got {section!r}")
        self.out = Path(out)
        self.section = section
        manifest = Manifest.read(self.out)  # raises SchemaVersionError on an unknown version
        if section not in manifest.sections:
            raise KeyError(f"{self.out} holds no stored {section}: its manifest has no {section!r} section; "
                           f"build it with {SECTIONS[section]}")
        self.info: dict[str, Any] = {k: v for k, v in manifest.sections[section].items() if k != "files"}
        self.files = [e.file for e in manifest.section_files(section)]
        self._tables: dict[int, pa.Table] = {}
        self._index: dict[str, tuple[int, int]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_tables"], state["_index"] = {}, None
        return state

    def _table(self, k: int) -> pa.Table:
        if k not in self._tables:
            self._tables[k] = read_shard(self.out / self.files[k])
        return self._tables[k]

    @property
    def index(self) -> dict[str, tuple[int, int]]:
        """ref -> (shard, row), read from the shards' ``ref`` columns on first use."""
        if self._index is None:
            self._index = {ref: (k, i) for k in range(len(self.files))
                           for i, ref in enumerate(self._table(k).column("ref").to_pylist())}
        return self._index

    def __len__(self) -> int:
        return len(self.index)

    def __contains__(self, ref: object) -> bool:
        return ref in self.index

    def __iter__(self):
        return iter(self.index)

    def _row(self, ref: str) -> tuple[pa.Table, int]:
        try:
            k, i = self.index[ref]
        except KeyError:
            raise KeyError(f"{ref!r} has no stored {self.section} in {self.out} ({len(self.index)} refs stored); "
                           f"refs are the media paths as written in the records") from None
        return self._table(k), i

    def __getitem__(self, ref: str) -> np.ndarray:
        table, i = self._row(ref)
        shape = table.column("shape")[i].as_py()
        values = table.column("values")[i].values.to_numpy(zero_copy_only=True)
        return values.reshape(shape)

    def valid_frames(self, ref: str) -> int:
        """Audio: the frames that hold the clip (what ``WhisperFeatureExtractor``'s
        attention mask sums to); the rest of the 3000 is padding."""
        table, i = self._row(ref)
        if "valid_frames" not in table.column_names:
            raise KeyError(f"{self.section} in {self.out} store no valid_frames (only audio_features do)")
        return int(table.column("valid_frames")[i].as_py())

    def attention_mask(self, ref: str) -> np.ndarray:
        """Audio: ``feature_attention_mask`` of one clip, int32 ``[frames]`` (1 then 0)."""
        frames = self[ref].shape[-1]
        mask = np.zeros(frames, dtype=np.int32)
        mask[: self.valid_frames(ref)] = 1
        return mask
