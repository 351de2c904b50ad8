"""String preference records (TRL's standard format) tokenized in time linear in the record's bytes, token for token.

TRL tokenizes ``prompt + response`` whole for each response; packer tokenizes the prompt once and each response with
only the prompt's tail from a pre-token boundary no continuation can move (:mod:`packer.encode.stable`). These tests
compare that route with the whole tokenization (the HF tokenizer's own call) on texts chosen to break it -- whitespace
runs and newlines at the cut, digits, CJK, emoji, combining marks that NFC joins to the prompt, a prompt with no
boundary, responses that merge with the prompt's last word, special tokens typed across the prompt's end -- on the
sample tokenizer (GPT-2's ByteLevel regex, no normalizer) and Qwen's (a ``Split`` regex, NFC).
"""

from __future__ import annotations

import dataclasses
import json
import random

import numpy as np
import pytest
from family_assets import QWEN_TOKENIZER

from conftest import SAMPLE, TOKENIZER
from packer.encode import Encoder, EncoderSpec
from packer.encode.tokenizer import open_tokenizer
from packer.encode.tokens import TextTokenizer
from packer.ingest.reader import RawLine
from packer.pack.trees import response_row

IGNORE = -100
WORDS = "The frog likes to jump over the stones by the river, 12 times a day (or 3.5?). " * 8

PROMPTS = [
    WORDS + "The frog likes to jump",  # BPE merges the last word with "ing"
    WORDS + "spaces   \n\n   \t  ",  # a whitespace run with newlines at the end
    WORDS + "a line\n\n\n",
    WORDS + "x  \n  y  ",
    WORDS + "pay 1234567",  # digits go on in the response
    WORDS + "日本語のテキストです。価格は ¥1000元",  # CJK, no ASCII near the end
    "日本語のテキストです" * 40,  # CJK without a single boundary character
    WORDS + "hi 👋🏽 there 👨‍👩‍👧",  # emoji with a skin tone, a ZWJ family the response extends
    WORDS + "cafe",  # the response opens with a combining accent NFC joins to "e"
    WORDS + "e\u0301\u0301 \u0303",  # combining marks at the end
    WORDS + "한국어 하",  # a Hangul syllable a trailing jamo joins under NFC
    "abcdefghij" * 300,  # one pre-token: no boundary at all
    WORDS + "I don",  # contractions in the response
    WORDS + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",  # typed special tokens
    WORDS + "text <|im_",  # half a special token: the response completes it
    WORDS + "<|endoftext|>",  # ends with a special token
    "",
    "x",
]
RESPONSES = ["ing around.", "ed once.", " ", "   x", "\n", "\n\nNext", "s", "'ll do", "'s", "890 dollars", "6", ".5",
             "です。", "‍👦", "\u0301 noir", "\u11a8", "end|> and", "<|endoftext|>", "", "x", "  \t\n  y"]


def tokenizers():
    out = [pytest.param(TOKENIZER, id="sample")]
    if QWEN_TOKENIZER:
        out.append(pytest.param(QWEN_TOKENIZER, id="qwen"))
    return out


def check_cut(tok, text: TextTokenizer, prompt: str, responses: list[str]) -> int:
    """The cut route equals the whole tokenization for every response; returns the cut (characters)."""
    special = np.array(tok(prompt)["input_ids"], dtype=np.int32)
    c, n, lead = text.stable_head(prompt, special)
    for r in responses:
        whole = tok(prompt + r)["input_ids"]
        tail = tok(prompt[c:] + r)["input_ids"]
        assert special[:n].tolist() + tail[lead:] == whole, (prompt[-40:], r, c)
    return c


@pytest.mark.parametrize("path", tokenizers())
def test_a_prompt_cut_at_a_stable_boundary_gives_the_whole_tokenization(path):
    tok = open_tokenizer(path)
    text = TextTokenizer(tok)
    cuts = [check_cut(tok, text, prompt, RESPONSES) for prompt in PROMPTS]
    assert sum(c > 0 for c in cuts) >= 10  # most prompts are cut: the check is not vacuous
    assert cuts[PROMPTS.index("abcdefghij" * 300)] == 0 and cuts[PROMPTS.index("")] == 0
    typed = PROMPTS[PROMPTS.index(WORDS + "text <|im_")]
    assert cuts[PROMPTS.index(typed)] <= len(typed) - len("<|im_start|>")  # no added token can start before the cut


