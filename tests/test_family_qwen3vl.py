"""Qwen3-VL, token for token with ``Qwen3VLProcessor`` and logit for logit with ``Qwen3VLForConditionalGeneration``.

The processor is built in code (patch 16, merge 2, small budgets, 4 fps video sampling, at most 12 frames)
and saved into a checkpoint folder that the build reads with ``--processor``; the chat template is a
Qwen3-VL-style fixture. Records hold the awkward media of the family harness.
"""

from __future__ import annotations

import pytest

pytest.importorskip("av")
pytest.importorskip("torchvision")

from assets_qwen3vl import ASSETS  # noqa: E402
from family_harness import build_family, conformance, write_media  # noqa: E402

FAMILY = "qwen3vl"
TestConformance = conformance(FAMILY)  # ulysses and ring; a clip's runs, timestamps between them


@pytest.mark.slow  # the real processor, a build and verify (~13 s)
def test_private_use_markers_typed_in_records_pass_verify_against_the_processor(tmp_path):
    """U+F0000 / U+F0001 (transformers' control-token markers) typed in a chat that marks no control token, or in a
    document, are the record's text: packed as ``processor.apply_chat_template`` / the tokenizer encode them, so
    ``verify --against-processor`` finds every id equal (they used to be removed, and verify exited 6)."""
    import json

    from packer.loader import PackedDataset
    from packer.verify.against_processor import verify_against_processor

    typed = "x\U000f0000y\U000f0001z"
    image = str(write_media(tmp_path, ("image",))["plain_300x200.jpg"].relative_to(tmp_path))
    records = [
        {"id": "chat", "messages": [{"role": "user", "content": typed}, {"role": "assistant", "content": "ok " + typed}]},
        {"id": "parts", "messages": [{"role": "user", "content": [{"type": "image", "image": image},
                                                                   {"type": "text", "text": typed}]},
                                     {"role": "assistant", "content": "\U000f0001"}]},
        {"id": "doc", "text": "a document " + typed},
    ]
    source = tmp_path / "records.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    processor = ASSETS.processor(tmp_path / "checkpoint")
    build_family("qwen3vl", tmp_path / "checkpoint", source, tmp_path / "out")
    mismatches, checked = verify_against_processor(tmp_path / "out", str(tmp_path / "checkpoint"), sample=3)
    assert checked == 3 and mismatches == [], [str(m) for m in mismatches]
    ds = PackedDataset(str(tmp_path / "out"))
    segments = {ds[r]["segment_ids"][k]: ds[r]["input_ids"][ds[r]["cu_seqlens"][k]:ds[r]["cu_seqlens"][k + 1]].tolist()
                for r in range(len(ds)) for k in range(len(ds[r]["segment_ids"]))}
    chat = records[0]["messages"]
    assert segments["chat"] == list(processor.apply_chat_template(chat, tokenize=True, return_dict=True)["input_ids"][0])
    assert typed in processor.tokenizer.decode(segments["doc"])


@pytest.mark.slow  # the real processor, a build and verify (~13 s)
def test_a_tool_calling_record_passes_verify_against_the_processor(tmp_path):
    """A record's ``tools`` and an assistant turn's ``tool_calls`` reach the processor's template in verify as they
    reached the build's (``apply_chat_template(messages, tools=tools)``); verify used to render without the tools."""
    import json

    from family_assets import QWEN_TOKENIZER
    from test_tool_calls import OPENAI, TOOLS
    from transformers import AutoTokenizer

    from packer.verify.against_processor import verify_against_processor

    processor = ASSETS.processor(tmp_path / "checkpoint")
    processor.chat_template = AutoTokenizer.from_pretrained(QWEN_TOKENIZER).chat_template  # Qwen3's: renders tools
    processor.save_pretrained(str(tmp_path / "checkpoint"))
    source = tmp_path / "records.jsonl"
    source.write_text(json.dumps({"id": "tools", "messages": OPENAI, "tools": TOOLS}) + "\n")
    build_family("qwen3vl", tmp_path / "checkpoint", source, tmp_path / "out")
    mismatches, checked = verify_against_processor(tmp_path / "out", str(tmp_path / "checkpoint"), sample=1)
    assert checked == 1 and mismatches == [], [str(m) for m in mismatches]
