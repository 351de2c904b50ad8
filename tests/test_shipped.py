"""A stage-1 worker in another folder or on another machine (``--engine ray`` on a cluster) reads no path of
the driver's: the tokenizer folder (or the hub cache snapshot it loads from) and a ``.jinja`` template file
travel inside the worker's EncoderSpec (packer.encode.shipped). The cluster test starts a node in another
folder too (tests/test_cluster.py)."""

from __future__ import annotations

import pickle
import re
import shutil

import pytest

from conftest import ROOT
from packer.config import BuildConfig
from packer.encode import Encoder, EncoderSpec
from packer.errors import PackerError


@pytest.fixture
def driver_folder(tmp_path, monkeypatch):
    """The driver's folder: a relative tokenizer folder (with a checkpoint's weights beside it) and template."""
    driver = tmp_path / "driver"
    shutil.copytree(ROOT / "sample_data" / "tokenizer", driver / "tok")
    (driver / "tok" / "model.safetensors").write_bytes(b"\0" * 1024)  # weights: never shipped
    source = (ROOT / "sample_data" / "tokenizer" / "chat_template.jinja").read_text()
    (driver / "t.jinja").write_text("{#- shipped -#}\n" + source)
    monkeypatch.setenv("PACKER_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(driver)
    return driver


def test_a_worker_in_another_folder_loads_the_tokenizer_and_template_the_driver_shipped(driver_folder, tmp_path,
                                                                                       monkeypatch):
    config = BuildConfig(tokenizer="tok", chat_template="t.jinja")
    here = Encoder(EncoderSpec.from_config(config))
    shipped = pickle.dumps(EncoderSpec.from_config(config, ship_files=True))  # as Ray hands it to a worker
    plain = pickle.dumps(EncoderSpec.from_config(config))
    names = [name for name, _ in pickle.loads(shipped).shipped.files]
    assert sorted(names) == ["chat_template.jinja", "tokenizer.json", "tokenizer_config.json"]  # no weights

    elsewhere = tmp_path / "node"  # `ray start` ran here: no t.jinja, and the driver's tok/ is not on this node
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    (driver_folder / "tok").rename(driver_folder / "tok.driver-only")
    worker = Encoder(pickle.loads(shipped))
    assert worker.serialized == here.serialized and worker.renderer.source == here.renderer.source
    assert worker.renderer.source.startswith("{#- shipped -#}")
    assert worker.fingerprint() == here.fingerprint()  # the manifest names the tokenizer as the driver recorded it
    tok = str(driver_folder / "tok")
    assert config.tokenizer == worker.fingerprint()["name"] == tok  # the folder the user named, absolute
    with pytest.raises(PackerError, match=f"cannot load tokenizer '{re.escape(tok)}'"):  # what a worker met before
        Encoder(pickle.loads(plain))
    Encoder(pickle.loads(shipped))  # a second worker on the machine: the unpacked copy is reused


def test_a_checkpoint_folder_too_large_to_ship_is_refused_naming_it(driver_folder, monkeypatch):
    from packer.encode import shipped
    from packer.errors import ConfigError

    monkeypatch.setattr(shipped, "MAX_BYTES", 1000)
    tok = re.escape(str(driver_folder / "tok"))
    with pytest.raises(ConfigError, match=f"tokenizer '{tok}': its folder {tok} holds over 1,000 bytes of tokenizer files"):
        EncoderSpec.from_config(BuildConfig(tokenizer="tok"), ship_files=True)


def test_a_hub_name_ships_the_snapshot_the_driver_loads_from(tmp_path, monkeypatch):
    """A tokenizer named by hub name is sent from the driver's hub cache: a node without that cache (or the
    hub) loads the same tokenizer."""
    from huggingface_hub import constants

    from packer.encode.shipped import ship

    hub = tmp_path / "hub" / "models--org--tok"
    (hub / "refs").mkdir(parents=True)
    (hub / "refs" / "main").write_text("abc123")
    shutil.copytree(ROOT / "sample_data" / "tokenizer", hub / "snapshots" / "abc123")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("PACKER_CACHE", str(tmp_path / "cache"))
    shipped = ship("org/tok")
    assert sorted(name for name, _ in shipped.files) == ["chat_template.jinja", "tokenizer.json", "tokenizer_config.json"]

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty"))  # the node: no hub cache, no hub
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    worker = Encoder(pickle.loads(pickle.dumps(EncoderSpec(BuildConfig(tokenizer="org/tok"), shipped=shipped))))
    local = Encoder(EncoderSpec.from_config(BuildConfig(tokenizer=str(ROOT / "sample_data" / "tokenizer"))))
    assert worker.serialized == local.serialized and worker.fingerprint()["name"] == "org/tok"
    with pytest.raises(PackerError, match=r"cannot load tokenizer 'org/tok'"):
        Encoder(EncoderSpec(BuildConfig(tokenizer="org/tok")))