@pytest.mark.parametrize("path", tokenizers())
def test_random_texts_of_tricky_characters_cut_exactly(path):
    """Seeded random prompts and responses over characters that split, merge, normalize and combine."""
    tok = open_tokenizer(path)
    text = TextTokenizer(tok)
    alphabet = list("ab Z9 0.,'!\n\t\r") + ["  ", "\n\n", "é", "e\u0301", "\u0301", "日", "本", "한", "\u1100", "\u1161",
                                             "\u11a8", "👋", "\u200d", "🏽", "<|im_end|>", "<|endoftext|>", "'s", "'ll", "１"]
    rng = random.Random(0)
    cut = 0
    for _ in range(150):
        prompt = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 200)))
        responses = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 8))) for _ in range(6)]
        cut += check_cut(tok, text, prompt, responses) > 0
    assert cut >= 15  # a cut needs a boundary the longest added token (13, 21 characters) before the end


def test_a_tokenizer_whose_pieces_depend_on_their_start_is_not_cut(tmp_path):
    """A normalizer that prepends (SentencePiece's ``▁``), a regex outside the known ones: the whole prompt goes with
    each response (exact, the responses times the prompt)."""
    from tokenizers import Tokenizer

    tok = open_tokenizer(TOKENIZER)
    state = json.loads(tok.backend_tokenizer.to_str())
    prompt = WORDS + "The frog"
    special = np.array(tok(prompt)["input_ids"], dtype=np.int32)
    assert TextTokenizer(tok).stable_head(prompt, special)[0] > 0
    for change in ({"normalizer": {"type": "Prepend", "prepend": "▁"}},
                   {"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "a+b|a"}, "behavior": "Isolated", "invert": False}},
                   {"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}}):
        other = Tokenizer.from_str(json.dumps({**state, **change}))
        assert TextTokenizer(tok, other.to_str()).stable_head(prompt, special) == (0, 0, 0)


def test_a_long_string_prompt_goes_to_the_tokenizer_a_bounded_number_of_times(monkeypatch):
    """A 21 KB prompt with 40 responses: the tokenizer is sent the prompt a few times in all, not once per response
    (before: 40 times), and the samples are TRL's tokens."""
    pytest.importorskip("trl", reason="trl is in the test layer (requirements.lock)")
    from trl.data_utils import common_prefix_length

    enc = Encoder(EncoderSpec.of(tokenizer=TOKENIZER, preference="tree", max_length=1 << 20))
    prompt = "The frog likes to jump over the stones by the river. " * 400 + "It likes to jump"
    responses = [f" Answer {i}: " + "yes " * (i % 4) for i in range(40)] + ["ing around."]
    sent = []
    real = enc.text._rust
    monkeypatch.setattr(enc.text, "_rust", lambda texts, **kw: sent.append(sum(map(len, texts))) or real(texts, **kw))
    sample = enc.encode_line(RawLine(1, json.dumps({"prompt": prompt, "responses": responses}).encode()), "t.jsonl", SAMPLE)
    assert sum(sent) < 3 * len(prompt) + 40 * 200
    tok = enc.tok
    full = [tok(prompt + r + tok.eos_token)["input_ids"] for r in responses]
    start = min(common_prefix_length(tok(prompt)["input_ids"], ids) for ids in full)
    row = {"input_ids": sample.input_ids, "labels": sample.labels, "media": [],
           "responses": [dataclasses.asdict(r) for r in sample.responses], "prefix": sample.prefix}
    for k, want in enumerate(full):
        got = response_row(row, k)
        assert list(got["input_ids"]) == want and list(got["labels"]) == [IGNORE] * start + want[start:]
