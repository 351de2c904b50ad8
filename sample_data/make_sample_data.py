"""Regenerate sample_data/: images, audio clips, three JSONL files and a small tokenizer.

    python sample_data/make_sample_data.py      # or: make sample-data

Everything is drawn or synthesised here, deterministically (fixed seeds), so the data is
free to redistribute: images are PIL drawings of coloured shapes whose conversations
describe what is really drawn, audio clips are tones and chords whose conversations
name their real pitch and length. The tokenizer is a byte-level BPE trained on the
sample text, with a ChatML chat template (no ``{% generation %}`` markers, like most
real templates). A few records are deliberately broken to show the quarantine.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import numpy as np
import soundfile as sf
from PIL import Image, ImageDraw

ROOT = Path(__file__).resolve().parent
RNG = random.Random(0)

COLORS = {"red": (220, 40, 40), "green": (40, 170, 70), "blue": (40, 80, 220), "yellow": (235, 200, 40),
          "purple": (140, 60, 170), "orange": (240, 140, 30), "black": (20, 20, 20), "white": (250, 250, 250)}
BACKGROUNDS = {"white": (255, 255, 255), "light grey": (215, 215, 215), "pale blue": (205, 225, 245), "cream": (245, 238, 215)}
SHAPES = ("circle", "square", "triangle", "rectangle")
# (name, width, height, format): several sizes and aspect ratios, PNG and JPEG.
IMAGES = [("square_336", 336, 336, "png"), ("landscape_640x480", 640, 480, "jpg"), ("portrait_480x640", 480, 640, "png"),
          ("wide_1280x720", 1280, 720, "jpg"), ("small_224", 224, 224, "png"), ("photo_1024x768", 1024, 768, "jpg"),
          ("square_672", 672, 672, "png"), ("tall_300x900", 300, 900, "png")]
NOTES = {"A4": 440.0, "C5": 523.25, "E4": 329.63, "G3": 196.0, "A3": 220.0}
# (name, notes, seconds, sample rate, format)
AUDIO = [("tone_a4_1s", ["A4"], 1.0, 16000, "wav"), ("tone_c5_2s", ["C5"], 2.5, 16000, "flac"),
         ("chord_a_minor_4s", ["A3", "C5", "E4"], 4.0, 22050, "wav"), ("tone_g3_7s", ["G3"], 7.5, 16000, "flac"),
         ("chord_c_major_3s", ["C5", "E4", "G3"], 3.0, 44100, "flac")]

SENTENCES = [
    "Packing several short training examples into one long sequence removes most of the padding.",
    "A causal language model predicts each token from the tokens before it.",
    "The attention mask decides which positions a token may look at.",
    "When two examples share a sequence, the mask must keep them from seeing each other.",
    "Position ids restart at zero for every example so that each one looks unpacked to the model.",
    "Vision encoders cut an image into patches and turn each patch into one embedding.",
    "A 336 pixel image with 14 pixel patches gives a grid of 24 by 24 patches.",
    "Audio encoders usually work on log-mel spectrograms computed every ten milliseconds.",
    "Rivers carry sediment from the mountains and lay it down where the water slows.",
    "The moon has no air, so its sky stays black even during the day.",
    "Bread rises because yeast turns sugar into carbon dioxide and a little alcohol.",
    "A good experiment changes one thing at a time and measures everything else.",
    "Honey bees communicate the direction of flowers with a waggle dance.",
    "Copper conducts electricity well, which is why it is used in most household wiring.",
    "The first step of any data pipeline is to look at the raw records by hand.",
    "Determinism means that the same inputs and the same settings give the same bytes.",
    "A shard is one file among many that together hold a large dataset.",
    "Glaciers move slowly downhill under their own weight, grinding the rock below them.",
    "The speed of sound in air is roughly three hundred and forty metres per second.",
    "Tomatoes were once thought to be poisonous in parts of Europe.",
    "Most of the heat of a cup of tea escapes through its open surface.",
    "A lighthouse beam can be seen from more than twenty kilometres away on a clear night.",
    "Octopuses have three hearts and blue blood.",
    "Compilers turn source code into instructions that a processor can execute.",
    "The tallest trees on Earth are coast redwoods, which can grow above one hundred metres.",
    "A prime number has exactly two divisors: one and itself.",
    "Wind turbines turn faster in the steady winds found far out at sea.",
    "Maps distort either the shape or the area of continents, never neither.",
    "Sourdough starter is a living culture of wild yeast and lactic acid bacteria.",
    "Gradient descent moves the weights a small step against the gradient of the loss.",
]
QA = [
    ("What does packing do for training efficiency?", "Packing fills each sequence with several examples, so far fewer positions are spent on padding and more of the compute goes to real tokens."),
    ("Why do position ids restart for each packed example?", "Because each example should see the same positions it would see on its own; restarting at zero keeps rotary embeddings consistent with unpacked training."),
    ("How many patches does a 336 pixel image give with 14 pixel patches?", "It gives 24 patches per side, so 24 times 24, which is 576 patches in total."),
    ("Give me a tip for debugging a data pipeline.", "Print a handful of raw records and the exact tokens they become, and compare them by eye before trusting any statistics."),
    ("What is a shard?", "A shard is one file of a dataset that has been split into many files so that it can be read in parallel."),
    ("Why is the sky on the moon black?", "The moon has almost no atmosphere, so there is no air to scatter sunlight, and the sky stays black."),
    ("Explain gradient descent in one sentence.", "Gradient descent repeatedly nudges the model's weights in the direction that lowers the loss the most."),
    ("What makes bread rise?", "Yeast ferments the sugars in the dough and releases carbon dioxide, which forms bubbles that make the bread rise."),
    ("Name a fact about octopuses.", "An octopus has three hearts, and its blood is blue because it carries oxygen with copper instead of iron."),
    ("What is a prime number?", "A prime number is a whole number greater than one whose only divisors are one and itself, such as 2, 3, 5 and 7."),
]


def draw_image(name: str, w: int, h: int, fmt: str, rng: random.Random) -> dict:
    bg_name = rng.choice(list(BACKGROUNDS))
    img = Image.new("RGB", (w, h), BACKGROUNDS[bg_name])
    d = ImageDraw.Draw(img)
    shapes = []
    for _ in range(rng.randint(1, 3)):
        shape, color = rng.choice(SHAPES), rng.choice([c for c in COLORS if c != bg_name])
        s = rng.randint(min(w, h) // 6, min(w, h) // 3)
        x, y = rng.randint(0, w - s), rng.randint(0, h - s)
        box = (x, y, x + s, y + (s // 2 if shape == "rectangle" else s))
        if shape == "circle":
            d.ellipse(box, fill=COLORS[color])
        elif shape == "triangle":
            d.polygon([(x + s // 2, y), (x, y + s), (x + s, y + s)], fill=COLORS[color])
        else:
            d.rectangle(box, fill=COLORS[color])
        shapes.append((color, shape))
    path = ROOT / "images" / f"{name}.{fmt}"
    path.parent.mkdir(exist_ok=True)
    img.save(path, quality=85) if fmt == "jpg" else img.save(path, optimize=True)
    return {"ref": f"images/{path.name}", "w": w, "h": h, "background": bg_name, "shapes": shapes}


def synth_audio(name: str, notes: list[str], seconds: float, rate: int, fmt: str) -> dict:
    t = np.arange(int(seconds * rate)) / rate
    wave = sum(np.sin(2 * np.pi * NOTES[n] * t) for n in notes) / len(notes)
    envelope = np.minimum(1.0, np.minimum(t, seconds - t) / 0.05)  # 50 ms fade in and out
    path = ROOT / "audio" / f"{name}.{fmt}"
    path.parent.mkdir(exist_ok=True)
    sf.write(path, (0.3 * wave * envelope).astype(np.float32), rate, subtype="PCM_16")
    return {"ref": f"audio/{path.name}", "notes": notes, "seconds": seconds, "rate": rate}


def describe(img: dict) -> str:
    items = [f"a {c} {s}" for c, s in img["shapes"]]
    listed = items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
    return f"The image shows {listed} on a {img['background']} background."


def llava_records(images: list[dict]) -> list[str]:
    lines = []
    for i in range(96):
        img = images[i % len(images)]
        rid = f"llava-{i:03d}"
        if i % 4 == 3:  # text-only LLaVA record
            q, a = QA[i % len(QA)]
            lines.append(json.dumps({"id": rid, "conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": a}]}))
            continue
        turns = [{"from": "human", "value": "<image>\nDescribe this image."}, {"from": "gpt", "value": describe(img)}]
        if i % 3 == 0:
            turns += [{"from": "human", "value": "How many shapes are there?"},
                      {"from": "gpt", "value": f"There {'is' if len(img['shapes']) == 1 else 'are'} {len(img['shapes'])}."}]
        if i % 5 == 0:
            turns += [{"from": "human", "value": "What size is the picture?"}, {"from": "gpt", "value": f"It is {img['w']} pixels wide and {img['h']} pixels tall."}]
        lines.append(json.dumps({"id": rid, "image": img["ref"], "conversations": turns}))
    # Two images in one record, tags in the text.
    a, b = images[0], images[1]
    lines.append(json.dumps({"id": "llava-pair", "image": [a["ref"], b["ref"]], "conversations": [
        {"from": "human", "value": "<image>\n<image>\nWhich of the two images is wider?"},
        {"from": "gpt", "value": f"The second image is wider: {b['w']} pixels against {a['w']}."}]}))
    # Deliberately broken records (they end up in quarantine.jsonl).
    lines.append(json.dumps({"id": "llava-missing-image", "image": "images/does_not_exist.png",
                             "conversations": [{"from": "human", "value": "<image>\nWhat is this?"}, {"from": "gpt", "value": "A picture."}]}))
    lines.append(json.dumps({"id": "llava-tag-mismatch", "image": [a["ref"], b["ref"]],
                             "conversations": [{"from": "human", "value": "<image>\nCompare them."}, {"from": "gpt", "value": "They differ."}]}))
    lines.append('{"id": "llava-broken-json", "conversations": [{"from": "human", "value": "unterminated')
    return lines


def chat_records(images: list[dict], clips: list[dict]) -> list[str]:
    lines = []
    for i in range(60):
        q, a = QA[i % len(QA)]
        messages = [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        if i % 3 == 0:
            messages.insert(0, {"role": "system", "content": "You are a concise, friendly assistant."})
        if i % 4 == 1:
            q2, a2 = QA[(i + 3 + i // len(QA)) % len(QA)]
            messages += [{"role": "user", "content": q2}, {"role": "assistant", "content": a2}]
        lines.append(json.dumps({"id": f"chat-{i:03d}", "messages": messages}))
    for i, clip in enumerate(clips):
        pitch = " and ".join(f"{n} ({NOTES[n]:g} Hz)" for n in clip["notes"])
        kind = "tone" if len(clip["notes"]) == 1 else "chord"
        part = {"type": "audio", "audio": clip["ref"]} if i % 2 == 0 else {"audio": clip["ref"]}
        lines.append(json.dumps({"id": f"audio-{i:03d}", "messages": [
            {"role": "user", "content": [part, {"type": "text", "text": "What do you hear, and for how long?"}]},
            {"role": "assistant", "content": f"A {kind} of {pitch}, lasting {clip['seconds']:g} seconds."}]}))
    for i, img in enumerate(images + images[:4]):
        lines.append(json.dumps({"id": f"vision-chat-{i:03d}", "messages": [
            {"role": "system", "content": "Answer questions about images briefly."},
            {"role": "user", "content": [{"type": "image", "image": img["ref"]}, {"type": "text", "text": "What colours do you see?"}]},
            {"role": "assistant", "content": "I see " + " and ".join(sorted({c for c, _ in img["shapes"]})) + f" on {img['background']}."}]}))
    img, clip = images[2], clips[0]
    lines.append(json.dumps({"id": "image-and-audio", "messages": [
        {"role": "user", "content": [{"type": "image", "image": img["ref"]}, {"type": "audio", "audio": clip["ref"]},
                                     {"type": "text", "text": "Describe the picture, then the sound."}]},
        {"role": "assistant", "content": describe(img) + f" The sound is a tone of {clip['notes'][0]} lasting {clip['seconds']:g} seconds."}]}))
    lines.append(json.dumps({"id": "chat-unknown-role", "messages": [{"role": "user", "content": "Weather?"}, {"role": "narrator", "content": "{\"temp\": 21}"}]}))
    lines.append(json.dumps({"id": "chat-empty", "messages": []}))
    lines.append(json.dumps({"id": "chat-no-assistant", "messages": [{"role": "user", "content": "Is anyone there?"}]}))
    return lines


def doc_records() -> list[str]:
    lines = []
    sizes = [3, 8, 15, 40, 5, 90, 12, 25, 60, 2, 200, 30, 10, 350, 7, 18]
    for i, n_sentences in enumerate(sizes + [RNG.randint(2, 120) for _ in range(32)]):
        text = " ".join(RNG.choice(SENTENCES) for _ in range(n_sentences))
        if i % 5 == 2:
            text = text.replace(". ", ".\n\n", 3)  # a few paragraphs
        lines.append(json.dumps({"id": f"doc-{i:03d}", "text": text}))
    lines.append("")  # blank lines are skipped, not errors
    lines.append(json.dumps({"id": "doc-wrong-type", "text": 42}))
    lines.append(json.dumps(["not", "an", "object"]))
    return lines


CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "<audio>"]


def train_tokenizer(texts: list[str], out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=2048, special_tokens=SPECIAL, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                   extra_special_tokens=["<|im_start|>", "<|im_end|>", "<image>", "<audio>"])
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 4096
    fast.save_pretrained(out)


VIDEOS = [("orbit_96x64_2s.mp4", 96, 64, 10, 20, 0), ("rotated_64x48_1s.mp4", 64, 48, 12, 12, 90),
          ("slow_80x60_3s.mp4", 80, 60, 8, 24, 0)]


def video_frame(i: int, width: int, height: int):
    """A gradient that moves with i and a bright top-left block (shows a rotation)."""
    import numpy as np

    y = np.linspace(0, 200, height, dtype=np.float32)[:, None]
    x = np.linspace(0, 200, width, dtype=np.float32)[None, :]
    img = np.stack(np.broadcast_arrays((y + x + 9 * i) % 256, y + 0 * x, x + 0 * y), axis=-1).astype(np.uint8)
    img[: max(1, height // 4), : max(1, width // 4)] = 255
    return img


def video_files() -> list[str]:
    """Tiny H.264 clips (PyAV), a video given as frame images, and video.jsonl. Written apart
    from the tokenizer's corpus, so the other sample files and the tokenizer stay the same."""
    try:
        import av
    except ImportError:
        print("PyAV (pip install av) not installed: sample_data/videos left as they are")
        return []
    from PIL import Image

    folder = ROOT / "videos"
    (folder / "frames").mkdir(parents=True, exist_ok=True)
    for name, w, h, fps, n, rotation in VIDEOS:
        with av.open(str(folder / name), "w") as c:
            stream = c.add_stream("libx264", rate=fps)
            stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
            if rotation:
                stream.set_display_rotation(rotation)
            for k in range(n):
                for packet in stream.encode(av.VideoFrame.from_ndarray(video_frame(k, w, h), format="rgb24")):
                    c.mux(packet)
            for packet in stream.encode():
                c.mux(packet)
    frames = [f"videos/frames/f{k}.png" for k in range(4)]
    for k, ref in enumerate(frames):
        Image.fromarray(video_frame(3 * k, 64, 48)).save(ROOT / ref)
    q = ["What happens in this clip?", "Describe the motion.", "How long is the clip?"]
    records = [
        {"id": "video-0", "messages": [{"role": "user", "content": [{"type": "video", "video": "videos/orbit_96x64_2s.mp4"},
                                                                     {"type": "text", "text": q[0]}]},
                                       {"role": "assistant", "content": "A colour gradient slides across the frame."}]},
        {"id": "video-1", "video": "videos/rotated_64x48_1s.mp4",
         "conversations": [{"from": "human", "value": "<video>\n" + q[1]},
                           {"from": "gpt", "value": "The gradient moves while a bright block stays in one corner."}]},
        {"id": "video-2", "messages": [{"role": "user", "content": [{"type": "video", "video": "videos/slow_80x60_3s.mp4"},
                                                                     {"type": "image", "image": "images/square_336.png"},
                                                                     {"type": "text", "text": q[2]}]},
                                       {"role": "assistant", "content": "About three seconds; the picture shows shapes."}]},
        {"id": "video-frames", "messages": [{"role": "user", "content": [{"type": "video", "video": frames, "fps": 2},
                                                                          {"type": "text", "text": q[1]}]},
                                            {"role": "assistant", "content": "Four frames of a shifting gradient."}]},
    ]
    return [json.dumps(r) for r in records]


