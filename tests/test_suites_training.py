"""``gymllm train --env.suite``: a suite's mixture as the env side of the one training loop
(:class:`gymllm.suites.training.MixtureEnvs`): each group is one env and seed, drawn by weight,
every env in flight on the one engine; per-env figures in metrics.jsonl; the curriculum re-weights."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import pathlib

import numpy as np
import pytest

from gymllm.train.train_config import EnvSection
from gymllm.train.trainer import train
from gymllm.errors import ConfigError
from gymllm.suites import load_suite
from gymllm.suites.mixture import MixtureSampler
from gymllm.suites.training import MixtureEnvs

HERE = pathlib.Path(__file__).resolve().parent

# two envs: a registered one (weight 3) and a user's module (weight 1), one turn each
SUITE = (
    'name = "two"\nmax_turns = 1\n'
    '[[env]]\nname = "repeat"\nweight = 3.0\nid = "gymllm/TinyRepeat-v0"\nkwargs = { num_letters = 2 }\n'
    '[[env]]\nname = "count"\nweight = 1.0\nid = "user_envs:make_count"\nkwargs = { start = 5 }\n'
)


@pytest.fixture
def suite_file(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))  # the user's env module of the second table
    path = tmp_path / "two.toml"
    path.write_text(SUITE)
    return path


def test_a_groups_env_depends_on_its_seed_and_the_weights_only():
    s = MixtureSampler({"a": 3.0, "b": 1.0}, seed=7)
    names = [s.name_for(k) for k in range(4000)]
    assert names == [MixtureSampler({"a": 3.0, "b": 1.0}, seed=7).name_for(k) for k in range(4000)]
    share = names.count("a") / len(names)
    assert abs(share - 0.75) < 4 * np.sqrt(
        0.75 * 0.25 / 4000
    )  # within 4 standard errors of the weight


def test_slots_bind_each_group_to_its_env_and_reuse_idle_instances(suite_file):
    envs = MixtureEnvs(load_suite(suite_file), num_envs=4, seed=0)

    async def play():
        seeds = list(range(12))
        for slot, seed in enumerate(seeds[:4]):  # 4 slots, then each reset again with a later seed
            obs, info = await envs.areset_env(slot, seed=seed)
            assert info["suite_env"] == envs.sampler.name_for(seed)
            assert ("number after" in obs) == (info["suite_env"] == "count")
        for slot, seed in enumerate(seeds[4:8]):
            await envs.areset_env(slot, seed=seed)
            await envs.astep_env(slot, "x")
        return {s: envs.env_of_seed(s) for s in seeds[:8]}

    drawn = asyncio.run(play())
    made = sum(len(p) for p in envs.idle.values()) + len(envs.bound)
    assert made <= 8 and len(envs.bound) == 4  # instances are reused once their slot moves on
    assert set(drawn.values()) <= {"repeat", "count"}
    envs.close()


def test_curriculum_moves_weight_to_the_learnable_env(suite_file):
    envs = MixtureEnvs(load_suite(suite_file), num_envs=4, seed=0, curriculum="learnability")

    class G:  # a finished group as the filter sees it
        def __init__(self, seed, rewards):
            self.info = {"seed": seed}
            self.trajectories = [type("T", (), {"reward": r})() for r in rewards]

    repeat_seed = next(s for s in range(100) if envs.env_of_seed(s) == "repeat")
    count_seed = next(s for s in range(100) if envs.env_of_seed(s) == "count")
    keep = envs.observe(None)
    assert keep(G(repeat_seed, [1.0, 1.0, 1.0, 1.0])) and keep(G(count_seed, [1.0, 0.0, 1.0, 0.0]))
    before = envs.sampler.weights
    figures = envs.flush()
    after = envs.sampler.weights
    assert figures["env/repeat/groups"] == 1 and figures["env/count/success"] == 0.5
    # repeat always solved: p(1-p) = 0 -> the floor 0.01; count at p = 1/2: 1/4; times the base weights
    expected = 0.25 * 0.25 / (0.25 * 0.25 + 0.75 * 0.01)
    assert before["repeat"] == 0.75 and after["count"] == pytest.approx(expected)


def test_train_on_a_two_env_mixture_logs_per_env_figures(suite_file, tmp_path):
    from test_algos_trainer import small_config

    base = small_config(tmp_path / "run", steps=3)
    cfg = dataclasses.replace(
        base,
        env=EnvSection(suite=str(suite_file), num_envs=8),
        engine=dataclasses.replace(base.engine, max_len=128),
        learner=dataclasses.replace(base.learner, max_len=128),
    )
    res = train(cfg)
    assert res.steps == 3
    rows = [json.loads(line) for line in (res.run_dir / "metrics.jsonl").read_text().splitlines()]
    last = rows[-1]
    groups = {n: last.get(f"env/{n}/groups", 0) for n in ("repeat", "count")}
    assert sum(groups.values()) == sum(
        r.get("rollout_groups", 0) for r in rows
    )  # every finished group, by env
    assert all(f"env/{n}/weight" in last for n in groups)
    trajs = [
        json.loads(line) for line in (res.run_dir / "trajectories.jsonl").read_text().splitlines()
    ]
    assert trajs and all(t["info"]["env_steps"] >= 1 for t in trajs)
    from gymllm.telemetry.report import env_table

    table = env_table(rows)
    assert table is not None and "per env" in table
    for name, n in groups.items():
        if n:
            assert any(line.split()[:2] == [name, f"{n:g}"] for line in table.splitlines()), table
    assert env_table([{"step": 1, "reward_mean": 0.5}]) is None  # one env: no table


def test_bad_mixture_settings_are_clear(suite_file):
    with pytest.raises(ConfigError, match="not both"):
        EnvSection(suite=str(suite_file), id="gymllm/Arithmetic-v0")
    with pytest.raises(ConfigError, match="--env.suite"):
        EnvSection(curriculum="learnability")


def test_in_loop_evaluation_runs_the_suites_envs(suite_file, tmp_path):
    """--eval.suite (and a mixture run's own suite when eval names nothing) evaluates each env of the
    suite with its table's kwargs; --eval.envs with --eval.suite is a clear error."""
    from test_algos_trainer import small_config

    from gymllm.train.heldout import HeldOutHook
    from gymllm.train.train_config import EvalSection
    from gymllm.models import make_tiny
    from gymllm.rollout import ModelAgent

    tok = make_tiny("qwen3", vocab_size=300).tokenizer
    base = small_config(tmp_path / "run")
    for cfg in (
        dataclasses.replace(base, eval=EvalSection(every=1, seeds=2, suite=str(suite_file))),
        dataclasses.replace(
            base,
            env=EnvSection(suite=str(suite_file), num_envs=8),
            eval=EvalSection(every=1, seeds=2),
        ),
    ):
        hook = HeldOutHook(cfg)
        hook.open(ModelAgent(tok), tok)
        try:
            specs = hook.evaluator.specs
            assert [(s[0], s[1]) for s in specs] == [
                ("gymllm/TinyRepeat-v0", {"num_letters": 2}),
                ("user_envs:make_count", {"start": 5}),
            ]
            obs, _ = hook.evaluator.envs[1].reset(seed=0)
            assert all("number after" in o for o in obs)  # the user's env, built from its table
        finally:
            hook.evaluator.close()
    with pytest.raises(ConfigError, match="not both"):
        EvalSection(envs=("gymllm/TinyRepeat-v0",), suite=str(suite_file))
