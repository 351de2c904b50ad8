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
    """Each family's test module subclasses tests/family_harness.FamilyConformance for its name."""
    found = set()
    for path in sorted(Path(__file__).parent.glob("test_family_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(getattr(b, "id", "") == "FamilyConformance" for b in node.bases):
                found |= {s.value.value for s in node.body if isinstance(s, ast.Assign) and isinstance(s.value, ast.Constant)
                          and any(getattr(t, "id", "") == "family" for t in s.targets)}
    assert found == {n for n, cls in FAMILIES.items() if cls.routed}
