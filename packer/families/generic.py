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

from packer.families.base import KINDS, Expansion, Family, RecordMedia, Run
from packer.families.towers import QWEN_VISION, llava, llava_next, whisper_audio
from packer.media.policies import parse_policy, policy_count
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
