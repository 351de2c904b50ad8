"""One parser for the ``name[:key=value,...]`` spec strings of the config.

``--image-tokens dynamic:max_pixels=1003520``, ``--audio-tokens whisper:windows=one`` and
``--audio-features whisper:feature_size=128`` all name a kind and set some fields of the
frozen dataclass that kind stands for. :func:`parse_spec` splits the string, checks the
name against the known kinds and every key against the dataclass's fields, and converts
each value to the field's type (that of its default: bool, int, float or str). Every
mistake is a :class:`~packer.errors.ConfigError` in one style::

    unknown image token policy 'square'; known: anyres, dynamic, fixed
    image token policy dynamic: unknown parameter 'max_pix'; known: patch_size, merge_size, ...
    dynamic.max_pixels = 'lots' is not a valid int
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from packer.errors import ConfigError

TRUE, FALSE = ("true", "1", "yes"), ("false", "0", "no")


def parse_spec(spec: str, kinds: Mapping[str, type], *, what: str, exclude: Iterable[str] = ()) -> tuple[str, dict[str, Any]]:
    """Split ``name[:key=value,...]`` into the kind's name and its keyword arguments.

    ``kinds`` maps each known name to its dataclass; ``what`` names the spec in errors
    (``"image token policy"``); ``exclude`` lists fields a spec may not set."""
    name, _, params = spec.strip().partition(":")
    name = name.strip()
    if name not in kinds:
        raise ConfigError(f"unknown {what} {name!r}; known: {', '.join(sorted(kinds)) or 'none'}")
    return name, parse_params(name, params, kinds[name], what=what, exclude=exclude)


def parse_params(name: str, params: str, cls: type, *, what: str, exclude: Iterable[str] = ()) -> dict[str, Any]:
    """``key=value,...`` checked against the init fields of dataclass ``cls`` and converted."""
    skip = set(exclude)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init and f.name not in skip}
    known = ", ".join(fields) or "none"
    kwargs: dict[str, Any] = {}
    for item in (s.strip() for s in params.split(",")):
        if not item:
            continue
        key, eq, value = (s.strip() for s in item.partition("="))
        if key not in fields:
            raise ConfigError(f"{what} {name}: unknown parameter {key!r}; known: {known}")
        if not eq:
            raise ConfigError(f"{what} {name}: parameter {key!r} has no value; write {name}:{key}=VALUE")
        if key in kwargs:
            raise ConfigError(f"{what} {name}: parameter {key!r} is given twice; give it once")
        kwargs[key] = convert(fields[key].default, value, f"{name}.{key}")
    return kwargs


def convert(default: Any, value: str, where: str) -> Any:
    """``value`` as the type of ``default`` (bool, int, float; anything else stays a string)."""
    if isinstance(default, bool):
        if value.lower() in TRUE:
            return True
        if value.lower() in FALSE:
            return False
        raise ConfigError(f"{where} = {value!r} is not a valid bool; use true or false")
    for kind in (int, float):
        if isinstance(default, kind):
            try:
                return kind(value)
            except ValueError:
                raise ConfigError(f"{where} = {value!r} is not a valid {kind.__name__}; give a number "
                                  f"({where.rsplit('.', 1)[-1]}={default})") from None
    return value
