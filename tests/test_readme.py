"""The README's five-minute paths run as written: each bash and python block of a "Five minutes"
section, with hub names swapped for local assets (the real Qwen3 tokenizer files, a Qwen3-VL processor saved in
code, tiny random-init models), data paths for generated records and ``max_steps`` for one step. A swap whose
text is missing from the README fails the test, so the README cannot drift from what is run."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

pytest.importorskip("av")

from click.testing import CliRunner  # noqa: E402
from family_assets import FAMILY_ASSETS, QWEN_TOKENIZER  # noqa: E402
from media_fixtures import write_images  # noqa: E402

from packer.cli import main  # noqa: E402

README = Path(__file__).parents[1] / "README.md"


def blocks(title: str) -> list[tuple[str, str]]:
    text = README.read_text()
    section = text[text.index(f"## Five minutes: {title}"):]
    section = section[: section.index("\n## ", 4)]
    return re.findall(r"```(bash|python)\n(.*?)```", section, re.S)


def swap(code: str, swaps: dict[str, str]) -> str:
    for old, new in swaps.items():
        assert old in code, f"the README no longer says {old!r}: update tests/test_readme.py with it"
        code = code.replace(old, new)
    return code


def run(title: str, bash: dict[str, str], python: dict[str, str], names: dict) -> dict:
    """Every block of the section, each swap of its language applied (and present) in every block."""
    for lang, code in blocks(title):
        code = swap(code, bash if lang == "bash" else python)
        if lang == "bash":
            for line in code.strip().splitlines():
                args = shlex.split(line.split("#")[0])
                assert args[0] == "packer"
                result = CliRunner().invoke(main, args[1:])
                assert result.exit_code == 0, (line, result.output)
        else:
            exec(compile(code, f"README {title}", "exec"), names)  # noqa: S102 -- the README's own snippet
    return names


def chat(k: int, media: list | None = None) -> dict:
    return {"id": f"c{k}", "messages": [{"role": "user", "content": [*(media or []), {"type": "text", "text": f"Q{k}?"}]},
                                        {"role": "assistant", "content": f"Answer {k}."}]}


def tiny_causal_lm():
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=len(AutoTokenizer.from_pretrained(QWEN_TOKENIZER)), hidden_size=32,
                         intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=8, attn_implementation="sdpa")
    return Qwen3ForCausalLM(config)


STEPS = {"max_steps=100)": "max_steps=1, report_to=[], use_cpu=True)"}


def test_text_sft(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("data").mkdir()
    Path("data/chats.jsonl").write_text("".join(json.dumps(chat(k)) + "\n" for k in range(6)))
    names = run("text SFT", {"Qwen/Qwen3-8B": QWEN_TOKENIZER},
                {'AutoModelForCausalLM.from_pretrained("Qwen/Qwen3-8B")': "tiny_causal_lm()", **STEPS},
                {"tiny_causal_lm": tiny_causal_lm})
    assert names["ds"].family["name"] == "generic" and len(names["ds"]) >= 1


@pytest.mark.slow  # over 10 s (subprocesses / real tokenizers): make test-fast leaves it out
def test_a_vision_language_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assets = FAMILY_ASSETS["qwen3vl"]
    files = write_images(tmp_path / "data" / "img")
    image = str(files["plain_300x200.jpg"].relative_to(tmp_path / "data"))
    Path("data/vqa.jsonl").write_text("".join(json.dumps(chat(k, [{"type": "image", "image": image}] if k % 2 else []))
                                              + "\n" for k in range(4)))
    processor = assets.processor(tmp_path / "qwen3vl")
    names = run("a vision-language model", {"Qwen/Qwen3-VL-8B-Instruct": str(tmp_path / "qwen3vl")},
                {'Qwen3VLForConditionalGeneration.from_pretrained("Qwen/Qwen3-VL-8B-Instruct")': "vl_model()", **STEPS},
                {"vl_model": lambda: assets.model(processor, "sdpa")})
    assert names["loss"].isfinite()
    assert names["collate"].family.name == "qwen3vl" and names["collate"].media_step is not None


@pytest.mark.slow  # a VLM build and a training step
def test_from_a_hugging_face_dataset(tmp_path, monkeypatch):
    """The Cauldron's layout (``images`` + ``texts`` turns) as the hub's parquet holds it, read with no mapping; the
    build trains with its images in its own media shards (the parquet is deleted first)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets import Features, Image, List, Value

    monkeypatch.chdir(tmp_path)
    assets = FAMILY_ASSETS["qwen3vl"]
    files = write_images(tmp_path / "img")
    features = Features({"images": List(Image()), "texts": List({"user": Value("string"), "assistant": Value("string"),
                                                                 "source": Value("string")})})
    pictures = [p.read_bytes() for p in sorted(files.values())[:2]]
    table = pa.table({"images": [[{"bytes": pictures[k % 2], "path": f"{k}.png"}] for k in range(4)],
                      "texts": [[{"user": f"What is {k}?", "assistant": f"Shapes {k}.", "source": "ai2d"}]
                                for k in range(4)]}, schema=features.arrow_schema)
    Path("hub").mkdir()
    pq.write_table(table, "hub/train-00000-of-00001.parquet")
    processor = assets.processor(tmp_path / "qwen3vl")
    names = run("from a Hugging Face dataset",
                {"hf://datasets/HuggingFaceM4/the_cauldron/ai2d/*.parquet": "hub/*.parquet",
                 "Qwen/Qwen3-VL-8B-Instruct": str(tmp_path / "qwen3vl")},
                {'Qwen3VLForConditionalGeneration.from_pretrained("Qwen/Qwen3-VL-8B-Instruct")': "vl_model()",
                 'PackedDataset("out/cauldron")': 'PackedDataset(gone("out/cauldron"))', **STEPS},
                {"vl_model": lambda: assets.model(processor, "sdpa"), "gone": _without_inputs})
    assert len(names["ds"]) >= 1 and (tmp_path / "out" / "cauldron" / "media").is_dir()


def _without_inputs(out: str) -> str:
    """``out`` once the parquet it was built from is gone: its media are in the build."""
    for f in Path("hub").glob("*.parquet"):
        f.unlink()
    return out


def test_preference_data(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("data").mkdir()
    pairs = [{"prompt": [{"role": "user", "content": f"Q{k}?"}], "chosen": [{"role": "assistant", "content": f"Yes {k}."}],
              "rejected": [{"role": "assistant", "content": f"No {k}, never."}]} for k in range(4)]
    Path("data/pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    names = run("preference data (DPO)", {"Qwen/Qwen3-8B": QWEN_TOKENIZER},
                {'AutoModelForCausalLM.from_pretrained("Qwen/Qwen3-8B")': "tiny_causal_lm()"},
                {"tiny_causal_lm": tiny_causal_lm})
    assert names["loss"].isfinite()
