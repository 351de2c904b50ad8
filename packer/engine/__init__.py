"""Engines decide where a stage function runs; the stage functions are the same everywhere."""

from __future__ import annotations

from packer.errors import NotAvailableError


def get_engine(name: str, workers: int):
    if name == "local":
        from packer.engine.local import LocalEngine

        return LocalEngine(workers)
    if name == "ray":
        raise NotAvailableError("--engine ray is not available yet in this version; use --engine local")
    raise ValueError(f"unknown engine {name!r}")