TESTS = ROOT.parent / "tests"


def processor_folder(sample) -> Path:
    """``processors/<folder>/`` for a family's declared :class:`Sample` (``tests/family_assets.py``): a processor
    checkpoint as ``save_pretrained`` writes one (``processor_config.json`` with each sub-processor's settings),
    around the sample tokenizer with the family's special tokens (those it names also named in
    ``tokenizer_config.json``), and the family's chat template: what ``--processor`` reads, no model code needed to
    write it. A sample declared as a callable is the real processor around the sample tokenizer, saved by
    ``save_pretrained`` (the folder then also loads as the processor, named tokens and all)."""
    folder = ROOT / "processors" / sample.folder
    template = (TESTS / "fixtures" / "templates" / sample.template).read_text()
    if callable(sample.processor):
        sample.processor(str(ROOT / "tokenizer"), template).save_pretrained(str(folder))
        return folder
    from tokenizers import AddedToken, Tokenizer

    extra_special = [*sample.named.values(), *sample.tokens]
    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer.from_file(str(ROOT / "tokenizer" / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in extra_special])
    tok.save(str(folder / "tokenizer.json"))
    config = json.loads((ROOT / "tokenizer" / "tokenizer_config.json").read_text())
    config["extra_special_tokens"] = list(dict.fromkeys([*config.get("extra_special_tokens", []), *extra_special]))
    if sample.named:
        config.update(sample.named, model_specific_special_tokens=sample.named)
    config.update(sample.tokenizer)
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (folder / "processor_config.json").write_text(json.dumps(sample.processor, indent=2, sort_keys=True) + "\n")
    (folder / "chat_template.jinja").write_text(template)
    return folder


