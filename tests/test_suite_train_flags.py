"""`gymllm train --env.suite S` on the command line: a suite file (a .toml) is never taken for the
recipe, any preset works (its env id and kwargs give way to the suite), and --env.suite together with
--env.id or --env-kwargs is a clear error naming both flags. Parsing only: nothing trains."""

from __future__ import annotations

import pytest

from gymllm.cli.main import main
from gymllm.cli.train_args import leading_arguments, parse_train_args
from gymllm.errors import ConfigError


@pytest.fixture
def suite_file(tmp_path):
    path = tmp_path / "two.toml"
    path.write_text(
        'name = "two"\n[[env]]\nid = "gymllm/TinyRepeat-v0"\nname = "repeat"\n'
        '[[env]]\nid = "gymllm/Arithmetic-v0"\nname = "arith"\n'
    )
    return str(path)


def test_a_suite_file_is_not_the_recipe(suite_file):
    assert leading_arguments(["--preset", "tiny", "--env.suite", suite_file])["recipe"] is None
    cfg = parse_train_args(["--preset", "tiny", "--env.suite", suite_file])
    assert cfg.env.suite == suite_file and cfg.env.kwargs == {}


def test_any_preset_trains_on_a_suite():
    cfg = parse_train_args(["--env.suite", "core"])  # the default preset names an env with kwargs
    assert cfg.env.suite == "core" and cfg.env.kwargs == {}
    assert parse_train_args(["--preset", "tiny", "--env.suite=core"]).env.suite == "core"


@pytest.mark.parametrize(
    "flag,value", [("--env.id", "gymllm/Arithmetic-v0"), ("--env-kwargs", '{"digits": 1}')]
)
def test_suite_with_an_env_flag_is_a_clear_error(flag, value, tmp_path, capsys):
    with pytest.raises(ConfigError) as e:
        parse_train_args(["--preset", "tiny", "--env.suite", "core", flag, value])
    assert f"--env.suite S or {flag}, not both" in str(e.value) and f"drop {flag}" in str(e.value)
    assert (
        main(
            [
                "train",
                "--preset",
                "tiny",
                "--run-dir",
                str(tmp_path / "r"),
                "--env.suite",
                "core",
                flag,
                value,
            ]
        )
        == 2
    )
    assert "not both" in capsys.readouterr().err


def test_eval_suite_evaluates_a_suites_envs(suite_file):
    """--eval.suite S: the in-loop evaluator's envs are the suite's, with their tables' kwargs and
    agents (built here without an engine); with --eval.envs too it is a clear error."""
    from gymllm.train.heldout import HeldOutHook

    cfg = parse_train_args(["--preset", "tiny", "--eval.suite", suite_file, "--eval.every", "1"])
    hook = HeldOutHook(cfg)
    hook.open(agent="the run's agent", tok=None)
    try:
        from gymllm.rollout import ModelAgent

        # each env played by the agent its table (else its reset) asks for: a model agent for these two
        assert [i for i, _, _ in hook.evaluator.specs] == [
            "gymllm/TinyRepeat-v0",
            "gymllm/Arithmetic-v0",
        ]
        assert all(isinstance(a, ModelAgent) for _, _, a in hook.evaluator.specs)
    finally:
        hook.close()
    from gymllm.train.train_config import EvalSection

    with pytest.raises(ConfigError, match="--eval.envs or --eval.suite, not both"):
        EvalSection(suite=suite_file, envs=("gymllm/Arithmetic-v0",))
