"""The documentation site: its tutorials' code runs as written, and it builds with ``mkdocs build --strict``.

Every fenced ``python`` block of a page under ``docs/`` runs, the blocks of one page in order in one
fresh interpreter (a page reads like a notebook: later blocks use earlier names), in a temporary
working directory. A block that cannot run here (it needs a Ray cluster, ...) is marked on the
line before its fence with ``<!-- docs-test: skip (the reason) -->``, which the rendered page does
not show. ``bash`` blocks are not run. The tutorials use the tiny model and few steps, so the whole
module stays near a minute of CPU time on two cores.

The site build (mkdocs-material, an API reference from the docstrings through mkdocstrings) runs
with ``--strict``, so a broken link or cross-reference in a page or a docstring fails it; the
docstrings' Sphinx roles become cross-references (``docs/hooks/griffe_sphinx_roles.py``). It is
skipped only when the ``docs`` extra (mkdocs, mkdocs-material, mkdocstrings[python]) is absent.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

import gymllm

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MKDOCS_YML = ROOT / "mkdocs.yml"
TUTORIALS = ("train-default", "bring-your-env", "custom-algorithm", "cluster")
# the pages that took what the README held before it became a front page
GUIDES = ("commands", "recipes", "sft", "scale-out", "network", "design", "bad-input", "benchmarks")
SKIP = re.compile(r"^<!--\s*docs-test:\s*skip\s*\((?P<reason>[^)]+)\)\s*-->$")
PAGE_TIMEOUT_S = 300  # per page; the slowest (two tiny training steps) takes ~25 s of CPU


@dataclasses.dataclass(frozen=True, kw_only=True)
class Block:
    """One fenced code block: its language, first code line (1-based), code and skip reason (or None)."""

    lang: str
    line: int
    code: str
    skip: str | None


def blocks(text: str) -> list[Block]:
    """The fenced code blocks of a Markdown page, in order."""
    lines = text.splitlines()
    out, i = [], 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        start, j = i + 1, i + 1
        while j < len(lines) and lines[j] != "```":
            j += 1
        assert j < len(lines), f"a code fence opened at line {i + 1} is never closed"
        prev = next((lines[k].strip() for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        skip = SKIP.match(prev)
        out.append(
            Block(
                lang=m.group(1),
                line=start + 1,
                code="\n".join(lines[start:j]),
                skip=skip.group("reason") if skip else None,
            )
        )
        i = j + 1
    return out


def script(page: pathlib.Path) -> str:
    """The page's runnable python blocks as one script (each block keeps its page line numbers)."""
    parts, at = [], 1
    for b in blocks(page.read_text()):
        if b.lang == "python" and b.skip is None:
            parts.append(
                "\n" * (b.line - at) + b.code
            )  # pad so tracebacks give the page's line numbers
            at = b.line + b.code.count("\n")
    return "".join(parts)


PAGES = sorted(DOCS.rglob("*.md"))
RUNNABLE = [p for p in PAGES if script(p).strip()]


def test_four_tutorials_are_in_the_nav_and_run_code():
    nav = MKDOCS_YML.read_text()
    for name in TUTORIALS:
        page = DOCS / "tutorials" / f"{name}.md"
        assert page.exists() and f"tutorials/{name}.md" in nav, (
            f"tutorial {name} missing from docs/ or the nav"
        )
        assert page in RUNNABLE, f"{page.name} has no python block the test runs"
    cluster = blocks((DOCS / "tutorials" / "cluster.md").read_text())
    assert any(b.skip and "cluster" in b.skip for b in cluster), (
        "the cluster-only blocks must be marked to skip"
    )


def test_guides_are_in_the_nav_and_their_server_blocks_are_marked():
    nav = MKDOCS_YML.read_text()
    for name in GUIDES:
        assert (DOCS / f"{name}.md").exists() and f": {name}.md" in nav, (
            f"docs/{name}.md missing or not in the nav"
        )
    network = blocks((DOCS / "network.md").read_text())
    assert [b.skip for b in network if b.lang == "python"] == [
        "needs a running gymllm serve-env server"
    ]
    benchmarks = (DOCS / "benchmarks.md").read_text()
    assert (
        "<!-- BEGIN GENERATED: peers" in benchmarks
        and "<!-- END GENERATED: peers -->" in benchmarks
    )