def family_processors() -> list[Path]:
    """Every registered family's sample processor, as its test assets declare it (``ASSETS.sample`` in
    ``tests/assets_<module>.py``; a family sharing another's processor declares none): no list of families here."""
    sys.path.insert(0, str(TESTS))
    from family_assets import FAMILY_ASSETS

    samples = {a.sample.folder: a.sample for a in FAMILY_ASSETS.values() if a.sample is not None}
    return [processor_folder(sample) for sample in samples.values()]


def main() -> None:
    rng = random.Random(1)
    images = [draw_image(n, w, h, f, rng) for n, w, h, f in IMAGES]
    clips = [synth_audio(*a) for a in AUDIO]
    files = {"llava.jsonl": llava_records(images), "chat.jsonl": chat_records(images, clips), "docs.jsonl": doc_records()}
    for name, lines in files.items():
        (ROOT / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    corpus = SENTENCES + [t for qa in QA for t in qa] + [describe(i) for i in images] + [l for ls in files.values() for l in ls]
    train_tokenizer(corpus * 3, ROOT / "tokenizer")
    family_processors()
    videos = video_files()
    if videos:
        (ROOT / "video.jsonl").write_text("\n".join(videos) + "\n", encoding="utf-8")
    print(f"wrote {len(images)} images, {len(clips)} audio clips, "
          + ", ".join(f"{n} ({len(ls)} lines)" for n, ls in files.items()) + ", tokenizer/")


if __name__ == "__main__":
    main()
