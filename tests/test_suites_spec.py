"""Suite files: the shipped ones load by name and by path; every malformed suite fails with an error that
names the key, the table and the fix; env ids in all three forms (a registered id, Gymnasium's
``module:EnvId-v0`` with the module imported first, ``module:factory``)."""

from __future__ import annotations

import sys
import textwrap

import pytest

import gymllm
from gymllm.suites.resolve import make_vec_for
from gymllm.registration import resolve_env_id
from gymllm.suites.spec import (
    SUITES_DIR,
    SuiteError,
    load_suite,
    one_off_suite,
    parse_suite,
    shipped_suites,
)

USER_MODULE = '''
import gymnasium
from gymllm.core import TextEnv


class UserEcho(TextEnv):
    """Says a word; reward 1 when the reply contains it."""

    def __init__(self, word="hi", max_turns=None, render_mode=None):
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        self.word = word

    def _reset(self, *, seed, options):
        return f"Say {self.word}.", {"answer": self.word}

    def _step(self, action):
        return "done", float(self.word in action), True, {}


gymnasium.register(id="{env_id}", entry_point=__name__ + ":UserEcho")


def make_env(**kwargs):
    return UserEcho(**kwargs)


NOT_CALLABLE = 3
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A module of the user's, importable by name, that registers ``UserEchoSpec-v0`` on import."""
    name = f"user_envs_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(USER_MODULE.replace("{env_id}", "UserEchoSpec-v0"))
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)
    import gymnasium

    gymnasium.registry.pop("UserEchoSpec-v0", None)


def test_shipped_suites_load_by_name_and_by_path():
    assert {"core", "games", "reasoning"} <= set(shipped_suites())
    core = load_suite("core")
    from gymllm.cli.evaluate import SUITE

    assert tuple(e.id for e in core.envs) == SUITE  # today's default list
    assert load_suite("core.toml") == load_suite(SUITES_DIR / "core.toml") == core
    assert all(len(e.seeds) == 16 and e.k == 4 for e in core.envs)
    for name in ("games", "reasoning"):
        suite = load_suite(name)
        assert suite.name == name and len(suite.envs) >= 5
        assert all(
            isinstance(e.target, str) and e.target in gymllm.registration.registered_ids()
            for e in suite.envs
        )


def test_defaults_are_overridden_per_env_and_by_overrides(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(
        textwrap.dedent("""
        name = "mine"
        k = 2
        num_seeds = 3
        seed_base = 50
        [[env]]
        id = "gymllm/Echo-v0"
        [[env]]
        id = "Echo-v0"
        name = "echo2"
        k = 5
        seeds = [7, 9]
        weight = 3.0
        kwargs = { episode_length = 2 }
        agent = "model"
        system_prompt = "Be brief."
    """)
    )
    s = load_suite(path)
    a, b = s.envs
    assert (a.name, a.k, a.seeds, a.weight) == ("gymllm/Echo-v0", 2, (50, 51, 52), 1.0)
    assert (b.name, b.k, b.seeds, b.kwargs, b.agent, b.system_prompt) == (
        "echo2",
        5,
        (7, 9),
        {"episode_length": 2},
        "model",
        "Be brief.",
    )
    assert s.weights == {"gymllm/Echo-v0": 0.25, "echo2": 0.75}
    o = load_suite(path, overrides={"k": 1, "num_seeds": 2})
    assert [(e.k, e.seeds) for e in o.envs] == [(1, (50, 51)), (1, (50, 51))]
    with pytest.raises(SuiteError, match="override only"):
        load_suite(path, overrides={"name": "x"})


def _bad(data, *patterns):
    with pytest.raises(SuiteError) as info:
        parse_suite(data, source="bad.toml")
    text = str(info.value)
    for p in patterns:
        assert p in text, text
    assert "Fix:" in text
    return text


ECHO = {"id": "gymllm/Echo-v0"}


def test_malformed_suites_name_the_key_the_table_and_the_fix():
    _bad({"nmae": "x", "env": [ECHO]}, "top level", "'nmae'", "rename it to 'name'")
    _bad(
        {"env": [{**ECHO, "kwarg": {}}]},
        "[[env]] #1 (id = 'gymllm/Echo-v0')",
        "'kwarg'",
        "rename it to 'kwargs'",
    )
    _bad(
        {"env": [ECHO, {**ECHO, "name": "x"}, {"id": "gymllm/Arithmetic-v0", "name": "x"}]},
        "[[env]] #3",
        "'name'",
        "also the name of [[env]] #2",
        "distinct name",
    )
    _bad({"env": [ECHO, ECHO]}, "[[env]] #2", "unique")  # both default to the id
    _bad({"env": [{"id": "gymllm/Arithmetik-v0"}]}, "[[env]] #1", "'id'", "gymllm/Arithmetic-v0")
    _bad(
        {"env": [{**ECHO, "seeds": [1, 2], "num_seeds": 2}]},
        "'seeds' and 'num_seeds'",
        "drop num_seeds",
    )
    _bad({"env": [{**ECHO, "seeds": [1, 1]}]}, "'seeds'", "distinct")
    _bad({"env": [{**ECHO, "seeds": []}]}, "'seeds'", "non-empty list")
    _bad({"k": 0, "env": [ECHO]}, "top level: key 'k'", "integer >= 1")
    _bad({"env": [{**ECHO, "temperature": -1}]}, "key 'temperature'", ">= 0")
    _bad({"env": [{**ECHO, "k": True}]}, "key 'k'", "integer")
    _bad({"env": [{**ECHO, "weight": -1}]}, "key 'weight'")
    _bad({"env": [{**ECHO, "weight": 0}]}, "weight > 0")
    _bad({"env": [{**ECHO, "agent": "robot"}]}, "key 'agent'", "'model' or 'tool'")
    _bad({"env": [{**ECHO, "kwargs": 3}]}, "key 'kwargs'", "table")
    _bad({"env": [{**ECHO, "name": "*"}]}, "other than '*'")
    _bad({"env": [{"name": "x"}]}, "[[env]] #1: key 'id'", "add id =")
    _bad({"name": "x"}, "key 'env'", "at least one [[env]] table")
    _bad({"env": ["gymllm/Echo-v0"]}, "[[env]] #1", "a table")


def test_unknown_suite_names_and_bad_toml(tmp_path):
    with pytest.raises(SuiteError, match="did you mean core"):
        load_suite("cor")
    bad = tmp_path / "bad.toml"
    bad.write_text("name = \n")
    with pytest.raises(SuiteError, match="valid TOML"):
        load_suite(bad)


def test_env_ids_in_all_three_forms(user_module):
    assert resolve_env_id("Arithmetic-v0") == "gymllm/Arithmetic-v0"
    assert (
        resolve_env_id(f"{user_module}:UserEchoSpec-v0") == "UserEchoSpec-v0"
    )  # the import registered it
    factory = resolve_env_id(f"{user_module}:make_env")
    assert callable(factory) and factory(word="yo").word == "yo"
    suite = parse_suite(
        {
            "env": [
                {"id": f"{user_module}:UserEchoSpec-v0", "name": "user"},
                {"id": f"{user_module}:make_env", "name": "factory", "kwargs": {"word": "ok"}},
            ]
        }
    )
    for e in suite.envs:
        vec = make_vec_for(e.target, 2, e.kwargs, max_turns=2)
        try:
            obs, _ = vec.reset(seed=0)
            _, rewards, terms, _, _ = vec.step([e.kwargs.get("word", "hi")] * 2)
        finally:
            vec.close()
        assert list(rewards) == [1.0, 1.0] and all(terms)


def test_env_id_errors_say_what_to_fix(user_module):
    with pytest.raises(gymllm.errors.ConfigError, match="no_such_module_xyz"):
        resolve_env_id("no_such_module_xyz:Foo-v0")
    with pytest.raises(gymllm.errors.ConfigError, match="not registered after the import"):
        resolve_env_id(f"{user_module}:Missing-v0")
    with pytest.raises(gymllm.errors.ConfigError, match="did you mean .*make_env"):
        resolve_env_id(f"{user_module}:make_envv")
    with pytest.raises(gymllm.errors.ConfigError, match="int"):
        resolve_env_id(f"{user_module}:NOT_CALLABLE")
    with pytest.raises(gymllm.errors.ConfigError, match="did you mean 'gymllm/Countdown-v0'"):
        resolve_env_id("gymllm/Countdwn-v0")


def test_one_off_suite_is_the_command_lines_envs():
    s = one_off_suite(
        ["gymllm/Echo-v0", "gymllm/Arithmetic-v0"], env_kwargs={}, k=2, num_seeds=3, seed_base=10
    )
    assert [e.name for e in s.envs] == ["gymllm/Echo-v0", "gymllm/Arithmetic-v0"]
    assert all(e.k == 2 and e.seeds == (10, 11, 12) for e in s.envs)
