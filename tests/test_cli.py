"""The gymllm command: help, one-line errors with hints, recipes, and the commands that need no model."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap

import pytest

from gymllm.cli.main import COMMANDS, main
from gymllm.cli.recipes import find_recipe
from gymllm.validation import apply_overrides
from gymllm.errors import ConfigError


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gymllm.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_help_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert f"  {name} " in out


@pytest.mark.parametrize("name", sorted(set(COMMANDS) - {"train"}))
def test_every_subcommand_has_useful_help(name, capsys):
    assert main([name, "--help"]) == 0
    out = capsys.readouterr().out
    assert f"gymllm {name}" in out
    first_doc_line = COMMANDS[name].__doc__.strip().splitlines()[0]
    assert first_doc_line[:40] in " ".join(out.split())


def test_unknown_command_is_one_line_plus_hint():
    proc = run_cli("trian")
    assert proc.returncode == 2
    err = proc.stderr.strip().splitlines()
    assert err[0].startswith("error: unknown command 'trian'") and err[1].startswith("hint:")
    assert "Traceback" not in proc.stderr


def test_unknown_env_id_is_one_line_plus_hint():
    proc = run_cli("check", "gymllm/NoSuchEnv-v0")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith("error:") and "NoSuchEnv" in lines[0]
    assert lines[-1].startswith("hint:") and "gymllm envs" in lines[-1]


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Inner:
    lr: float = 1e-3
    shape: tuple[int, ...] = (1, 2)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Outer:
    name: str = "x"
    inner: _Inner = dataclasses.field(default_factory=_Inner)


def test_recipe_overrides_apply_recursively_and_coerce():
    cfg = apply_overrides(_Outer(), {"name": "y", "inner": {"lr": 1, "shape": [3, 4]}})
    assert cfg == _Outer(name="y", inner=_Inner(lr=1.0, shape=(3, 4)))
    assert isinstance(cfg.inner.lr, float)


def test_bad_recipe_key_names_key_and_allowed_values():
    with pytest.raises(ConfigError) as e:
        apply_overrides(_Outer(), {"inner": {"learning_rate": 1.0}})
    msg = str(e.value)
    assert "inner.learning_rate" in msg and "'lr'" in msg and "'shape'" in msg


def test_missing_recipe_is_a_clear_error():
    with pytest.raises(ConfigError, match="not found"):
        find_recipe("no_such_recipe_anywhere")


def test_bench_runs_scripts_and_prints_their_results(tmp_path, capsys):
    (tmp_path / "fake.py").write_text(
        textwrap.dedent(
            """
            import json, sys
            assert "--quick" in sys.argv
            print("RESULT " + json.dumps({"ratio": 2.5}))
            """
        )
    )
    assert main(["bench", "--benchmarks-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "fake" in out and '"ratio": 2.5' in out


def test_train_tiny_preset_end_to_end_through_the_cli(tmp_path):
    """`gymllm train --preset tiny --run-dir DIR` leaves metrics, a Perfetto trace and PNG plots."""
    import json

    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gymllm.cli.main",
            "train",
            "--preset",
            "tiny",
            "--run-dir",
            str(run_dir),
            "--learner.num-steps",
            "4",
            "--run.no-console",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert all(0.0 <= r["reward_mean"] <= 1.0 for r in records)
    trace = json.loads((run_dir / "trace.json").read_text())
    spans = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    assert {"train_step", "generate"} <= {e["name"] for e in spans}
    assert all(e["dur"] >= 0 for e in spans)
    assert list(run_dir.glob("*.png")), "expected a reward-curve PNG"
    assert "trained 4 steps" in proc.stdout
