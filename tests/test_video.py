"""Videos: what packer counts from the container's headers is what transformers' Qwen2-VL /
Qwen2.5-VL video processor produces from the video loaded the HF way, on short clips PyAV
writes here (several sizes, rates, durations, codecs; a rotated one, a variable-frame-rate
one, a WebM without a frame count), frame-list videos, and bad files quarantined with the
right reason."""

from __future__ import annotations

from fractions import Fraction
from functools import partial

import numpy as np
import pytest

av = pytest.importorskip("av")

from packer.errors import BadRecord, ConfigError  # noqa: E402
from packer.media.policies import Qwen2VLVideo, VideoCount, parse_policy  # noqa: E402
from packer.media.video import (  # noqa: E402
    count_frames,
    count_video,
    load_video,
    probe_frames,
    probe_video,
    video_metadata,
)

# name -> (width, height, fps, frames, codec, pix_fmt, extra)
CLIPS = {
    "64x48_24fps_1.25s.mp4": (64, 48, 24, 30, "libx264", "yuv420p", {}),
    "200x120_30fps_4s.mp4": (200, 120, 30, 120, "libx264", "yuv420p", {}),
    "33x77_10fps_0.5s.mp4": (33, 77, 10, 5, "libx264", "yuv444p", {}),
    "96x64_30fps_17f.mp4": (96, 64, 30, 17, "libx264", "yuv420p", {}),
    "48x32_10fps_3s_mpeg4.mp4": (48, 32, 10, 30, "mpeg4", "yuv420p", {}),
    "64x48_24fps_rot90.mp4": (64, 48, 24, 24, "libx264", "yuv420p", {"rotation": 90}),
    "64x48_vfr.mp4": (64, 48, 30, 20, "libx264", "yuv420p", {"vfr": True}),
    "80x60_25fps_2s.webm": (80, 60, 25, 50, "libvpx-vp9", "yuv420p", {}),
    "one_frame.mp4": (64, 48, 24, 1, "libx264", "yuv420p", {}),
}
HF_READABLE = [n for n, s in CLIPS.items() if n.endswith(".mp4") and "rotation" not in s[6] and s[3] > 1]
POLICIES = ["qwen2vl", "qwen2vl:fps=1", "qwen2vl:fps=2,max_frames=4", "qwen2vl:sample=false",
            "qwen2vl:min_pixels=3136,max_pixels=50000", "qwen2vl:fps=4,cap_pixels_per_frame=true,max_video_tokens=400"]


