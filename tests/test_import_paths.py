"""One import path per name: ``from X import name`` imports ``name`` from the module that defines it.

A module *defines* a name when its own source binds it at module level by ``def``, ``class`` or an
assignment (``=``, ``:=``, annotated, augmented, ``for``/``with`` targets, ``global`` in a function), or
when ``name`` is a submodule of the package ``X``. A name a module only imports is not its own, so
``from X import name`` there is a re-export and fails here, naming the importing file and line, the
name and the module that defines it (the fix: import it from there).

The one exception is the public entry points (``PUBLIC_ENTRY_POINTS``, listed in ARCHITECTURE.md):
the package root (``gymllm.make``, ``make_vec``, ``register``, ``TextEnv``) and the subpackage
``__init__`` files whose only job is to present that subpackage's documented public API (each has
an API reference page, docs/reference/). Only these may re-export, and every name they present must
exist where their table says (tests/test_public_surface.py).

Checked: every ``from X import ...`` in gymllm/, tests/, benchmarks/, examples/ and scripts/ whose
``X`` is a file of this repository (a ``gymllm`` module, or a sibling module of the importing file, as
``from accel import tolerance`` in tests/ or ``from results import emit_result`` in benchmarks/),
at module level or inside functions alike.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCANNED = ("gymllm", "tests", "benchmarks", "examples", "scripts")

# The only modules that may re-export a name they do not define (ARCHITECTURE.md, "Public entry points").
PUBLIC_ENTRY_POINTS: frozenset[str] = frozenset(
    {
        "gymllm",
        "gymllm.algos",
        "gymllm.envs",
        "gymllm.inference",
        "gymllm.models",
        "gymllm.multiagent",
        "gymllm.rollout",
        "gymllm.suites",
        "gymllm.telemetry",
        "gymllm.tools",
        "gymllm.trajectories",
        "gymllm.utils",
        "gymllm.vector",
        "gymllm.viewer",
        "gymllm.wrappers",
    }
)


def _files() -> list[Path]:
    return sorted(p for top in SCANNED for p in (REPO / top).rglob("*.py"))


def _module_of(path: Path) -> str:
    """The dotted name ``path`` is imported as: ``gymllm.x.y`` for the package, else relative to its
    directory (tests/ and benchmarks/ put their own directory on ``sys.path``)."""
    rel = path.relative_to(REPO)
    parts = list(rel.with_suffix("").parts)
    if parts[0] != "gymllm":
        parts = parts[1:]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _locate(module: str, importer: Path) -> Path | None:
    """The repository file ``module`` names, seen from ``importer``; None for anything else."""
    parts = module.split(".")
    roots = (
        [REPO]
        if parts[0] == "gymllm"
        else [importer.parent, REPO / importer.relative_to(REPO).parts[0]]
    )
    for root in roots:
        base = root.joinpath(*parts)
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def _targets(node: ast.AST) -> set[str]:
    """The names an assignment target binds (``a``, ``a, b``, ``*rest``)."""
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


@cache
def defined_names(path: Path) -> frozenset[str]:
    """The names ``path``'s module binds itself (never through an import)."""
    names: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
                for inner in ast.walk(node):  # `global x` in a function binds module-level x
                    if isinstance(inner, ast.Global):
                        names.update(inner.names)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    names.update(_targets(target))
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                names.update(_targets(node.target))
            elif isinstance(node, (ast.For, ast.AsyncFor)):
                names.update(_targets(node.target))
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                for item in node.items:
                    if item.optional_vars is not None:
                        names.update(_targets(item.optional_vars))
                visit(node.body)
            elif isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)
            if isinstance(
                node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Expr, ast.If, ast.Return)
            ):
                for inner in ast.walk(node):
                    if isinstance(inner, ast.NamedExpr):
                        names.update(_targets(inner.target))

    visit(ast.parse(path.read_text(), filename=str(path)).body)
    return frozenset(names)


