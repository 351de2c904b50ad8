"""Media behind http(s):// and data: URLs: fetched bounded (timeout, retries, size, redirects), every failure one
quarantined record naming the URL; a build over URLs packs what the same records with local files pack; remote media
are read many at once (stage 1 and the loader). A local HTTP server on 127.0.0.1; nothing leaves this machine."""

from __future__ import annotations

import base64
import collections
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import ROOT, SAMPLE
from packer.errors import BadRecord
from packer.io import blobs, fs, http
from packer.media import inline
from packer.media.refs import resolve_media

IMAGES = sorted(p.name for p in (SAMPLE / "images").iterdir())


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.hits: dict[str, int] = {}  # path -> requests
        self.methods: list[tuple[str, str]] = []
        self.in_flight = self.most_in_flight = 0
        self.delay = 0.0  # seconds every answer waits (round trips to overlap)
        self.sent: collections.Counter = collections.Counter()  # path -> body bytes sent
        self.ranges = True  # honour Range: bytes=0-N (206 with Content-Range); False: ignore it (200, the whole)
        self.files: dict[str, bytes] = {}  # extra /img/<name> bodies a test serves
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # quiet
        pass

    def do_HEAD(self):
        self.do_GET(body=False)

    def do_GET(self, body: bool = True):
        srv: Server = self.server
        path = self.path
        with srv.lock:
            srv.hits[path] = srv.hits.get(path, 0) + 1
            srv.methods.append((self.command, path))
            srv.in_flight += 1
            srv.most_in_flight = max(srv.most_in_flight, srv.in_flight)
            n = srv.hits[path]
        try:
            time.sleep(srv.delay)
            self._answer(path, n, body)
        finally:
            with srv.lock:
                srv.in_flight -= 1

    def _send(self, code: int, data: bytes = b"", body: bool = True, length: int | None = None, **headers):
        self.send_response(code)
        self.send_header("Content-Length", str(len(data) if length is None else length))
        self.send_header("Last-Modified", "Tue, 01 Dec 2026 00:00:00 GMT")
        for k, v in headers.items():
            self.send_header(k.replace("_", "-"), v)
        self.end_headers()
        if body:
            self.wfile.write(data)
            with self.server.lock:
                self.server.sent[self.path] += len(data)

    def _answer(self, path: str, n: int, body: bool):
        name = path.rsplit("/", 1)[-1]
        if path.startswith("/img/") and (name in IMAGES or name in self.server.files):
            data = self.server.files.get(name) or (SAMPLE / "images" / name).read_bytes()
            asked = self.headers.get("Range", "")
            if self.server.ranges and asked.startswith("bytes=0-"):
                part = data[: int(asked[len("bytes=0-"):]) + 1]
                return self._send(206, part, body, Content_Range=f"bytes 0-{len(part) - 1}/{len(data)}")
            return self._send(200, data, body)
        if path.startswith("/flaky/") and name in IMAGES:  # a 500 first, then the image
            return self._send(500) if n == 1 else self._send(200, (SAMPLE / "images" / name).read_bytes(), body)
        if path == "/down":
            return self._send(503)
        if path == "/forbidden":
            return self._send(403)
        if path == "/slow":
            time.sleep(1.0)
            return self._send(200, b"late", body)
        if path in ("/loop-a", "/loop-b"):
            return self._send(302, Location="/loop-b" if path == "/loop-a" else "/loop-a")
        if path == "/to-file":
            return self._send(302, Location="file:///etc/passwd")
        if path == "/big":  # says so
            return self._send(200, b"", body, length=10**9)
        if path == "/short":  # says more than it sends
            return self._send(200, b"x" * 10, body, length=1000)
        if path == "/endless":  # no length, never ends
            self.send_response(200)
            self.end_headers()
            self.close_connection = True
            try:
                while True:
                    self.wfile.write(b"\0" * 65536)
            except OSError:
                return
        return self._send(404)


@pytest.fixture()
def server(monkeypatch):
    # generous: a loaded machine must never time out (and retry: a second request) where no answer is slow; the
    # timeout test sets its own
    monkeypatch.setattr(http, "TIMEOUT_S", 10.0)
    monkeypatch.setattr(http, "BACKOFF_S", 0.01)
    monkeypatch.setattr(http, "RETRIES", 2)
    monkeypatch.setattr(http, "MAX_BYTES", 1 << 20)
    srv = Server()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    blobs.STORE.forget_urls()
    blobs.STORE.forget()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        blobs.STORE.forget_urls()
        blobs.STORE.forget()


# ---------------------------------------------------------------------------------------------- the fetcher


