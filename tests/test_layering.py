"""Imports point one way (ARCHITECTURE.md), and no two modules import each other.

Every top-level module and subpackage of ``gymllm`` has a rank (``ORDER``; equal ranks share a layer):

    errors, types, _lazy, atomic, validation -> telemetry, ray_support -> spaces -> core -> vector -> utils
    -> trajectories, multiagent, space_text -> wrappers, tools -> envs, registration -> models -> inference -> rollout -> suites -> algos -> train -> viewer -> cli

A module may import its own layer and the layers before it; a module missing from ``ORDER`` fails
(rank it). ``utils`` (the env and vector-env checkers) sits right after ``vector``, which its vector
checker uses. The package root (``gymllm/__init__.py``) is the facade and has no rank.

Checked on the source: module-level and function-level imports alike (so a lazy import that points
backwards fails here too), ``from gymllm import make`` and ``import gymllm; gymllm.make(...)`` as
imports of the module the root's lazy table names, and the module paths of ``__init__`` lazy tables
(``_LAZY``, ``ENV_MODULES``) as imports of those modules. The same import graph must have no cycle,
between files or between top-level modules (``registration`` <-> ``envs`` is one even though they share
a layer).

``KNOWN`` lists the violations found when the test first ranked every module, each with the fix to
make; they are skipped by the checks above, and listing one that no longer exists fails, so the
list only shrinks.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "gymllm"
ORDER: list[tuple[str, ...]] = [
    ("errors", "types", "_lazy", "atomic", "validation"),
    ("telemetry", "ray_support"),
    ("spaces",),
    ("core",),
    ("vector",),
    ("utils",),
    ("trajectories", "multiagent", "space_text"),
    ("wrappers", "tools"),
    ("envs", "registration"),
    ("models",),
    ("inference",),
    ("rollout",),
    ("suites",),
    ("algos",),
    ("train",),
    ("viewer",),
    ("cli",),
]
RANK = {name: i for i, layer in enumerate(ORDER) for name in layer}

# (importing file, imported module) -> why it is allowed for now, and the fix.
KNOWN: dict[tuple[str, str], str] = {}

LAZY_RELATIVE = re.compile(r"^\.[a-z_][a-z0-9_]*$")
MODULE_PATH = re.compile(r"^gymllm(\.[A-Za-z_][A-Za-z0-9_]*)+$")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


FILES = sorted(ROOT.rglob("*.py"))
MODULES = {_module_name(p): p for p in FILES}


def _root_names() -> dict[str, str]:
    """The root's lazy names: ``{"make": "gymllm.registration", ...}`` from its ``_LAZY`` table."""
    for node in ast.parse((ROOT / "__init__.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets
        ):
            return {k.value: v.value for k, v in zip(node.value.keys, node.value.values)}
    return {}


ROOT_NAMES = _root_names()


def _existing(module: str) -> str | None:
    """The module a dotted import path lands in: the longest prefix that is a gymllm file."""
    while module and module not in MODULES:
        module = module.rpartition(".")[0]
    return module or None


def _named(package: str, name: str) -> str:
    """What ``from package import name`` imports: a submodule, a root lazy name's module, or the package."""
    if f"{package}.{name}" in MODULES:
        return f"{package}.{name}"
    return ROOT_NAMES.get(name, package) if package == "gymllm" else package


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, gymllm module) for every import in ``path``, resolved to existing modules (itself excluded)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    bare_root = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                bare_root |= alias.name == "gymllm"
                if alias.name.startswith("gymllm."):
                    found.append((node.lineno, alias.name))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module == "gymllm" or module.startswith("gymllm."):
                found += [(node.lineno, _named(module, a.name)) for a in node.names]
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and path.name == "__init__.py"
            and MODULE_PATH.match(node.value)
        ):
            found.append((node.lineno, node.value))  # a lazy table's target
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and path.name == "__init__.py"
            and LAZY_RELATIVE.match(node.value)
        ):
            found.append((node.lineno, package + node.value))  # lazy_table's ".module" key
    if bare_root:  # import gymllm; gymllm.<name>
        found += [
            (n.lineno, _named("gymllm", n.attr))
            for n in ast.walk(tree)
            if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name)
            and n.value.id == "gymllm"
        ]
    return [(line, dep) for line, mod in found if (dep := _existing(mod)) and dep != me]


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None  # None: the package root


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT.parent))


def _graph() -> dict[str, set[str]]:
    """module -> the modules it imports, without the KNOWN edges."""
    return {m: {d for _, d in imports(p) if (_rel(p), d) not in KNOWN} for m, p in MODULES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_every_module_has_a_rank():
    layers = {_layer(m) for m in MODULES} - {None}
    missing = sorted(layers - set(RANK))
    assert not missing, (
        f"gymllm modules {missing} have no layer: expected every top-level module or subpackage "
        f"in tests/test_layering.py ORDER; add each where its imports put it"
    )


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_point_one_way(path):
    own = _layer(_module_name(path))
    if own is None:
        return  # the package root: a facade over every layer
    bad = [
        (line, mod)
        for line, mod in imports(path)
        if (dep := _layer(mod)) and RANK[dep] > RANK[own] and (_rel(path), mod) not in KNOWN
    ]
    order = " -> ".join(", ".join(layer) for layer in ORDER)
    assert not bad, (
        f"{_rel(path)} (layer {own!r}) imports later layers {bad}: expected imports to point "
        f"one way ({order}); move the shared code down a layer or the importer up"
    )


def test_no_import_cycles_between_files():
    cycles = _cycles(_graph())
    assert not cycles, (
        f"import cycles between modules: {cycles}; expected none (a lazy import hides a cycle "
        "only until both modules load): move what both need into a module below them"
    )


def test_no_import_cycles_between_top_level_modules():
    top: dict[str, set[str]] = defaultdict(set)
    for mod, deps in _graph().items():
        for dep in deps:
            a, b = _layer(mod), _layer(dep)
            if a and b and a != b:
                top[a].add(b)
    cycles = _cycles(dict(top))
    assert not cycles, (
        f"top-level modules importing each other: {cycles}; expected one direction between two "
        "modules of a layer too (e.g. envs -> registration, never back)"
    )


def test_known_violations_still_exist():
    present = {(_rel(p), dep) for p in FILES for _, dep in imports(p)}
    stale = sorted(set(KNOWN) - present)
    assert not stale, (
        f"KNOWN lists {stale}, which no longer occur: remove them from tests/test_layering.py KNOWN"
    )
