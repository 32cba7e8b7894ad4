"""The import graph of python/sparktrain: no cycle, no upward import, the demo data only where it belongs.

The graph is read with ``ast`` (nothing is imported): every ``import`` and
``from ... import`` anywhere in a module counts, inside functions too;
relative imports are resolved; ``from pkg import mod`` counts as importing
``pkg.mod`` when ``mod`` is a module.  :data:`LAYERS` is the table of the
package docstring (``sparktrain/__init__.py``), lowest first; a test holds
the two to each other.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "python" / "sparktrain"

#: Lowest first: a module imports only from its own layer or lower ones.  A name is the first part of a module's
#: dotted name below ``sparktrain`` (a top-level module or subpackage); ``sparktrain`` is the package's __init__.
LAYERS: List[Tuple[str, ...]] = [
    ("errors", "_internal", "settings", "sparktrain"),
    ("jvm", "session"),
    ("data",),
    ("features", "profile"),
    ("config",),
    ("train",),
    ("tune", "track", "serve"),
    ("job", "datasets"),
    ("cli", "__main__"),
]
#: The only modules (besides tests) that may import the demo's data.
DATASETS_IMPORTERS = ("sparktrain.job", "sparktrain.cli")


def _modules() -> Dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ("sparktrain",) + path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def import_graph() -> Dict[str, Dict[str, int]]:
    """``{module: {imported sparktrain module: line}}`` over every module of the package."""
    modules = _modules()

    def known(name: str) -> str:  # a name inside a module (sparktrain.x.f) is an import of the module
        while name not in modules and "." in name:
            name = name.rsplit(".", 1)[0]
        return name

    graph: Dict[str, Dict[str, int]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: List[Tuple[str, int]] = []
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found += [(alias.name, node.lineno) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base_parts = package.split(".")
                    base_parts = base_parts[:len(base_parts) - (node.level - 1)]
                    base = ".".join(base_parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    found.append((full if full in modules else base, node.lineno))
        edges: Dict[str, int] = {}
        for target, line in sorted(found, key=lambda t: t[1]):
            target = known(target)
            if target != name and target.split(".")[0] == "sparktrain":
                edges.setdefault(target, line)
        graph[name] = edges
    return graph


def layer_of(module: str) -> int:
    head = "sparktrain" if module == "sparktrain" else module.split(".")[1]
    for i, names in enumerate(LAYERS):
        if head in names:
            return i
    raise AssertionError(f"{module} has no layer: add '{head}' to LAYERS in tests/test_import_graph.py and to "
                         f"the layer table of python/sparktrain/__init__.py")


def _where(module: str, target: str, line: int) -> str:
    path = _modules()[module].relative_to(PACKAGE.parents[1])
    return f"{module} -> {target} ({path}:{line})"


def test_every_module_has_a_layer():
    for module in import_graph():
        layer_of(module)


def test_no_cycle():
    graph = import_graph()
    cycles: List[List[str]] = []
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()

    def connect(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            connect(v)
    described = []
    for component in cycles:
        members = set(component)
        edges = [_where(m, t, line) for m in component for t, line in graph[m].items() if t in members]
        described.append(f"cycle among {', '.join(component)}: " + "; ".join(edges))
    assert not described, "\n".join(described)


def test_no_import_from_a_lower_layer_to_a_higher_one():
    graph = import_graph()
    upward = [f"{_where(m, t, line)}: layer {layer_of(m)} ({', '.join(LAYERS[layer_of(m)])}) imports layer "
              f"{layer_of(t)} ({', '.join(LAYERS[layer_of(t)])})"
              for m, targets in graph.items() for t, line in targets.items() if layer_of(t) > layer_of(m)]
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_the_demo_data_is_imported_only_by_the_job_and_the_cli():
    graph = import_graph()
    offenders = [_where(m, t, line) for m, targets in graph.items() for t, line in targets.items()
                 if t == "sparktrain.datasets" and m not in DATASETS_IMPORTERS]
    assert not offenders, "sparktrain.datasets imported outside job/cli:\n" + "\n".join(offenders)


def test_the_layers_are_the_package_docstrings():
    import sparktrain

    doc = sparktrain.__doc__ or ""
    head = "Layers, lowest first"
    assert head in doc, f"the package docstring lost its '{head}' table"
    block = doc[doc.index(head):].split("::", 1)[1]
    rows = []
    for line in block.splitlines()[1:]:
        if line.strip() and not line.startswith("    "):
            break
        if line.strip():
            rows.append(tuple(n.strip() for n in line.split(",")))
    assert rows == LAYERS, f"python/sparktrain/__init__.py lists {rows}, tests/test_import_graph.py {LAYERS}"


@pytest.mark.parametrize("source, expected", [
    ("from sparktrain.data import _fs", "sparktrain.data._fs"),
    ("from . import guard", "sparktrain.data.guard"),
    ("from ..errors import ConfigError", "sparktrain.errors"),
    ("import sparktrain.data.manifest as m", "sparktrain.data.manifest"),
    ("def f():\n    from sparktrain.config import load_config", "sparktrain.config"),
])
def test_the_graph_reads_every_kind_of_import(tmp_path, monkeypatch, source, expected):
    pkg = tmp_path / "sparktrain"
    (pkg / "data").mkdir(parents=True)
    for name in ("__init__.py", "errors.py", "config.py", "data/__init__.py", "data/_fs.py", "data/guard.py",
                 "data/manifest.py"):
        (pkg / name).write_text("")
    (pkg / "data" / "probe.py").write_text(source + "\n")
    monkeypatch.setitem(globals(), "PACKAGE", pkg)
    assert expected in import_graph()["sparktrain.data.probe"]
