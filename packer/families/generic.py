"""The configurable family: a placeholder token per media kind, optional begin / end tokens, and a
token-count policy per kind (``--image-tokens``, ``--audio-tokens``, ``--video-tokens``).

It is how the 2024 pipelines are written (``pipelines/qwen2vl.toml``: ``<|vision_start|>`` +
``<|image_pad|>`` x n + ``<|vision_end|>`` under the ``dynamic`` policy; LLaVA-1.5: ``<image>`` x 576),
and the route for a model whose processor only repeats one token n times. The chat template
sees each media item as its placeholder token inside the message text (``structured = False``:
the templates these pipelines are used with render string content), and the expansion is
``[begin] Run(placeholder, n) [end]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from packer.errors import BadRecord
from packer.families.base import KINDS, Expansion, Family, RecordMedia, Run
from packer.families.towers import QWEN_VISION, llava, llava_next, whisper_audio
from packer.media.policies import Count, parse_policy
from packer.modeling.towers import Tower


@dataclass(frozen=True)
class GenericSettings:
    """The generic family's settings, per media kind: its placeholder token, the ``[begin, end]`` tokens around
    its placeholders ("" for none) and its token-count policy spec (``fixed:...``, ``dynamic:...``). The pipeline's
    ``image_token`` / ``image_begin`` / ``image_end`` / ``image_tokens`` keys (and audio's, video's) give them
    (:meth:`of_keys`: the family takes these few settings, never the whole build config); the manifest records
    them as they are here, so a worker or a reader rebuilds the family from the record alone."""

    placeholders: dict[str, str]
    wrappers: dict[str, Any]  # kind -> (begin, end); a list in the recorded JSON
    policies: dict[str, str]

    @classmethod
    def of_keys(cls, keys: Any) -> GenericSettings:
        """The settings an object carrying the pipeline's ``<kind>_token`` / ``_begin`` / ``_end`` / ``_tokens`` keys
        (a build config) names."""
        return cls({k: getattr(keys, f"{k}_token") for k in KINDS},
                   {k: (getattr(keys, f"{k}_begin"), getattr(keys, f"{k}_end")) for k in KINDS},
                   {k: getattr(keys, f"{k}_tokens") for k in KINDS})


class Generic(Family):
    name = "generic"
    supports = ("image", "audio", "video")
    structured = False
    routed = False
    # the 2024 model classes its pipelines feed (pipelines/qwen2vl.toml, llava.toml, qwen2audio.toml, ...)
    towers = {"qwen2_vl": (QWEN_VISION,), "qwen2_5_vl": (QWEN_VISION,),
              "llava": (Tower("model.vision_tower", ("image",), llava),),
              "llava_next": (Tower("model.vision_tower", ("image",), llava_next),),
              "qwen2_audio": (Tower("model.audio_tower", ("audio",), whisper_audio(3000)),),
              "qwen2_5_omni_thinker": (Tower("model.audio_tower", ("audio",), whisper_audio(None)), QWEN_VISION)}
    model_types = tuple(towers)
    model_inputs = ("pixel_values", "image_grid_thw", "image_sizes", "pixel_values_videos", "video_grid_thw",
                    "second_per_grid_ts", "input_features", "feature_attention_mask")

    is_generic = True
    settings_class = GenericSettings

    def __init__(self, kinds: tuple[str, ...], settings: GenericSettings):
        super().__init__(kinds)
        self.s = settings
        self.placeholders = dict(settings.placeholders)
        self.wrappers = {k: tuple(v) for k, v in settings.wrappers.items()}
        self.policies = {k: parse_policy(spec, k) for k, spec in settings.policies.items()}
        self.specs = dict(settings.policies)

    def run_tokens(self) -> dict[str, str]:
        return dict(self.placeholders)

    def special_tokens(self) -> list[str]:
        tokens = [*self.placeholders.values(), *(t for pair in self.wrappers.values() for t in pair if t)]
        return list(dict.fromkeys(tokens))  # images and videos may share <|vision_start|> / <|vision_end|>

    def expand(self, kind: str, info: Any, part: Any, record: RecordMedia) -> Expansion:
        count = policy_count(self.policies[kind], kind, info, part)
        begin, end = self.wrappers[kind]
        pieces = (*([begin] if begin else []), Run(self.placeholders[kind], count.length), *([end] if end else []))
        return Expansion(pieces, tuple(count.grid), float(getattr(count, "second_per_grid_t", 0.0)))

    def settings(self) -> dict[str, Any]:
        return {"placeholders": dict(self.placeholders), "wrappers": {k: list(v) for k, v in self.wrappers.items()},
                "policies": dict(self.specs)}


def policy_count(policy: Any, kind: str, info: Any, part: Any) -> Count:
    """``policy``'s count of a probed item; what the policy refuses is ``unsupported_<kind>``, a clip that
    gives no position ``audio_too_short``. A video given as frame images is counted as a file of those frames
    at the record's ``fps`` (the HF video processors sample a list of frames handed with its rate as they sample
    a file); one that states no rate is taken whole, timed at the policy's fps (qwen-vl-utils' convention)."""
    try:
        if kind == "image":
            return policy.count(info.height, info.width)
        if kind == "audio":
            count = policy.count(info.frames, info.sample_rate)
            if count.length < 1:
                raise BadRecord("audio_too_short", f"{part.ref!r} is {1000 * info.seconds:.1f} ms: the encoder produces "
                                                   f"0 positions under audio policy {policy.name!r}; drop the clip or pad it")
            return count
        return policy.count(info.frames, info.fps, info.height, info.width)
    except ValueError as e:
        size = f"{info.width}x{info.height}" if kind == "image" else f"{info.frames} frames"
        raise BadRecord(f"unsupported_{kind}", f"{part.ref!r} ({size}): {e} ({kind} policy {policy.name!r})") from None
