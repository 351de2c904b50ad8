"""Source specs: one ``input`` entry, its weight and cap, and its own packing.

A source is one ``--input`` entry (a file or a glob) with an optional weight and cap, and optionally its own
packing (``max_length``, ``packing``, ``oversize``, media caps: :data:`POLICY`)::

    -i 'data/chat.jsonl#weight=3'            every record three times (a repeat factor)
    -i 'data/web/*.jsonl#weight=0.2'         a fifth of the records, chosen with --seed
    -i 'data/ocr.jsonl#weight=2,cap=50000'   two copies each, at most 50,000 samples in all

or, in a pipeline file, ``[[sources]]`` tables (``input``, ``weight``, ``cap``). A weight
``w`` gives each sample ``floor(w)`` copies plus one more with probability ``w - floor(w)``
(InternVL's repeat factor; ms-swift's ``#N`` is a cap); a cap then keeps a seeded random
subset of the source's copies. Stage 1 encodes every record once; mixing happens when
planning, from the seed, so the same inputs and settings give the same rows (the seeded copy:
:func:`packer.stages.mix.mix`).

Accounting per input file: every record read is packed, quarantined, dropped, or
*skipped* by the mix (0 copies); extra copies are counted as *repeated*.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from packer.errors import ConfigError

SEPARATOR = "#"
# A weight repeats each record up to ceil(weight) times; only the ratios between sources matter to a mix, so a larger
# repeat factor is better written as smaller weights of the other sources (a weight of 1e7 tried to hold 10^7 copies
# of every record). The mix's copies together are bounded too (:data:`packer.stages.mix.MAX_COPIES`), once the
# records are counted.
MAX_WEIGHT = 1000.0


# A source's own packing policy: these build options, set per input, override the build's for its samples
POLICY = {"max_length": int, "packing": bool, "oversize": str, "max_media": int, "max_images": int, "max_audio": int,
          "max_videos": int}
OVERSIZE = ("truncate", "drop", "split")  # the build's own --oversize policies (BuildConfig.oversize's choices)
# The least value of each whole-number packing option, the build's and a source's own alike: stated once, checked for
# the build's by BuildConfig.__post_init__ and for a source's by Source.parse (a row holds a token; a media cap of 0 is
# no limit)
LEAST = {"max_length": 1, **{k: 0 for k in POLICY if k.startswith("max_") and k != "max_length"}}


# How a source's files are read (``format=``; auto: from each file's name, :func:`packer.ingest.units.detect`)
INPUT_FORMATS = ("auto", "jsonl", "parquet", "arrow", "webdataset")
# The record fields a column mapping may fill (``columns=messages=conversations,images=image_list``): the names the
# record shapes read (packer.ingest.formats), so a mapping's target is checked when the source is parsed
FIELDS = ("id", "messages", "conversations", "images", "image", "audios", "audio", "videos", "video", "text", "texts",
          "prompt", "completion", "chosen", "rejected", "label", "responses", "system", "tools", "instruction", "input",
          "output", "history")


@dataclass(frozen=True)
class Source:
    pattern: str
    weight: float = 1.0
    cap: int = 0  # 0: no cap
    policy: tuple[tuple[str, object], ...] = ()  # (option, value) of POLICY, sorted: this source's own packing
    format: str = "auto"  # how its files are read: INPUT_FORMATS
    columns: tuple[tuple[str, str], ...] = ()  # (record field, column it is read from), in the order given

    @property
    def reading(self) -> tuple[str, tuple[tuple[str, str], ...]]:
        """How the source's files are read (format and column mapping): two sources naming one file must agree."""
        return self.format, self.columns

    @property
    def mixed(self) -> bool:
        return self.weight != 1.0 or self.cap > 0

    def options(self) -> dict[str, object]:
        """The build options this source's samples are planned with instead of the build's (``packing = false``:
        ``max_segments = 1``, each sample a row of its own)."""
        out = dict(self.policy)
        if out.pop("packing", True) is False:
            out["max_segments"] = 1
        return out

    def mixing_spec(self) -> str:
        """This source as an ``input`` entry with its weight and cap only (its own packing left out)."""
        return f"{self.pattern}{SEPARATOR}weight={self.weight!r},cap={self.cap}"

    @classmethod
    def parse(cls, spec: str) -> Source:
        """``FILE#key=value,...``: the options after the last ``#``. A file whose name holds a ``#`` is ``FILE#``
        (nothing after the last ``#``: no option), which :class:`packer.config.BuildConfig` writes for an input
        that names an existing file whole (:func:`whole_file`)."""
        pattern, sep, params = spec.rpartition(SEPARATOR) if SEPARATOR in spec else (spec, "", "")
        if not sep:
            return cls(spec)
        values: dict[str, object] = {}
        columns: list[tuple[str, str]] = []
        mapping = False  # after columns=: items field=column until an option
        for item in filter(None, params.split(",")):
            key, eq, value = item.partition("=")
            if key == "columns" or (mapping and eq and key not in ALLOWED):
                columns.append(_mapping(spec, value if key == "columns" else item))
                mapping = True
                continue
            mapping = False
            if not eq or key not in ALLOWED:
                raise ConfigError(f"input {spec!r}: {item!r} after '#' is not an option; give weight=W, cap=N and this "
                                  f"source's own packing ({', '.join(f'{k}=...' for k in POLICY)}; e.g. "
                                  f"'video.jsonl#max_length=16384,packing=false'); a file whose name holds a '#' is "
                                  f"written with one more '#' at its end ({pattern + SEPARATOR + params + SEPARATOR!r})")
            if key in values:
                raise ConfigError(f"input {spec!r}: {key} is given twice")
            try:
                values[key] = _value(key, value)
            except (ValueError, OverflowError):
                raise ConfigError(f"input {spec!r}: {key} = {value!r} is not {ALLOWED[key]}") from None
        for key, v in values.items():
            if not _allowed(key, v):
                raise ConfigError(f"input {spec!r}: {key} = {v!r} is not {ALLOWED[key]}")
        policy = tuple(sorted((k, v) for k, v in values.items() if k in POLICY))
        if len({f for f, _ in columns}) != len(columns):
            raise ConfigError(f"input {spec!r}: columns maps one record field twice")
        return cls(pattern, float(values.get("weight", 1.0)), int(values.get("cap", 0)), policy,
                   str(values.get("format", "auto")), tuple(columns))