def test_reference_has_a_page_for_every_subpackage():
    nav = MKDOCS_YML.read_text()
    for name in gymllm.SUBMODULES:
        page = DOCS / "reference" / f"{name}.md"
        assert page.exists() and f"::: gymllm.{name}" in page.read_text(), (
            f"docs/reference/{name}.md: add ::: gymllm.{name}"
        )
        assert f"reference/{name}.md" in nav, f"mkdocs.yml's nav lacks reference/{name}.md"


def test_block_parser_reads_languages_lines_and_skip_marks():
    page = "intro\n\n```python\nx = 1\n```\n\n<!-- docs-test: skip (needs a Ray cluster) -->\n```python\nboom\n```\n```bash\nls\n```\n"
    got = blocks(page)
    assert [(b.lang, b.line, b.code, b.skip) for b in got] == [
        ("python", 4, "x = 1", None),
        ("python", 9, "boom", "needs a Ray cluster"),
        ("bash", 12, "ls", None),
    ]


@pytest.mark.parametrize("page", RUNNABLE, ids=lambda p: str(p.relative_to(DOCS)))
def test_page_code_runs(page, tmp_path):
    path = tmp_path / page.name.replace(".md", ".py")
    path.write_text(script(page))
    env = {
        **os.environ,
        "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu"),
        "PYTHONPATH": str(ROOT),
    }
    out = subprocess.run(
        [sys.executable, str(path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=PAGE_TIMEOUT_S,
    )
    assert out.returncode == 0, (
        f"docs/{page.relative_to(DOCS)}: its python blocks failed (line numbers are the "
        f"page's):\n{out.stderr[-4000:]}"
    )


def _missing_docs_package() -> str | None:
    for module, package in (
        ("mkdocs", "mkdocs"),
        ("material", "mkdocs-material"),
        ("mkdocstrings", "mkdocstrings"),
        ("mkdocstrings_handlers.python", "mkdocstrings-python"),
    ):
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            return package
    return None


def test_site_builds_strict_with_the_api_reference(tmp_path):
    missing = _missing_docs_package()
    if missing:
        pytest.skip(f"{missing} is not installed (pip install -e '.[docs]')")
    site = tmp_path / "site"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "-f",
            str(MKDOCS_YML),
            "-d",
            str(site),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=PAGE_TIMEOUT_S,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert out.returncode == 0, f"mkdocs build --strict failed:\n{out.stderr[-4000:]}"
    vector = (site / "reference" / "vector" / "index.html").read_text()
    assert (
        "gymllm.vector.vector_env.VectorEnv" in vector and "send" in vector
    )  # rendered from the docstrings
    core = (site / "reference" / "core" / "index.html").read_text()
    # docstrings' Sphinx roles became links (docs/hooks/griffe_sphinx_roles.py), none is left raw
    assert 'href="../errors/#gymllm.errors.InvalidActionError"' in core
    raw = {
        p.parent.name: re.findall(r":(?:class|func|meth|mod|attr|data|exc):`", p.read_text())
        for p in (site / "reference").glob("*/index.html")
    }
    assert not any(raw.values()), {k: len(v) for k, v in raw.items() if v}
    for name in TUTORIALS:
        assert (site / "tutorials" / name / "index.html").exists()
    for name in GUIDES:
        assert (site / name / "index.html").exists()
    bench = (site / "benchmarks" / "index.html").read_text()
    assert (
        "<table>" in bench and "barrier_free_vs_gym_async" in bench and "BEGIN GENERATED" in bench
    )
    assert "&lt;!-- BEGIN GENERATED" not in bench  # the markers are comments, never shown
    cluster = (site / "tutorials" / "cluster" / "index.html").read_text()
    assert (
        "<!-- docs-test: skip" in cluster and "&lt;!-- docs-test" not in cluster
    )  # a comment, never shown
