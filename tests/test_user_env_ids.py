"""A user's own env named by module on the command line: ``module:EnvId-v0`` (Gymnasium's
convention: the import registers it) and ``module:factory``, through the one resolver in
``gymllm.registration``: ``make``, ``make_vec``, ``gymllm train --env.id`` and ``gymllm eval``.
The module is tests/user_envs.py, which no gymllm code imports by itself."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys

import gymnasium
import pytest

import gymllm
from gymllm.algos.trainer import train
from gymllm.algos.train_config import EnvSection
from gymllm.cli.main import main
from gymllm.errors import ConfigError
from gymllm.utils import check_env

HERE = pathlib.Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def user_module_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))


def test_both_module_forms_make_envs_and_vector_envs_with_kwargs():
    sys.modules.pop("user_envs", None)
    gymnasium.registry.pop("UserCount-v0", None)
    env = gymllm.make("user_envs:UserCount-v0")  # the import registers the id, then it is made
    assert "UserCount-v0" in gymnasium.registry and type(env.unwrapped).__name__ == "CountEnv"
    check_env(gymllm.make("user_envs:make_count", start=7))
    env = gymllm.make("user_envs:make_count", start=7)
    obs, _ = env.reset(seed=0)
    assert obs == f"Reply with the number after {env.unwrapped.target - 1}." and env.unwrapped.start == 7
    vec = gymllm.make_vec("user_envs:make_count", num_envs=3, start=20)
    try:
        obs, _ = vec.reset(seed=0)
        assert len(obs) == 3 and all(int(o.rsplit(" ", 1)[1].rstrip(".")) >= 20 for o in obs)
    finally:
        vec.close()


@pytest.mark.parametrize("env_id, expected", [
    ("user_envs:nope", "a callable 'nope' in module 'user_envs'"),
    ("no_such_module_xyz:Thing-v0", "an importable module before ':'"),
    ("user_envs:Missing-v0", "to register 'Missing-v0' when imported"),
    ("user_envs:", "both sides non-empty"),
    ("Arithmetc-v0", "did you mean"),
])
def test_bad_module_ids_say_what_was_expected_and_how_to_fix(env_id, expected):
    with pytest.raises(ConfigError, match="Fix:") as e:
        gymllm.make_vec(env_id, num_envs=2) if env_id.endswith(":") else gymllm.make(env_id)
    assert expected in str(e.value)


def test_train_and_eval_a_user_env_named_by_module(tmp_path):
    from test_algos_trainer import small_config

    base = small_config(tmp_path / "run", steps=2)
    cfg = dataclasses.replace(base, env=EnvSection(id="user_envs:make_count", kwargs={"start": 5}, num_envs=8),
                              engine=dataclasses.replace(base.engine, max_len=128),  # the chat prompt is ~70 tokens
                              learner=dataclasses.replace(base.learner, max_len=128))
    res = train(cfg)
    assert res.steps == 2 and len(res.history) == 2
    trajs = [json.loads(line) for line in (res.run_dir / "trajectories.jsonl").read_text().splitlines()]
    # the user's env played: one model call and one env step each, its one-turn episodes terminated
    assert trajs and all(t["info"]["env_steps"] == 1 and t["info"]["terminated"] and t["num_sampled"] > 0
                         for t in trajs)
    out = tmp_path / "eval.json"
    assert main(["eval", "user_envs:UserCount-v0", "--checkpoint", str(res.run_dir), "--num-seeds", "2", "--k", "1",
                 "--max-tokens", "4", "--max-turns", "1", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    assert row["env"] == "user_envs:UserCount-v0" and row["episodes"] == 2 and 0.0 <= row["mean_reward"] <= 1.0
