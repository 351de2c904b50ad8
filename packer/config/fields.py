"""The build configuration's fields: one frozen dataclass, resolved in three layers (:mod:`packer.config.pipeline`).

    packer defaults (this file)  <  pipeline TOML (pipelines/*.toml)  <  command-line flags

Pipeline files use the field names below as flat top-level keys; every key has a
command-line flag of the same name (``max_length`` -> ``--max-length``). Unknown keys
and out-of-range values are rejected up front with :class:`~packer.errors.ConfigError`.
Paths in a pipeline file are relative to the file's folder; on the command line, to the
folder ``packer`` runs in.

Each field is tagged once with a ``stage`` (content / plan / execution: what changing it
redoes, see :data:`STAGES`) and a ``group`` (its section of ``packer build --help``);
:data:`CONTENT_KEYS`, :data:`PLAN_KEYS`, :data:`EXECUTION_KEYS` and :data:`REPACK_KEYS`
are derived from the tags.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packer.config.inputs import expand_inputs
from packer.config.sources import LEAST, OVERSIZE, Source, whole_file
from packer.errors import ConfigError
from packer.media.feature_specs import EmbedSpec, FeatureSpec

# max_row_encoder = auto: (1 + S) x the mean row's encoder cost for the tightest S of these whose plan has no more rows
# than the plan without a budget (none when each costs a row): steps of alike rows balance (BENCHMARKS)
AUTO_ENCODER_SLACKS = (0.2, 0.25, 0.3, 0.35, 0.4, 0.5, 0.75, 1.0)
MAX_ENCODER_SLACK = 1000.0  # auto:S: a budget of 1001 mean rows holds back no row of a real corpus (off does that)
# max_row_encoder = N, in the cost model's units: seconds (packer calibrate; an image costs over 1e-6 s), FLOPs (a
# model config) or token-equivalents; a smaller budget holds no media sample at all (1e-300 overflowed the planner).
MIN_ENCODER_BUDGET = 1e-12
MAX_LENGTH = 2**31 - 1
MEDIA_KINDS = ("image", "audio", "video")  # the media kinds there are (a media span's ``kind``, ``modalities``' names)
IMAGE_CHECKS = ("header", "verify", "decode")  # how hard packer.media.probe checks an image
ROW_LENGTHS_AUTO = 4  # row lengths ``row_lengths = auto`` chooses


# Every field is tagged once; the key sets at the bottom are derived from the tags.
#   content    decides stage 1's output (samples/, quarantine, media sections): changing it needs a re-encode
#   plan       decides the plan and the packed rows: `packer repack` may change it
#   execution  how a build runs, not what it builds: kept out of the manifest's config and the fingerprint
STAGES = ("content", "plan", "execution")
# Sections of `packer build --help`, in this order.
GROUPS = ("input", "tokenizer", "media", "packing", "execution", "output")


def _opt(default: Any, help: str, *, stage: str, group: str, choices: tuple[str, ...] | None = None,
         short: str | None = None):
    if stage not in STAGES or group not in GROUPS:
        raise ValueError(f"config field tagged stage={stage!r}, group={group!r}: stage must be one of {', '.join(STAGES)}, "
                         f"group one of {', '.join(GROUPS)}")
    meta = {"help": help, "choices": choices, "short": short, "stage": stage, "group": group}
    if isinstance(default, (list, tuple)):
        return field(default=tuple(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class BuildConfig:
    name: str = _opt("", "Name of the job (free text, recorded in the manifest).", stage="content", group="output")
    input: tuple[str, ...] = _opt((), "Input JSONL files or glob patterns (sorted after expansion).", short="-i",
                                  stage="content", group="input")
    output: str = _opt("out/packed", "Output folder.", short="-o", stage="execution", group="output")
    format: str = _opt("auto", "Record shape, or auto-detect per line.",
                       choices=("auto", "llava", "sharegpt", "messages", "prompt_completion", "alpaca", "text",
                                "preference", "unpaired_preference", "responses"),
                       stage="content", group="input")
    media_root: str | None = _opt(None, "Folder that relative media paths are resolved against (default: the JSONL file's).",
                                  stage="content", group="input")
    allow_outside_media_root: bool = _opt(False, "Accept media paths written outside the dataset root "
                                          "(symlinks inside it are always followed).",
                                          stage="content", group="input")
    tokenizer: str = _opt("", "HF tokenizer: a local folder or a hub name (default: the --processor's).",
                          stage="content", group="tokenizer")
    family: str = _opt("generic", "Model family whose processor the build reproduces token for token (qwen3vl, ...); "
                                  "generic: the placeholder / policy settings below.", stage="content", group="media")
    processor: str = _opt("", "Processor checkpoint (a folder written by save_pretrained, or a hub id) whose configs give "
                              "the family's budgets; also the tokenizer and chat template unless --tokenizer is set.",
                          stage="content", group="media")
    processor_options: str = _opt("", "Override the family's resolved settings: key=value,... (names as the manifest's "
                                      "family.settings).", stage="content", group="media")
    chat_template: str = _opt("", "Which of the tokenizer's named chat templates to render with (default: as "
                                  "apply_chat_template picks: its only or 'default' one, its 'tool_use' one for a "
                                  "record with tools), or a .jinja file to use instead.", stage="content", group="tokenizer")
    template_time: str = _opt("", "The time a template's strftime_now sees (ISO 8601); empty: SOURCE_DATE_EPOCH if set, "
                                  "else 1970-01-01T00:00:00Z, so a clock never makes two builds differ.",
                              stage="content", group="tokenizer")
    template_max_steps: int = _opt(1_000_000, "Loop iterations and calls one chat-template rendering may take; a record "
                                              "needing more is quarantined (template_too_slow).",
                                   stage="content", group="tokenizer")
    template_max_chars: int = _opt(64 * 2**20, "Characters one chat-template rendering may build or write; a record "
                                               "needing more is quarantined (template_output_too_long).",
                                   stage="content", group="tokenizer")
    train_on: str = _opt("assistant", "Which tokens get labels in conversations.", choices=("assistant", "all"),
                         stage="content", group="tokenizer")
    append_eos: bool = _opt(True, "End every text document with the tokenizer's EOS token.", stage="content", group="tokenizer")
    train_on_empty_think: bool = _opt(False, "Train the empty <think></think> block a reasoning template (Qwen3) adds to an "
                                      "assistant turn without reasoning (default: masked).", stage="content", group="tokenizer")
    image_tag: str = _opt("<image>", "Marker of an image's place in the input text (LLaVA's <image>).",
                          stage="content", group="input")
    audio_tag: str = _opt("<audio>", "Marker of an audio clip's place in the input text.", stage="content", group="input")
    video_tag: str = _opt("<video>", "Marker of a video's place in the input text.", stage="content", group="input")
    image_token: str = _opt("<image>", "Placeholder token images expand to (added as a special token if absent).",
                            stage="content", group="tokenizer")
    audio_token: str = _opt("<audio>", "Placeholder token audio clips expand to (added as a special token if absent).",
                            stage="content", group="tokenizer")
    video_token: str = _opt("<video>", "Placeholder token videos expand to (e.g. <|video_pad|>; added if absent).",
                            stage="content", group="tokenizer")
    image_tokens: str = _opt("fixed:image_size=336,patch_size=14",
                             "Image token-count policy: fixed[:model=ViT-L-14-336], dynamic[:max_pixels=..], anyres.",
                             stage="content", group="media")
    audio_tokens: str = _opt("qwen2-audio",
                             "Audio token-count policy: whisper[:windows=one], qwen2-audio[:long=split], rate[:per_second=25].",
                             stage="content", group="media")
    video_tokens: str = _opt("qwen2vl", "Video token-count policy: qwen2vl[:fps=2,min_frames=4,max_frames=768,"
                                        "min_pixels=..,max_pixels=..] (Qwen2-VL / Qwen2.5-VL's video processor).",
                             stage="content", group="media")
    video_begin: str = _opt("", "Token before each video's placeholders (e.g. <|vision_start|>); empty: none.",
                            stage="content", group="tokenizer")
    video_end: str = _opt("", "Token after each video's placeholders (e.g. <|vision_end|>); empty: none.",
                          stage="content", group="tokenizer")
    image_begin: str = _opt("", "Token before each image's placeholders (e.g. <|vision_start|>); empty: none.",
                            stage="content", group="tokenizer")
    image_end: str = _opt("", "Token after each image's placeholders (e.g. <|vision_end|>); empty: none.",
                          stage="content", group="tokenizer")
    audio_begin: str = _opt("", "Token before each audio clip's placeholders (e.g. <|audio_bos|>); empty: none.",
                            stage="content", group="tokenizer")
    audio_end: str = _opt("", "Token after each audio clip's placeholders (e.g. <|audio_eos|>); empty: none.",
                          stage="content", group="tokenizer")
    modalities: tuple[str, ...] = _opt(("image", "audio", "video"),
                                       "Media kinds the model has an encoder for; a record holding another kind is "
                                       "quarantined (no_encoder), or stops the build with --strict. None (--modalities '', "
                                       "modalities = []): text only.",
                                       stage="content", group="media")
    image_check: str = _opt("verify", "How hard to check images: header, verify (structure, no pixel decode), decode.",
                            choices=IMAGE_CHECKS, stage="content", group="media")
    video_check: str = _opt("header", "How hard to check videos: header (the container's claims, held to packer.media.limits, "
                                      "and one decoded frame), decode (every frame; counts the frames that exist and refuses "
                                      "a header that lists another number).",
                            choices=("header", "decode"), stage="content", group="media")
    media_hash: bool = _opt(False, "Record each media file's sha256 in the build's media index (reads every media file once), "
                                   "so `packer verify --media hash` can prove the files unchanged; without it the index holds "
                                   "their size and modification time.", stage="content", group="media")
    media: str = _opt("auto", "Where the build's media live: ref (each span names its file or URL, read at train time), "
                              "embed (each packed shard's media bytes in a media shard beside it: the build folder trains "
                              "with no other file), auto (embed exactly when a source's media have no file to point at: "
                              "parquet / tar cells, data: URLs).", choices=("auto", "embed", "ref"),
                      stage="content", group="media")
    image_embeddings: str = _opt("", "Store open_clip image embeddings: MODEL[:PRETRAINED] (a checkpoint file, a tag, "
                                     "or random); empty: off.", stage="content", group="media")
    embed_output: str = _opt("pooled", "What to store per image: the pooled embedding, or one hidden state "
                                       "(class token + patch tokens, see --embed-layer).", choices=("pooled", "tokens"),
                             stage="content", group="media")
    embed_layer: int = _opt(-2, "With --embed-output tokens: which hidden state, indexed as HF CLIP's hidden_states "
                                "(0: embeddings, -1: last block, -2: penultimate, LLaVA's vision_feature_layer).",
                            stage="content", group="media")
    embed_device: str = _opt("auto", "Device for the embedding pass: auto (cuda if available), cpu, cuda, cuda:1, ...",
                             stage="content", group="media")
    embed_batch_size: int = _opt(32, "Images per batch in the embedding pass.", stage="content", group="media")
    embed_gpus: float = _opt(0.0, "With --engine ray: GPUs reserved by the embedding pass task.",
                             stage="execution", group="execution")
    long_audio: str = _opt("truncate", "A clip longer than the audio encoder's window (Qwen2-Audio: 30 s): truncate counts "
                                       "the window the model sees (its processor cuts the rest; counted as audio_truncated), "
                                       "drop quarantines the record (audio_too_long).", choices=("truncate", "drop"),
                           stage="content", group="media")
    audio_features: str = _opt("", "Store audio features: whisper[:feature_size=128] (WhisperFeatureExtractor's "
                                   "input_features, 30 s padded, float32); empty: off.", stage="content", group="media")
    cost_model: str = _opt("auto", "Coefficients of each sample's stored cost vector (llm, encoder, supervised: packer.cost): "
                                   "auto (FLOPs from the model config.json beside --processor / --tokenizer, else "
                                   "CostModel()), default (CostModel()), or a path: a cost model JSON (packer calibrate "
                                   "writes one; any subset of the coefficients) or a model's config.json / folder.",
                            stage="content", group="media")
    max_length: int = _opt(4096, "Capacity of a packed row, in tokens.", stage="plan", group="packing")
    algorithm: str = _opt("bfd", "Bin-packing algorithm (see packer.pack.ALGORITHMS).", stage="plan", group="packing")
    oversize: str = _opt("truncate", "What to do with a sample longer than max_length. split: pieces of at most max_length, "
                                     "cut before media; a piece that follows a media item it does not hold is left out "
                                     "(counted as split_lost_media).", choices=OVERSIZE,
                         stage="plan", group="packing")
    max_segments: int = _opt(0, "Most samples in one packed row (0: no limit).", stage="plan", group="packing")
    max_media: int = _opt(0, "Most media items (images + audio clips) in one packed row (0: no limit).",
                          stage="plan", group="packing")
    max_images: int = _opt(0, "Most images in one packed row (0: no limit).", stage="plan", group="packing")
    max_audio: int = _opt(0, "Most audio clips in one packed row (0: no limit).", stage="plan", group="packing")
    max_videos: int = _opt(0, "Most videos in one packed row (0: no limit).", stage="plan", group="packing")
    max_row_encoder: str = _opt("auto", "A budget on each row's encoder cost (images, frames, clips through the towers, "
                                       "under the build's cost_model) besides its tokens: off; auto (the tightest of "
                                       "1.2 to 2 x the mean row's at the token lower bound that adds no row), auto:S "
                                       "((1 + S) x it), or a number in the cost model's units. Rows of alike encoder "
                                       "cost balance better across ranks; a sample over the budget alone gets a row "
                                       "whose budget it takes whole (never dropped).",
                                stage="plan", group="packing")
    preference: str = _opt("none", "Preference / multi-response records (prompt + chosen / rejected, completion + label, a "
                                   "list of responses): none (quarantined as preference_record); pairs (each response a "
                                   "segment with its own copy of the prompt, a record's segments adjacent in one row); tree "
                                   "(the prompt once, each response a branch attending to it). repack switches pairs <-> tree.",
                           choices=("none", "pairs", "tree"), stage="plan", group="packing")
    preference_strings: str = _opt("standard", "Preference records whose prompt and responses are all strings: standard "
                                               "(TRL's standard format, as DPOTrainer / KTOTrainer tokenize it: prompt + "
                                               "response + EOS, no chat template) or chat (a user turn and an assistant "
                                               "turn through the chat template).", choices=("standard", "chat"),
                                   stage="content", group="input")
    row_lengths: str = _opt("", "A few fixed row lengths for compiled training: auto (4 the planner chooses from the rows, "
                                "least padding), auto:K, or N,N,... (max_length added); the collator pads each batch to "
                                "the smallest that holds it (PackedCollator(row_lengths=ds.row_lengths)). Empty: off.",
                            stage="plan", group="packing")
    group_by: str = _opt("none", "Rows hold samples of one group only (modality: text, image, audio, ...).",
                         choices=("none", "modality"), stage="plan", group="packing")
    order: str = _opt("shuffle", "Row order: shuffled with the seed; sequential (source order, for curricula: rows by "
                                 "their earliest sample; exact with --algorithm next-fit); planner; longest-first (the "
                                 "costliest row first, so an out-of-memory error shows at step one; the rest shuffled).",
                      choices=("shuffle", "sequential", "planner", "longest-first"), stage="plan", group="packing")
    seed: int = _opt(0, "Seed for every random choice of the build.", stage="plan", group="packing")
    engine: str = _opt("local", "Where stages 1 and 3 run.", choices=("local", "ray"), stage="execution", group="execution")
    workers: int = _opt(0, "Processes for stages 1 and 3 (0: one per CPU core; in-process for inputs under 16 MiB); "
                           "in stage 1 the build's own process is one of them.",
                        stage="execution", group="execution")
    chunk_records: int = _opt(10_000, "Most input records per stage-1 task (a task writes one samples/ shard). Smaller inputs "
                                      "are cut into up to 64 tasks of at least 64 KiB, so every worker has work; the cuts "
                                      "depend on the input only, never on --workers.",
                              stage="content", group="execution")
    max_line_bytes: int = _opt(8 * 2**20, "A longer input line is quarantined (line_too_long) without being held in memory. "
                                          "Tokenizing a line costs about 140x its bytes (docs/reliability.md): the default "
                                          "keeps one record near 1.2 GB per worker.",
                               stage="content", group="input")
    shard_rows: int = _opt(8192, "Most packed rows in one packed/ shard.", stage="plan", group="output")
    shard_bytes: int = _opt(256 * 2**20, "Approximate most bytes in one packed/ shard.", stage="plan", group="output")
    strict: bool = _opt(False, "Stop at the first bad record instead of quarantining it.", stage="content", group="input")
    on_internal_error: str = _opt("stop", "A record that meets a packer bug (internal_error): stop the build (exit 1; the record "
                                          "and the traceback written to OUT/internal_error.json), or quarantine it and go on "
                                          "(warned; not counted by --max-bad-fraction, which counts data problems).",
                                  choices=("stop", "quarantine"), stage="execution", group="input")
    max_bad_fraction: float = _opt(0.1, "Fail the build when more than this fraction of the records is quarantined or "
                                   "dropped (no_encoder aside); 1.0 never fails.",
                                   stage="plan", group="input")
    overwrite: bool = _opt(False, "Replace a build of other inputs or settings in the output folder (else refuse).",
                           stage="execution", group="output")
    durable: bool = _opt(True, "fsync every file before renaming it into place (crash safety on power loss).",
                         stage="execution", group="output")
    staging_dir: str | None = _opt(None, "Local folder to build in when output is an fsspec URL, uploaded when finished "
                                   "(default: none, the workers write the URL directly).",
                                   stage="execution", group="output")
    ray_address: str | None = _opt(None, "With --engine ray: the cluster to join (auto in a cluster); empty: a local Ray.",
                                   stage="execution", group="execution")
    cpus_per_task: float = _opt(1.0, "With --engine ray: CPUs reserved by each stage-1 / stage-3 worker.",
                                stage="execution", group="execution")
    # The report's step-balance table describes the trainer's TokenBalancedSampler: it changes no shard, so execution.
    report_ranks: tuple[int, ...] = _opt((8, 64), "Data-parallel ranks the report's step imbalance is shown for, "
                                         "comma-separated (e.g. 8,64,256).", stage="execution", group="output")
    report_batch: int = _opt(1, "Rows per rank per step in the report's step imbalance (the sampler's batch_size).",
                             stage="execution", group="output")
    report_window: int = _opt(64, "Steps per sorting window in the report's step imbalance (the sampler's window).",
                              stage="execution", group="output")

    def __post_init__(self):
        for key in ("tokenizer", "processor"):
            value = getattr(self, key)
            if value and "://" not in value and Path(value).expanduser().is_dir():
                # a local folder is recorded absolute, as the media root is (a hub id as typed): the manifest (and the
                # fingerprint) then name the same folder from any current folder, and PackedCollator.for_build finds
                # the processor from the trainer's
                object.__setattr__(self, key, os.path.abspath(Path(value).expanduser()))
        object.__setattr__(self, "input", tuple(whole_file(spec) for spec in self.input))
        for f in dataclasses.fields(self):
            choices = f.metadata.get("choices")
            value = getattr(self, f.name)
            if choices and value not in choices:
                raise ConfigError(f"{f.name} = {value!r} is not one of {', '.join(choices)}")
        # the packing options a source may set too take their least value from LEAST (its Source.parse check's)
        least = {"max_length": LEAST["max_length"], **dict.fromkeys(
            ("chunk_records", "shard_rows", "shard_bytes", "embed_batch_size", "max_line_bytes", "report_batch",
             "report_window", "template_max_steps", "template_max_chars"), 1),
            "max_segments": 0, **{k: n for k, n in LEAST.items() if k != "max_length"}}
        for key, n in least.items():
            if getattr(self, key) < n:
                raise ConfigError(f"{key} must be at least {n}, got {getattr(self, key)}" if n else
                                  f"{key} must be 0 (no limit) or positive, got {getattr(self, key)}")
        if self.max_length > MAX_LENGTH:
            raise ConfigError(f"max_length = {self.max_length:,} is over {MAX_LENGTH:,} (2^31 - 1: positions and "
                              f"cu_seqlens are int32)")
        if self.preference != "none" and self.train_on == "all":
            raise ConfigError(f"preference = {self.preference!r} trains the responses only; train_on = 'all' would train "
                              f"the prompt too: leave train_on at 'assistant'")
        if not 0.0 < self.cpus_per_task < float("inf"):  # Ray raised its own traceback at -1; nan passed
            raise ConfigError(f"cpus_per_task must be a positive number (CPUs a Ray task reserves, e.g. 1 or 0.5), got "
                              f"{self.cpus_per_task}")
        if not 0.0 <= self.embed_gpus < float("inf"):
            raise ConfigError(f"embed_gpus must be 0 (none) or a positive number of GPUs, got {self.embed_gpus}")
        if not 0.0 <= self.max_bad_fraction <= 1.0:
            raise ConfigError(f"max_bad_fraction must be between 0 and 1, got {self.max_bad_fraction}")
        if self.workers < 0:
            raise ConfigError(f"workers must be 0 (auto) or positive, got {self.workers}")
        if not self.report_ranks or min(self.report_ranks) < 1:
            raise ConfigError(f"report_ranks must be one or more positive rank counts, got {list(self.report_ranks)}")
        if any(m not in MEDIA_KINDS for m in self.modalities) or len(set(self.modalities)) != len(self.modalities):
            raise ConfigError(f"modalities = {list(self.modalities)}: name each of image, audio, video at most once "
                              "(an empty list packs text only: modalities = [], or --modalities '')")
        for group in (("image_token", "audio_token", "video_token"), ("image_tag", "audio_tag", "video_tag")):
            values = [getattr(self, k) for k in group]
            if not all(values) or len(set(values)) != len(values):
                raise ConfigError(f"{', '.join(group)} must be different non-empty strings, got {values}")
        self.encoder_budgets(1.0, 1)  # refuses a malformed max_row_encoder now, not after stage 1
        for source in self.sources():  # a source's own max_length: the build's is the rows' largest capacity
            own = dict(source.policy).get("max_length", 0)
            if own > self.max_length:
                raise ConfigError(f"input {source.pattern!r} packs rows of max_length {own:,}, over the build's "
                                  f"max_length {self.max_length:,}: raise max_length to at least {own:,} (the longest "
                                  f"row any source packs) and give the other sources their own")
        try:
            parse_row_lengths(self.row_lengths, self.max_length)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        _check_policies(self)
        if self.audio_features:
            FeatureSpec.parse(self.audio_features)  # the removed log-mel spec fails here, naming its replacement
        if self.image_embeddings:
            EmbedSpec.from_config(self)  # a malformed MODEL[:PRETRAINED] fails here, before any work
        # The checks that need a higher floor's knowledge (the family, the template clock) are
        # packer.pipeline.preflight's, run where a build starts, before any record is read.

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    def content_dict(self) -> dict[str, Any]:
        """The settings that decide the output bytes: content and plan keys (execution keys left out)."""
        return {k: v for k, v in self.to_dict().items() if k not in EXECUTION_KEYS}

    def execution_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in EXECUTION_KEYS}

    def sources(self) -> list[Source]:
        """One :class:`packer.config.sources.Source` per ``input`` entry (its weight and cap, if any)."""
        return [Source.parse(spec) for spec in self.input]

    def input_files(self) -> list:
        """The input patterns expanded: sorted, de-duplicated, each pattern must match.
        Local files come back as ``Path``, fsspec URLs as ``str``."""
        return [f for f, _ in self.input_sources()]

    def input_sources(self) -> list[tuple]:
        """``(file, source number)`` for every input file, in order; a file named by two
        entries (however spelled) is read once, for the first."""
        return self._expand_inputs()[0]

    def duplicate_inputs(self) -> list[tuple]:
        """``(file read, file left out)`` for every input named twice (two patterns, a relative and an
        absolute spelling, a symlink to it): the build warns about each."""
        return self._expand_inputs()[1]

    def _expand_inputs(self) -> tuple[list[tuple], list[tuple]]:
        return expand_inputs(self.sources())

    def encoder_budgets(self, total: float, rows: int) -> list[float]:
        """The row encoder budgets ``max_row_encoder`` allows, for samples of ``total`` encoder cost packed in ``rows``
        rows at the token lower bound, tightest first: ``auto:S`` and a number one; ``auto`` one for each slack of
        :data:`AUTO_ENCODER_SLACKS` (the planner keeps the tightest whose rows are no more than without a budget, else
        none); none when off or when no sample has an encoder cost."""
        value = self.max_row_encoder.strip()
        if value == "off":
            return []
        try:
            if value == "auto" or value.startswith("auto:"):
                slacks = [float(value.partition(":")[2])] if ":" in value else list(AUTO_ENCODER_SLACKS)
                if not all(0 <= slack <= MAX_ENCODER_SLACK for slack in slacks):  # nan and inf too
                    raise ValueError
                return [(1.0 + slack) * total / max(rows, 1) for slack in slacks] if total > 0 else []
            budget = float(value)
            if not MIN_ENCODER_BUDGET <= budget < float("inf"):
                raise ValueError
            return [budget]
        except ValueError:
            raise ConfigError(f"max_row_encoder = {value!r}: off, auto, auto:S (S from 0 to {MAX_ENCODER_SLACK:g}: "
                              f"(1 + S) x the mean row's encoder cost) or a finite number of at least "
                              f"{MIN_ENCODER_BUDGET:g} in the cost model's units") from None

    def media_caps(self) -> dict[str, int]:
        """The per-row media caps in force, as :func:`packer.pack.plan` takes them."""
        caps = {"total": self.max_media, "image": self.max_images, "audio": self.max_audio, "video": self.max_videos}
        return {k: v for k, v in caps.items() if v > 0}



FIELDS = {f.name: f for f in dataclasses.fields(BuildConfig)}


def parse_row_lengths(spec: str, capacity: int) -> tuple[int | None, list[int] | None]:
    """``row_lengths``: ``auto`` / ``auto:K`` -> (K, None); ``N,N,...`` -> (None, the lengths sorted, ``capacity``
    added when the largest is smaller: every row must fit one); empty -> (None, None). A malformed spec is a
    ValueError naming the setting and what it takes (:func:`packer.pack.buckets.parse` gives the lengths as an array)."""
    spec = spec.strip()
    if not spec:
        return None, None
    if spec == "auto" or spec.startswith("auto:"):
        try:
            k = int(spec.partition(":")[2] or ROW_LENGTHS_AUTO)
        except ValueError:
            k = 0
        if k < 1:
            raise ValueError(f"row_lengths {spec!r}: auto:K needs a whole number K >= 1")
        return k, None
    try:
        lengths = sorted({int(x) for x in spec.split(",") if x.strip()})
    except ValueError:  # int("x"): say which setting and what it takes, not int()'s own words
        lengths = []
    if not lengths or lengths[0] < 1 or lengths[-1] > capacity:
        raise ValueError(f"row_lengths {spec!r}: give positive whole lengths up to max_length ({capacity}), comma-separated, "
                         f"or auto[:K]")
    if lengths[-1] < capacity:
        lengths.append(capacity)
    return None, lengths


def _check_policies(config: BuildConfig) -> None:
    """Unknown policies, parameters and values fail here, before any work, without loading media or
    model code: a policy that reads a model's geometry (``fixed:model=...``, open_clip) has its spec
    checked only; it is built (and its model config read) when the build starts."""
    from packer.media.policies import POLICY_TABLES, parse_policy
    from packer.specs import parse_spec

    for kind in ("image", "audio", "video"):
        spec = getattr(config, f"{kind}_tokens")
        name, kwargs = parse_spec(spec, POLICY_TABLES[kind], what=f"{kind} token policy")
        if not kwargs.get("model"):
            parse_policy(spec, kind)


def _keys(stage: str) -> tuple[str, ...]:
    return tuple(name for name, f in FIELDS.items() if f.metadata["stage"] == stage)


CONTENT_KEYS = _keys("content")  # `packer repack` refuses these: they need `packer build`
PLAN_KEYS = _keys("plan")
EXECUTION_KEYS = _keys("execution")  # out of the manifest's config and the fingerprint
REPACK_KEYS = tuple(k for k in FIELDS if k not in CONTENT_KEYS)  # what `packer repack` accepts: plan + execution


