"""The house plan: imports run one way, down the floors. Read from the source (imports inside functions count): the
top-level parts of packer/ (each subpackage or top-level module) import only parts on their own floor or below, so
no two parts import each other in a circle, directly or through others; and no two files do (a module importing
its own package's re-exporting ``__init__`` aside)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKER = Path(__file__).resolve().parents[1] / "packer"

# bottom first; a part may import its own floor and the floors below it
FLOORS = [
    ("errors", "reasons", "_ranges", "specs", "progress", "records"),  # records: the typed records that cross floors
    ("io", "engine"),
    ("media", "modeling"),  # probes, token policies, media refs; mRoPE and masks over them
    ("config", "families"),  # the options (and the policies they name); what each model's processor writes
    ("pack", "shards", "ingest", "schedule"),  # the planner; the format; record shapes; rank balance and step plans
    ("cost",),  # what a row costs (the format stores its vector)
    ("encode",),
    ("stages",),
    ("report", "summary"),
    ("pipeline", "build"),
    ("verify", "loader"),
    ("cli", "__main__"),
]
FLOOR = {part: k for k, parts in enumerate(FLOORS) for part in parts}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKER.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_package(module: str) -> bool:
    return (PACKER.parent / module.replace(".", "/") / "__init__.py").exists()


def exists(module: str) -> bool:
    return is_package(module) or (PACKER.parent / (module.replace(".", "/") + ".py")).exists()


def imports() -> dict[str, set[str]]:
    """module -> the packer modules it imports (``from a.b import c`` names a.b.c where c is a module, else a.b)."""
    out: dict[str, set[str]] = {}
    for path in sorted(PACKER.rglob("*.py")):
        module = module_name(path)
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name.startswith("packer")}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                if not base.startswith("packer"):
                    continue
                for alias in node.names:
                    child = f"{base}.{alias.name}"
                    found.add(child if exists(child) else base)
        out[module] = {m for m in found if m != module}
    return out


def part(module: str) -> str | None:
    bits = module.split(".")
    return bits[1] if len(bits) > 1 else None


def test_every_part_has_a_floor():
    parts = {part(m) for m in imports()} - {None}
    assert parts <= set(FLOOR), f"parts with no floor in FLOORS: {sorted(parts - set(FLOOR))}"


def test_imports_run_down_the_floors():
    up = sorted({(part(a), part(b)) for a, names in imports().items() for b in names
                 if part(a) and part(b) and part(a) != part(b) and FLOOR[part(b)] > FLOOR[part(a)]})
    assert not up, f"imports up the floors (importer, imported): {up}"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
    return out


def test_no_two_parts_import_each_other_in_a_circle():
    graph: dict[str, set[str]] = {}
    for a, names in imports().items():
        for b in names:
            if part(a) and part(b) and part(a) != part(b):
                graph.setdefault(part(a), set()).add(part(b))
    assert cycles(graph) == []


def test_no_two_files_import_each_other_in_a_circle():
    """A module importing a package above it (its own package's ``__init__``, which re-exports it) is left out."""
    graph = {a: {b for b in names if not a.startswith(b + ".")} for a, names in imports().items()}
    assert cycles(graph) == []


def test_the_circle_finder_finds_circles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