def test_a_url_is_fetched_whole_with_its_time(server):
    got = http.fetch(f"{server.url}/img/{IMAGES[0]}")
    assert got.data == (SAMPLE / "images" / IMAGES[0]).read_bytes()
    assert got.mtime_ns == 1796083200 * 10**9
    assert http.head(f"{server.url}/img/{IMAGES[0]}") == http.Head(len(got.data), got.mtime_ns)


def test_a_5xx_is_retried_and_a_4xx_is_not(server):
    assert http.fetch(f"{server.url}/flaky/{IMAGES[0]}").data == (SAMPLE / "images" / IMAGES[0]).read_bytes()
    assert server.hits[f"/flaky/{IMAGES[0]}"] == 2
    with pytest.raises(BadRecord, match=r"/down: HTTP 503 .* after 3 tries") as e:
        http.fetch(f"{server.url}/down")
    assert e.value.reason == "media_fetch_failed" and server.hits["/down"] == 3  # RETRIES = 2
    with pytest.raises(BadRecord, match=r"/forbidden: HTTP 403") as e:
        http.fetch(f"{server.url}/forbidden")
    assert e.value.reason == "media_fetch_failed" and server.hits["/forbidden"] == 1
    with pytest.raises(http.Missing, match="HTTP 404"):
        http.fetch(f"{server.url}/nothing.png")
    assert server.hits["/nothing.png"] == 1


@pytest.mark.parametrize(("path", "reason", "match"), [
    ("/slow", "media_fetch_timeout", r"/slow: no answer within 0.3 s \(3 tries\)"),
    ("/loop-a", "media_fetch_failed", "redirect loop"),
    ("/to-file", "media_fetch_failed", "redirect"),
    ("/big", "media_too_large", r"states 1,000,000,000 bytes, over the 1,048,576-byte limit"),
    ("/endless", "media_too_large", r"goes past the 1,048,576-byte limit of one medium \(read stopped there\)"),
    ("/short", "media_fetch_failed", "ended after 10 of 1,000 bytes"),
])
def test_every_way_a_fetch_fails_is_one_named_bad_record(server, path, reason, match, monkeypatch):
    monkeypatch.setattr(http, "TIMEOUT_S", 0.3)  # /slow answers after 1 s
    start = time.monotonic()
    with pytest.raises(BadRecord, match=match) as e:
        http.fetch(server.url + path)
    assert e.value.reason == reason and server.url + path in e.value.detail
    assert time.monotonic() - start < 5  # nothing hangs


def test_only_http_and_https_are_fetched():
    with pytest.raises(BadRecord, match="http:// and https:// URLs only"):
        http.fetch("ftp://127.0.0.1/a.png")


def test_a_connection_refused_is_retried_then_named(monkeypatch):
    monkeypatch.setattr(http, "BACKOFF_S", 0.01)
    with pytest.raises(BadRecord, match=r"cannot connect .*4 tries\)") as e:
        http.fetch("http://127.0.0.1:9/a.png")  # the discard port: nobody listens
    assert e.value.reason == "media_fetch_failed"


# ---------------------------------------------------------------------------------------------- data: URLs


PNG = (SAMPLE / "images" / "small_224.png").read_bytes()


@pytest.mark.parametrize("url", [
    "data:image/png;base64," + base64.b64encode(PNG).decode(),
    "data:image/png;base64," + base64.urlsafe_b64encode(PNG).decode(),  # - and _
    "data:;base64," + base64.b64encode(PNG).decode(),  # no media type
])
def test_a_base64_data_url_is_its_bytes_as_a_blob(url):
    name = resolve_media(url, ".", "image")
    assert blobs.is_blob(name) and blobs.STORE.get(name) == PNG


@pytest.mark.parametrize(("url", "reason", "match"), [
    ("data:text/plain,hello", "bad_data_url", "not base64"),
    ("data:image/png;base64,iVBOR*w0K", "bad_data_url", "does not decode"),
    ("data:image/png;base64,", "bad_data_url", "holds no data"),
    ("data:image/png;base64", "bad_data_url", "without the ','"),
])
def test_a_data_url_that_holds_no_medium_is_a_bad_record(url, reason, match):
    with pytest.raises(BadRecord, match=match) as e:
        resolve_media(url, ".", "image")
    assert e.value.reason == reason


def test_a_data_url_over_the_limit_is_refused_before_it_is_decoded(monkeypatch):
    monkeypatch.setattr(inline, "MAX_INLINE_BYTES", 100)
    with pytest.raises(BadRecord, match="over the 100-byte limit") as e:
        resolve_media("data:image/png;base64," + base64.b64encode(PNG).decode(), ".", "image")
    assert e.value.reason == "media_too_large"


