"""Imports point one way (ARCHITECTURE.md): core -> vector -> wrappers -> envs -> models ->
inference -> rollout -> algos -> cli. A module may import its own layer and the layers before it;
the shared leaves (errors, types, telemetry, utils, spaces...) are importable from anywhere.
Checked on the source (module-level and function-level imports alike), so a lazy import that
points backwards fails here too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "gymllm"
ORDER = ["vector", "wrappers", "tools", "envs", "models", "inference", "rollout", "algos", "cli"]
RANK = {name: i + 1 for i, name in enumerate(ORDER)}
RANK["tools"] = RANK["wrappers"]  # the tool layer belongs with the wrappers that run tools


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "gymllm" and parts[1] in RANK else None


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
    return out


def _lazy_targets(path: Path) -> list[tuple[int, str]]:
    """Module paths named as strings in a ``_LAZY = {...}`` table (lazy re-exports)."""
    tree = ast.parse(path.read_text())
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.startswith("gymllm.")]


FILES = sorted(p for p in ROOT.rglob("*.py"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_point_one_way(path):
    rel = path.relative_to(ROOT)
    own = _layer("gymllm." + ".".join(rel.with_suffix("").parts))
    if own is None:
        return  # shared leaves and the package root
    found = _imports(path) + (_lazy_targets(path) if path.name == "__init__.py" else [])
    bad = [(line, mod) for line, mod in found if (dep := _layer(mod)) and RANK[dep] > RANK[own]]
    assert not bad, (f"gymllm/{rel} (layer {own!r}) imports later layers {bad}: expected imports to point "
                     f"one way ({' -> '.join(ORDER)}); move the shared code down a layer or the importer up")
