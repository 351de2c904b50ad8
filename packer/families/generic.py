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

from typing import Any

from packer.families.base import Expansion, Family, RecordMedia, Run
from packer.families.towers import QWEN_VISION, llava, llava_next, whisper_audio
from packer.media.policies import parse_policy, policy_count
from packer.modeling.towers import Tower


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

    def __init__(self, config: Any):
        super().__init__(tuple(config.modalities))
        self.placeholders = {"image": config.image_token, "audio": config.audio_token, "video": config.video_token}
        self.wrappers = {"image": (config.image_begin, config.image_end), "audio": (config.audio_begin, config.audio_end),
                         "video": (config.video_begin, config.video_end)}
        self.policies = {"image": parse_policy(config.image_tokens, "image"),
                         "audio": parse_policy(config.audio_tokens, "audio"),
                         "video": parse_policy(config.video_tokens, "video")}
        self.specs = {"image": config.image_tokens, "audio": config.audio_tokens, "video": config.video_tokens}

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
        return {"placeholders": self.placeholders, "wrappers": {k: list(v) for k, v in self.wrappers.items()},
                "policies": self.specs}
