"""--engine ray on a real multi-node cluster without a shared disk, on this machine: a Ray
head and a second node started with ``ray start`` (separate raylets, object stores and
temp dirs; 1 CPU each; the second in another folder than the repository, so the pipeline's
relative tokenizer is not there: the driver ships it), an S3-API server (moto) holding the
inputs, their media and the output. The Ray build from s3:// to s3:// has the local engine's bytes; a worker node
killed mid-stage-1 and a killed driver both end in the same bytes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import ROOT, SAMPLE

pytestmark = [pytest.mark.slow, pytest.mark.early]  # a cluster, four builds: minutes on 2 cores, mostly waiting on Ray

pytest.importorskip("ray")
pytest.importorskip("s3fs")
pytest.importorskip("moto")

from s3_server import S3Server, free_port  # noqa: E402

INPUTS = ("s3://data/llava.jsonl", "s3://data/chat.jsonl", "s3://data/docs.jsonl", "s3://data/gen.jsonl")
OBJECT_STORE = 80 * 2**20  # Ray's minimum is 75 MiB; the tasks pass a few KB each


class Cluster:
    """Ray nodes started with ``ray start --block``, each in its own process group and temp dir. The temp dirs are
    under a short folder of /tmp, not the test's: Ray's socket paths (``<temp dir>/session_<date>_<pid>/sockets/
    plasma_store``) must fit AF_UNIX's 107 bytes, and a pytest-xdist worker's tmp_path does not leave room."""

    def __init__(self, root: Path, env: dict[str, str]):
        self.root, self.env = root, env
        self.temp = Path(tempfile.mkdtemp(prefix="ray-"))
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.nodes: dict[str, subprocess.Popen] = {}
        self.killed: set[str] = set()

    def start(self, name: str, cwd: Path | None = None) -> None:
        """``cwd``: the folder ``ray start`` runs in (its workers start there); the repository root if None."""
        ray = str(Path(sys.executable).parent / "ray")
        ports = [free_port() for _ in range(5)]
        args = [ray, "start", "--block", "--node-ip-address=127.0.0.1", "--num-cpus=1",
                f"--object-store-memory={OBJECT_STORE}", f"--temp-dir={self.temp / name}", "--disable-usage-stats",
                f"--node-manager-port={ports[0]}", f"--object-manager-port={ports[1]}",
                f"--metrics-export-port={ports[2]}", f"--dashboard-agent-listen-port={ports[3]}",
                f"--dashboard-agent-grpc-port={ports[4]}", f"--runtime-env-agent-port={free_port()}",
                f"--min-worker-port={20000 + 100 * len(self.nodes)}", f"--max-worker-port={20099 + 100 * len(self.nodes)}"]
        args += [f"--port={self.port}", "--head", "--include-dashboard=false"] if not self.nodes else [f"--address={self.address}"]
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 -- closed with the process
        self.nodes[name] = subprocess.Popen(args, env=self.env, stdout=log, stderr=log, start_new_session=True, cwd=cwd)
        self.wait_for(len(self.alive()))

    def alive(self) -> list[str]:
        return [n for n, p in self.nodes.items() if p.poll() is None]

    def wait_for(self, count: int, timeout: float = 120) -> None:
        code = ("import ray, sys, time\n"
                "deadline = time.time() + float(sys.argv[3])\n"
                "while True:  # the head's GCS may not listen yet: ray start --block returns nothing to wait on\n"
                "    try:\n"
                "        ray.init(address=sys.argv[1], log_to_driver=False); break\n"
                "    except ConnectionError:\n"
                "        if time.time() > deadline: raise\n"
                "        time.sleep(1)\n"
                "while sum(n['Alive'] for n in ray.nodes()) != int(sys.argv[2]) and time.time() < deadline: time.sleep(0.5)\n"
                "sys.exit(sum(n['Alive'] for n in ray.nodes()) != int(sys.argv[2]))")
        with tempfile.TemporaryFile("w+") as err:
            probe = subprocess.Popen([sys.executable, "-c", code, self.address, str(count), str(timeout)], env=self.env,
                                     stdout=subprocess.DEVNULL, stderr=err, text=True)
            deadline = time.time() + timeout + 60
            while probe.poll() is None:  # a node that exits (its log says why) fails the start at once
                dead = [n for n, p in self.nodes.items() if p.poll() is not None and n not in self.killed]
                if dead or time.time() > deadline:
                    probe.kill()
                    probe.wait()
                    logs = "".join((self.root / f"{n}.log").read_text(errors="replace")[-2000:] for n in dead)
                    raise AssertionError(f"{count} Ray node(s) did not come up ({', '.join(dead) or 'timed out'}): {logs}")
                time.sleep(0.2)
            err.seek(0)
            assert probe.returncode == 0, f"{count} Ray node(s) did not come up: {err.read()[-2000:]}"

    def kill(self, name: str) -> None:
        """SIGKILL a node's whole process group: its raylet, object store and workers, at once."""
        p = self.nodes[name]
        self.killed.add(name)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()

    def stop(self) -> None:
        """SIGKILL every node's process group, as :meth:`kill` does (a graceful ``ray stop`` of a node takes its raylet
        20 s on 2 cores), those of nodes already gone included: none of their workers may outlive the test. Then the
        nodes' temp dirs go."""
        for p in self.nodes.values():
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        shutil.rmtree(self.temp, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    import s3fs

    root = Path(tmp_path_factory.mktemp("cluster"))
    saved = dict(os.environ)
    with S3Server() as s3:
        env = {**os.environ, **s3.env, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               "PACKER_CACHE": str(root / "cache"), "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
               "RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3",
               # every process of the test's cluster alike, whatever a local Ray left in ~/.ray (a token file)
               "RAY_AUTH_MODE": "disabled"}
        env.pop("RAY_ADDRESS", None)
        os.environ.update({k: env[k] for k in (*s3.env, "PACKER_CACHE")})
        s3fs.S3FileSystem.clear_instance_cache()
        fs = s3.filesystem()
        fs.mkdir("data")
        fs.mkdir("builds")
        for name in ("llava.jsonl", "chat.jsonl", "docs.jsonl"):
            fs.pipe(f"data/{name}", (SAMPLE / name).read_bytes())
        for folder in ("images", "audio"):
            for p in (SAMPLE / folder).iterdir():
                fs.pipe(f"data/{folder}/{p.name}", p.read_bytes())
        fs.pipe("data/gen.jsonl", b"".join(
            json.dumps({"id": f"g{i}", "text": " ".join(["packing", "rows", "ray", "nodes"] * (5 + i % 60))}).encode() + b"\n"
            for i in range(1600)))
        c = Cluster(root, env)
        try:
            c.start("head")
            (root / "elsewhere").mkdir()  # not the repository: the pipeline's relative tokenizer is not here
            c.start("node1", cwd=root / "elsewhere")
            yield c, fs
        finally:
            c.stop()
            s3fs.S3FileSystem.clear_instance_cache()
            os.environ.clear()
            os.environ.update(saved)


ARGS = ["pipelines/sample.toml", *[a for i in INPUTS for a in ("-i", i)], "--chunk-records", "40", "--shard-rows", "8"]


SPY = ("import runpy, sys\n"
       "import packer.io.cache as cache\n"
       "log, copy = open(sys.argv[1], 'a'), cache.local_copy\n"
       "def spied(path, sha256=None):\n"
       "    log.write(f'{path}\\n'); log.flush()\n"
       "    return copy(path, sha256)\n"
       "cache.local_copy = spied\n"
       "sys.argv = ['packer', *sys.argv[2:]]\n"
       "runpy.run_module('packer', run_name='__main__')\n")


def packer(cluster: Cluster, out: str, *extra: str, wait: bool = True, downloads: Path | None = None):
    """``packer build`` as a driver process of its own; ``downloads``: a file listing every remote file
    the driver process itself copies to its cache (the Ray workers are other processes)."""
    cmd = [sys.executable, "-m", "packer", "build", *ARGS, "-o", out, *extra]
    if downloads is not None:
        cmd = [sys.executable, "-c", SPY, str(downloads), "build", *ARGS, "-o", out, *extra]
    if wait:
        return subprocess.run(cmd, env=cluster.env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    return subprocess.Popen(cmd, env=cluster.env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def ray_args(cluster: Cluster) -> list[str]:
    return ["--engine", "ray", "--ray-address", cluster.address, "--workers", "2"]


@pytest.fixture(scope="module")
def reference(cluster, tmp_path_factory):
    """The local engine's build of the same s3:// inputs, into a local folder."""
    c, _ = cluster
    out = tmp_path_factory.mktemp("ref") / "out"
    r = packer(c, str(out), "--engine", "local")
    assert r.returncode == 0, r.stderr[-3000:]
    return out, json.loads((out / "manifest.json").read_text())


def same_build(fs, url: str, ref_out: Path, ref: dict) -> None:
    m = json.loads(fs.cat(f"{url}/manifest.json"))
    strip = lambda d: {k: v for k, v in d.items() if k not in ("created_at", "execution")}  # noqa: E731
    assert strip(m) == strip(ref)
    f = ref["files"]
    names = [e["file"] for e in [*f["samples"], *f["packed"], *f["tokenizer"], f["plan"], f["quarantine"], f["dropped"]]]
    assert len(f["samples"]) > 40 and len(f["packed"]) > 5
    for name in names:
        assert fs.cat(f"{url}/{name}") == (ref_out / name).read_bytes(), name
    assert not [p for p in fs.find(url) if ".tmp-" in p]


def wait_for_journal(fs, url: str, count: int, process: subprocess.Popen, timeout: float = 300) -> int:
    deadline = time.time() + timeout
    while time.time() < deadline and process.poll() is None:
        n = len(fs.glob(f"{url}/.state/encode-*.json"))
        if n >= count:
            return n
        time.sleep(0.2)
    raise AssertionError(f"stage 1 never wrote {count} journal entries (driver exit code {process.poll()})")


def test_ray_from_s3_to_s3_has_the_local_engines_bytes(cluster, reference):
    c, fs = cluster
    downloads = c.root / "driver-downloads.txt"
    r = packer(c, "s3://builds/ray", *ray_args(c), downloads=downloads)
    assert r.returncode == 0, r.stderr[-3000:]
    same_build(fs, "builds/ray", *reference)
    m = json.loads(fs.cat("builds/ray/manifest.json"))
    assert m["execution"]["engine"] == "ray" and m["execution"]["output"] == "s3://builds/ray"
    # node1 ran `ray start` in another folder: its workers loaded the tokenizer the driver shipped
    assert list((c.root / "cache" / "shipped").glob("*/tokenizer/tokenizer.json"))
    for node in ("head", "node1"):  # each node ran stage workers (Ray names a worker's log after its actor)
        logs = (c.temp / node / "session_latest" / "logs").glob("worker-*.out")
        assert any("MapWorker(MapBatches(_Stage))" in p.read_text(errors="replace") for p in logs), node
    # The driver planned from the columns stage 1 returned and reported from the stats stage 3 returned:
    # it downloaded no packed shard but the first (the report's example row), and no samples shard but the
    # one holding the sample it truncated.
    downloaded = set(downloads.read_text().split()) if downloads.exists() else set()
    assert m["stats"]["truncated_samples"] == 1 and len(downloaded) == 2, downloaded
    assert "s3://builds/ray/packed/part-00000.arrow" in downloaded, downloaded
    assert next(iter(downloaded - {"s3://builds/ray/packed/part-00000.arrow"})).startswith("s3://builds/ray/samples/part-")


def test_a_worker_node_killed_mid_stage_1_costs_time_not_bytes(cluster, reference):
    c, fs = cluster
    driver = packer(c, "s3://builds/node-kill", *ray_args(c), wait=False)
    try:
        done = wait_for_journal(fs, "builds/node-kill", 6, driver)
        c.kill("node1")
        total = len(reference[1]["files"]["samples"])
        assert done < total and driver.poll() is None  # mid-stage-1
        assert driver.wait(900) == 0
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    same_build(fs, "builds/node-kill", *reference)
    c.start("node2")  # a two-node cluster again for the next test


def test_a_killed_driver_reruns_to_the_same_bytes(cluster, reference):
    c, fs = cluster
    assert len(c.alive()) >= 2
    driver = packer(c, "s3://builds/driver-kill", *ray_args(c), wait=False)
    try:
        done = wait_for_journal(fs, "builds/driver-kill", 6, driver)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)  # the driver only: the cluster stays up
        driver.wait()
    assert done < len(reference[1]["files"]["samples"]) and not fs.exists("builds/driver-kill/manifest.json")
    r = packer(c, "s3://builds/driver-kill", *ray_args(c))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "reused from the interrupted run" in r.stderr
    same_build(fs, "builds/driver-kill", *reference)
