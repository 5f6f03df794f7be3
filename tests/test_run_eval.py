"""Held-out evaluation inside the run, honest progress figures and the op-level profile window, on a
tiny model: eval metrics at step 0, every N steps and the last; held-out seeds never meet training
seeds (recorded on both sides, and checked statically and at run time); the mean over every rollout
beside the trained groups' mean in async and sync runs; tool-call figures on a tool env; the
``jax.profiler`` trace of ``run.profile_steps``."""

from __future__ import annotations

import asyncio
import dataclasses
import glob
import gzip
import json
import pathlib

import numpy as np
import pytest

from gymllm.train.run import Run
from gymllm.train.components import LocalComponents
from gymllm.train.step_log import RolloutTally
from gymllm.train.heldout import check_heldout_seeds, training_seed_bound
from gymllm.train.trainer import train
from gymllm.inference.config import EngineConfig
from gymllm.train.train_config import EvalSection, EnvSection
from gymllm.rollout.config import RolloutConfig
from gymllm.inference.params import SamplingParams
from gymllm.errors import ConfigError
from gymllm.telemetry.report import write_report
from gymllm.telemetry.report_series import read_metrics
from gymllm.telemetry.sinks import parse_step_window, progress_line
from gymllm.types import Group, Trajectory

from test_algos_trainer import small_config

ENV = "gymllm/TinyRepeat-v0"


def run_directly(cfg, components=None) -> Run:
    """Run.setup / train / close, as ``train`` does, keeping the Run to inspect."""

    async def go() -> Run:
        run = Run(cfg)
        run.setup(components or LocalComponents())
        try:
            await run.train()
        finally:
            await run.close()
        return run

    return asyncio.run(go())


def with_eval(cfg, **eval_kw):
    return dataclasses.replace(cfg, eval=EvalSection(**eval_kw))


def test_eval_at_configured_steps_seeds_disjoint_and_profile_window(tmp_path):
    cfg = with_eval(small_config(tmp_path / "run", eta=1, steps=3), every=2, seeds=3, seed_base=500)
    cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, profile_steps="2:2"))
    run = run_directly(cfg)
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    key = f"eval/{ENV}/pass@1"
    assert [r["step"] for r in rows if key in r] == [0, 2, 3]  # before, every 2, after the last
    assert [r["step"] for r in rows if "reward_mean" in r] == [1, 2, 3]
    for r in rows:
        if key in r:
            assert 0.0 <= r[key] <= 1.0 and 0.0 <= r[f"eval/{ENV}/mean_reward"] <= 1.0
    # each evaluation ran at the policy the step had just pushed, on the held-out seeds only
    assert [e["step"] for e in run.evals] == [0, 2, 3]
    assert all(e["policy_versions"] == [e["step"], e["step"]] for e in run.evals)
    heldout = set(range(500, 503))
    assert all(set(e["seeds"]) == heldout and e["episodes"] == 3 for e in run.evals)
    assert (
        run.log.tally.seeds and not run.log.tally.seeds & heldout
    )  # training's seeds, recorded as groups completed
    assert max(run.log.tally.seeds) < cfg.run.seed + training_seed_bound(cfg) <= 500
    # the profile window: a trace of step 2 that jax/TensorBoard's profile plugin reads
    assert run.profiler.captured == (2, 2)
    (xplane,) = glob.glob(
        str(tmp_path / "run" / "profile" / "plugins" / "profile" / "*" / "*.xplane.pb")
    )
    assert pathlib.Path(xplane).stat().st_size > 1000
    (trace,) = glob.glob(
        str(tmp_path / "run" / "profile" / "plugins" / "profile" / "*" / "*.trace.json.gz")
    )
    events = json.loads(gzip.open(trace).read())["traceEvents"]
    names = {e.get("name") or "" for e in events if e.get("ph") == "X"}
    assert any(n.startswith("PjitFunction(") for n in names)  # jitted device calls ...
    assert any("prefill" in n or "decode" in n for n in names)  # ... the engine's among them
    # the report draws the eval curve and names both reward means
    written = {p.name for p in write_report(tmp_path / "run")}
    assert {"eval.png", "reward.png"} <= written
    text = (tmp_path / "run" / "summary.txt").read_text()
    assert "held-out gymllm/TinyRepeat-v0 pass@1" in text and "reward over every rollout" in text


def test_summary_prints_held_out_before_and_after_and_the_profile_dir(tmp_path):
    cfg = with_eval(
        small_config(tmp_path / "run", eta=0, steps=2), every=5, seeds=2, seed_base=10_000
    )
    cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, profile_steps="1:1"))
    res = train(cfg)
    assert [e["step"] for e in res.evals] == [0, 2]  # every=5 > num_steps: before and after only
    text = res.summary()
    assert "held-out gymllm/TinyRepeat-v0 (2 episodes, seeds 10000..10001): pass@1" in text
    assert "(step 0) ->" in text and "(step 2)" in text
    assert (
        res.profile_steps == (1, 1)
        and f"op-level profile of steps 1..1: {res.run_dir / 'profile'}" in text
    )


