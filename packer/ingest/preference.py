"""Preference and multi-response records: one prompt, several responses (:class:`Preference`).

Shapes (detected by :func:`detect`, or forced with ``--format``):

- ``preference`` (TRL paired): ``{"prompt", "chosen", "rejected"}``, each a string or a list of
  messages; images in the prompt as the usual media parts (or ``<image>`` tags with a top-level
  ``images`` list). Without a ``prompt``, message lists whose first turns are equal share those
  turns as the prompt (TRL's implicit prompt, ``extract_prompt``). ``score_chosen`` /
  ``score_rejected`` (UltraFeedback's) become the responses' weights.
- ``unpaired_preference`` (TRL unpaired, KTO): ``{"prompt", "completion", "label": true | false}``:
  one response, role ``desirable`` (``true``) or ``undesirable``. The label must be a JSON boolean:
  ``"false"``, ``0``, ``1``, ``null`` are refused (``label_not_boolean``), never coerced (Python's
  ``bool("false")`` is true) nor trained as a plain prompt / completion record.
- ``responses`` (rejection sampling, best-of-n, GRPO-style groups): ``{"prompt", "responses": [...]}``
  (or ``"completions"``), each response a string or a list of messages, with optional per-response
  ``rewards`` (or ``weights``), numbers: roles ``"0"``, ``"1"``, ...

A record whose prompt and responses are all strings is in TRL's *standard* format: by default
(``preference_strings = "standard"``) it is tokenized as TRL's ``DPOTrainer`` / ``KTOTrainer``
tokenize it, with no chat template (:mod:`packer.encode.standard`); ``Preference.strings`` marks it.
Otherwise (message lists, or ``preference_strings = "chat"``) a string prompt is one user turn and
a string response one assistant turn, rendered with the chat template as TRL's prompt / completion
records are; the prompt's turns are context (never trained, assistant turns in a multi-turn prompt
included), each response's assistant turns are trained. Media belong to the prompt: a response holding an image, a clip
or a video is refused (``media_in_response``), so a shared prompt holds every media item.
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct
from typing import Any

from packer.errors import BadRecord
from packer.records import Preference, Response

FORMATS = ("preference", "unpaired_preference", "responses")
NEEDS = {"preference": (("chosen",), ("rejected",)), "unpaired_preference": (("prompt",), ("completion",), ("label",)),
         "responses": (("prompt",), ("responses", "completions"))}
RESPONSE_LISTS = ("responses", "completions")
WEIGHT_LISTS = ("rewards", "weights")


# The fields that hold a record's responses, one group per shape: a pair, a list (either name), a completion
# (prompt / completion, or KTO's with a label). A record holding two groups has no one shape to read.
RESPONSE_FIELDS = (("chosen", "rejected"), ("responses",), ("completions",), ("completion",))
FORCE_HINT = "--format preference, responses, unpaired_preference or prompt_completion"


def check_unambiguous(obj: dict[str, Any]) -> None:
    """Refuse (``ambiguous_record``) a record holding the responses of more than one shape (a pair and a list of
    responses and a completion): reading one shape would drop the others' responses without a word. A field
    that is null counts as absent (a table written out with every column)."""
    held = [group for group in RESPONSE_FIELDS if all(obj.get(k) is not None for k in group)]
    if len(held) > 1:
        names = " and ".join(" + ".join(f"'{k}'" for k in group) for group in held)
        raise BadRecord("ambiguous_record", f"the record holds {names}: the responses of {len(held)} shapes, and "
                                            f"reading one would drop the others'; keep one shape's fields in each "
                                            f"record, or force the shape with {FORCE_HINT}")


def check_conversation_beside_responses(obj: dict[str, Any]) -> None:
    """Refuse (``ambiguous_record``) a record holding a conversation (``messages`` / ``conversations``) and the
    responses of a preference shape (UltraFeedback-binarized's columns: prompt, chosen, rejected, messages): read
    as a conversation, its responses would be dropped without a word, and read as a preference, its conversation.
    TRL's SFTTrainer reads the conversation and its DPOTrainer the responses; ``--format`` says which is meant. A
    field that is null counts as absent."""
    conversation = [k for k in ("messages", "conversations") if obj.get(k) is not None]
    held = [group for group in RESPONSE_FIELDS[:-1] if all(obj.get(k) is not None for k in group)]  # a lone
    # 'completion' beside a conversation is no preference response (a record of two SFT shapes reads as the conversation)
    if conversation and held:
        responses = " + ".join(f"'{k}'" for k in held[0])
        raise BadRecord("ambiguous_record", f"the record holds '{conversation[0]}' (a conversation) and {responses} "
                                            f"(preference responses): reading one would drop the other without a word; "
                                            f"force the shape with --format messages (train the conversation, as TRL's "
                                            f"SFTTrainer) or {FORCE_HINT} (train the responses, as its DPOTrainer)")


def check_label(obj: dict[str, Any], fmt: str) -> None:
    """Refuse (``label_without_completion``) a JSON boolean ``label`` on a record not read as TRL's unpaired
    ``{"prompt", "completion", "label"}``: it says whether the response is desirable, and any other shape would
    train the record as a plain example, ``false`` included."""
    label = obj.get("label")
    if isinstance(label, bool) and fmt != "unpaired_preference":
        raise BadRecord("label_without_completion",
                        f"'label': {json.dumps(label)} marks a KTO response desirable or not, but the record is read as "
                        f"{fmt}, which has no labelled completion: it would be trained as a plain example whatever the "
                        f"label says; give it as {{\"prompt\", \"completion\", \"label\"}} (built with --preference pairs "
                        f"or tree), or drop 'label'")


def detect(obj: dict[str, Any]) -> str | None:
    """The preference shape ``obj`` has, or None (an SFT shape, or none)."""
    if "chosen" in obj and "rejected" in obj:
        return "preference"
    if "prompt" in obj and any(k in obj for k in RESPONSE_LISTS):
        return "responses"
    if "prompt" in obj and "completion" in obj and "label" in obj:  # a label that is no boolean: refused in parse
        return "unpaired_preference"
    return None


def parse(obj: dict[str, Any], fmt: str, media, turns_of, rid: str | None) -> Preference:
    """A :class:`Preference` from ``obj`` of shape ``fmt``. ``media`` hands out the record's media
    (``formats._MediaQueue``); ``turns_of(value, key)`` reads a string or a message list as turns."""
    if fmt == "preference":
        prompt_value, values = _paired(obj)
        roles = ["chosen", "rejected"]
        weights = [_number(obj.get(f"score_{r}"), f"score_{r}") for r in roles]
    elif fmt == "unpaired_preference":
        label = obj["label"]
        if not isinstance(label, bool):  # "false", 0, null: never coerced (bool("false") is True), never trained as SFT
            raise BadRecord("label_not_boolean", f"'label' must be the JSON boolean true or false (desirable or not), "
                                                 f"got {json.dumps(label)[:40]} ({type(label).__name__}); write it as true / "
                                                 f"false, or drop 'label' to train the record as prompt / completion SFT")
        prompt_value, values = obj["prompt"], [("completion", obj["completion"])]
        roles, weights = ["desirable" if label else "undesirable"], [math.nan]
    else:
        key = next(k for k in RESPONSE_LISTS if k in obj)
        listed = obj[key]
        if not isinstance(listed, list):
            raise BadRecord("wrong_type", f"'{key}' must be a list of responses, got {type(listed).__name__}")
        if not listed:
            raise BadRecord("empty_conversation", f"'{key}' is empty: no response to train on")
        prompt_value, values = obj["prompt"], [(f"{key}[{i}]", v) for i, v in enumerate(listed)]
        roles = [str(i) for i in range(len(listed))]
        weights = _weights(obj, len(listed))
    prompt = tuple(dataclasses.replace(t, trained=False) for t in turns_of(prompt_value, "prompt", "user"))
    responses = []
    for (where, value), role, weight in zip(values, roles, weights, strict=True):
        if isinstance(value, str) and not value.strip():
            raise BadRecord("empty_text", f"'{where}' is empty: nothing to train on")
        turns = tuple(turns_of(value, where, "assistant"))
        held = [p.kind for t in turns for p in t.parts if p.kind != "text"]
        if held:
            raise BadRecord("media_in_response", f"'{where}' holds {len(held)} media item(s) ({', '.join(held)}): media "
                                                 f"belong to the prompt, which every response shares; move them there")
        responses.append(Response(turns, role, weight))
    media.check_all_used()
    strings = isinstance(prompt_value, str) and all(isinstance(v, str) for _, v in values)
    return Preference(prompt, tuple(responses), rid, strings)


def _paired(obj: dict[str, Any]) -> tuple[Any, list[tuple[str, Any]]]:
    """(prompt, [(key, response)]) of a paired record; TRL's implicit prompt when no 'prompt' is given."""
    chosen, rejected = obj["chosen"], obj["rejected"]
    if "prompt" in obj:
        return obj["prompt"], [("chosen", chosen), ("rejected", rejected)]
    if not (isinstance(chosen, list) and isinstance(rejected, list)):
        raise BadRecord("wrong_format", "a 'chosen' / 'rejected' pair without a 'prompt' needs both as message lists "
                                        "that share their first turns (TRL's implicit prompt); give a 'prompt' field")
    shared = 0
    while shared < min(len(chosen), len(rejected)) - 1 and chosen[shared] == rejected[shared]:
        shared += 1
    if shared == 0:
        raise BadRecord("wrong_format", "'chosen' and 'rejected' share no first turn to use as the prompt (TRL's implicit "
                                        "prompt); give a 'prompt' field")
    return chosen[:shared], [("chosen", chosen[shared:]), ("rejected", rejected[shared:])]


def _number(value: Any, key: str) -> float:
    """A response's weight: NaN when not given, else a number float32 holds as a finite value (``segment_weight``
    and ``ResponseLogps.weight`` are float32: 1e39 would be stored as inf, a JSON integer of 400 digits has no
    float at all), so the weight a trainer reads is the one the record gave."""
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRecord("wrong_type", f"'{key}' must be a finite number, got {value!r}"[:200])
    try:
        weight = float(value)  # OverflowError: an integer past float64
        struct.pack("<f", weight)  # OverflowError: float32 rounds it to infinity
    except OverflowError:
        weight = math.inf
    if not math.isfinite(weight):
        shown = f"an integer of {len(str(abs(value))):,} digits" if isinstance(value, int) else repr(value)
        raise BadRecord("wrong_type", f"'{key}' is {shown}: a weight must be a finite number within float32's range "
                                      f"(|x| <= 3.4028235e38), the type segment_weight stores; rescale the scores")
    return weight


def _weights(obj: dict[str, Any], n: int) -> list[float]:
    given = [k for k in WEIGHT_LISTS if k in obj and obj[k] is not None]
    if not given:
        return [math.nan] * n
    if len(given) > 1:
        raise BadRecord("wrong_type", "give per-response 'rewards' or 'weights', not both")
    values = obj[given[0]]
    if not isinstance(values, list) or len(values) != n:
        raise BadRecord("wrong_type", f"'{given[0]}' must be a list of {n} numbers, one per response")
    return [_number(v, f"{given[0]}[{i}]") for i, v in enumerate(values)]
