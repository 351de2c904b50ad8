"""Shape detection and parsing, and one test per bad-record reason."""

import json
from pathlib import Path

import pytest

from packer.errors import BadRecord
from packer.ingest.formats import decode_json, detect_format, parse_record
from packer.ingest.records import Conversation, Document

SAMPLE = Path(__file__).resolve().parents[1] / "sample_data"
TAGS = {"image": "<image>", "audio": "<audio>"}
IMG = "images/square_336.png"
IMG2 = "images/landscape_640x480.jpg"
WAV = "audio/tone_a4_1s.wav"


def parse(obj, fmt="auto"):
    return parse_record(obj, fmt, SAMPLE, TAGS)


@pytest.mark.parametrize(
    "obj, fmt",
    [
        ({"conversations": []}, "llava"),
        ({"messages": []}, "messages"),
        ({"text": "x"}, "text"),
        ({"id": 3, "image": IMG, "conversations": [], "text": "ignored"}, "llava"),
    ],
)
def test_detect_format(obj, fmt):
    assert detect_format(obj) == fmt


def test_llava_record_splits_text_at_image_tags():
    conv = parse({"id": "a", "image": IMG, "conversations": [
        {"from": "human", "value": "Look <image> here"}, {"from": "gpt", "value": "A square."}]})
    assert isinstance(conv, Conversation) and conv.id == "a"
    assert [t.role for t in conv.turns] == ["user", "assistant"]
    kinds = [(p.kind, p.text or p.ref) for p in conv.turns[0].parts]
    assert kinds == [("text", "Look "), ("image", IMG), ("text", " here")]
    assert conv.turns[0].parts[1].path == str(SAMPLE / IMG)


def test_messages_parts_in_every_accepted_shape():
    conv = parse({"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [
            {"type": "image", "image": IMG},
            {"type": "image_url", "image_url": {"url": IMG2}},
            {"audio": WAV},
            {"type": "text", "text": "What are these?"},
        ]},
        {"role": "assistant", "content": "Two images and a tone."},
    ]})
    assert [(p.kind, p.ref) for p in conv.media] == [("image", IMG), ("image", IMG2), ("audio", WAV)]


def test_messages_with_top_level_images_list_and_pathless_parts():
    conv = parse({"images": [IMG, IMG2], "messages": [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "and <image>?"}]},
        {"role": "assistant", "content": "Yes."},
    ]})
    assert [p.ref for p in conv.media] == [IMG, IMG2]


def test_text_record_and_integer_id():
    doc = parse({"id": 7, "text": "hello"})
    assert doc == Document(text="hello", id="7")


def test_forced_format_needs_its_key():
    with pytest.raises(BadRecord, match="--format messages needs a 'messages' field") as e:
        parse({"text": "x"}, "messages")
    assert e.value.reason == "wrong_format"


@pytest.mark.parametrize(
    "line, reason, match",
    [
        (b'{"text": "unterminated', "malformed_json", "Unterminated string"),
        (b'{"text": "caf\xe9"}', "invalid_utf8", "byte 13 is not valid UTF-8"),
        (b'[1, 2]', "not_an_object", "JSON list, not an object"),
        (b'"just a string"', "not_an_object", "JSON str"),
    ],
)
def test_decode_errors(line, reason, match):
    with pytest.raises(BadRecord, match=match) as e:
        decode_json(line)
    assert e.value.reason == reason


@pytest.mark.parametrize(
    "obj, reason, match",
    [
        ({"foo": 1}, "unknown_format", r"no 'conversations', 'messages' or 'text' field \(keys: foo\)"),
        ({"text": 42}, "wrong_type", "'text' must be a string"),
        ({"text": "  \n"}, "empty_text", "'text' is empty"),
        ({"id": [1], "text": "x"}, "wrong_type", "'id' must be a string or integer"),
        ({"conversations": []}, "empty_conversation", "'conversations' is empty"),
        ({"messages": []}, "empty_conversation", "'messages' is empty"),
        ({"messages": {"role": "user"}}, "wrong_type", "'messages' must be a list"),
        ({"messages": ["hi"]}, "wrong_type", r"messages\[0\] must be an object"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "unknown_role", "role = 'tool'"),
        ({"messages": [{"role": 1, "content": "x"}]}, "wrong_type", "role must be a string"),
        ({"messages": [{"role": "user", "content": None}]}, "wrong_type", "content must be a string or a list"),
        ({"messages": [{"role": "user", "content": [{"type": "video", "video": "v.mp4"}]}]}, "wrong_type", "unsupported part type 'video'"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, "wrong_type", r"\.text must be a string"),
        ({"conversations": [{"from": "robot", "value": "x"}]}, "unknown_role", "from = 'robot'"),
        ({"conversations": [{"from": "human", "value": 3}]}, "wrong_type", "needs string 'from' and 'value'"),
        ({"image": [IMG, IMG2], "conversations": [{"from": "human", "value": "<image>"}]}, "image_count_mismatch", "1 listed image"),
        ({"conversations": [{"from": "human", "value": "<image>"}]}, "image_count_mismatch", "no image path left"),
        ({"image": 5, "conversations": [{"from": "human", "value": "x"}]}, "wrong_type", "'image' must be a path"),
        ({"image": "nope.png", "conversations": [{"from": "human", "value": "<image>"}]}, "missing_image", "'nope.png' not found"),
        ({"messages": [{"role": "user", "content": [{"type": "audio", "audio": "gone.wav"}]}]}, "missing_audio", "'gone.wav' not found"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "url": "https://x.org/a.png"}]}]}, "unsupported_media_ref", "remote URL"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "image": ""}]}]}, "wrong_type", "non-empty string"),
    ],
)
def test_bad_records(obj, reason, match):
    with pytest.raises(BadRecord, match=match) as e:
        parse(json.loads(json.dumps(obj)))
    assert e.value.reason == reason
