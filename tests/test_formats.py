"""Shape detection and parsing, and one test per bad-record reason."""

import json
import os
import shutil
from pathlib import Path

import pytest

from packer.build import build
from packer.config import BuildConfig
from packer.errors import BadRecord
from packer.ingest.formats import FORMATS, decode_json, detect_format, parse_record
from packer.ingest.records import Conversation, Document

SAMPLE = Path(__file__).resolve().parents[1] / "sample_data"
TOKENIZER = str(SAMPLE / "tokenizer")
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
        ({"messages": [{"from": "human", "value": "x"}]}, "sharegpt"),
        ({"messages": [{"role": "user", "content": "x"}], "prompt": "x", "completion": "y"}, "messages"),
        ({"prompt": "x", "completion": "y"}, "prompt_completion"),
        ({"prompt": [], "completion": [], "text": "ignored"}, "prompt_completion"),
        ({"instruction": "x", "input": "", "output": "y", "text": "Alpaca's own rendering"}, "alpaca"),
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


def roles(conv):
    return [(t.role, "".join(p.text or f"[{p.ref}]" for p in t.parts), t.trained) for t in conv.turns]


def test_trl_standard_prompt_completion():
    conv = parse({"id": "p1", "prompt": "The sky is", "completion": " blue."})
    assert conv.id == "p1" and roles(conv) == [("user", "The sky is", False), ("assistant", " blue.", True)]


def test_trl_conversational_prompt_completion_with_an_image():
    conv = parse({"images": [IMG], "prompt": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Colour?"}]},
        {"role": "assistant", "content": "Which part?"},
        {"role": "user", "content": "All of it."},
    ], "completion": [{"role": "assistant", "content": "Red."}]})
    assert roles(conv) == [("system", "Be brief.", False), ("user", f"[{IMG}]Colour?", False),
                           ("assistant", "Which part?", False), ("user", "All of it.", False), ("assistant", "Red.", True)]


def test_alpaca_joins_instruction_and_input_with_a_blank_line():
    assert roles(parse({"instruction": "Sum.", "input": "2 and 3", "output": "5", "text": "ignored"})) == [
        ("user", "Sum.\n\n2 and 3", True), ("assistant", "5", True)]
    assert roles(parse({"instruction": "Say hi.", "input": "", "output": "Hi", "system": "Be kind."})) == [
        ("system", "Be kind.", True), ("user", "Say hi.", True), ("assistant", "Hi", True)]
    assert roles(parse({"instruction": "", "input": "Only input", "output": "ok", "system": None})) == [
        ("user", "Only input", True), ("assistant", "ok", True)]


def test_alpaca_history_and_image_tags():
    conv = parse({"images": [IMG], "instruction": "<image>And now?", "output": "Blue.", "history": [["First?", "Red."]]})
    assert roles(conv) == [("user", "First?", True), ("assistant", "Red.", True), ("user", f"[{IMG}]And now?", True),
                           ("assistant", "Blue.", True)]


@pytest.mark.parametrize("key", ["conversations", "messages"])
def test_sharegpt_variants_and_their_roles(key):
    conv = parse({"image": IMG, key: [
        {"from": "system", "value": "S"}, {"from": "human", "value": "<image>Q"}, {"from": "function_call", "value": "call"},
        {"from": "observation", "value": "obs"}, {"from": "function", "value": "fn"}, {"from": "tool", "value": "t"},
        {"from": "GPT", "value": "A"}, {"from": "user", "value": "Q2"}, {"from": "chatgpt", "value": "B"},
        {"from": "bard", "value": "C"}, {"from": "assistant", "value": "D"}]})
    assert [r for r, _, _ in roles(conv)] == ["system", "user", "assistant", "tool", "tool", "tool", "assistant", "user",
                                              "assistant", "assistant", "assistant"]
    assert roles(conv)[1] == ("user", f"[{IMG}]Q", True)


