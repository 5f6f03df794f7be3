"""A user's own env named by module on the command line: ``module:EnvId-v0`` (Gymnasium's
convention: the import registers it) and ``module:factory``, through the one resolver in
``gymllm.registration``: ``make``, ``make_vec``, ``gymllm train --env.id`` and ``gymllm eval``.
The module is tests/user_envs.py, which no gymllm code imports by itself. Training and evaluating a
user's module from the command line: tests/test_user_env_train.py."""

from __future__ import annotations

import pathlib
import sys

import gymnasium
import pytest

import gymllm
from gymllm.train.train_config import EnvSection
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
    assert (
        obs == f"Reply with the number after {env.unwrapped.target - 1}."
        and env.unwrapped.start == 7
    )
    vec = gymllm.make_vec("user_envs:make_count", num_envs=3, start=20)
    try:
        obs, _ = vec.reset(seed=0)
        assert len(obs) == 3 and all(int(o.rsplit(" ", 1)[1].rstrip(".")) >= 20 for o in obs)
    finally:
        vec.close()


@pytest.mark.parametrize(
    "env_id, expected",
    [
        ("user_envs:nope", "a callable 'nope' in module 'user_envs'"),
        ("no_such_module_xyz:Thing-v0", "an importable module before ':'"),
        ("user_envs:Missing-v0", "to register 'Missing-v0' when imported"),
        ("user_envs:", "both sides non-empty"),
        ("Arithmetc-v0", "did you mean"),
    ],
)
def test_bad_module_ids_say_what_was_expected_and_how_to_fix(env_id, expected):
    with pytest.raises(ConfigError, match="Fix:") as e:
        gymllm.make_vec(env_id, num_envs=2) if env_id.endswith(":") else gymllm.make(env_id)
    assert expected in str(e.value)


def test_a_bad_module_in_env_section_fails_before_any_model_loads():
    with pytest.raises(ConfigError, match="a callable 'nope' in module 'user_envs'"):
        EnvSection(id="user_envs:nope")
    assert EnvSection(id="user_envs:make_count").id == "user_envs:make_count"
