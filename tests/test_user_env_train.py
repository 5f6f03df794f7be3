"""A user's env named on the command line: ``gymllm train --env.id module:EnvId-v0`` (the module's
``gymnasium.register`` call runs on import) and ``--env.id module:factory`` train two steps of the tiny
preset, then ``gymllm eval`` evaluates the same env; a bad module or a missing factory is a clear
ConfigError before any model loads."""

from __future__ import annotations

import json
import pathlib

import pytest

from gymllm.train.train_config import EnvSection
from gymllm.cli.main import main
from gymllm.errors import ConfigError

HERE = pathlib.Path(__file__).resolve().parent


@pytest.fixture
def user_module(monkeypatch):
    """tests/user_envs.py, a user's module that no gymllm code imports by itself."""
    monkeypatch.syspath_prepend(str(HERE))
    return "user_envs"


def _train(run, env_id):
    return main(
        [
            "train",
            "--preset",
            "tiny",
            "--run-dir",
            str(run),
            "--env.id",
            env_id,
            "--env-kwargs",
            '{"start": 5}',
            "--learner.num-steps",
            "2",
            "--run.no-console",
            "--run.no-report",
        ]
    )


@pytest.mark.parametrize("attr", ["UserCount-v0", "make_count"])
def test_user_env_trains_from_the_command_line(tmp_path, user_module, attr):
    run = tmp_path / "run"
    assert _train(run, f"{user_module}:{attr}") == 0
    rows = [
        json.loads(line)
        for line in (run / "metrics.jsonl").read_text().splitlines()
        if line.strip()
    ]
    assert max(r.get("step", 0) for r in rows) == 2
    assert json.loads((run / "config.json").read_text())["env"]["id"] == f"{user_module}:{attr}"


def test_user_env_is_evaluated_by_gymllm_eval(tmp_path, user_module, capsys):
    out = tmp_path / "eval"
    assert (
        main(
            [
                "eval",
                "suite",
                "--eval.suite",
                _suite(tmp_path, f"{user_module}:make_count"),
                "--model.name",
                "tiny-qwen3",
                "--out",
                str(out),
                "--engine.num-slots",
                "8",
                "--engine.max-len",
                "256",
                "--max-concurrency-per-env",
                "4",
                "--no-progress",
            ]
        )
        == 0
    )
    rows = [
        json.loads(line)
        for line in (out / "results.jsonl").read_text().splitlines()
        if line.strip()
    ]
    assert (
        len(rows) == 2 * 2
        and {r["env"] for r in rows} == {"count"}
        and all(r["error"] is None for r in rows)
    )


def _suite(tmp_path, env_id):
    path = tmp_path / "user.toml"
    path.write_text(
        f'name = "user"\nk = 2\nnum_seeds = 2\nmax_tokens = 4\nmax_turns = 1\n\n'
        f'[[env]]\nid = "{env_id}"\nname = "count"\nkwargs = {{ start = 5 }}\n'
    )
    return str(path)


def test_bad_module_and_missing_factory_are_clear_errors(user_module):
    with pytest.raises(ConfigError) as e:
        EnvSection(id="no_such_module_xyz:Env-v0")
    assert (
        "env.id" in str(e.value)
        and "no_such_module_xyz" in str(e.value)
        and "PYTHONPATH" in str(e.value)
    )
    with pytest.raises(ConfigError) as e:
        EnvSection(id=f"{user_module}:make_coun")
    assert "env.id" in str(e.value) and "make_count" in str(
        e.value
    )  # the nearest callable is suggested
    with pytest.raises(ConfigError) as e:
        EnvSection(id=f"{user_module}:Missing-v0")
    assert "register" in str(e.value)


def test_bad_module_on_the_command_line_is_one_line(tmp_path, capsys):
    assert (
        main(
            [
                "train",
                "--preset",
                "tiny",
                "--run-dir",
                str(tmp_path / "r"),
                "--env.id",
                "no_such_module_xyz:E-v0",
                "--learner.num-steps",
                "1",
                "--run.no-console",
            ]
        )
        == 2
    )
    err = " ".join(capsys.readouterr().err.replace("│", " ").split())  # tyro's box, unwrapped
    assert (
        "env.id: expected an importable module before ':' ('no_such_module_xyz')" in err
        and "PYTHONPATH" in err
    )