def test_conversations_written_as_role_content_are_messages():
    conv = parse({"conversations": [{"role": "user", "content": [{"type": "text", "text": "Q"}]},
                                    {"role": "assistant", "content": "A"}]})
    assert roles(conv) == [("user", "Q", True), ("assistant", "A", True)]


def test_messages_tool_role():
    assert [t.role for t in parse({"messages": [{"role": "tool", "content": "x"}]}).turns] == ["tool"]


@pytest.mark.parametrize("fmt, obj", [
    ("sharegpt", {"messages": [{"from": "human", "value": "Q"}, {"from": "gpt", "value": "A"}]}),
    ("sharegpt", {"conversations": [{"from": "human", "value": "Q"}, {"from": "gpt", "value": "A"}]}),
    ("prompt_completion", {"prompt": "Q", "completion": "A", "messages": "not used"}),
    ("alpaca", {"instruction": "Q", "output": "A", "conversations": "not used"}),
])
def test_forced_formats(fmt, obj):
    assert [t.role for t in parse(obj, fmt).turns] == ["user", "assistant"]


@pytest.mark.parametrize("fmt, match", [
    ("prompt_completion", "--format prompt_completion needs 'prompt' and 'completion' fields"),
    ("alpaca", "--format alpaca needs 'instruction' and 'output' fields"),
    ("sharegpt", "--format sharegpt needs a 'conversations' or 'messages' field"),
])
def test_forced_formats_name_their_fields(fmt, match):
    with pytest.raises(BadRecord, match=match) as e:
        parse({"text": "x"}, fmt)
    assert e.value.reason == "wrong_format"


