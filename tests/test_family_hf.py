"""The route for other HF processors (``--family hf``): the processor says what each item becomes.

Idefics3 is not a named family; its processor splits an image into tiles and writes ``<row_1_col_1>`` /
``<fake_token_around_image>`` / ``<global-img>`` text between runs of ``<image>``. Built with ``--family hf``,
the ids equal the processor's token for token, and the loader's check uses the processor's own replacement.
What the route cannot do is refused up front, naming what is missing.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torchvision")

from family_assets import QWEN_TOKENIZER, TEMPLATES, _save_and_load  # noqa: E402
from family_harness import check_ids  # noqa: E402
from media_fixtures import write_images  # noqa: E402

from packer.build import build  # noqa: E402
from packer.config import resolve  # noqa: E402
from packer.errors import ConfigError  # noqa: E402
from packer.loader import PackedCollator, PackedDataset  # noqa: E402


def idefics3_processor(folder):
    from transformers import AutoTokenizer, Idefics3ImageProcessor, Idefics3Processor

    tok = AutoTokenizer.from_pretrained(QWEN_TOKENIZER)
    ip = Idefics3ImageProcessor(size={"longest_edge": 2 * 56}, max_image_size={"longest_edge": 56}, do_image_splitting=True)
    proc = Idefics3Processor(image_processor=ip, tokenizer=tok, image_seq_len=4,
                             chat_template=(TEMPLATES / "idefics3.jinja").read_text())
    return _save_and_load(proc, folder)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    files = write_images(root / "img")
    names = [["exif6.jpg"], ["thin_10x2000.png", "one_1x1.png"], ["plain_300x200.jpg"], ["flat_2600x13.png", "cmyk.jpg"]]
    records = []
    for k, group in enumerate(names):
        user = [*({"type": "image", "image": str(files[n].relative_to(root))} for n in group),
                {"type": "text", "text": f"What is in picture {k}?"}]
        records.append({"id": f"h{k}", "messages": [{"role": "user", "content": user},
                                                    {"role": "assistant", "content": [{"type": "text", "text": "Shapes."}]}]})
    source = root / "records.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    processor = idefics3_processor(root / "checkpoint")
    manifest = build(resolve(None, input=[str(source)], output=str(root / "out"), family="hf",
                             processor=str(root / "checkpoint"), modalities=["image"], max_bad_fraction=0.0),
                     progress=False).to_dict()
    return root, records, processor, manifest


def test_ids_equal_the_processor_with_the_text_it_writes_between_tiles(built):
    root, records, processor, manifest = built
    family = manifest["tokenizer"]["family"]
    assert family["name"] == "hf" and family["settings"]["processor_class"] == "Idefics3Processor"
    assert family["settings"]["image_run"] == "<image>"
    check_ids(PackedDataset(root / "out"), processor, records, root)
    spans = [m for i in range(len(PackedDataset(root / "out"))) for m in PackedDataset(root / "out")[i]["media"]]
    assert any(m["length"] > m["tokens"] for m in spans)  # row / column text between an image's runs


def test_the_loader_checks_each_image_against_the_processors_own_text(built):
    root, _, processor, _ = built
    ds = PackedDataset(root / "out")
    batch = PackedCollator(attention="sdpa", processor=processor, family=ds.family)([ds[i] for i in range(len(ds))])
    assert "pixel_values" in batch and "pixel_attention_mask" in batch


def test_what_the_route_cannot_do_is_refused_naming_it(built, tmp_path):
    root, _, _, _ = built
    with pytest.raises(ConfigError, match="family hf encodes image, audio; modalities also names video"):
        build(resolve(None, input=[str(root / "records.jsonl")], output=str(tmp_path / "v"), family="hf",
                      processor=str(root / "checkpoint"), modalities=["image", "video"]), progress=False)
    with pytest.raises(ConfigError, match="Idefics3Processor has no audio_token"):
        build(resolve(None, input=[str(root / "records.jsonl")], output=str(tmp_path / "a"), family="hf",
                      processor=str(root / "checkpoint"), modalities=["image", "audio"]), progress=False)
    with pytest.raises(ConfigError, match="give --processor"):
        build(resolve(None, input=[str(root / "records.jsonl")], output=str(tmp_path / "n"), family="hf",
                      tokenizer=str(root / "checkpoint"), modalities=["image"]), progress=False)


def test_a_processor_whose_text_depends_on_the_other_items_is_refused(tmp_path):
    """LLaVA-OneVision tiles one image and not two: asking about each image alone would be wrong (found in review)."""
    from assets_llava_onevision import ASSETS

    ASSETS.processor(tmp_path / "ov")
    (tmp_path / "x.jsonl").write_text('{"text": "x"}\n')
    with pytest.raises(ConfigError, match="writes another text for an image when the record holds two"):
        build(resolve(None, input=[str(tmp_path / "x.jsonl")], output=str(tmp_path / "o"), family="hf",
                      processor=str(tmp_path / "ov"), modalities=["image"]), progress=False)


def test_an_image_over_the_blank_image_bound_is_refused_not_allocated(built):
    from types import SimpleNamespace

    from packer.families import make_family

    root, _, _, _ = built
    family = make_family(resolve(None, family="hf", processor=str(root / "checkpoint"), modalities=["image"]))
    with pytest.raises(ValueError, match="over the hf route's"):
        family.expand("image", SimpleNamespace(width=20000, height=20000), None, None)