def _mapping(spec: str, item: str) -> tuple[str, str]:
    """``messages=conversations``: the record field ``messages`` read from the column ``conversations``."""
    field, eq, column = item.partition("=")
    if not eq or field not in FIELDS or not column:
        raise ConfigError(f"input {spec!r}: columns takes FIELD=COLUMN pairs (messages=conversations,images=image_list), "
                          f"FIELD one of {', '.join(FIELDS)}; got {item!r}")
    return field, column


# What each option after the '#' takes (the build's own checks: its max_length over every source's, the
# algorithm's constraints, are BuildConfig's and check_plan_options')
ALLOWED = {"format": f"one of {', '.join(INPUT_FORMATS)}",
           "weight": f"a number from 0 to {MAX_WEIGHT:g} (only the ratios between sources matter: lower the other "
                     f"sources' weights instead)", "cap": "a whole number >= 0 (0: no cap)",
           "max_length": f"a whole number >= {LEAST['max_length']} (at most the build's max_length)",
           "packing": "true or false", "oversize": f"one of {', '.join(OVERSIZE)}",
           **{k: f"a whole number >= {n} (0: no limit)" for k, n in LEAST.items() if k != "max_length"}}


def _allowed(key: str, value: object) -> bool:
    if key == "format":
        return value in INPUT_FORMATS
    if key == "oversize":
        return value in OVERSIZE
    if key == "packing":
        return isinstance(value, bool)
    if key == "weight":
        return 0 <= value <= MAX_WEIGHT  # type: ignore[operator]  # nan and inf fail too
    return value >= LEAST.get(key, 0)  # type: ignore[operator]  # cap: 0 or more


def policy_text(policy: dict[str, object]) -> str:
    """``max_length=4096, packing=false``: a source's own packing as it is written after the ``#``."""
    return ", ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in policy.items())


def capacity_text(max_length: int, groups: list[dict]) -> str:
    """What a fill is of: ``8,192 tokens per row``, or where source groups have their own ``max_length``, each
    row's own capacity with the rows of each (``4 rows of 2,048, 9 of 4,096``)."""
    rows: dict[int, int] = {}
    for g in groups:
        rows[int(g["capacity"])] = rows.get(int(g["capacity"]), 0) + int(g["rows"])
    if len(rows) < 2:
        return f"{next(iter(rows), max_length):,} tokens per row"
    listed = ", ".join(f"{n:,}{' rows' if k == 0 else ''} of {c:,}" for k, (c, n) in enumerate(sorted(rows.items())))
    return f"each row's own max_length ({listed})"


def _value(key: str, value: str) -> object:
    if key == "format":
        return value
    if key == "weight":
        return float(value)
    kind = POLICY.get(key, int)
    if kind is bool:
        if value.lower() not in ("true", "false"):
            raise ValueError
        return value.lower() == "true"
    return value if kind is str else int(value)


def whole_file(spec: str) -> str:
    """An ``input`` entry that names an existing local file whole, though its name holds a ``#`` (``a#b.jsonl``), is
    that file: written ``a#b.jsonl#`` (no option after the last ``#``), so it reads the same once the file is gone
    (a manifest's config, a repack). Any other entry is kept: its options follow its last ``#``."""
    if SEPARATOR not in spec or "://" in spec or not Path(spec).is_file():
        return spec
    return spec + SEPARATOR


def settings_text(source) -> str:
    """A source's weight, cap and own packing as the ``#`` options that set them (``weight=2, packing=false``)."""
    mixing = {"weight": f"{source.weight:g}", "cap": source.cap} if source.mixed else {}
    reading = {"format": source.format} if source.format != "auto" else {}
    if source.columns:
        reading["columns"] = ",".join(f"{f}={c}" for f, c in source.columns)
    return policy_text({**mixing, **dict(source.policy), **reading}) or "the build's"