def test_every_format_is_a_format_choice():
    assert BuildConfig.__dataclass_fields__["format"].metadata["choices"] == ("auto", *FORMATS)


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
        ({"foo": 1}, "unknown_format", r"no 'conversations', 'messages', 'prompt' \+ 'completion', 'instruction' \+ 'output' "
                                       r"or 'text' field \(keys: foo\)"),
        ({"prompt": "x", "score": 1}, "unknown_format", "a 'prompt' needs a 'completion', 'chosen' \\+ 'rejected' or a list "
                                                        "of 'responses'"),
        ({"instruction": "x"}, "unknown_format", "an Alpaca 'instruction' needs an 'output'"),
        ({"text": 42}, "wrong_type", "'text' must be a string"),
        ({"text": "  \n"}, "empty_text", "'text' is empty"),
        ({"id": [1], "text": "x"}, "wrong_type", "'id' must be a string or integer"),
        ({"conversations": []}, "empty_conversation", "'conversations' is empty"),
        ({"messages": []}, "empty_conversation", "'messages' is empty"),
        ({"messages": {"role": "user"}}, "wrong_type", "'messages' must be a list"),
        ({"messages": ["hi"]}, "wrong_type", r"messages\[0\] must be an object"),
        ({"messages": [{"role": "narrator", "content": "x"}]}, "unknown_role", "role = 'narrator'"),
        ({"messages": [{"role": 1, "content": "x"}]}, "wrong_type", "role must be a string"),
        ({"messages": [{"role": "user", "content": None}]}, "wrong_type", "content must be a string or a list"),
        ({"messages": [{"role": "user", "content": [{"type": "hologram", "hologram": "v.glb"}]}]}, "wrong_type", "unsupported part type 'hologram'"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, "wrong_type", r"\.text must be a string"),
        ({"conversations": [{"from": "robot", "value": "x"}]}, "unknown_role", "from = 'robot'"),
        ({"conversations": [{"from": "human", "value": 3}]}, "wrong_type", "needs string 'from' and 'value'"),
        ({"image": [IMG, IMG2], "conversations": [{"from": "human", "value": "<image>"}]}, "image_count_mismatch", "1 listed image"),
        ({"conversations": [{"from": "human", "value": "<image>"}]}, "image_count_mismatch", "no image path left"),
        ({"image": 5, "conversations": [{"from": "human", "value": "x"}]}, "wrong_type", "'image' must be a path"),
        ({"image": "nope.png", "conversations": [{"from": "human", "value": "<image>"}]}, "missing_image", "'nope.png' not found"),
        ({"messages": [{"role": "user", "content": [{"type": "audio", "audio": "gone.wav"}]}]}, "missing_audio", "'gone.wav' not found"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "url": "s3://x/a.png"}]}]}, "unsupported_media_ref",
         "s3:// URL in a local dataset"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "image": ""}]}]}, "wrong_type", "non-empty string"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 999}}]}]},
         "bad_data_url", r"'data:image/png;base64,A{26}\.\.\.': its base64 data does not decode"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "gs://x/a.png"}}]}]},
         "unsupported_media_ref", "gs:// URL in a local dataset; packer reads media relative to the dataset, http"),
        ({"messages": [{"from": "narrator", "value": "x"}]}, "unknown_role", r"messages\[0\]\.from = 'narrator'"),
        ({"prompt": 3, "completion": "x"}, "wrong_type", "'prompt' must be a string or a list of messages"),
        ({"prompt": "x", "completion": " "}, "empty_text", "'completion' is empty"),
        ({"prompt": "x", "completion": []}, "empty_conversation", "'completion' is empty"),
        ({"prompt": [{"role": "oracle", "content": "x"}], "completion": "y"}, "unknown_role", r"prompt\[0\]\.role = 'oracle'"),
        ({"instruction": "x", "output": 3}, "wrong_type", "'output' must be a string, got int"),
        ({"instruction": "x", "input": 1, "output": "y"}, "wrong_type", "'input' must be a string"),
        ({"instruction": " ", "input": "", "output": "y"}, "empty_text", "'instruction' and 'input' are both empty"),
        ({"instruction": "x", "output": ""}, "empty_text", "'output' is empty"),
        ({"instruction": "x", "output": "y", "history": [["a"]]}, "wrong_type", r"history\[0\] must be an \[instruction, response\]"),
        ({"image": "../tests/fixtures/outside.png", "conversations": [{"from": "human", "value": "<image>"}]},
         "media_outside_root", "written as a path outside the dataset root"),
        ({"image": "/etc/passwd", "conversations": [{"from": "human", "value": "<image>"}]}, "media_outside_root",
         "--allow-outside-media-root"),
    ],
)
def test_bad_records(obj, reason, match):
    with pytest.raises(BadRecord, match=match) as e:
        parse(json.loads(json.dumps(obj)))
    assert e.value.reason == reason


# --- builds: every shape packs; symlinks inside the dataset are followed -----------------------


def build_jsonl(tmp_path, records, name="out", **kw):
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    (data / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    config = BuildConfig(input=(str(data / "in.jsonl"),), output=str(tmp_path / name), tokenizer=TOKENIZER,
                         max_length=2048, max_bad_fraction=1.0, **kw)
    manifest = build(config, progress=False).to_dict()
    quarantine = [json.loads(line) for line in (tmp_path / name / "quarantine.jsonl").read_text().splitlines()]
    return manifest["accounting"], {q["id"]: (q["reason"], q["detail"]) for q in quarantine}


MIXED = [
    {"id": "llava", "image": IMG, "conversations": [{"from": "human", "value": "<image>\nWhat?"}, {"from": "gpt", "value": "A."}]},
    {"id": "sharegpt", "messages": [{"from": "system", "value": "S"}, {"from": "human", "value": "Q"},
                                    {"from": "function_call", "value": "{}"}, {"from": "observation", "value": "r"},
                                    {"from": "gpt", "value": "A"}]},
    {"id": "messages", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": IMG2}},
                                                                 {"type": "text", "text": "What?"}]},
                                    {"role": "tool", "content": "t"}, {"role": "assistant", "content": "B."}]},
    {"id": "trl-standard", "prompt": "The sky is", "completion": " blue."},
    {"id": "trl-conversational", "images": [IMG], "prompt": [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Colour?"}]},
        {"role": "assistant", "content": "Which part?"}, {"role": "user", "content": "All."}],
     "completion": [{"role": "assistant", "content": "Red."}]},
    {"id": "alpaca", "instruction": "Sum.", "input": "2 and 3", "output": "5", "text": "ignored"},
    {"id": "alpaca-image", "image": IMG, "instruction": "<image>Describe.", "output": "A square.", "system": "Be brief."},
    {"id": "text", "text": "A plain document."},
]


