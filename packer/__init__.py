"""packer: offline packing of multimodal LLM training data into Arrow shards.

``import packer`` is deliberately cheap: it imports nothing heavy. Where things live:

- ``packer.build`` runs a build (stages in ``packer.stages``, run on an engine from
  ``packer.engine``); ``packer.pack`` is the pure planner; ``packer.media`` counts and
  loads images and audio; ``packer.encode`` / ``packer.ingest`` read and tokenize records.
- ``packer.shards`` is the on-disk format (schemas, shard reader / writer, the typed
  ``Manifest``, row statistics): what the loader, ``packer.report``, ``packer.summary``
  and ``packer.verify`` read.
- ``packer.loader`` (imports torch) turns a build into batches for a trainer.
"""

DISTRIBUTION = "packer-multimodal"  # the name on the package index (``packer`` there is another project)


def _version() -> str:
    """The version ``pyproject.toml`` states, from the installed metadata; from the file itself in a
    source checkout that is not installed (``PYTHONPATH=.``)."""
    from importlib import metadata
    from pathlib import Path

    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
        try:
            import tomllib

            return str(tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["version"])
        except (OSError, ValueError, KeyError):
            return "0+unknown"


def __getattr__(name: str):
    if name == "__version__":  # computed on first use: importlib.metadata costs ~20 ms that `import packer` need not pay
        global __version__
        __version__ = _version()
        return __version__
    raise AttributeError(f"module 'packer' has no attribute {name!r}")
