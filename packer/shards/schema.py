"""Record kinds and the Arrow schemas derived from them (schema_version 5).

One frozen dataclass per record kind. Each field carries its Arrow type in an
``Annotated`` hint, and :func:`arrow_schema` derives the file schema from the hints, so
a column is declared exactly once. Every file carries ``packer.schema_version`` and
``packer.kind`` in its schema metadata; :func:`check_schema` refuses a version this
packer does not know with :class:`~packer.errors.SchemaVersionError`.

A packed row, worked example (two segments, capacity 8)::

    segment   A: "Hi" -> [5, 9, 2]         B: <image> + "cat" -> [7, 4, 2]
    input_ids  [ 5,   9,  2,   7,    4,  2]
    labels     [-100, 9,  2, -100, -100, 2]   # first token of each segment untrained;
                                              # placeholders (7) never trained
    cu_seqlens [0, 3, 6]
    segment_ids ["chat.jsonl:1", "img-42"]       # display: the record's id, or file:line
    segment_source [0, 1]   segment_line [1, 42]   segment_start [0, 0]   # identity: input file, line, piece
    segment_modality ["text", "image"]
    segment_parent [-1, -1]   segment_group [0, 1]   segment_role ["", ""]   segment_weight [nan, nan]
    media      [{segment: 1, kind: "image", start: 3, length: 1, tokens: 1, ref: "cat.png", llm_grid: []}]
    n_tokens   6
    segment_trained [2, 1]   n_trained 3           # supervised tokens (labels != -100) per segment, per row

A preference record packed as a tree (``--preference tree``): its prompt once, then each
response as a branch whose parent is the prompt (it attends to the prompt and to itself)::

    segment_ids ["p7", "p7", "p7"]   segment_role ["prompt", "chosen", "rejected"]
    segment_parent [-1, 0, 0]   segment_group [0, 0, 0]   segment_weight [nan, nan, nan]
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass
from typing import Annotated

import numpy as np
import pyarrow as pa

from packer._ranges import csr_offsets
from packer.config.fields import MEDIA_KINDS as MEDIA_KINDS  # what a media span's ``kind`` may be (the config's)
from packer.errors import SchemaVersionError

SCHEMA_VERSION = 5  # 2: integer segment identity (segment_source / _line / _start), sample source_index;
#                    3: media spans cover a whole item (tokens, llm_grid);
#                    4: preference records: a sample's responses and shared prefix, a packed segment's
#                       parent / group / role / weight (a tree's branch attends to its parent);
#                    5: a sample's cost vector (cost_llm / cost_encoder / cost_supervised, packer.cost)
IGNORE = -100  # label of a position that is not trained (the HF / PyTorch ignore_index)
VERSION_KEY = b"packer.schema_version"
KIND_KEY = b"packer.kind"

Int32 = Annotated[int, pa.int32()]
Int64 = Annotated[int, pa.int64()]
Int64List = Annotated[tuple[int, ...], pa.list_(pa.int64())]
Str = Annotated[str, pa.string()]
Float64 = Annotated[float, pa.float64()]
Int32List = Annotated[tuple[int, ...], pa.list_(pa.int32())]
StrList = Annotated[tuple[str, ...], pa.list_(pa.string())]
Category = Annotated[str, pa.dictionary(pa.int32(), pa.string())]
CategoryList = Annotated[tuple[str, ...], pa.list_(pa.dictionary(pa.int32(), pa.string()))]


def arrow_fields(cls: type) -> list[pa.Field]:
    """The Arrow fields of a record dataclass, read from its ``Annotated`` hints."""
    hints = typing.get_type_hints(cls, include_extras=True)
    out = []
    for f in dataclasses.fields(cls):
        meta = getattr(hints[f.name], "__metadata__", ())
        if not meta or not isinstance(meta[0], pa.DataType):
            raise TypeError(f"{cls.__name__}.{f.name} has no Arrow type annotation")
        out.append(pa.field(f.name, meta[0], nullable=f.name in getattr(cls, "NULLABLE", ())))
    return out


def list_of(cls: type) -> pa.DataType:
    return pa.list_(pa.struct(arrow_fields(cls)))


@dataclass(frozen=True)
class MediaSpan:
    """One image, audio clip or video: the positions its processor's expansion occupies.

    ``start`` is the item's first placeholder, absolute within the row it is stored in (a
    sample row in ``samples/``, a packed row in ``packed/``); ``length`` runs through its last
    placeholder; ``tokens`` counts its placeholders (the features the model scatters into the
    span, in order). They differ where the family's processor writes text between runs of
    placeholders (Qwen3-VL's ``<1.5 seconds><|vision_start|>`` between a video's temporal
    groups, Llama 4's tile separators): that text is in the span, never trained, positioned as
    text. ``segment`` indexes the row's segments.

    ``llm_grid`` is (t, h, w) of the item's features in the language model's positions --
    *after* the vision tower's spatial merge: ``[1, 6, 2]`` where HF's ``image_grid_thw`` is
    ``[1, 12, 4]`` for merge 2 -- where the family's rotary positions need it, else empty; a
    run of ``k * h * w`` placeholders covers ``k`` temporal steps. ``second_per_grid_t`` is a
    video's seconds per temporal grid step (what Qwen2.5-VL's ``second_per_grid_ts`` holds;
    its time-scaled mRoPE needs it), 0.0 for every other kind. ``ref`` names the file relative
    to the build's media root (``Manifest.media_root``), or absolutely when it lies outside it
    (or a URL); the loader joins the two.
    """

    segment: Int32
    kind: Str
    start: Int32
    length: Int32
    tokens: Int32
    ref: Str
    llm_grid: Int32List = ()
    second_per_grid_t: Annotated[float, pa.float32()] = 0.0


@dataclass(frozen=True)
class ResponseSpan:
    """One response of a preference / multi-response sample: tokens ``start : start + length`` of the
    sample's responses counted whole (stored with the prompt once: :class:`Sample`) are the record's
    prompt followed by this response, rendered and tokenized as that
    conversation alone would be (its labels train the response only). ``role``: ``chosen`` /
    ``rejected``, ``desirable`` / ``undesirable``, or the response's index (``"0"``, ``"1"``, ...);
    ``weight``: its reward / weight from the record, NaN when none was given."""

    start: Int32
    length: Int32
    role: Str
    weight: Annotated[float, pa.float32()] = float("nan")


@dataclass(frozen=True)
class Sample:
    """One encoded record (stage 1 output, one row of ``samples/*.arrow``).

    ``labels`` are unshifted (HF convention: the model shifts) and already -100 on the
    first token, so no segment's first token is ever the target of the one before it.
    The sample is stored whole even when longer than ``max_length``: the oversize
    policy is applied when planning, so ``repack`` can use a longer context.

    A preference record is one sample of several responses, each its whole conversation (``responses``:
    token ranges counted as if the responses were stored whole, one after the other); the first
    ``prefix`` tokens of every response are the same tokens (the prompt they share, untrained), so
    they are stored once: ``input_ids`` / ``labels`` hold the shared prompt, then each response's
    remaining tokens, and ``media`` the prompt's spans once (:func:`packer.pack.trees.stored_ranges`,
    :func:`~packer.pack.trees.response_row`); ``length`` is the responses' tokens whole (their
    ``pairs`` length). The plan lays them out as pairs (each response whole) or as a tree
    (``prefix`` once, then each response's remaining tokens). ``prefix`` is 0 and ``responses``
    empty for every other record.

    ``cost_llm`` / ``cost_encoder`` / ``cost_supervised`` are :meth:`packer.cost.CostModel.vector` of a
    packed row holding this sample alone (:func:`packer.shards.stats.sample_stats`; the whole sample, before
    any truncation; a preference sample in its ``pairs`` layout), under the build's cost model (its
    coefficients in the manifest's ``stats.cost_model``). Stage 1 fills them once its batch of samples is a
    table (:func:`packer.stages.encode.with_costs`; a ``Sample`` built in memory holds 0.0). Three named
    float64 columns, not one list of three: any Arrow reader (polars, ``datasets``) reads each cost by name,
    and the planner takes them as they are (:func:`packer.stages.planning.plan_columns`).
    """

    key: Str
    source_file: Str
    source_index: Int32  # the input file's number in the manifest's ``inputs``
    source_line: Int64
    modality: Category
    input_ids: Int32List
    labels: Int32List
    length: Int32
    n_trained: Int32
    media: Annotated[tuple[MediaSpan, ...], list_of(MediaSpan)] = ()
    responses: Annotated[tuple[ResponseSpan, ...], list_of(ResponseSpan)] = ()
    prefix: Int32 = 0
    cost_llm: Float64 = 0.0
    cost_encoder: Float64 = 0.0
    cost_supervised: Float64 = 0.0


@dataclass(frozen=True)
class PackedRow:
    """One packed training sequence (stage 3 output, one row of ``packed/*.arrow``).

    A segment is identified by integers -- its input file's number (``segment_source``,
    an index into the manifest's ``inputs``), the line (``segment_line``) and the token
    where its piece starts (``segment_start``, 0 unless ``--oversize split`` cut the
    sample) -- so duplicate or odd ids are harmless; ``segment_ids`` is for display.

    Preference records (:mod:`packer.pack.trees`): ``segment_parent`` is the segment (of this
    row) a segment's tokens also attend to -- a tree's prompt for each of its branches, whose
    positions continue from the prompt's end -- or -1; ``segment_group`` the first segment of
    the record's segments in the row (a segment's own number for any other record), so the
    responses of one record are told apart from another copy of it; ``segment_role`` is ``""``
    for SFT records, ``prompt`` for a tree's shared prompt, else the response's role;
    ``segment_weight`` the response's reward / weight (NaN: none given).
    ``segment_trained`` / ``n_trained`` count the supervised tokens per segment and per row.
    """

    input_ids: Int32List
    labels: Int32List
    cu_seqlens: Int32List
    segment_ids: StrList
    segment_source: Int32List
    segment_line: Int64List
    segment_start: Int32List
    segment_modality: CategoryList
    segment_parent: Int32List
    segment_group: Int32List
    segment_role: CategoryList
    segment_weight: Annotated[tuple[float, ...], pa.list_(pa.float32())]
    media: Annotated[tuple[MediaSpan, ...], list_of(MediaSpan)]
    n_tokens: Int32
    # Supervised tokens (labels != -100) of each segment and of the row: the loss denominators
    # (token / sample / sqrt weights) without recounting labels, before any batch is loaded.
    segment_trained: Int32List = ()
    n_trained: Int32 = 0


@dataclass(frozen=True)
class QuarantineEntry:
    """One rejected record, a line of ``quarantine.jsonl``."""

    file: str
    line: int  # a JSONL line's number; a table row's, a tar sample's (``where`` says which: RawLine.line)
    id: str | None
    reason: str
    detail: str
    raw: str
    where: str = "line"  # "line" | "row" | "member"
    member: str | None = None  # a tar sample's key

    def to_json(self) -> str:
        entry = dataclasses.asdict(self)
        if self.where == "line":  # a JSONL record's entry as it always was
            del entry["where"], entry["member"]
        elif self.member is None:
            del entry["member"]
        return json.dumps(entry, ensure_ascii=False, sort_keys=True)


@dataclass(frozen=True)
class ShardEntry:
    """A file listed in ``manifest.json``."""

    file: str
    rows: int
    bytes: int
    sha256: str


def arrow_schema(cls: type, kind: str) -> pa.Schema:
    """The file schema for a record kind, with the version metadata attached."""
    return pa.schema(
        arrow_fields(cls),
        metadata={VERSION_KEY: str(SCHEMA_VERSION).encode(), KIND_KEY: kind.encode()},
    )


def check_schema(schema: pa.Schema, where: str) -> None:
    """Refuse a file whose schema version this packer cannot read."""
    meta = schema.metadata or {}
    version = meta.get(VERSION_KEY)
    if version is None:
        raise SchemaVersionError(f"{where}: no packer.schema_version in the Arrow schema metadata")
    if version.decode() != str(SCHEMA_VERSION):
        raise SchemaVersionError(version_message(where, version.decode()))


def version_message(where: str, version: object) -> str:
    """What to say about a file of another schema version: which, and how to get a readable one."""
    if str(version) in ("1", "2", "3", "4"):
        what = {"1": "before integer segment identity", "2": "before whole-item media spans",
                "3": "before preference records", "4": "before per-sample cost vectors"}[str(version)]
        return (f"{where}: schema_version {version} (written by an earlier packer, {what}) is not read by "
                f"this packer (reads {SCHEMA_VERSION}); rebuild it: packer build ... --overwrite, same inputs")
    return (f"{where}: schema_version {version} is not supported by this packer (reads {SCHEMA_VERSION}); "
            f"rebuild, or install the packer that wrote it")


SAMPLE_SCHEMA = arrow_schema(Sample, "samples")
PACKED_SCHEMA = arrow_schema(PackedRow, "packed")


def to_table(records: typing.Sequence, schema: pa.Schema) -> pa.Table:
    """Column-wise conversion of record dataclasses into a table of ``schema``."""
    columns = {}
    for field in schema:
        values = [getattr(r, field.name) for r in records]
        if pa.types.is_list(field.type) and pa.types.is_struct(field.type.value_type):
            values = [[dataclasses.asdict(v) for v in vs] for vs in values]
        columns[field.name] = _numeric_lists(values, field.type) or pa.array(values, type=field.type)
    return pa.table(columns, schema=schema)


def _numeric_lists(values: list, type_: pa.DataType) -> pa.Array | None:
    """A list column whose cells are all numpy arrays (token ids, labels), as one offsets
    array over their concatenation; None for any other column. The same array as
    ``pa.array(values, type=type_)``, without a Python-level pass over every cell's items
    (and without the pandas import pyarrow makes on meeting a numpy array in a list)."""
    if not (values and pa.types.is_list(type_) and pa.types.is_integer(type_.value_type)):
        return None
    dtype = np.dtype(type_.value_type.to_pandas_dtype())
    if not all(type(v) is np.ndarray and v.ndim == 1 and v.dtype == dtype for v in values):
        return None
    offsets = csr_offsets([len(v) for v in values])
    if offsets[-1] > np.iinfo(np.int32).max:
        return None  # past a list array's int32 offsets: pyarrow's own error, from the general path
    flat = np.concatenate(values)
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(flat, type=type_.value_type), type=type_)


@dataclass(frozen=True)
class PlanRow:
    """One bin of the plan (``plan.arrow``): segment ``j`` is tokens
    ``starts[j] : starts[j] + lengths[j]`` of global sample ``samples[j]``."""

    samples: Annotated[tuple[int, ...], pa.list_(pa.int64())]
    starts: Int32List
    lengths: Int32List


PLAN_SCHEMA = arrow_schema(PlanRow, "plan")


@dataclass(frozen=True)
class MediaFeature:
    """One image embedding (``embeddings/``), keyed by the media ref as written in the
    records; ``values`` is ``shape`` flattened, float16 (``[embed_dim]`` pooled, or
    ``[1 + n_patches, width]`` for one hidden state)."""

    ref: Str
    shape: Int32List
    values: Annotated[tuple[float, ...], pa.list_(pa.float16())]


FEATURE_SCHEMA = arrow_schema(MediaFeature, "media_features")


@dataclass(frozen=True)
class AudioFeature:
    """One clip's Whisper log-mel features (``audio_features/``), keyed by the media ref:
    ``values`` is ``shape`` = ``[feature_size, 3000]`` flattened, float32 (what
    ``WhisperFeatureExtractor`` returns, padded to 30 s); ``valid_frames`` is what its
    attention mask sums to (Qwen2-Audio's ``feature_attention_mask``)."""

    ref: Str
    shape: Int32List
    values: Annotated[tuple[float, ...], pa.list_(pa.float32())]
    valid_frames: Int32


AUDIO_FEATURE_SCHEMA = arrow_schema(AudioFeature, "audio_features")