def _frame(i: int, width: int, height: int) -> np.ndarray:
    """A gradient that moves with i, plus a bright block in the top-left corner (shows rotation)."""
    y = np.linspace(0, 200, height, dtype=np.float32)[:, None]
    x = np.linspace(0, 200, width, dtype=np.float32)[None, :]
    img = np.stack(np.broadcast_arrays((y + x + 9 * i) % 256, y + 0 * x, x + 0 * y), axis=-1).astype(np.uint8)
    img[: max(1, height // 4), : max(1, width // 4)] = 255
    return img


def write_clip(path, width, height, fps, frames, codec, pix_fmt, extra, options=None) -> None:
    with av.open(str(path), "w", options=options or {}) as c:
        s = c.add_stream(codec, rate=fps)
        s.width, s.height, s.pix_fmt = width, height, pix_fmt
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


def write_bad(folder) -> dict:
    bad = {}
    write_clip(folder / "fs.mp4", 64, 48, 24, 24, "libx264", "yuv420p", {}, options={"movflags": "faststart"})
    data = (folder / "fs.mp4").read_bytes()
    bad["truncated_faststart.mp4"] = folder / "truncated_faststart.mp4"
    bad["truncated_faststart.mp4"].write_bytes(data[: len(data) // 2])
    write_clip(folder / "plain.mp4", 64, 48, 24, 24, "libx264", "yuv420p", {})
    data = (folder / "plain.mp4").read_bytes()
    bad["truncated.mp4"] = folder / "truncated.mp4"
    bad["truncated.mp4"].write_bytes(data[: len(data) // 2])
    i = data.find(b"avc1", data.find(b"stsd"))
    bad["unknown_codec.mp4"] = folder / "unknown_codec.mp4"
    bad["unknown_codec.mp4"].write_bytes(data[:i] + b"zzzz" + data[i + 4:])
    bad["audio_only.m4a"] = folder / "audio_only.m4a"
    with av.open(str(bad["audio_only.m4a"]), "w", format="mp4") as c:
        s = c.add_stream("aac", rate=16000)
        for k in range(8):
            fr = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
            fr.sample_rate, fr.pts = 16000, k * 1024
            for p in s.encode(fr):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    for name in ("zero_frames.mkv", "zero_frames.mov"):  # a video track and no frame: duration 0
        bad[name] = folder / name
        with av.open(str(bad[name]), "w") as c:
            s = c.add_stream("libx264", rate=24)
            s.width, s.height, s.pix_fmt = 64, 48, "yuv420p"
            c.start_encoding()
    bad["not_a_video.mp4"] = folder / "not_a_video.mp4"
    bad["not_a_video.mp4"].write_bytes(b"this is a text file, not a video\n" * 40)
    bad["missing.mp4"] = folder / "missing.mp4"
    return bad


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    folder = tmp_path_factory.mktemp("video")
    out = {}
    for name, spec in CLIPS.items():
        write_clip(folder / name, *spec)
        out[name] = folder / name
    return out


@pytest.fixture(scope="module")
def bad(tmp_path_factory):
    return write_bad(tmp_path_factory.mktemp("bad_video"))


# ------------------------------------------------------------------ the HF side


def hf_video_processor(policy: Qwen2VLVideo):
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    return Qwen2VLVideoProcessor(min_pixels=policy.min_pixels, max_pixels=policy.max_pixels, patch_size=policy.patch_size,
                                 temporal_patch_size=policy.temporal_patch_size, merge_size=policy.merge_size,
                                 min_frames=policy.min_frames, max_frames=policy.max_frames,
                                 max_video_tokens=policy.max_video_tokens, cap_pixels_per_frame=policy.cap_pixels_per_frame)


def hf_sampling(policy: Qwen2VLVideo) -> dict:
    return {"num_frames": policy.num_frames} if policy.num_frames else {"fps": policy.fps}


def hf_load(path, policy: Qwen2VLVideo):
    """transformers' own loader (PyAV backend) with the processor's own frame sampling."""
    from transformers.video_utils import load_video as hf_load_video

    vp = hf_video_processor(policy)
    fn = partial(vp.sample_frames, **hf_sampling(policy)) if policy.sample else None
    return hf_load_video(str(path), backend="pyav", sample_indices_fn=fn)


def hf_qwen25(frames, metadata, policy: Qwen2VLVideo, **kwargs) -> tuple[tuple[int, int, int], int, float]:
    """Qwen2.5-VL's processor path for videos (``Qwen2_5_VLProcessor._process_videos``, which runs
    the video processor and adds ``second_per_grid_ts``): (video_grid_thw, pixel rows, second_per_grid_t)."""
    from transformers.models.qwen2_5_vl import Qwen2_5_VLProcessor

    proc = object.__new__(Qwen2_5_VLProcessor)  # no tokenizer needed for the video half
    proc.video_processor, proc.video_token = hf_video_processor(policy), None
    kwargs.setdefault("do_sample_frames", False)
    out, _ = proc._process_videos(frames, video_metadata=metadata, return_metadata=True, return_tensors="pt", **kwargs)
    thw = tuple(int(v) for v in out["video_grid_thw"][0])
    return thw, int(out["pixel_values_videos"].shape[0]), float(out["second_per_grid_ts"][0])


def assert_same(count: VideoCount, hf, policy: Qwen2VLVideo):
    (t, h, w), rows, spg = hf
    m = policy.merge_size
    assert count.grid == (t, h // m, w // m)
    assert count.length == t * h * w // (m * m) and rows == t * h * w
    assert count.second_per_grid_t == pytest.approx(spg, rel=1e-9)


# ------------------------------------------------------------------ probe


@pytest.mark.parametrize("name", list(CLIPS))
def test_probe_reads_the_headers(clips, name):
    width, height, fps, frames, codec, _, extra = CLIPS[name]
    info = probe_video(str(clips[name]))
    if extra.get("rotation") in (90, 270):
        width, height = height, width
    assert (info.frames, info.height, info.width) == (frames, height, width)
    assert info.rotation == extra.get("rotation", 0)
    if not extra.get("vfr"):
        assert info.fps == pytest.approx(fps) and info.duration == pytest.approx(frames / fps, abs=1.5 / fps)
    assert info.codec == {"libx264": "h264", "libvpx-vp9": "vp9", "mpeg4": "mpeg4"}[codec]
    assert probe_video(str(clips[name]), "decode").frames == frames


@pytest.mark.parametrize("name", HF_READABLE)
def test_probe_agrees_with_transformers_pyav_reader(clips, name):
    from transformers.video_utils import load_video as hf_load_video

    info = probe_video(str(clips[name]))
    frames, meta = hf_load_video(str(clips[name]), backend="pyav")
    assert (info.frames, info.fps) == (meta.total_num_frames, meta.fps) == (len(frames), meta.fps)
    assert frames.shape[1:3] == (info.height, info.width)
    assert np.array_equal(load_video(str(clips[name])), frames)


def test_vfr_clip_rate_is_the_average(clips):
    info = probe_video(str(clips["64x48_vfr.mp4"]))
    with av.open(str(clips["64x48_vfr.mp4"])) as c:
        s = c.streams.video[0]
        pts = [f.pts for f in c.decode(s)]
        assert info.fps == float(s.average_rate)
    assert len(set(np.diff(pts))) > 1  # really variable
    assert info.frames == len(pts) == 20


def test_rotation_is_applied_counter_clockwise(clips):
    """PyAV's ``set_display_rotation(90)`` = display turned 90 degrees counter-clockwise (FFmpeg's
    autorotate): the stored top-left block ends at the bottom-left, the frame stands 48 x 64."""
    path = str(clips["64x48_24fps_rot90.mp4"])
    video = load_video(path, [0, 5])
    assert video.shape == (2, 64, 48, 3)
    assert video[0, -4:, :4].mean() > 240 and video[0, :4, :4].mean() < 200
    from transformers.video_utils import load_video as hf_load_video

    stored, _ = hf_load_video(path, backend="pyav")  # transformers' PyAV reader ignores the rotation
    assert stored.shape[1:3] == (48, 64) and np.array_equal(np.rot90(stored[[0, 5]], 1, axes=(1, 2)), video)


# ------------------------------------------------------------------ counts equal the processor's


@pytest.mark.parametrize("spec", POLICIES)
@pytest.mark.parametrize("name", HF_READABLE)
def test_count_equals_the_processor_on_the_hf_loaded_video(clips, name, spec):
    policy = parse_policy(spec, "video")
    info, count = count_video(str(clips[name]), policy)
    frames, meta = hf_load(clips[name], policy)
    assert_same(count, hf_qwen25(frames, meta, policy), policy)
    assert count.frames == len(frames)
    assert policy.sample_indices(info.frames, info.fps) == [int(i) for i in meta.frames_indices]
    indices = policy.frame_indices(info.frames, info.fps)
    assert np.array_equal(load_video(str(clips[name]), indices), frames)  # packer's loader = HF's, frame for frame


@pytest.mark.parametrize("name", ["200x120_30fps_4s.mp4", "64x48_vfr.mp4"])
def test_count_equals_the_processor_sampling_itself(clips, name):
    """The other HF route: every frame loaded, the processor samples (``do_sample_frames=True``)."""
    from transformers.video_utils import load_video as hf_load_video

    policy = parse_policy("qwen2vl:fps=2,min_frames=2", "video")
    _, count = count_video(str(clips[name]), policy)
    frames, meta = hf_load_video(str(clips[name]), backend="pyav")
    meta.frames_indices = None
    assert_same(count, hf_qwen25(frames, meta, policy, do_sample_frames=True, **hf_sampling(policy)), policy)


@pytest.mark.parametrize("spec", ["qwen2vl", "qwen2vl:fps=1,max_frames=6", "qwen2vl:sample=false"])
@pytest.mark.parametrize("name", list(CLIPS))
def test_count_equals_the_processor_on_packers_loaded_video(clips, name, spec):
    """Every clip -- rotated and WebM included, which transformers' PyAV reader gets wrong or
    cannot read -- loaded by packer and given to the processor as it is: the counted grid."""
    policy = parse_policy(spec, "video")
    try:
        info, count = count_video(str(clips[name]), policy)
    except BadRecord as e:
        assert name == "one_frame.mp4" and policy.sample and e.reason == "unsupported_video" and "0 frames" in e.detail
        return
    indices = policy.frame_indices(info.frames, info.fps)
    video = load_video(str(clips[name]), indices)
    assert video.shape[1:3] == (info.height, info.width)
    assert_same(count, hf_qwen25(video, video_metadata(info, policy), policy), policy)


def test_num_frames_and_the_odd_arange(clips):
    """torch.arange(0, 17, 17 / 14) holds 15 indices, the last one (17) past the last frame:
    transformers' PyAV reader returns 14 frames (t = 7) and its metadata 15 indices (the rate
    Qwen2.5-VL's second_per_grid_ts uses)."""
    policy = parse_policy("qwen2vl:num_frames=14", "video")
    assert policy.sample_indices(17, 30.0)[-2:] == [15, 17] and policy.frame_indices(17, 30.0)[-1] == 15
    _, count = count_video(str(clips["96x64_30fps_17f.mp4"]), policy)
    assert count.frames == 14 and count.grid[0] == 7 and count.second_per_grid_t == pytest.approx(2 / (15 / 17 * 30))
    frames, meta = hf_load(clips["96x64_30fps_17f.mp4"], policy)
    assert_same(count, hf_qwen25(frames, meta, policy), policy)


def test_frame_indices_equal_sample_frames_everywhere():
    """The pure sampling arithmetic against the processor's ``sample_frames`` (no video needed)."""
    from transformers.video_utils import VideoMetadata

    rng = np.random.default_rng(0)
    for spec in ["qwen2vl", "qwen2vl:fps=1,min_frames=2,max_frames=10", "qwen2vl:fps=3.5,max_frames=64", "qwen2vl:num_frames=14"]:
        policy = parse_policy(spec, "video")
        vp = hf_video_processor(policy)
        for total in [*range(2, 60), *rng.integers(60, 5000, 40).tolist()]:
            rate = float(rng.choice([7.5, 10, 23.976, 24, 25, 29.97, 30, 60]))
            try:
                want = vp.sample_frames(VideoMetadata(total_num_frames=int(total), fps=rate), **hf_sampling(policy)).tolist()
            except (ValueError, ZeroDivisionError):
                with pytest.raises(ValueError):
                    policy.sample_indices(int(total), rate)
                continue
            assert policy.sample_indices(int(total), rate) == want, (spec, total, rate)
            assert policy.count(int(total), rate, 100, 100).frames == sum(1 for i in want if i < total)


# ------------------------------------------------------------------ bad files


@pytest.mark.parametrize("name, reason", [
    ("truncated_faststart.mp4", "corrupt_video"),
    ("truncated.mp4", "corrupt_video"),
    ("unknown_codec.mp4", "unsupported_video"),
    ("audio_only.m4a", "no_video_stream"),
    ("zero_frames.mkv", "corrupt_video"),
    ("zero_frames.mov", "no_video_stream"),
    ("not_a_video.mp4", "corrupt_video"),
    ("missing.mp4", "missing_video"),
])
def test_bad_videos_are_quarantined_with_a_reason(bad, name, reason):
    for check in ("verify", "decode"):
        with pytest.raises(BadRecord) as e:
            probe_video(str(bad[name]), check)
        assert e.value.reason == reason and name in e.value.detail


def test_one_frame_clip_is_unsupported_under_sampling(clips):
    with pytest.raises(BadRecord) as e:
        count_video(str(clips["one_frame.mp4"]), parse_policy("qwen2vl", "video"))
    assert e.value.reason == "unsupported_video" and "one_frame.mp4" in e.value.detail and "sample=false" in e.value.detail
    _, count = count_video(str(clips["one_frame.mp4"]), parse_policy("qwen2vl:sample=false", "video"))
    assert count.grid[0] == 1


# ------------------------------------------------------------------ frame lists


@pytest.fixture(scope="module")
def frame_list(tmp_path_factory):
    from PIL import Image

    folder = tmp_path_factory.mktemp("frames")
    paths = []
    for i in range(9):
        paths.append(str(folder / f"f{i}.jpg"))
        Image.fromarray(_frame(i, 90, 50)).save(paths[-1], quality=90)
    Image.fromarray(_frame(0, 50, 90)).save(folder / "odd.png")
    return paths, str(folder / "odd.png")


@pytest.mark.parametrize("n", [5, 6, 9])
@pytest.mark.parametrize("stated_fps", [0.0, 1.0, 3.0, 6.0])
@pytest.mark.parametrize("spec", ["qwen2vl", "qwen2vl:fps=1,min_frames=2", "qwen2vl:num_frames=4", "qwen2vl:sample=false"])
def test_frame_list_counts_equal_the_processor(frame_list, stated_fps, spec, n):
    """A list of frame images with its ``fps`` is counted as the processor counts those frames handed with that fps in
    their metadata: it samples them as it samples a decoded file (6 frames at 3 fps keep 4, t = 2, where
    packer once took all 6, t = 3). A list without a rate: by count with num_frames; else taken whole, timed at the
    policy's rate -- what qwen-vl-utils / ms-swift hand the processor for such a list (every frame,
    do_sample_frames=False, the pipeline's fps), since the processor cannot sample frames without a rate."""
    from packer.media.load import load_image

    paths, _ = frame_list
    paths = paths[:n]
    policy = parse_policy(spec, "video")
    pil = [load_image(p) for p in paths]
    sampling = {"do_sample_frames": policy.sample, **(hf_sampling(policy) if policy.sample else {})}
    if policy.sample and not policy.num_frames and not stated_fps:
        with pytest.raises(ValueError, match="no video metadata"):  # nothing to sample such a list by
            hf_qwen25([pil], [{"total_num_frames": n}], policy, **sampling)
        sampling = {"do_sample_frames": False}  # qwen-vl-utils: every frame, at the pipeline's fps
    info, count = count_frames(paths, policy, fps=stated_fps)
    assert (info.frames, info.height, info.width) == (n, 50, 90)
    rate = stated_fps or policy.fps  # none stated (sample=false / num_frames): as sampled at the policy's rate
    hf = hf_qwen25([pil], [{"total_num_frames": n, "fps": rate}], policy, **sampling)
    assert_same(count, hf, policy)
    if not policy.sample or not (stated_fps or policy.num_frames):
        assert count.grid[0] == -(-n // 2) and count.frames == n  # every frame, the odd one padded
    if not policy.num_frames and not stated_fps:  # timed at the pipeline's rate
        assert count.second_per_grid_t == policy.temporal_patch_size / policy.fps
    if (spec, n, stated_fps) == ("qwen2vl", 6, 3.0):  # the held-out case
        assert count.grid[0] == 2 and count.frames == 4


@pytest.fixture(scope="module")
def no_fps_build(frame_list, tmp_path_factory):
    """pipelines/qwen2vl_video.toml (files sampled at 2 fps) over one record whose video is 5 frame images with no
    ``fps``: (the build, its policy, the HF processor's (grid, rows, second_per_grid_t) for those frames handed with
    do_sample_frames=False at the pipeline's fps -- what qwen-vl-utils / ms-swift give it for such a list)."""
    import json

    from conftest import ROOT
    from packer.build import build
    from packer.config import resolve
    from packer.media.load import load_image

    tmp = tmp_path_factory.mktemp("no_fps")
    paths = frame_list[0][:5]
    record = {"id": "no-fps", "messages": [{"role": "user", "content": [{"type": "video", "video": paths},
                                                                        {"type": "text", "text": "What moves?"}]},
                                           {"role": "assistant", "content": "A gradient."}]}
    (tmp / "in.jsonl").write_text(json.dumps(record) + "\n")
    config = resolve(ROOT / "pipelines" / "qwen2vl_video.toml", input=[str(tmp / "in.jsonl")], output=str(tmp / "out"),
                     allow_outside_media_root=True)  # the frames: the fixture's folder
    manifest = build(config, progress=False)
    policy = parse_policy(config.video_tokens, "video")
    hf = hf_qwen25([[load_image(p) for p in paths]], [{"total_num_frames": 5, "fps": policy.fps}], policy,
                   do_sample_frames=False)
    return tmp / "out", manifest, policy, hf


def test_a_frame_list_without_fps_is_built_whole_at_the_pipelines_fps(no_fps_build):
    """It was quarantined as unsupported_video: now every frame (5: t = 3, the odd one padded), timed at the
    pipeline's 2 fps (the span's second_per_grid_t 2 / 2 = 1.0, Qwen2.5-VL's second_per_grid_ts), ids as the HF
    processor gives those frames."""
    import json

    from packer.loader import PackedDataset

    out, manifest, policy, ((t, h, w), _, seconds) = no_fps_build
    assert manifest.accounting.quarantined == 0 and manifest.accounting.samples_packed == 1
    (span,) = [m for m in PackedDataset(out)[0]["media"] if m["kind"] == "video"]
    merge = policy.merge_size
    assert (t, span["llm_grid"]) == (3, [t, h // merge, w // merge]) and span["length"] == t * h * w // merge**2
    assert span["second_per_grid_t"] == seconds == 1.0
    assert json.loads(span["ref"])["fps"] == 0  # the record states none: the rule decides, no guessed rate is stored


def test_a_frame_list_without_fps_is_loaded_as_counted(no_fps_build):
    """The loader's media step hands the processor the same frames (every one): its count check against the span
    passes and the grid is the processor's."""
    from mm_models import qwen2vl_processor

    from packer.loader import PackedCollator, PackedDataset

    out, _, _, ((t, h, w), _, _) = no_fps_build
    ds = PackedDataset(out)
    batch = PackedCollator(attention="sdpa", rope="mrope", processor=qwen2vl_processor(ds.tokenizer()))([ds[0]])
    assert batch["video_grid_thw"].tolist() == [[t, h, w]]



def test_verify_against_processor_passes_on_a_frame_list_without_fps(no_fps_build, tmp_path, monkeypatch):
    """``verify --against-processor`` hands the processor such a list as the build counted it: every frame, at the
    pipeline's fps, ``do_sample_frames=False``. A Qwen2.5-VL processor that samples files at the pipeline's 2 fps
    (the checkpoint this build is for) then gives the build's ids (asked to sample the list without a rate it raised
    "no video metadata"), and its second_per_grid_ts equals the span's 1.0 s; handed without the rate, the
    processor's 24 fps default (2 / 24 s) is named against it."""
    from mm_models import qwen2vl_processor
    from transformers import Qwen2VLVideoProcessor

    from packer.loader import PackedDataset
    from packer.verify import against_processor
    from packer.verify.against_processor import verify_against_processor

    out, _, policy, (_, _, seconds) = no_fps_build
    proc = qwen2vl_processor(PackedDataset(out).tokenizer(), "2.5")
    proc.video_processor = Qwen2VLVideoProcessor(do_sample_frames=True, fps=policy.fps)
    proc.save_pretrained(tmp_path / "sampling")
    assert verify_against_processor(out, str(tmp_path / "sampling")) == ([], 1)
    proc.video_processor = Qwen2VLVideoProcessor()  # the class default: no sampling
    proc.save_pretrained(tmp_path / "plain")
    assert verify_against_processor(out, str(tmp_path / "plain")) == ([], 1) and seconds == 1.0
    monkeypatch.setattr(against_processor, "_untimed_fps", lambda config, family: None)  # no rate handed
    (m,) = verify_against_processor(out, str(tmp_path / "plain"))[0]
    assert m.detail == "video 1: the build's second_per_grid_t 1 s, the processor's second_per_grid_ts 0.0833333 s: " \
                       "Qwen2.5-VL's mRoPE time positions differ"

def test_bad_frame_lists(frame_list, tmp_path):
    paths, odd = frame_list
    with pytest.raises(BadRecord) as e:
        probe_frames([*paths[:3], odd])
    assert e.value.reason == "unsupported_video" and "odd.png" in e.value.detail and "50x90" in e.value.detail
    with pytest.raises(BadRecord) as e:
        probe_frames([*paths[:2], str(tmp_path / "gone.jpg")])
    assert e.value.reason == "missing_video" and "gone.jpg" in e.value.detail and "frame 2 of 3" in e.value.detail
    with pytest.raises(BadRecord) as e:
        probe_frames([])
    assert e.value.reason == "corrupt_video"


# ------------------------------------------------------------------ policy specs


def test_video_policy_specs():
    p = parse_policy("qwen2vl:fps=2,max_frames=8,cap_pixels_per_frame=true", "video")
    assert isinstance(p, Qwen2VLVideo) and (p.fps, p.max_frames, p.cap_pixels_per_frame) == (2.0, 8, True)
    assert p.count(120, 30.0, 120, 200) == VideoCount(4 * 9 * 15, (4, 9, 15), 8, 1.0)
    with pytest.raises(ConfigError, match="unknown video token policy 'qwen3'"):
        parse_policy("qwen3", "video")
    with pytest.raises(ConfigError, match="unknown parameter 'frames_per_second'"):
        parse_policy("qwen2vl:frames_per_second=2", "video")
    with pytest.raises(ConfigError, match="fps must be positive"):
        parse_policy("qwen2vl:fps=0", "video")
    with pytest.raises(ConfigError, match="max_frames"):
        parse_policy("qwen2vl:max_frames=1", "video")
    with pytest.raises(ConfigError, match="unknown media kind"):
        parse_policy("qwen2vl", "hologram")