# ---------------------------------------------------------------------------------------------- builds


def records(image_ref, n: int = 16) -> list[dict]:
    """LLaVA records over the sample images (one or two each), their refs made by ``image_ref(name)``."""
    out = []
    for k in range(n):
        names = [IMAGES[k % len(IMAGES)]] + ([IMAGES[(k + 3) % len(IMAGES)]] if k % 3 == 0 else [])
        out.append({"id": f"r{k:03d}", "image": [image_ref(x) for x in names],
                    "conversations": [{"from": "human", "value": "<image>\n" * len(names) + f"Question {k}?"},
                                      {"from": "gpt", "value": f"Answer {k}, about {len(names)} picture(s)."}]})
    return out


def openai(image_ref, n: int = 8) -> list[dict]:
    """OpenAI-style messages, the image an ``image_url`` part."""
    return [{"id": f"o{k:03d}", "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": image_ref(IMAGES[k % len(IMAGES)])}},
                                     {"type": "text", "text": f"What is in picture {k}?"}]},
        {"role": "assistant", "content": f"Shapes, {k}."}]} for k in range(n)]


def write(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def run_build(files: list[str], out, **kw):
    from packer.build import build
    from packer.config import resolve

    config = resolve(ROOT / "pipelines" / "qwen3vl.toml", input=tuple(files), output=str(out), **kw)
    return build(config, progress=False).to_dict()


def packed(out) -> list[tuple]:
    """Every packed row's ids, labels, segments and media spans (refs aside): what must not depend on where the
    media were read from."""
    from packer.loader import PackedDataset

    ds = PackedDataset(out)
    rows = []
    for k in range(len(ds)):
        row = ds[k]
        spans = [{key: v for key, v in m.items() if key not in ("ref", "path")} for m in row.get("media", [])]
        rows.append((list(map(int, row["input_ids"])), list(map(int, row["labels"])), list(row["cu_seqlens"]),
                     list(row["segment_ids"]), json.dumps(spans, sort_keys=True, default=str)))
    return rows


def quarantined(out) -> dict[str, tuple[str, str, int]]:
    lines = (out / "quarantine.jsonl").read_text().splitlines() if (out / "quarantine.jsonl").exists() else []
    return {q["id"]: (q["reason"], q["detail"], q["line"]) for q in map(json.loads, lines)}


@pytest.mark.slow  # two builds: ~15 s on 2 cores
def test_a_build_over_http_urls_packs_what_local_files_pack(server, tmp_path):
    """The same records with their images as local files, as http:// URLs and as data: URLs: the same packed ids,
    labels, positions and spans; the shards store each URL as the ref; broken URLs are quarantined, named."""
    local = tmp_path / "local"
    local.mkdir()
    (local / "images").symlink_to(SAMPLE / "images")
    files = [write(local / "llava.jsonl", records(lambda x: f"images/{x}")),
             write(local / "openai.jsonl", openai(lambda x: f"images/{x}"))]
    run_build(files, tmp_path / "a")

    web = tmp_path / "web"
    web.mkdir()
    bad = [{"id": f"bad-{name}", "image": f"{server.url}/{name}",
            "conversations": [{"from": "human", "value": "<image>\nWhat?"}, {"from": "gpt", "value": "No."}]}
           for name in ("gone.png", "down", "big", "loop-a")]
    url = lambda x: f"{server.url}/img/{x}"  # noqa: E731
    files = [write(web / "llava.jsonl", records(url) + bad), write(web / "openai.jsonl", openai(url))]
    inline_refs = lambda x: "data:image/png;base64," + base64.b64encode((SAMPLE / "images" / x).read_bytes()).decode()  # noqa: E731
    run_build([files[0], write(web / "inline.jsonl", openai(inline_refs))], tmp_path / "c",  # data: URLs
              max_bad_fraction=1.0)
    server.methods.clear()
    run_build(files, tmp_path / "b", max_bad_fraction=1.0)
    stage1 = [(m, p) for m, p in server.methods if p.startswith("/img/")]

    assert packed(tmp_path / "b") == packed(tmp_path / "a")
    assert quarantined(tmp_path / "a") == {}
    assert {k: v[0] for k, v in quarantined(tmp_path / "b").items()} == {
        "bad-gone.png": "missing_image", "bad-down": "media_fetch_failed", "bad-big": "media_too_large",
        "bad-loop-a": "media_fetch_failed"}
    assert "HTTP 404" in quarantined(tmp_path / "b")["bad-gone.png"][1]
    assert quarantined(tmp_path / "b")["bad-down"][2] == 18  # the line: file + line name the record
    from packer.loader import PackedDataset

    ds = PackedDataset(tmp_path / "b")
    refs = {m["ref"] for k in range(len(ds)) for m in ds[k]["media"]}
    assert refs == {f"{server.url}/img/{x}" for x in IMAGES}  # a ref build: the URL, fetched again at train time
    # each file's task read each image once, GET (its probe and the media index answered from it: no HEAD); the
    # report reads a sample's headers once more
    assert {m for m, _ in stage1} == {"GET"}
    assert all(len(files) <= n <= len(files) + 1 for n in collections.Counter(p for _, p in stage1).values()), \
        collections.Counter(p for _, p in stage1)

    inline_rows = packed(tmp_path / "c")  # llava over http, openai as data: URLs: the same rows again
    assert inline_rows == packed(tmp_path / "a")


def test_a_tasks_remote_media_are_read_many_at_once(server, tmp_path):
    """Stage 1 reads a task's URLs concurrently (a prefetch before the records are probed), so round trips overlap."""
    server.delay = 0.5  # long enough that requests overlap even on a loaded machine
    web = tmp_path / "web"
    web.mkdir()
    files = [write(web / "llava.jsonl", records(lambda x: f"{server.url}/img/{x}", n=8))]
    start = time.monotonic()
    run_build(files, tmp_path / "b", modalities=("image",))
    took = time.monotonic() - start
    assert server.most_in_flight >= 4, server.most_in_flight
    assert all(n <= 2 for n in server.hits.values())  # the task's read, and the report's sample of headers
    assert took < 30


def test_prefetch_holds_bodies_facts_and_failures(server):
    good, gone = f"{server.url}/img/{IMAGES[0]}", f"{server.url}/gone.png"
    asked = fs.prefetch([good, gone, good, str(SAMPLE / "images" / IMAGES[0])])
    assert asked == [good, gone]  # local files are not read ahead; each URL once
    assert fs.open_binary(good).read() == (SAMPLE / "images" / IMAGES[0]).read_bytes()
    assert fs.stat(good) == (len((SAMPLE / "images" / IMAGES[0]).read_bytes()), 1796083200 * 10**9)
    with pytest.raises(FileNotFoundError, match="HTTP 404"):
        fs.stat(gone)
    assert sum(server.hits.values()) == 2
    blobs.STORE.release_urls(asked, keep_facts=True)  # a probed window: bytes gone, size and time kept
    assert blobs.STORE.url_bytes(good) is None and fs.stat(good)[0] > 0 and sum(server.hits.values()) == 2
    blobs.STORE.forget()  # a group's media written: the facts stay for the task's media index
    assert fs.stat(good)[0] > 0 and sum(server.hits.values()) == 2
    blobs.STORE.release_urls(asked)
    assert blobs.STORE.url(good) is None and len(blobs.STORE) == 0


def test_the_loader_reads_a_batchs_remote_media_at_once_in_order(server):
    """The collator's media step reads a batch's URLs concurrently; the images it loads are those of the files,
    in the spans' order, and the batch's bodies are dropped once loaded."""
    from packer.loader.media import prefetch_remote
    from packer.media.load import load_image

    server.delay = 0.5  # long enough that requests overlap even on a loaded machine
    spans = [{"kind": "image", "ref": f"{server.url}/img/{x}", "path": f"{server.url}/img/{x}", "start": k}
             for k, x in enumerate(IMAGES)]
    held = prefetch_remote(spans)
    assert held == [m["path"] for m in spans] and server.most_in_flight >= 4
    for m, name in zip(spans, IMAGES, strict=True):
        assert load_image(m["path"]).tobytes() == load_image(str(SAMPLE / "images" / name)).tobytes()
    assert sum(server.hits.values()) == len(IMAGES)
    blobs.STORE.release_urls(held)
    assert len(blobs.STORE) == 0


@pytest.mark.slow  # two builds: ~10 s on 2 cores
def test_an_embedded_build_over_urls_reads_each_url_once_and_carries_its_bytes(server, tmp_path):
    """``--media embed`` of http:// refs: the task keeps the bodies it read for probing and writes them into its media
    shards (no second fetch); the rows equal the local files' build."""
    local = tmp_path / "local"
    local.mkdir()
    (local / "images").symlink_to(SAMPLE / "images")
    run_build([write(local / "llava.jsonl", records(lambda x: f"images/{x}"))], tmp_path / "a")
    web = tmp_path / "web"
    web.mkdir()
    server.methods.clear()
    run_build([write(web / "llava.jsonl", records(lambda x: f"{server.url}/img/{x}"))], tmp_path / "b", media="embed")
    assert sorted(server.methods) == sorted(("GET", f"/img/{x}") for x in IMAGES)  # once each: probe and embed
    from packer.loader import PackedDataset

    ds = PackedDataset(tmp_path / "b")
    assert all(blobs.is_blob(m["ref"]) for k in range(len(ds)) for m in ds[k]["media"])
    assert packed(tmp_path / "b") == packed(tmp_path / "a")


# ---------------------------------------------------------------------------------------------- ranged header reads


def big_exif_jpeg(exif_bytes: int) -> bytes:
    """A 300x200 JPEG rotated by its EXIF (orientation 6: a 200x300 image) whose EXIF block, before the frame header
    (SOF), is ``exif_bytes`` long: its size is not in the first bytes."""
    import io

    from PIL import Image

    exif = Image.Exif()
    exif[0x0112] = 6
    exif[0x010E] = "x" * exif_bytes  # ImageDescription: padding inside APP1
    out = io.BytesIO()
    Image.new("RGB", (300, 200), (10, 120, 200)).save(out, "JPEG", exif=exif.tobytes())
    return out.getvalue()


def test_a_header_probe_reads_the_first_bytes_and_the_whole_only_when_it_needs_more(server, monkeypatch):
    """--image-check header over http: a ranged read of the first HEAD_BYTES, the size from Content-Range; an image
    whose header lies further (a long EXIF block before its SOF) is read whole and probed again: the same answer as the
    whole file, never a guess from a part. Every other reader of the URL gets the whole body."""
    from packer.media.counter import MediaProber
    from packer.records import Part

    monkeypatch.setattr(fs, "HEAD_BYTES", 256)
    late = big_exif_jpeg(4000)
    server.files["late.jpg"] = late
    prober = MediaProber("header")
    parts = [Part(kind="image", ref=u, path=u) for u in (f"{server.url}/img/{IMAGES[-1]}", f"{server.url}/img/late.jpg")]
    prober.prefetch(parts)
    assert blobs.STORE.head(parts[1].path) == late[:256]
    assert fs.stat(parts[1].path) == (len(late), 1796083200 * 10**9)  # the whole size, from the 206's Content-Range
    got = [prober.probe(p) for p in parts]
    assert (got[1].width, got[1].height) == (200, 300)  # EXIF orientation 6 from the whole file
    from packer.media.probe import probe_image

    assert got == [probe_image(str(SAMPLE / "images" / IMAGES[-1]), "header"), probe_image(parts[1].path, "verify")]
    assert server.sent["/img/late.jpg"] == 256 + len(late) + len(late)  # the part, the whole, verify's whole
    assert blobs.STORE.head(parts[1].path) is None
    assert fs.open_binary(parts[0].path).read() == (SAMPLE / "images" / IMAGES[-1]).read_bytes()  # never a part

    server.ranges = False  # a server that ignores Range: its 200 is the whole body, held whole
    blobs.STORE.forget_urls()
    prober.prefetch(parts[1:])
    assert blobs.STORE.head(parts[1].path) is None and blobs.STORE.url_bytes(parts[1].path) == late


def test_a_header_build_over_http_reads_only_the_headers_of_large_images(server, tmp_path, monkeypatch):
    """A build with --image-check header reads at most HEAD_BYTES of each image whose header fits there (PNGs with
    their IHDR up front), the whole of those whose does not, and packs what the whole-file build and local files pack."""
    monkeypatch.setattr(fs, "HEAD_BYTES", 1024)
    local = tmp_path / "local"
    local.mkdir()
    (local / "images").symlink_to(SAMPLE / "images")
    run_build([write(local / "llava.jsonl", records(lambda x: f"images/{x}"))], tmp_path / "a", image_check="header")
    web = tmp_path / "web"
    web.mkdir()
    files = [write(web / "llava.jsonl", records(lambda x: f"{server.url}/img/{x}"))]
    run_build(files, tmp_path / "whole", image_check="verify")
    server.sent.clear()
    run_build(files, tmp_path / "b", image_check="header")

    assert packed(tmp_path / "b") == packed(tmp_path / "a") == packed(tmp_path / "whole")
    sizes = {x: (SAMPLE / "images" / x).stat().st_size for x in IMAGES}
    stage1 = {p.rsplit("/", 1)[-1]: n for p, n in server.sent.items()}
    large = [x for x in IMAGES if sizes[x] > 4 * 1024]
    # stage 1 sent 1024 bytes of each (a verify build sends it whole: twice its size in all), the report's sample whole
    assert large and all(stage1[x] <= 1024 + sizes[x] for x in large), (stage1, sizes)