def test_heldout_seed_overlap_is_refused_statically_and_at_run_time(tmp_path):
    cfg = small_config(tmp_path / "run", steps=3)  # 3 steps x 2 groups, no filtering
    bound = training_seed_bound(cfg)
    assert bound >= 3 * 2
    with pytest.raises(ConfigError, match="eval.seed_base"):
        check_heldout_seeds(with_eval(cfg, every=1, seeds=4, seed_base=bound - 1))
    with pytest.raises(ConfigError, match="eval.seed_base"):
        Run(with_eval(cfg, every=1, seeds=4, seed_base=0))
    assert check_heldout_seeds(with_eval(cfg, every=1, seeds=4, seed_base=bound)) == range(
        bound, bound + 4
    )
    seeded = dataclasses.replace(
        cfg, run=dataclasses.replace(cfg.run, seed=100)
    )  # held-out below training: fine
    assert check_heldout_seeds(with_eval(seeded, every=1, seeds=4, seed_base=0)) == range(0, 4)
    # filtering zero-variance groups raises the bound: up to patience - 1 filtered groups per kept one
    assert training_seed_bound(small_config(tmp_path, steps=3).with_loss("dapo")) > bound
    # at run time: a training group on a held-out seed (a stale or failed group past the bound) is refused
    tally = RolloutTally(range(50, 60))

    def group(seed):
        traj = Trajectory(
            token_ids=np.arange(6, dtype=np.int32),
            loss_mask=np.r_[0, 0, 1, 1, 1, 1].astype(np.int8),
            behaviour_logprobs=np.zeros(6, np.float32),
            versions=np.zeros(6, np.int32),
            reward=1.0,
            trajectory_id=f"g{seed}/m0/a0",
            seed=seed,
            info={"tool_calls": 1},
        )
        return Group(group_id=f"g{seed}", task_id="t", trajectories=[traj])

    tally.add(group(49))
    with pytest.raises(ConfigError, match="held-out"):
        tally.add(group(55))
    assert tally.seeds == {49} and tally.pop()["tool_call_share"] == 1.0


def test_profile_steps_are_validated():
    assert parse_step_window("3:5") == (3, 5) and parse_step_window("") is None
    for bad in ("3", "5:2", "a:b", "0:1"):
        with pytest.raises(ConfigError, match="profile_steps"):
            parse_step_window(bad)
    from gymllm.train.train_config import RunSection

    with pytest.raises(ConfigError, match="run.profile_steps"):
        RunSection(profile_steps="5:2")


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_every_rollout_and_trained_groups_means_are_both_logged_and_named(tmp_path, mode):
    res = train(small_config(tmp_path / mode, eta=0, mode=mode, steps=2))
    assert len(res.history) == 2
    for h in res.history:
        assert 0.0 <= h["rollout_reward_mean"] <= 1.0 and 0.0 <= h["reward_mean"] <= 1.0
        assert (
            h["rollout_groups"] >= 2
            and h["tool_calls_per_episode"] == 0.0
            and h["tool_call_share"] == 0.0
        )
        line = progress_line(h["step"], 2, h, None)
        assert f"reward (all rollouts) {h['rollout_reward_mean']:.3f}" in line
        assert f"trained groups {h['reward_mean']:.3f}" in line
    text = res.summary()
    assert (
        "reward over every rollout" in text
        and "trained groups" in text
        and "tool calls per episode" in text
    )


class ScriptedToolEngine:
    """A stand-in engine (a tiny random model never writes a tool call, and a real 135M policy is too
    slow for a unit test): member 0 of every group calls the calculator on its first turn, then answers;
    every other member answers at once. Implements the Engine protocol the run uses (generate,
    update_weights, version, close)."""

    CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1 + 1"}}\n</tool_call>'

    def __init__(self, tokenizer, version: int = 0):
        self.tok, self.version, self.turns = tokenizer, version, {}

    async def generate(self, prompt_ids, params, *, session_id=None):
        from gymllm.inference.completion import Completion

        turn = self.turns.get(session_id, 0)
        self.turns[session_id] = turn + 1
        member0 = (session_id or "").split("/")[-2] == "m0"
        text = self.CALL if member0 and turn == 0 else "\\boxed{2}"
        ids = self.tok.encode(text) + [int(self.tok.eos_token_id)]
        return Completion(
            token_ids=ids,
            logprobs=[-1.0] * len(ids),
            finish_reason="stop",
            versions=[self.version] * len(ids),
            prompt_len=len(prompt_ids),
        )

    def update_weights(self, state, version):
        self.version = version

    def end_session(self, session_id):
        self.turns.pop(session_id, None)

    async def close(self):
        pass


class ScriptedComponents(LocalComponents):
    def make_engine(self, cfg, lm, version):
        return ScriptedToolEngine(lm.tokenizer, version)


@pytest.mark.parametrize(
    "agent", ["tool", "model"]
)  # the agent parses the call | the env's ToolUse does
def test_tool_call_figures_on_a_tool_env(tmp_path, agent):
    base = small_config(tmp_path / "run", eta=0, steps=2)
    cfg = dataclasses.replace(
        base,
        env=EnvSection(
            id="gymllm/ArithmeticTool-v0", kwargs={"digits": 1}, num_envs=8, agent=agent
        ),
        engine=EngineConfig(
            num_slots=8, max_len=1024, min_bucket=64, prefix_reuse=False, decode_chunk=8
        ),
        sampling=SamplingParams(max_tokens=48),
        rollout=RolloutConfig(group_size=4, max_concurrency=8, max_staleness=0, max_model_calls=3),
        learner=dataclasses.replace(base.learner, max_len=1024, min_bucket=512),
    )
    run = run_directly(with_eval(cfg, every=1, seeds=2), ScriptedComponents())
    for h in run.history:  # one episode in four calls the calculator once, over every rollout
        assert h["tool_call_share"] == pytest.approx(0.25) and h[
            "tool_calls_per_episode"
        ] == pytest.approx(0.25)
    assert all(
        e["tool_call_share"] == 1.0 for e in run.evals
    )  # held-out: one sample per seed, member 0
    totals = run.log.tally.totals
    assert totals["episodes"] >= 16 and totals["tool_calls"] * 4 == totals["episodes"]
