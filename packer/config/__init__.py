"""The build configuration, low in the house: it imports only :mod:`packer.errors`, :mod:`packer.specs`,
:mod:`packer.io` and :mod:`packer.media` (the media token policies and the media passes' specs it checks).

- :mod:`packer.config.fields`: :class:`BuildConfig` (every option, tagged with its stage and group) and the
  checks of values the config can judge alone, run when it is made.
- :mod:`packer.config.pipeline`: pipeline TOML files and :func:`resolve` (defaults < pipeline < flags).
- :mod:`packer.config.sources`: source specs (``FILE#weight=2,cap=N,max_length=...``): :class:`Source`.
- :mod:`packer.config.inputs`: the input patterns expanded into files.

The checks that need a higher floor (the family, the chat template's clock) run where a build starts:
:func:`packer.pipeline.preflight.preflight`.
"""

from packer.config.fields import (
    CONTENT_KEYS,
    EXECUTION_KEYS,
    FIELDS,
    GROUPS,
    PLAN_KEYS,
    REPACK_KEYS,
    STAGES,
    BuildConfig,
    _opt,
)
from packer.config.pipeline import DEFAULT_PIPELINE, PATH_KEYS, load_pipeline, resolve

__all__ = ["CONTENT_KEYS", "DEFAULT_PIPELINE", "EXECUTION_KEYS", "FIELDS", "GROUPS", "PATH_KEYS", "PLAN_KEYS",
           "REPACK_KEYS", "STAGES", "BuildConfig", "_opt", "load_pipeline", "resolve"]
