"""Two processes on CPU (gloo), each under a timeout so a hang fails the test instead of the
suite: DDP and FSDP2 on a tiny Qwen2-VL where one rank's rows hold no image (packer's dummy
media), gradients against one process over the same rows; PackedTrainer under torchrun
against a plain loop; Accelerate's prepare(loader) keeping each row once per epoch; the
training examples of docs/training.md as a user runs them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile

import pytest
import torch
from mm_models import FAMILIES

from conftest import ROOT, SAMPLE, TOKENIZER
from packer.build import build
from packer.config import resolve
from packer.loader import PackedCollator, PackedDataset, loss_norm, model_inputs, packed_loss

pytestmark = pytest.mark.slow  # each test starts two Python processes with torch and transformers

TIMEOUT = 300  # seconds for a torchrun: a collective mismatch that hangs fails here
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]


def run(args: list[str]) -> subprocess.CompletedProcess:
    """``args`` under TIMEOUT; output to temporary files, so what a hung run printed shows in the failure."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(args, stdout=out, stderr=err, text=True, env=env, cwd=ROOT, start_new_session=True)
        try:
            code = proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the launcher and its workers: nothing left running
            proc.wait()
            err.seek(0)
            pytest.fail(f"{' '.join(args[-6:])} did not finish in {TIMEOUT} s (a hang in a collective?): {err.read()[-3000:]}")
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(args, code, out.read(), err.read())


@pytest.fixture(scope="module")
def vlm_build(tmp_path_factory):
    """Qwen2-VL rows of one modality each (--group-by modality): images, and text only."""
    out = tmp_path_factory.mktemp("vlm") / "out"
    build(resolve(None, input=[str(SAMPLE / "llava.jsonl"), str(SAMPLE / "docs.jsonl")], output=str(out), tokenizer=TOKENIZER,
                  max_length=512, group_by="modality", modalities=["image"], max_bad_fraction=1.0,
                  **FAMILIES["qwen2vl"].build), progress=False)
    return out


@pytest.fixture(scope="module")
def qwen2vl_build(tmp_path_factory):
    """What docs/examples/ddp_train.py says to build: pipelines/qwen2vl.toml over images and text, by modality."""
    out = tmp_path_factory.mktemp("qwen2vl") / "out"
    build(resolve(ROOT / "pipelines" / "qwen2vl.toml", input=[str(SAMPLE / "llava.jsonl"), str(SAMPLE / "docs.jsonl")],
                  output=str(out), tokenizer=TOKENIZER, max_length=512, group_by="modality", max_bad_fraction=1.0),
          progress=False)
    return out


@pytest.fixture(scope="module")
def small_build(tmp_path_factory):
    """sample_data at 512-token rows (about 50): quick steps."""
    out = tmp_path_factory.mktemp("small") / "out"
    build(resolve(ROOT / "pipelines" / "sample.toml", output=str(out), max_length=512, max_bad_fraction=1.0,
                  modalities=[]), progress=False)  # text only: these train a text model (media records quarantined)
    return out


