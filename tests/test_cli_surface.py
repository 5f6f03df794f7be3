"""`gymllm train`'s whole command line goes through tyro: malformed commands get tyro's usage error
(exit 2, no traceback), every form that worked before still parses to the same config."""

import subprocess
import sys

import pytest

from gymllm.train.train_config import preset
from gymllm.cli.train_args import parse_train_args, train_config_from
from gymllm.cli.main import main
from gymllm.cli.recipes import RECIPES_DIR, load_recipe
from gymllm.validation import apply_overrides


def _usage_error(args, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        parse_train_args(args)
    assert e.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    "args,words",
    [
        (["--run-dir"], ["--run-dir", "Expected 1"]),
        (["--preset"], ["--preset"]),
        (["--loss-preset"], ["--loss-preset"]),
        (["--preset", "huge"], ["'huge'", "tiny"]),
        (["--loss-preset", "ppo"], ["'ppo'", "dapo"]),
        (["--learner.num-steps", "many"], ["num-steps"]),
        (["--no-such.flag", "1"], ["--no-such.flag"]),
        (["arithmetic_tiny", "extra_positional"], ["extra_positional"]),
    ],
)
def test_malformed_commands_get_tyros_usage_error(args, words, capsys):
    err = _usage_error(args, capsys)
    assert "Traceback" not in err
    for w in words:
        assert w in err, (w, err)


def test_main_returns_2_for_a_usage_error_and_prints_no_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "gymllm.cli.main", "train", "--run-dir"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "IndexError" not in proc.stderr
    assert "--run-dir" in proc.stderr


def test_preset_equals_form_is_accepted(tmp_path):
    a = parse_train_args(["--preset=tiny", f"--run-dir={tmp_path}"])
    b = parse_train_args(["--preset", "tiny", "--run-dir", str(tmp_path)])
    assert a == b == apply_overrides(preset("tiny"), {"run": {"run_dir": str(tmp_path)}})


def test_preset_run_dir_and_section_flags(tmp_path):
    cfg = parse_train_args(
        [
            "--preset",
            "tiny",
            "--run-dir",
            str(tmp_path),
            "--learner.num-steps",
            "3",
            "--run.no-console",
            "--loss-preset",
            "gspo",
        ]
    )
    ref = apply_overrides(
        preset("tiny").with_loss("gspo"),
        {"run": {"run_dir": str(tmp_path), "console": False}, "learner": {"num_steps": 3}},
    )
    assert cfg == ref


def test_recipe_then_flags_override_the_recipe():
    cfg = parse_train_args(["arithmetic_tiny", "--learner.num-steps", "10"])
    recipe = load_recipe("arithmetic_tiny")
    assert cfg.learner.num_steps == 10 != recipe["learner"]["num_steps"]
    assert cfg.env.id == recipe["env"]["id"] and cfg.env.num_envs == recipe["env"]["num_envs"]
    assert cfg == apply_overrides(
        train_config_from("arithmetic_tiny", None, None, None), {"learner": {"num_steps": 10}}
    )
    # the recipe's own presets apply, and the flags win over them
    assert cfg.loss == preset("tiny").with_loss("dapo").loss
    assert (
        parse_train_args(["arithmetic_tiny", "--loss-preset", "grpo"]).loss
        == preset("tiny").with_loss("grpo").loss
    )


def test_a_recipe_given_by_path_and_flags_in_any_order(tmp_path):
    own = tmp_path / "mine.toml"
    own.write_text('preset = "tiny"\n[learner]\nnum_steps = 5\n')
    a = parse_train_args(["--optimizer.learning-rate", "0.5", str(own)])
    b = parse_train_args([str(own), "--run.seed", "7"])
    assert a.learner.num_steps == 5 and a.optimizer.learning_rate == 0.5
    assert b.learner.num_steps == 5 and b.run.seed == 7


def test_first_parse_does_not_check_the_config_on_defaults_the_recipe_replaces():
    """arithmetic_tiny has 32 envs; the default preset fewer: a group of 16 is valid only with the recipe."""
    default_envs = preset("default").env.num_envs
    group = load_recipe("arithmetic_tiny")["env"]["num_envs"] // 2
    assert group > default_envs, "pick a group size the default preset's envs cannot hold"
    cfg = parse_train_args(["arithmetic_tiny", "--rollout.group-size", str(group)])
    assert cfg.rollout.group_size == group


def test_help_shows_the_recipes_defaults(capsys):
    with pytest.raises(SystemExit) as e:
        parse_train_args(["arithmetic_tiny", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "runs/arithmetic_tiny" in out and "--loss-preset" in out


def test_recipes_ship_as_package_data():
    assert RECIPES_DIR.parent.name == "gymllm" and (RECIPES_DIR / "arithmetic_tiny.toml").is_file()
    with pytest.raises(Exception, match="shipped in"):
        parse_train_args(["no_such_recipe"])


def test_bench_without_benchmarks_says_where_they_live(tmp_path, monkeypatch, capsys):
    from gymllm.cli import commands

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(commands, "SOURCE_BENCHMARKS_DIR", tmp_path / "absent")
    assert main(["bench"]) == 2
    err = capsys.readouterr().err
    assert "not package data" in err and "--benchmarks-dir" in err
    assert main(["bench", "--benchmarks-dir", str(tmp_path / "nope")]) == 2


def test_env_kwargs_json_replaces_the_presets_for_another_env():
    """`gymllm train --env.id X --env-kwargs JSON`: env X's own kwargs from the command line (the preset's
    TinyRepeat kwargs, which X would reject, are replaced, not merged)."""
    cfg = parse_train_args(
        ["--preset", "tiny", "--env.id", "gymllm/Arithmetic-v0", "--env-kwargs", '{"digits": 2}']
    )
    assert cfg.env.id == "gymllm/Arithmetic-v0" and cfg.env.kwargs == {"digits": 2}
    assert parse_train_args(["--preset", "tiny"]).env.kwargs == {
        "num_letters": 2
    }  # unchanged without it


def test_another_env_id_takes_the_presets_env_kwargs_away(tmp_path, monkeypatch):
    """`gymllm train --preset tiny --env.id my_games:nim_env`: the preset's TinyRepeat kwargs are not handed
    to the user's factory (which does not take them); the same env id keeps them; --env-kwargs still sets them."""
    (tmp_path / "my_games.py").write_text(
        "import gymllm\ndef nim_env(*, heap=3):\n    return gymllm.make('gymllm/TinyRepeat-v0')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = parse_train_args(["--preset", "tiny", "--env.id", "my_games:nim_env"])
    assert cfg.env.id == "my_games:nim_env" and cfg.env.kwargs == {}
    import gymllm

    gymllm.make(
        cfg.env.id, **cfg.env.kwargs
    ).close()  # no stray kwargs (num_letters would be a TypeError)
    assert parse_train_args(
        ["--preset", "tiny", "--env.id", "gymllm/TinyRepeat-v0"]
    ).env.kwargs == {"num_letters": 2}
    assert parse_train_args(
        ["--preset", "tiny", "--env.id", "my_games:nim_env", "--env-kwargs", '{"heap": 5}']
    ).env.kwargs == {"heap": 5}


def test_env_kwargs_that_are_not_a_json_object_are_a_clear_error(capsys):
    assert main(["train", "--preset", "tiny", "--env-kwargs", "[1, 2]"]) == 2
    err = capsys.readouterr().err
    assert "--env-kwargs: expected a JSON object" in err and "Traceback" not in err
