"""Small media files that exercise the counting / loading convention, generated at test time.

Nothing binary is committed: every file is drawn from a fixed seed with PIL, numpy and
soundfile, so the bytes are the same on every run (about 0.5 s for all of them).

Images (the stored size is what the header says; the "seen" size is after EXIF transpose):

    exif6.jpg          stored 60x40 (w x h), EXIF orientation 6 -> seen 40x60
    exif8.jpg          stored 60x40, orientation 8             -> seen 40x60
    thin_10x2000.png   10 wide, 2000 high (a side under 28 px)
    flat_2600x13.png   2600 wide, 13 high (aspect ratio 200)
    one_1x1.png        a single pixel
    cmyk.jpg           CMYK JPEG (loaders must convert to RGB)
    gray16.png         mode I;16
    palette_alpha.png  mode P with a transparent palette index
    animated.gif       3 frames
    photo.webp         lossy WebP
    plain_300x200.jpg  300x200 RGB JPEG

Audio (tone + a little noise, amplitude <= 0.2):

    5ms_16k.wav  20ms_8k.wav  1s_48k_stereo.wav  2s_44k.mp3  3s_22k.ogg
    29.99s_16k.flac  31s_24k.flac  45s_8k.flac
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

SEED = 1234

# name -> (seconds, sample_rate, channels, soundfile format, subtype)
AUDIO_SPECS: dict[str, tuple[float, int, int, str, str | None]] = {
    "5ms_16k.wav": (0.005, 16000, 1, "WAV", "PCM_16"),
    "20ms_8k.wav": (0.020, 8000, 1, "WAV", "PCM_16"),
    "1s_48k_stereo.wav": (1.0, 48000, 2, "WAV", "PCM_16"),
    "2s_44k.mp3": (2.0, 44100, 1, "MP3", "MPEG_LAYER_III"),
    "3s_22k.ogg": (3.0, 22050, 1, "OGG", "VORBIS"),
    "29.99s_16k.flac": (29.99, 16000, 1, "FLAC", "PCM_16"),
    "31s_24k.flac": (31.0, 24000, 1, "FLAC", "PCM_16"),
    "45s_8k.flac": (45.0, 8000, 1, "FLAC", "PCM_16"),
}


def _pixels(rng: np.random.Generator, height: int, width: int, channels: int = 3) -> np.ndarray:
    """A smooth gradient plus noise: compresses small, and a wrong rotation changes it visibly."""
    y = np.linspace(0, 255, height, dtype=np.float32)[:, None]
    x = np.linspace(0, 255, width, dtype=np.float32)[None, :]
    planes = np.broadcast_arrays((y + x) / 2, y, x, 255 - y + 0 * x)
    base = np.stack(planes[:channels], axis=-1)
    noise = rng.integers(-8, 9, size=(height, width, channels))
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def _exif_jpeg(path: Path, rng: np.random.Generator, orientation: int) -> None:
    from PIL import Image

    img = Image.fromarray(_pixels(rng, 40, 60))  # stored 60 wide x 40 high
    exif = Image.Exif()
    exif[0x0112] = orientation  # Orientation tag
    img.save(path, "JPEG", quality=90, exif=exif.tobytes())


def write_images(folder: Path) -> dict[str, Path]:
    """Write every fixture image into ``folder``; returns {name: path}."""
    from PIL import Image

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    out = {name: folder / name for name in (
        "exif6.jpg", "exif8.jpg", "thin_10x2000.png", "flat_2600x13.png", "one_1x1.png", "cmyk.jpg",
        "gray16.png", "palette_alpha.png", "animated.gif", "photo.webp", "plain_300x200.jpg",
    )}
    _exif_jpeg(out["exif6.jpg"], rng, 6)
    _exif_jpeg(out["exif8.jpg"], rng, 8)
    Image.fromarray(_pixels(rng, 2000, 10)).save(out["thin_10x2000.png"])
    Image.fromarray(_pixels(rng, 13, 2600)).save(out["flat_2600x13.png"])
    Image.fromarray(_pixels(rng, 1, 1)).save(out["one_1x1.png"])
    Image.fromarray(_pixels(rng, 48, 64, 4), mode="CMYK").save(out["cmyk.jpg"], "JPEG", quality=90)
    gray = (np.linspace(0, 65535, 50 * 70).reshape(50, 70)).astype(np.uint16)
    Image.fromarray(gray).convert("I;16").save(out["gray16.png"])
    palette = Image.fromarray(_pixels(rng, 30, 45)).quantize(colors=16)
    palette.save(out["palette_alpha.png"], transparency=0)
    frames = [Image.fromarray(_pixels(rng, 32, 48)).quantize(colors=32) for _ in range(3)]
    frames[0].save(out["animated.gif"], save_all=True, append_images=frames[1:], duration=100, loop=0)
    Image.fromarray(_pixels(rng, 90, 120)).save(out["photo.webp"], "WEBP", quality=80)
    Image.fromarray(_pixels(rng, 200, 300)).save(out["plain_300x200.jpg"], "JPEG", quality=90)
    return out


def _clip(rng: np.random.Generator, seconds: float, rate: int, channels: int) -> np.ndarray:
    n = int(round(seconds * rate))
    t = np.arange(n, dtype=np.float64) / rate
    tone = 0.15 * np.sin(2 * np.pi * 440.0 * t)
    data = tone[:, None] + 0.02 * rng.standard_normal((n, channels))
    if channels > 1:
        data[:, 1] *= 0.5  # channels differ, so a mono mixdown is observable
    return data.astype(np.float32)


def write_audio(folder: Path) -> dict[str, Path]:
    """Write every fixture clip into ``folder``; returns {name: path}. Frame counts are
    exact for WAV / FLAC / OGG; MP3 adds encoder padding, so read its length back."""
    import soundfile as sf

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    out = {}
    for name, (seconds, rate, channels, fmt, subtype) in AUDIO_SPECS.items():
        path = folder / name
        sf.write(path, _clip(rng, seconds, rate, channels), rate, format=fmt, subtype=subtype)
        out[name] = path
    return out


# name -> (width, height, fps, frames, extra): 0.1 s to 20 s, a variable frame rate, a phone rotation, a thin strip
VIDEO_SPECS: dict[str, tuple[int, int, int, int, dict]] = {
    "tenth_s.mp4": (48, 40, 30, 3, {}),
    "one_s_vfr.mp4": (64, 48, 24, 24, {"vfr": True}),
    "rot90_2s.mp4": (80, 48, 10, 20, {"rotation": 90}),
    "thin_16x200.mp4": (200, 16, 8, 12, {}),
    "odd_17f.mp4": (84, 56, 30, 17, {}),
    "twenty_s.mp4": (64, 36, 4, 80, {}),
}


def _frame(i: int, width: int, height: int) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width]
    img = np.stack(np.broadcast_arrays((y + x + 9 * i) % 256, y + 0 * x, x + 0 * y), axis=-1).astype(np.uint8)
    img[: max(1, height // 4), : max(1, width // 4)] = 255
    return img


def write_videos(folder: Path) -> dict[str, Path]:
    """Write every fixture clip (H.264 in MP4, PyAV) into ``folder``; returns {name: path}."""
    from fractions import Fraction

    import av

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, (width, height, fps, frames, extra) in VIDEO_SPECS.items():
        path = folder / name
        with av.open(str(path), "w") as c:
            s = c.add_stream("libx264", rate=fps)
            s.width, s.height, s.pix_fmt = width, height, "yuv420p"
            if "rotation" in extra:
                s.set_display_rotation(extra["rotation"])
            pts = 0
            for i in range(frames):
                f = av.VideoFrame.from_ndarray(_frame(i, width, height), format="rgb24")
                if extra.get("vfr"):  # frames 1, 1, 3, 1, 1, 3, ... ticks apart
                    f.pts, f.time_base = pts, Fraction(1, fps)
                    pts += 3 if i % 3 == 2 else 1
                for p in s.encode(f):
                    c.mux(p)
            for p in s.encode():
                c.mux(p)
        out[name] = path
    return out