def reference(build, steps):
    """One process, no dummy: each step's loss over both ranks' rows / their summed weights, SGD."""
    sys.path.insert(0, str(ROOT / "tests"))
    from distributed_vlm import LR, setup

    ds, model, processor = setup(str(build))
    collate = PackedCollator(attention="sdpa", rope="mrope", pad_to_multiple_of=16, processor=processor)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    out = []
    for pair in steps:
        batches = [collate([ds[i]]) for i in pair]
        norm = sum(loss_norm(b) for b in batches)
        loss = sum(packed_loss(model(**model_inputs(b)).logits, b, reduce=False)[0] for b in batches) / norm
        loss.backward()
        out.append((loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
        opt.step()
        opt.zero_grad()
    return out


@pytest.fixture(scope="module")
def vlm_runs(vlm_build, tmp_path_factory):
    """One torchrun of tests/distributed_vlm.py for three runs (a start costs ~20 s of CPU): DDP, then FSDP2, with a
    text-only rank (rank 1, then 0, then 1), then DDP without dummy media, which stops the process group.
    Returns the run's result and, per run, (its folder, its steps)."""
    ds = PackedDataset(vlm_build)
    image = [i for i in range(len(ds)) if any(m["kind"] == "image" for m in ds[i]["media"])]
    text = [i for i in range(len(ds)) if not ds[i]["media"]]
    assert len(image) >= 2 and len(text) >= 2
    root = tmp_path_factory.mktemp("vlm_runs")
    steps = {"ddp": [[image[0], text[0]], [text[1], image[1]], [image[0], text[1]]],
             "no-dummy": [[image[0], text[0]], [image[0], text[1]]]}
    steps["fsdp"] = steps["ddp"]
    runs = {name: (root / name, steps[name]) for name in ("ddp", "fsdp", "no-dummy")}
    for folder, _ in runs.values():
        folder.mkdir()
    plan = [{"mode": name.replace("no-dummy", "ddp"), "rows": rows, "out": str(folder), "dummy": name != "no-dummy"}
            for name, (folder, rows) in runs.items()]
    (root / "runs.json").write_text(json.dumps(plan))
    return run([*TORCHRUN, str(ROOT / "tests" / "distributed_vlm.py"), str(vlm_build), str(root / "runs.json")]), runs


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_ddp_and_fsdp2_with_a_text_only_rank_equal_one_process(vlm_build, vlm_runs, mode):
    result, runs = vlm_runs
    out, steps = runs[mode]
    assert all((out / f"rank-{r}.json").exists() for r in (0, 1)), result.stderr[-4000:]
    reports = [json.loads((out / f"rank-{r}.json").read_text()) for r in (0, 1)]
    real = [[n > 0 for n in r["images"]] for r in reports]
    assert real == [[True, False, True], [False, True, False]]  # real images on one rank only, each step
    assert reports[0]["losses"] == reports[1]["losses"]
    for k, (loss, grads) in enumerate(reference(vlm_build, steps)):
        assert reports[0]["losses"][k] == pytest.approx(loss, rel=1e-5)
        got = torch.load(out / f"grads-{k}.pt")
        assert set(got) == set(grads)  # every tower's parameters have a gradient on every step
        scale = max(g.abs().max() for g in grads.values())
        for name, g in grads.items():
            assert (got[name] - g).abs().max() <= 1e-5 * scale, f"step {k}: gradient of {name}"


def test_ddp_without_dummy_media_fails_as_users_saw(vlm_runs):
    """What the dummy fixes: plain DDP stops when a rank's batch leaves the vision tower unused."""
    result, runs = vlm_runs
    out, _ = runs["no-dummy"]
    assert all((out / f"started-{r}").exists() for r in (0, 1)), result.stderr[-3000:]  # the runs before it ended
    # "parameters that were not used" (DDP's check) or, first, gloo's mismatched all-reduce sizes
    assert result.returncode != 0 and any(t in result.stderr for t in ("did not receive grad", "gloo::EnforceNotMet")), \
        result.stderr[-3000:]
    assert not (out / "rank-0.json").exists()


EXAMPLES = ROOT / "docs" / "examples"


def plain_two_rank_loop(build, steps, *, batch_size=2, accumulation=2, loss="token", lr=3e-3):
    """One process doing what PackedTrainer does over 2 ranks: per optimizer step, `accumulation`
    micro-batches of each rank's TokenBalancedSampler, divided by their summed weights; plain SGD (the
    example's ``--optim sgd``), gradients clipped at 1 (the Trainer's default), one thread as each rank runs.
    SGD, not Adam: the ranks' all-reduce sums the gradients in another order than this loop (float noise),
    which SGD keeps at lr x noise and Adam turns into steps of about lr where a gradient is near zero.
    Returns losses, rows per rank, the model."""
    sys.path.insert(0, str(EXAMPLES))
    from hf_trainer import tiny_llama

    from packer.loader import TokenBalancedSampler

    ds = PackedDataset(build)
    model = tiny_llama(ds)
    collate = PackedCollator(attention="sdpa", loss=loss, pad_to_multiple_of=64)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    samplers = [TokenBalancedSampler(ds, num_replicas=2, rank=r, batch_size=batch_size, seed=0) for r in (0, 1)]
    losses, rows, epoch = [], [[], []], 0
    while len(losses) < steps:
        per_rank = []
        for s in samplers:
            s.set_epoch(epoch)
            order = list(s)
            per_rank.append([order[k : k + batch_size] for k in range(0, len(order), batch_size)])
        for k in range(0, len(per_rank[0]), accumulation):
            group = [(r, b) for r in (0, 1) for b in per_rank[r][k : k + accumulation]]
            batches = [collate([ds[i] for i in b]) for _, b in group]
            norm = sum(loss_norm(b) for b in batches)
            total = sum(packed_loss(model(**model_inputs(b)).logits, b, reduce=False)[0] for b in batches)
            (total / norm).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
            losses.append(total.item() / norm.item())
            for r, b in group:
                rows[r] += b
            if len(losses) == steps:
                break
        epoch += 1
    return losses, rows, model


def test_packed_trainer_over_two_processes_equals_a_plain_loop_and_resumes(small_build, tmp_path):
    out = small_build
    steps = 4  # 2 ranks x 2 micro-batches x 2 rows a step: 16 of the ~50 rows, mid-epoch
    common = [*TORCHRUN, str(EXAMPLES / "hf_trainer.py"), str(out), "--steps", str(steps), "--loss", "sample",
              "--optim", "sgd", "--output-dir", str(tmp_path / "ckpt")]
    result = run([*common, "--save-steps", "2", "--report-dir", str(tmp_path)])
    assert result.returncode == 0, result.stderr[-4000:]
    reports = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each rank (OMP_NUM_THREADS=1): one summation order in each process
    try:
        losses, rows, model = plain_two_rank_loop(out, steps, loss="sample")
    finally:
        torch.set_num_threads(threads)
    assert [r["rows"] for r in reports] == rows  # each rank its own rows, in the sampler's order
    assert reports[0]["losses"] == reports[1]["losses"] == pytest.approx(losses, abs=1e-4)  # logged to 4 decimals
    trained = torch.load(tmp_path / "model.pt")
    for name, p in model.state_dict().items():
        assert (trained[name] - p).abs().max() < 1e-6, name
    (tmp_path / "resumed").mkdir()  # stopped after step 2, mid-epoch: the same remaining rows on each rank
    result = run([*common, "--resume", str(tmp_path / "ckpt" / "checkpoint-2"), "--report-dir", str(tmp_path / "resumed")])
    assert result.returncode == 0, result.stderr[-4000:]
    resumed = [json.loads((tmp_path / "resumed" / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert [r["rows"] for r in resumed] == [r[len(r) // 2 :] for r in rows]
    again = torch.load(tmp_path / "resumed" / "model.pt")
    for name, p in trained.items():
        assert torch.allclose(again[name], p, atol=1e-6), name


def test_accelerate_prepare_sees_each_row_once_per_epoch(small_build, tmp_path):
    out = small_build
    ds = PackedDataset(out)
    # accelerate's launcher runs one process under --cpu; --multi_gpu starts torchrun, and the script asks for the CPU
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
              "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0"]
    per_epoch = -(-len(ds) // 4)  # 2 ranks x 2 rows a step
    result = run([*launch, str(EXAMPLES / "accelerate_train.py"), str(out), "--steps", str(per_epoch + 2),
                  "--report-dir", str(tmp_path)])
    assert result.returncode == 0, result.stderr[-4000:]
    reports = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    first = reports[0]["epochs"][0] + reports[1]["epochs"][0]
    padded = per_epoch * 4 - len(ds)  # the last step completed from the start of the order, as DistributedSampler does
    assert sorted(set(first)) == list(range(len(ds))) and len(first) == len(ds) + padded
    assert reports[0]["batches_per_epoch"] == reports[1]["batches_per_epoch"] == per_epoch
    assert reports[0]["epochs"][1] != reports[0]["epochs"][0][: len(reports[0]["epochs"][1])]  # a new order per epoch
    assert reports[0]["losses"] == reports[1]["losses"] and reports[0]["losses"][-1] < reports[0]["losses"][0]


def test_vlm_example_with_text_only_batches(qwen2vl_build, tmp_path):
    """docs/examples/ddp_train.py as documented, under FSDP2 (its DDP path is the gradient test's)."""
    result = run([*TORCHRUN, str(EXAMPLES / "ddp_train.py"), str(qwen2vl_build), "--steps", "6", "--report-dir", str(tmp_path),
                  "--fsdp"])
    assert result.returncode == 0, result.stderr[-4000:]
    reports = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    images = [r["images"] for r in reports]
    assert any(a == 0 or b == 0 for a, b in zip(*images)) and sum(map(sum, images)) > 0  # a rank without images, some step
    losses = reports[0]["losses"]
    assert losses == reports[1]["losses"] and all(x == x for x in losses) and losses[-1] < losses[0]


def test_plain_loop_example(small_build):
    result = run([sys.executable, str(EXAMPLES / "train_loop.py"), str(small_build), "--steps", "4", "--loss", "sample"])
    assert result.returncode == 0, result.stderr[-3000:]
    losses = [float(line.split()[3]) for line in result.stdout.splitlines() if line.startswith("step")]
    assert len(losses) == 4 and all(x == x for x in losses) and losses[-1] < losses[0]
