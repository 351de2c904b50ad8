"""Pipeline files and the three layers: packer defaults < pipeline TOML (pipelines/*.toml) < command-line flags.

A pipeline file's keys are :class:`~packer.config.fields.BuildConfig`'s field names, plus ``[[sources]]`` tables
(an input with its weight, cap and own packing, written as the ``FILE#key=value,...`` entry
:mod:`packer.config.sources` parses). Paths in a pipeline file are relative to the file's folder.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from packer.config.fields import FIELDS, BuildConfig
from packer.config.sources import POLICY, SEPARATOR
from packer.errors import ConfigError

DEFAULT_PIPELINE = Path("pipelines/sample.toml")


def load_pipeline(path: str | Path) -> dict[str, Any]:
    """Read a pipeline TOML into a dict of known keys (types checked by :func:`resolve`)."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"pipeline file {str(path)!r} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    unknown = sorted(set(data) - set(FIELDS) - {"sources"})
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {', '.join(unknown)}; known keys: {', '.join(FIELDS)}, sources")
    if "sources" in data:  # [[sources]] tables: more inputs, each with a weight and a cap
        tables = data.pop("sources")
        data["input"] = [*_as_list(data.get("input", [])), *(_source_spec(path, t) for t in tables)]
    return _relative_to(data, path.parent)


def _as_list(value: Any) -> list:
    return [value] if isinstance(value, str) else list(value)


def _source_spec(path: Path, table: Any) -> str:
    """``{input = "a.jsonl", weight = 3, cap = 1000}`` -> ``"a.jsonl#weight=3.0,cap=1000"``."""
    known = {"input", "weight", "cap", "format", "columns", *POLICY}
    if not isinstance(table, dict) or not isinstance(table.get("input"), str) or set(table) - known:
        raise ConfigError(f"{path}: each [[sources]] table needs input = \"FILE\" and may hold weight, cap and its own "
                          f"packing ({', '.join(POLICY)}), got {table!r}")
    params = []
    for k in ("format", "weight", "cap", *POLICY):
        if k not in table:
            continue
        text = str(table[k]).lower() if isinstance(table[k], bool) else str(table[k])
        if any(c in text for c in ",=#"):  # "split,packing=false" would set packing too: a value is its key's only
            raise ConfigError(f"{path}: [[sources]] input {table['input']!r}: {k} = {table[k]!r} is not one value of {k} "
                              f"(',', '=' and '#' separate options); give each option its own key in the table")
        params.append(f"{k}={text}")
    if "columns" in table:  # {messages = "conversations", images = "image_list"}, last: its pairs run to the end
        columns = table["columns"]
        if not isinstance(columns, dict) or not columns or not all(
                isinstance(v, str) and v and not any(c in v + k for c in ",=#") for k, v in columns.items()):
            raise ConfigError(f"{path}: [[sources]] input {table['input']!r}: columns must be a table of record field = "
                              f"\"column\" (columns = {{messages = \"conversations\", images = \"image_list\"}}), got "
                              f"{columns!r}")
        params.append("columns=" + ",".join(f"{k}={v}" for k, v in columns.items()))
    if params or SEPARATOR in table["input"]:  # a table's input is a path whole: a '#' in it is the file's name
        return f"{table['input']}{SEPARATOR}{','.join(params)}"
    return table["input"]


PATH_KEYS = ("input", "output", "media_root", "staging_dir")  # paths in a pipeline file: relative to the file


def _relative_to(data: dict[str, Any], folder: Path) -> dict[str, Any]:
    """Paths written in a pipeline file are relative to the file's folder, wherever packer
    runs; they are shown relative to the current folder when inside it. ``tokenizer`` is
    a path only when that folder holds it (else a hub name), and so is ``processor``."""

    def place(value: Any, must_exist: bool = False) -> Any:
        if not isinstance(value, str) or not value or "://" in value or Path(value).is_absolute():
            return value
        joined = folder / value
        if must_exist and not joined.exists():
            return value
        absolute = Path(os.path.abspath(joined))
        try:
            return str(absolute.relative_to(Path.cwd()))
        except ValueError:
            return str(absolute)

    out = dict(data)
    for key in PATH_KEYS:
        if key in out:
            out[key] = [place(v) for v in out[key]] if isinstance(out[key], list) else place(out[key])
    for key in ("tokenizer", "processor", "cost_model"):  # a path when the pipeline's folder holds it, else a name
        if key in out:
            out[key] = place(out[key], must_exist=True)
    if isinstance(out.get("chat_template"), str) and out["chat_template"].endswith(".jinja"):
        out["chat_template"] = place(out["chat_template"])
    return out


def resolve(pipeline: str | Path | None = None, **overrides: Any) -> BuildConfig:
    """Defaults < pipeline file < overrides (``None`` values in overrides are ignored)."""
    values: dict[str, Any] = {}
    if pipeline is not None:
        values.update(load_pipeline(pipeline))
    unknown = sorted(set(overrides) - set(FIELDS))
    if unknown:
        raise ConfigError(f"unknown option(s) {', '.join(unknown)}")
    values.update({k: v for k, v in overrides.items() if v is not None})
    return BuildConfig(**{k: _coerce(k, v) for k, v in values.items()})


def _coerce(key: str, value: Any) -> Any:
    default = FIELDS[key].default
    if FIELDS[key].type == "tuple[int, ...]":
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise ConfigError(f"{key} must be a list of integers, got {value!r}")
        return tuple(value)
    if isinstance(default, tuple):
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{key} must be a list of strings, got {value!r}")
        return tuple(value)
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false, got {value!r}")
        return value
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key} must be a number, got {value!r}")
        return float(value)
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key} must be an integer, got {value!r}")
        return value
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"{key} must be a string, got {value!r}")
    return value
