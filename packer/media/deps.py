"""The optional packages media need, imported where they are used; one that is missing is a configuration error.

PyAV reads video files (their headers at build time, their frames at train time) and soxr resamples audio
(``--audio-features``, the loader's clips); neither is in the build layer (``requirements-demo.lock``). Left to an
``import`` inside a per-record ``try``, a missing package looked like a damaged file: every video quarantined as
``corrupt_video`` ("re-encode them"), exit 0, the cause only in quarantine.jsonl. :func:`require` raises
:class:`~packer.errors.ConfigError` instead (exit 2, the install line): a build stops at its first video file, a
:class:`PackerError` that no record's ``try`` quarantines.

    >>> require("av")                                               # doctest: +SKIP
    ConfigError: reading video files (...) needs the package 'av', which is not installed (...): pip install ...
"""

from __future__ import annotations

import importlib
from types import ModuleType

from packer.errors import ConfigError

# module -> (what needs it, the package's name on PyPI, the extra that installs it, another way out)
OPTIONAL = {
    "av": ("reading video files (their headers when building, their frames when loading)", "av", "video",
           "or leave video out of modalities / drop the video records"),
    "soxr": ("resampling audio (--audio-features, the loader's audio clips)", "soxr", "audio",
             "or give audio at the encoder's rate"),
}


def require(module: str) -> ModuleType:
    """``import module``; a missing one raises :class:`ConfigError` naming what needs it and its install line."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        what, package, extra, other = OPTIONAL[module]
        raise ConfigError(f"{what} needs the package {package!r}, which is not installed ({type(e).__name__}: {e}): "
                          f"pip install 'packer-multimodal[{extra}]' (or pip install {package}), {other}") from None


__all__ = ["OPTIONAL", "require"]
