"""A run that cannot make progress stops with a clear error (``RolloutConfig.max_failed_streak``); a run
whose failures are occasional is never stopped by it (the bound holds whatever the completion order)."""

from __future__ import annotations

import asyncio

import numpy as np

import pytest
from test_rollout_orchestrator import SAMPLING, HangOrFailEnv, ScriptedEngine, consume_all, tok

import gymllm
from gymllm.errors import ConfigError
from gymllm.rollout import ModelAgent, RolloutConfig, RolloutOrchestrator, RolloutStalledError


def test_every_trajectory_failing_stops_the_run_with_the_cause():
    """gymllm/Failing-v0 raises at every first step: the orchestrator used to start groups forever."""
    envs = [gymllm.make("gymllm/Failing-v0", fail_at_step=1) for _ in range(4)]
    cfg = RolloutConfig(group_size=2, max_concurrency=4, max_staleness=None, max_failed_streak=8)
    orch = RolloutOrchestrator(
        envs, ScriptedEngine(), ModelAgent(tok()), sampling=SAMPLING, config=cfg
    )
    with pytest.raises(RolloutStalledError, match="8 failed attempts in a row") as info:
        asyncio.run(consume_all(orch, timeout=60))
    assert "deliberate failure" in str(info.value) and info.value.failures == 8
    assert (
        orch.counts["member_errors"] >= 8 and orch.counts["admitted"] <= 8 + 4
    )  # stopped, not 55,000 groups
    assert orch.counts["stalled"] == 1


def test_occasional_failures_never_trip_the_bound():
    """Two failing groups of two (4 failed attempts at most in a row, in any order) under a bound of 5."""
    HangOrFailEnv.attempts.clear()
    envs = [HangOrFailEnv(fail_seeds={3, 4}) for _ in range(4)]
    cfg = RolloutConfig(group_size=2, num_groups=10, max_staleness=None, max_failed_streak=5)
    orch = RolloutOrchestrator(
        envs, ScriptedEngine(), ModelAgent(tok()), sampling=SAMPLING, config=cfg
    )
    groups = asyncio.run(consume_all(orch))
    assert sorted(g.group_id for g in groups) == sorted(
        f"g{k}" for k in range(10) if k not in (3, 4)
    )
    assert orch.counts["groups_failed"] == 2 and orch.counts["stalled"] == 0


def test_the_bound_is_validated_and_can_be_off():
    with pytest.raises(ConfigError, match="max_failed_streak"):
        RolloutConfig(max_failed_streak=0)
    assert RolloutConfig(max_failed_streak=None).max_failed_streak is None


class BadRewardEnv(HangOrFailEnv):
    """Returns a NaN, an inf or a string as reward for chosen seeds (a buggy reward function)."""

    def __init__(self, *, bad: dict):
        super().__init__()
        self.bad = bad

    async def _astep(self, action):
        obs, reward, term, info = await super()._astep(action)
        return obs, self.bad.get(self.seed_, reward), term, info


@pytest.mark.parametrize("value", [float("nan"), float("inf"), "1.0", None])
def test_a_bad_reward_fails_its_trajectory_with_a_clear_error_and_the_run_goes_on(value):
    from gymllm.errors import RewardError

    env = BadRewardEnv(bad={0: value})
    env.reset(seed=0)
    with pytest.raises(RewardError, match="finite real number"):
        env.step("a")
    envs = [BadRewardEnv(bad={1: value}) for _ in range(4)]
    cfg = RolloutConfig(group_size=2, num_groups=4, max_staleness=None)
    orch = RolloutOrchestrator(
        envs, ScriptedEngine(), ModelAgent(tok()), sampling=SAMPLING, config=cfg
    )
    groups = asyncio.run(consume_all(orch))
    assert sorted(g.group_id for g in groups) == [
        "g0",
        "g2",
        "g3",
    ]  # g1 recorded as failed, nothing else lost
    assert orch.counts["groups_failed"] == 1 and any("RewardError" in e for e in orch.errors)
    assert all(np.isfinite(g.rewards).all() for g in groups)
