"""The one table of run kinds (:data:`gymllm.train.assembly.KINDS`): every kind a config can ask for has
its entry (envs and group source), the first that applies wins, and a new kind is registered from
outside ``run.py`` and drives a real ``train`` call."""

from __future__ import annotations

import dataclasses

import pytest

from gymllm.train import assembly
from gymllm.train.components import LocalComponents
from gymllm.train.assembly import Kind, kind_named, register_kind, select_kind
from gymllm.train.trainer import train
from gymllm.cli.train_args import parse_train_args
from gymllm.errors import ConfigError

from synthetic_groups import groups as synthetic_groups
from test_algos_trainer import small_config
from test_group_source import PreparedSource

BUILT_IN = [
    "agent_programs",
    "policies",
    "game_seats",
    "sync_baseline",
    "suite_mixture",
    "single_env",
]


@pytest.fixture
def kinds():
    """The table as it was, restored after the test (a registered kind must not leak into other tests)."""
    saved = list(assembly.KINDS)
    yield assembly.KINDS
    assembly.KINDS[:] = saved


def test_every_kind_a_config_asks_for_has_one_entry():
    assert [k.name for k in assembly.KINDS] == BUILT_IN
    tiny = ["--preset", "tiny"]
    game = [*tiny, "--env.id", "tic-tac-toe", "--env-kwargs", "{}", "--rollout.group-size", "2"]
    asks = {
        "agent_programs": [
            *tiny,
            "--rollout.mode",
            "proxy",
            "--rollout.agent-program",
            "{python} agent.py",
        ],
        "policies": [*game, "--multiagent.policies", '{"first": "a", "second": "b"}'],
        "game_seats": game,
        "sync_baseline": [*tiny, "--rollout.mode", "sync"],
        "suite_mixture": [*tiny, "--env.suite", "core"],
        "single_env": tiny,
    }
    assert sorted(asks) == sorted(BUILT_IN)
    for name, args in asks.items():
        assert select_kind(parse_train_args(args)).name == name, args
    with pytest.raises(ConfigError, match="register_kind"):
        kind_named("no-such-kind")


def test_a_new_kind_registered_outside_the_run_drives_train(tmp_path, kinds):
    """A kind whose source yields prepared groups, registered here: ``train`` (and the run's loop) use it
    without any change to run.py; the table, not the loop, decided."""
    built: list[PreparedSource] = []

    def source(ctx):
        assert ctx.cfg.run.run_dir.endswith("prepared") and ctx.parts.learner is not None
        built.append(PreparedSource(synthetic_groups(6, seed=3), per_call=2))
        return built[-1]

    made: list[str] = []

    def learner(
        cfg, lm
    ):  # the kind's own parts, built through the table (as several policies' are)
        made.append("learner")
        return LocalComponents().make_learner(cfg, lm)

    def pusher(cfg, engine, lm, trained):
        made.append("pusher")
        return LocalComponents().make_pusher(cfg, engine, lm, trained)

    register_kind(
        Kind(
            "prepared",
            lambda cfg: cfg.run.run_dir.endswith("prepared"),
            lambda cfg, components: components.make_envs(cfg),
            source,
            learner=learner,
            pusher=pusher,
        )
    )
    assert [k.name for k in kinds][-2:] == ["prepared", "single_env"]  # before the catch-all
    result = train(small_config(tmp_path / "prepared", steps=2))
    assert result.steps == 2 and len(built) == 1
    assert built[0].versions == [1, 2] and built[0].events == ["start", "close", "result"]
    assert select_kind(small_config(tmp_path / "other")).name == "single_env"
    assert made == ["learner", "pusher"]


def test_several_policies_are_one_entry_with_their_own_parts():
    """The policies kind brings a learner per policy, the engine that serves them and their weight push;
    the components build none of it. Asked for without a game, it refuses with the fix."""
    kind = kind_named("policies")
    assert kind.learner is not None and kind.engine is not None and kind.pusher is not None
    assert all(
        k.learner is None and k.engine is None and k.pusher is None
        for k in assembly.KINDS
        if k.name != "policies"
    )
    cfg = parse_train_args(["--preset", "tiny", "--multiagent.policies", '{"first": "a"}'])
    assert select_kind(cfg) is kind
    with pytest.raises(ConfigError, match="expected a multi-agent game"):
        kind.learner(cfg, None)


def test_register_kind_replaces_by_name_and_checks_its_anchor(kinds):
    mine = Kind("single_env", lambda cfg: True, lambda cfg, components: None, lambda ctx: None)
    register_kind(mine)
    assert kind_named("single_env") is mine and len(kinds) == len(BUILT_IN)
    with pytest.raises(ConfigError, match=r"register_kind\(before\): expected one of"):
        register_kind(dataclasses.replace(mine, name="x"), before="nowhere")