def _definer(name: str, path: Path, seen: frozenset[Path] = frozenset()) -> str | None:
    """Where the import chain of ``name`` in ``path`` ends: ``module`` or ``module.real_name`` when the
    chain renames it (``import x as name``); None when ``path`` does not import it."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any(
            (a.asname or a.name) == name for a in node.names
        ):
            alias = next(a for a in node.names if (a.asname or a.name) == name)
            source = _resolve(node, path)
            here = source if alias.name == name else f"{source}.{alias.name}"
            found = _locate(source, path) if source else None
            if found is None or found in seen or alias.name in defined_names(found):
                return here
            return _definer(alias.name, found, seen | {path}) or here
    return None


def _resolve(node: ast.ImportFrom, path: Path) -> str:
    """The absolute module ``from X import ...`` names (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    package = _module_of(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _import_nodes(tree: ast.Module) -> list[ast.ImportFrom]:
    """Every ``from X import ...`` in ``tree``, and in the Python source its string constants hold (the
    code a test hands to ``python -c``); a string's imports carry the line of the string."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            found.append(node)
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and "import" in node.value
        ):
            try:
                inner = ast.parse(node.value)
            except (SyntaxError, ValueError):
                continue
            for imp in ast.walk(inner):
                if isinstance(imp, ast.ImportFrom):
                    imp.lineno = node.lineno
                    found.append(imp)
    return found


def reexports(path: Path) -> list[str]:
    """One line per name ``path`` imports from a repository module that does not define it."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in _import_nodes(tree):
        module = _resolve(node, path)
        if module in PUBLIC_ENTRY_POINTS or module == "__future__":
            continue
        source = _locate(module, path)
        if source is None:
            continue  # not a file of this repository
        for alias in node.names:
            if alias.name == "*":
                out.append(
                    f"{path.relative_to(REPO)}:{node.lineno}: `from {module} import *` (name each import)"
                )
                continue
            if alias.name in defined_names(source):
                continue
            if source.name == "__init__.py" and _locate(f"{module}.{alias.name}", path) is not None:
                continue  # a submodule of the package
            home = _definer(alias.name, source) or "no module it imports from"
            out.append(
                f"{path.relative_to(REPO)}:{node.lineno}: `{alias.name}` from {module}, which does not "
                f"define it (defined in {home}): import it from there"
            )
    return out


def _module_aliases(tree: ast.Module, path: Path) -> dict[str, tuple[str, Path]]:
    """Local names bound to repository modules: ``import a.b as m``, ``from a import b`` (b a module)."""
    out: dict[str, tuple[str, Path]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and (found := _locate(alias.name, path)) is not None:
                    out[alias.asname] = (alias.name, found)
        elif isinstance(node, ast.ImportFrom):
            module = _resolve(node, path)
            for alias in node.names:
                if (found := _locate(f"{module}.{alias.name}", path)) is not None:
                    out[alias.asname or alias.name] = (f"{module}.{alias.name}", found)
    return out


def attribute_reexports(path: Path) -> list[str]:
    """One line per ``module.name`` read through a module alias where the module does not define it."""
    tree = ast.parse(path.read_text(), filename=str(path))
    aliases = _module_aliases(tree, path)
    out = []
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
        ):
            continue
        module, source = aliases[node.value.id]
        if (
            module in PUBLIC_ENTRY_POINTS
            or node.attr in defined_names(source)
            or node.attr.startswith("__")
        ):
            continue
        if source.name == "__init__.py" and _locate(f"{module}.{node.attr}", path) is not None:
            continue
        home = _definer(node.attr, source) or "no module it imports from"
        out.append(
            f"{path.relative_to(REPO)}:{node.lineno}: `{node.value.id}.{node.attr}` reads {node.attr} through "
            f"{module}, which does not define it (defined in {home}): import it from there"
        )
    return out


def foreign_all(path: Path) -> list[str]:
    """The names ``path``'s ``__all__`` lists that the module does not define (re-exports)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    listed: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            listed = [
                e.value
                for e in ast.walk(node.value)
                if isinstance(e, ast.Constant) and isinstance(e.value, str)
            ]
    return [name for name in listed if name not in defined_names(path)]


FILES = _files()


def test_the_scan_sees_the_tree():
    assert len(FILES) > 300, (
        f"expected the repository's Python files under {SCANNED}, found {len(FILES)}"
    )
    assert "TrainConfig" in defined_names(REPO / "gymllm/train/train_config.py")


def test_the_check_finds_a_reexport(tmp_path):
    """The check fails on a planted re-export and passes the direct import and a submodule."""
    pkg = tmp_path / "tests"
    pkg.mkdir()
    (pkg / "home.py").write_text("VALUE = 1\n\ndef f():\n    pass\n")
    (pkg / "relay.py").write_text("from home import VALUE, f\n")
    (pkg / "user.py").write_text("from relay import VALUE\nfrom home import f\n")
    global REPO
    saved, REPO = REPO, tmp_path
    try:
        defined_names.cache_clear()
        found = reexports(pkg / "user.py")
    finally:
        REPO = saved
        defined_names.cache_clear()
    assert len(found) == 1 and "`VALUE` from relay" in found[0] and "defined in home" in found[0], (
        found
    )


@pytest.mark.parametrize("top", SCANNED)
def test_names_are_imported_from_where_they_are_defined(top):
    found = [
        line
        for path in FILES
        if path.relative_to(REPO).parts[0] == top
        for line in reexports(path) + attribute_reexports(path)
    ]
    assert not found, (
        f"{len(found)} imports in {top}/ take a name from a module that does not define it; "
        f"expected each name imported from its defining module (or a public entry point "
        f"listed in tests/test_import_paths.py PUBLIC_ENTRY_POINTS):\n" + "\n".join(found)
    )


def test_only_entry_points_list_foreign_names_in_all():
    modules = [
        p
        for p in FILES
        if p.parts[len(REPO.parts)] == "gymllm" and _module_of(p) not in PUBLIC_ENTRY_POINTS
    ]
    found = [f"{p.relative_to(REPO)}: {names}" for p in modules if (names := foreign_all(p))]
    assert not found, (
        "modules that are not public entry points list names they do not define in __all__; "
        "expected __all__ to hold the module's own names (drop the re-export, import the name "
        "from its home):\n" + "\n".join(found)
    )


def lazy_table(path: Path) -> dict[str, str]:
    """An entry point's ``_LAZY`` table: public name -> the module it is imported from on first use.
    The table is a dict literal or a ``lazy_table(__name__, {".module": ("Name", ...)})`` call."""
    package = ".".join(path.relative_to(REPO).parent.parts)
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        target = (
            node.target
            if isinstance(node, ast.AnnAssign)
            else (node.targets[0] if isinstance(node, ast.Assign) else None)
        )
        if not (isinstance(target, ast.Name) and target.id == "_LAZY"):
            continue
        if isinstance(node.value, ast.Dict):
            return {
                k.value: v.value
                for k, v in zip(node.value.keys, node.value.values)
                if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)
            }
        if isinstance(node.value, ast.Call) and isinstance(node.value.args[1], ast.Dict):
            groups = node.value.args[1]
            return {
                name.value: (package + k.value if k.value.startswith(".") else k.value)
                for k, v in zip(groups.keys, groups.values)
                for name in v.elts
            }
    return {}


def test_entry_point_tables_name_the_defining_module():
    """Each lazy table points at the module that defines the name, not at another re-export."""
    found = []
    for package in sorted(PUBLIC_ENTRY_POINTS):
        init = _locate(package, REPO / "gymllm" / "__init__.py")
        for name, module in lazy_table(init).items():
            source = _locate(module, init)
            if source is None or name not in defined_names(source):
                home = (_definer(name, source) if source else None) or "no module it imports from"
                found.append(
                    f"{init.relative_to(REPO)}: {name!r} -> {module}, which does not define it "
                    f"(defined in {home})"
                )
    assert not found, (
        "entry-point tables name modules that do not define the name; expected each to name its "
        "defining module:\n" + "\n".join(found)
    )
