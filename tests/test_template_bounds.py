"""A chat template is code from a checkpoint: its renderings are bounded in steps and characters
(the record is quarantined with its own reason, the build goes on), what it reads that could differ between builds
(the clock, ``%s``, ``|random``, ``lipsum``) is fixed, and a ``--chat-template`` file is part of the build's identity."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SAMPLE, TOKENIZER
from packer.encode import Encoder, EncoderSpec
from packer.errors import BadRecord
from packer.ingest.reader import RawLine

CHATML = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
CHAT = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
ROOT = Path(__file__).resolve().parents[1]


def encoder(tmp_path, head: str, **settings) -> Encoder:
    path = tmp_path / "t.jinja"
    path.write_text(head + CHATML)
    return Encoder(EncoderSpec.of(tokenizer=TOKENIZER, chat_template=str(path), **settings))


def encode(enc: Encoder, record: dict = CHAT):
    return enc.encode_line(RawLine(1, json.dumps(record).encode()), "t.jsonl", SAMPLE)


@pytest.mark.parametrize("head", [
    "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}",  # 10^10 steps
    "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}",  # 2^60 calls
])
def test_a_template_that_never_ends_costs_its_record(tmp_path, head):
    enc = encoder(tmp_path, "{% if messages | length > 2 %}" + head + "{% endif %}", template_max_steps=20_000)
    with pytest.raises(BadRecord, match="more than 20,000 steps") as e:
        encode(enc, {"messages": CHAT["messages"] * 2})
    assert e.value.reason == "template_too_slow"
    assert enc.tok.decode(encode(enc).input_ids).startswith("<|im_start|>user")  # the next record renders


@pytest.mark.parametrize("head", [
    "{% for i in range(100) %}{{ 'x' * 2000000 }}{% endfor %}",  # 200 MB written
    "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",  # doubling
    "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",  # str + str
    "{{ 'a'.ljust(10 ** 9) }}", "{{ '%999999999d' % 1 }}", "{{ messages[0].content | center(10 ** 9) }}",
])
def test_a_template_that_writes_too_much_costs_its_record(tmp_path, head):
    enc = encoder(tmp_path, head, template_max_chars=1_000_000)
    with pytest.raises(BadRecord, match="over template_max_chars = 1,000,000") as e:
        encode(enc)
    assert e.value.reason == "template_output_too_long"


def test_bounds_in_a_build_quarantine_and_go_on(tmp_path):
    from packer.build import build
    from packer.config import BuildConfig

    template = tmp_path / "t.jinja"
    template.write_text("{% if 'loop' in messages[0].content %}{% for i in range(99999) %}{% for j in range(99999) %}"
                        "{% endfor %}{% endfor %}{% endif %}" + CHATML)
    src = tmp_path / "in.jsonl"
    loop = {"messages": [{"role": "user", "content": "loop"}, {"role": "assistant", "content": "x"}]}
    src.write_text("".join(json.dumps(r) + "\n" for r in [CHAT, loop, CHAT]))
    manifest = build(BuildConfig(input=(str(src),), output=str(tmp_path / "out"), tokenizer=TOKENIZER,
                                 chat_template=str(template), template_max_steps=50_000, max_bad_fraction=1.0),
                     progress=False)
    assert manifest.accounting.samples_packed == 2
    quarantined = [json.loads(x) for x in (tmp_path / "out" / "quarantine.jsonl").read_text().splitlines()]
    assert [q["reason"] for q in quarantined] == ["template_too_slow"]


def test_random_and_lipsum_are_seeded_by_the_record(tmp_path):
    head = "{{ lipsum(1, html=False) }} {{ range(10 ** 5) | list | random }}|"
    first, second = encoder(tmp_path, head), encoder(tmp_path, head)
    assert first.renderer.compiled is not None and first.fingerprint()["template_random"].startswith("seeded")
    other = {"messages": [{"role": "user", "content": "other"}, {"role": "assistant", "content": "yo"}]}
    texts = [first.tok.decode(encode(e, r).input_ids) for e in (first, second, first) for r in (CHAT, other)]
    assert texts[0] == texts[2] == texts[4] and texts[1] == texts[3] == texts[5]
    assert texts[0].split("|")[0] != texts[1].split("|")[0]  # a seed per record, not one draw for all


def test_a_sub_second_clock_renders_at_the_builds_fixed_time(tmp_path):
    enc = encoder(tmp_path, "{{ strftime_now('%Y-%m-%d %H:%M:%S.%f %s %%s') }}|", template_time="2026-01-01T12:00:00+02:00")
    assert enc.renderer.compiled is not None
    assert enc.tok.decode(encode(enc).input_ids).startswith("2026-01-01 10:00:00.000000 1767261600 %s|")


CLOCK_SCRIPT = """
import json, sys
from packer.encode import Encoder, EncoderSpec
from packer.ingest.reader import RawLine
enc = Encoder(EncoderSpec.of(tokenizer=sys.argv[1], chat_template=sys.argv[2]))
s = enc.encode_line(RawLine(1, sys.argv[3].encode()), "t.jsonl", ".")
print(json.dumps(s.input_ids.tolist()))
"""


def test_the_clock_gives_the_same_ids_in_every_time_zone(tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text("{{ strftime_now('%s %d %b %Y %H:%M %Z') }}|" + CHATML)
    out = set()
    for tz in ("UTC", "America/Los_Angeles", "Asia/Kolkata"):
        env = {**os.environ, "TZ": tz, "SOURCE_DATE_EPOCH": "1767225600", "PYTHONPATH": str(ROOT)}
        out.add(subprocess.run([sys.executable, "-c", CLOCK_SCRIPT, TOKENIZER, str(template), json.dumps(CHAT)],
                               env=env, capture_output=True, text=True, check=True).stdout)
    assert len(out) == 1


def test_a_chat_template_file_is_part_of_the_build(tmp_path):
    from packer.build import build
    from packer.config import BuildConfig
    from packer.errors import PackerError

    template = tmp_path / "t.jinja"
    template.write_text(CHATML)
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps(CHAT) + "\n")
    config = BuildConfig(input=(str(src),), output=str(tmp_path / "out"), tokenizer=TOKENIZER, chat_template=str(template))
    build(config, progress=False)
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(str(tmp_path / "out" / "tokenizer")).chat_template == CHATML
    template.write_text("edited " + CHATML)
    with pytest.raises(PackerError, match="tokenizer"):
        build(config, progress=False)  # the same folder, another template: refused, never the stale shards


@pytest.mark.slow  # over 10 s (subprocesses / real tokenizers): make test-fast leaves it out
def test_a_dated_template_builds_byte_identical_across_runs_and_time_zones(tmp_path):
    """A Llama 3.x-style date line (and ``%s``, and sub-second fields): the same bytes under three TZs and twice."""
    template = tmp_path / "t.jinja"
    template.write_text("Cutting Knowledge Date: December 2023\nToday Date: {{ strftime_now('%d %b %Y') }} "
                        "{{ strftime_now('%s.%f') }}\n" + CHATML)
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q{k}"},
                                                    {"role": "assistant", "content": f"a{k}"}]}) + "\n" for k in range(5)))
    digests = []
    for k, tz in enumerate(("UTC", "America/Los_Angeles", "Asia/Kolkata", "UTC")):
        out = tmp_path / f"out{k}"
        env = {**os.environ, "TZ": tz, "PYTHONPATH": str(ROOT)}
        env.pop("SOURCE_DATE_EPOCH", None)
        subprocess.run([sys.executable, "-m", "packer", "build", "-i", str(src), "-o", str(out), "--tokenizer", TOKENIZER,
                        "--chat-template", str(template)], env=env, check=True, capture_output=True, text=True)
        manifest = json.loads((out / "manifest.json").read_text())
        digests.append(json.dumps({k: manifest["files"][k] for k in ("samples", "packed")}, sort_keys=True))
    assert len(set(digests)) == 1
    import pyarrow as pa
    from transformers import AutoTokenizer

    with pa.ipc.open_stream(str(tmp_path / "out0" / json.loads(digests[0])["packed"][0]["file"])) as f:
        ids = f.read_all().column("input_ids")[0].as_py()
    text = AutoTokenizer.from_pretrained(str(tmp_path / "out0" / "tokenizer")).decode(ids)
    assert "Today Date: 01 Jan 1970 0.000000" in text  # no SOURCE_DATE_EPOCH: the Unix epoch, in UTC


def test_the_bounded_path_reads_a_message_as_the_sandbox_does(tmp_path):
    """The compiled path reads a message's keys without the sandbox's failed attribute lookup: a key, a missing key
    (undefined), a key named like a dict method (the method, as the sandbox gives it) and a method call render as
    transformers' own call renders them; an attribute of another object still goes through the sandbox."""
    head = ("{{ messages[0].role }}|{{ messages[0].nothing is defined }}|{{ messages[0].get('role') }}|"
            "{{ messages[0].items is defined }}|{{ messages[0].keys() | list | length }}|{{ 'ab'.upper() }}|"
            "{{ messages[0].__class__ is defined }}|")
    enc = encoder(tmp_path, head)
    messages = [{"role": "user", "content": "Hi", "items": "typed"}]
    assert enc.renderer.compiled is not None
    assert enc.renderer.render(messages) == enc.renderer.public(messages)
    assert enc.renderer.render(messages).startswith("user|False|user|True|3|AB|False|")
