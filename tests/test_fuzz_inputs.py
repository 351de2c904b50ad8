"""Fuzz the new readers: whatever a table row or a tar holds, a record is made or one bad record is named.

- any row (nested dicts / lists of strings, numbers, bytes, nulls under the record fields' names) goes through the
  column mapping, the published layouts and the record shapes to a record or a ``BadRecord``: never another error;
- any tar cut or with bytes flipped anywhere yields its samples, each a record or a ``BadRecord``, or is one
  ``ConfigError`` for the whole input (not a tar): never another error, never a hang.
"""

from __future__ import annotations

import io
import json
import tarfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packer.errors import BadRecord, ConfigError
from packer.ingest import layouts
from packer.ingest.formats import parse_record
from packer.ingest.webdataset import read_samples
from packer.io import blobs

FIELDS = ["messages", "conversations", "images", "image", "audios", "videos", "texts", "text", "prompt", "completion",
          "chosen", "rejected", "role", "content", "type", "from", "value", "user", "assistant", "bytes", "path"]
leaf = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=8), st.binary(max_size=16),
                 st.sampled_from(["<image>", "user", "assistant", "human", "gpt", "image", "text"]))
value = st.recursive(leaf, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                   st.dictionaries(st.sampled_from(FIELDS), inner, max_size=4)),
                     max_leaves=12)
rows = st.dictionaries(st.sampled_from(FIELDS), value, min_size=1, max_size=5)
TAGS = {"image": "<image>", "audio": "<audio>", "video": "<video>"}


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(row=rows, mapped=st.booleans())
def test_any_row_is_a_record_or_a_bad_record(row, mapped, tmp_path_factory):
    columns = (("messages", "conversations"),) if mapped else ()
    try:
        record = layouts.to_record(row, columns)
        parse_record(record, "auto", tmp_path_factory.getbasetemp(), TAGS)
    except BadRecord:
        pass
    finally:
        blobs.STORE.forget()


def tar_bytes() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for k in range(4):
            record = {"id": f"s{k}", "conversations": [{"from": "human", "value": "<image>\nWhat?"},
                                                       {"from": "gpt", "value": "This."}]}
            for ext, data in (("json", json.dumps(record).encode()), ("0.png", bytes(range(256)) * 4)):
                info = tarfile.TarInfo(f"{k:03d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


ORIGINAL = tar_bytes()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, len(ORIGINAL)), flips=st.lists(st.tuples(st.integers(0, len(ORIGINAL) - 1),
                                                                    st.integers(1, 255)), max_size=6))
def test_any_damaged_tar_yields_records_bad_records_or_one_error(cut, flips, tmp_path):
    data = bytearray(ORIGINAL[:cut])
    for at, x in flips:
        if at < len(data):
            data[at] ^= x
    path = tmp_path / "x.tar"
    path.write_bytes(bytes(data))
    try:
        for _, key, sample, _ in read_samples(path):
            assert isinstance(key, str) and isinstance(sample, (dict, BadRecord))
    except ConfigError:
        pass  # not a tar at all: the whole input's one error


@pytest.mark.parametrize("cut", [0, 100, 511, 512, 1024, 1500])
def test_fixed_cuts(cut, tmp_path):
    test_any_damaged_tar_yields_records_bad_records_or_one_error.hypothesis.inner_test(cut=cut, flips=[], tmp_path=tmp_path)
