"""benchmarks/learner_replay.py: a run's recorded steps replayed through its own learner and through a variant
of its learner settings, side by side; both train on the same rows, so their weights agree."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

from gymllm.cli.main import main as gymllm_main
from gymllm.errors import ConfigError
from gymllm.train.train_config import TrainConfig, from_tables

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import learner_replay  # noqa: E402


def test_a_variant_reads_as_sections_and_toml_values():
    name, tables = learner_replay.parse_variant(
        "wide:learner.prefix_len=256, learner.micro_batch_size=8,loss.kl.beta=0.1"
    )
    assert name == "wide"
    assert tables == {
        "learner": {"prefix_len": 256, "micro_batch_size": 8},
        "loss": {"kl": {"beta": 0.1}},
    }
    # what the benchmark builds from it
    cfg = from_tables(tables, TrainConfig(), where="--variant wide")
    assert (cfg.learner.prefix_len, cfg.learner.micro_batch_size, cfg.loss.kl.beta) == (256, 8, 0.1)


@pytest.mark.parametrize(
    "text, what",
    [
        ("learner.prefix_len=256", "NAME:SECTION.KEY=VALUE"),
        ("run:learner.prefix_len=256", "NAME:SECTION.KEY=VALUE"),  # the run's own side
        ("v:prefix_len=256", "SECTION.KEY=VALUE"),
    ],
)
def test_a_malformed_variant_says_what_was_expected(text, what):
    with pytest.raises(ConfigError, match=f"expected {what}"):
        learner_replay.parse_variant(text)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run = tmp_path_factory.mktemp("replay") / "run"
    argv = ["train", "--preset", "tiny", "--run-dir", str(run), "--learner.num-steps", "2"]
    assert gymllm_main([*argv, "--run.no-console", "--run.no-report"]) == 0
    return run


def test_the_recorded_steps_are_the_trained_groups(run_dir):
    steps = learner_replay.recorded_steps(run_dir)
    config = json.loads((run_dir / "config.json").read_text())
    assert len(steps) == 2
    for groups in steps:
        assert len(groups) == config["learner"]["groups_per_step"]
        assert {len(g.trajectories) for g in groups} == {config["rollout"]["group_size"]}
        for g in groups:
            assert {t.group_id for t in g.trajectories} == {g.group_id}
    moved = learner_replay.at_version(steps[0], 7)
    t = moved[0].trajectories[0]
    assert moved[0].admitted_version == 7
    assert set(t.versions[t.loss_mask > 0]) == {7} and set(t.versions[t.loss_mask == 0]) <= {-1}


def test_the_run_and_a_variant_train_alike_and_are_timed_side_by_side(run_dir, monkeypatch, capsys):
    monkeypatch.setenv("GYMLLM_BENCH_RECORDS", str(run_dir.parent / "records"))
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "learner_replay.py",
            "--run",
            str(run_dir),
            "--quick",
            "--variant",
            "half:learner.micro_batch_size=16",
        ],
    )
    learner_replay.main()
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("RESULT ")][-1]
    result = json.loads(line[len("RESULT ") :])
    assert result["run_dir"] == str(run_dir)
    assert result["steps"] == 2 and result["rows"] == [32, 32]  # tiny: 4 groups of 8 a step
    run, half = result["run"], result["half"]
    assert result["speedup_half"] == half["speedup"] == run["median_step_s"] / half["median_step_s"]
    assert result["median_step_s_run"] == run["median_step_s"]
    assert run["learner"]["micro_batch_size"] == 32 and half["learner"]["micro_batch_size"] == 16
    assert len(run["step_s"]) == len(half["step_s"]) == 2
    assert (
        run["counts"]["shared_prefix_passes"] == 2 and half["counts"]["shared_prefix_passes"] == 4
    )
    assert run["max_weight_diff_vs_run"] == 0.0 and result["max_weight_change_run"] > 1e-3
    assert half["max_weight_diff_vs_run"] < 0.01 * result["max_weight_change_run"]
    assert half["loss"] == pytest.approx(run["loss"], rel=1e-4, abs=1e-6)
    assert (run_dir.parent / "records" / "learner_replay.jsonl").exists()