def test_a_build_of_every_shape_packs_every_record(tmp_path):
    shutil.copytree(SAMPLE / "images", tmp_path / "data" / "images")
    acc, quarantined = build_jsonl(tmp_path, MIXED)
    assert quarantined == {}
    assert acc["records_read"] == acc["samples_packed"] == len(MIXED) and acc["dropped"] == 0


def test_symlinked_media_folder_inside_the_dataset_is_followed(tmp_path):
    elsewhere = tmp_path / "elsewhere"  # the images live on "another disk"
    shutil.copytree(SAMPLE / "images", elsewhere)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "images").symlink_to(elsewhere, target_is_directory=True)
    (tmp_path / "data" / "alias.png").symlink_to(tmp_path / "data" / "images" / "square_336.png")  # link to a link
    shutil.copy(SAMPLE / "images" / "small_224.png", tmp_path / "outside.png")

    def rec(rid, path):
        return {"id": rid, "image": path, "conversations": [{"from": "human", "value": "<image>"}, {"from": "gpt", "value": "ok"}]}

    acc, quarantined = build_jsonl(tmp_path, [
        rec("via-linked-folder", IMG), rec("file-link", "alias.png"), rec("dot-dot-inside", "images/../images/square_336.png"),
        rec("absolute-inside", str(tmp_path / "data" / IMG)), rec("outside", "../outside.png"),
        rec("outside-through-link", "images/../../outside.png"), rec("absolute-outside", str(tmp_path / "outside.png")),
    ])
    assert acc["samples_packed"] == 4
    assert {rid: reason for rid, (reason, _) in quarantined.items()} == {
        "outside": "media_outside_root", "outside-through-link": "media_outside_root", "absolute-outside": "media_outside_root"}
    assert "--allow-outside-media-root" in quarantined["outside"][1]


def test_dot_dot_is_read_lexically_not_through_a_symlink(tmp_path):
    """``images/../x.png`` names ``ROOT/x.png`` whatever ``images`` links to, so the root
    check and the file read agree."""
    (tmp_path / "far" / "imgs").mkdir(parents=True)
    shutil.copy(SAMPLE / IMG, tmp_path / "far" / "x.png")  # what the OS would reach through the link
    root = tmp_path / "data"
    root.mkdir()
    (root / "images").symlink_to(tmp_path / "far" / "imgs", target_is_directory=True)
    with pytest.raises(BadRecord, match=r"looked at .*data/x\.png") as e:
        parse_record({"image": "images/../x.png", "conversations": [{"from": "human", "value": "<image>"}]}, "auto", root, TAGS)
    assert e.value.reason == "missing_image"


def test_a_root_reached_through_a_symlink_accepts_its_real_absolute_paths(tmp_path):
    real = tmp_path / "real"
    shutil.copytree(SAMPLE / "images", real / "images")
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    conv = parse_record({"image": str(real / IMG), "conversations": [{"from": "human", "value": "<image>"}]}, "auto",
                        tmp_path / "link", TAGS)
    assert conv.media[0].path == str(real / IMG)


def test_outside_paths_are_accepted_when_allowed(tmp_path):
    shutil.copy(SAMPLE / IMG, tmp_path / "outside.png")
    (tmp_path / "data").mkdir()
    conv = parse_record({"image": "../outside.png", "conversations": [{"from": "human", "value": "<image>"}]}, "auto",
                        tmp_path / "data", TAGS, allow_outside_root=True)
    assert conv.media[0].path == os.path.normpath(tmp_path / "outside.png")
