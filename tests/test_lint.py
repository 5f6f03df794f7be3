"""The tree passes ``ruff check`` and ``ruff format --check`` with the project's configuration
(pyproject.toml ``[tool.ruff]``).

The rules: pycodestyle's import, statement and syntax errors (E4, E7, E9) and pyflakes (F), line
length 100, Python 3.11. Fix a finding (``ruff check --fix`` applies the safe ones), or, where the code
is right, say why on the line with ``# noqa: CODE``.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PATHS = ("gymllm", "tests", "benchmarks", "examples", "scripts")
CONFIG = REPO / "pyproject.toml"

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("ruff") is None,
    reason="ruff is not installed (pip install -e '.[test]')",
)


def ruff(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--config", str(CONFIG), "--no-cache"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_tree_passes_ruff_check():
    done = ruff("check", "--output-format", "concise", *PATHS)
    assert done.returncode == 0, (
        f"ruff check found problems in {', '.join(PATHS)} (expected none):\n"
        f"{done.stdout}{done.stderr}\nfix them, `ruff check --fix` applies the safe "
        "fixes, or mark a deliberate case with `# noqa: CODE` and the reason"
    )


def test_the_tree_is_formatted():
    done = ruff("format", "--check", *PATHS)
    assert done.returncode == 0, (
        f"ruff format --check: files not formatted (expected every file formatted):\n"
        f"{done.stdout}{done.stderr}\nfix: ruff format {' '.join(PATHS)}"
    )


def test_ruff_format_check_fails_on_an_unformatted_file(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("x = { 'a':1 }\n")
    done = ruff("format", "--check", str(bad), cwd=tmp_path)
    assert done.returncode == 1 and "bad.py" in done.stdout + done.stderr, done.stdout + done.stderr


def test_ruff_check_fails_on_a_finding(tmp_path):
    """The check can fail: an unused import and a name that is never defined are findings."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n\n\ndef f():\n    return undefined_name\n")
    done = ruff("check", "--output-format", "concise", str(bad), cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "F401" in done.stdout and "F821" in done.stdout, done.stdout


def test_the_configuration_is_the_documented_one():
    ruff_cfg = tomllib.loads(CONFIG.read_text())["tool"]["ruff"]
    assert ruff_cfg["line-length"] == 100 and ruff_cfg["target-version"] == "py311", ruff_cfg
    assert {"E4", "E7", "E9", "F"} <= set(ruff_cfg["lint"]["select"]), ruff_cfg["lint"]
    assert "format" in ruff_cfg, (
        "expected a [tool.ruff.format] table, so `ruff format` formats the tree one way"
    )
