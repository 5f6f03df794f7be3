"""Episode statistics, limits and reward transforms, checked against Gymnasium's own wrappers and a
hand-computed reference; sync vs async twins agree; per-vector-index statistics follow each env."""

from __future__ import annotations

import asyncio

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import gymllm
from gymllm.errors import ConfigError, ResetNeededError
from gymllm.wrappers import (
    Limits,
    RecordEpisodeStatistics,
    RecordVectorEpisodeStatistics,
    RewardTransform,
    TimeLimit,
    TransformReward,
    TurnLimit,
)
from gymllm.wrappers.episode_statistics import summarize

pytestmark = pytest.mark.filterwarnings("ignore")


def _rollout(env, seed, policy, max_steps=500):
    obs, info = env.reset(seed=seed)
    out = []
    for _ in range(max_steps):
        obs, r, te, tr, info = env.step(policy(obs, info))
        out.append((r, te, tr, info))
        if te or tr:
            break
    return out


def test_statistics_match_gymnasium_wrapper():
    """r and l equal Gymnasium's RecordEpisodeStatistics on the same raw env and actions."""
    ours = RecordEpisodeStatistics(gym.make("CliffWalking-v1", max_episode_steps=40))
    ref = gym.wrappers.RecordEpisodeStatistics(gym.make("CliffWalking-v1", max_episode_steps=40))
    for seed in range(4):
        rng_a, rng_b = np.random.default_rng(seed), np.random.default_rng(seed)
        a = _rollout(ours, seed, lambda o, i: int(rng_a.integers(4)))
        b = _rollout(ref, seed, lambda o, i: int(rng_b.integers(4)))
        assert a[-1][3]["episode"]["r"] == pytest.approx(float(b[-1][3]["episode"]["r"]))
        assert a[-1][3]["episode"]["l"] == int(b[-1][3]["episode"]["l"])
    assert list(ours.return_queue) == pytest.approx([float(x) for x in ref.return_queue])


def test_text_statistics_tokens_tool_calls_invalid_actions():
    env = RecordEpisodeStatistics(
        gymllm.make("gymllm/FrozenLake-v0", is_slippery=False, max_invalid=None),
        token_counter=lambda s: len(s.split()),
    )
    env.reset(seed=0)
    for a in ("I go DOWN", "fly", "DOWN", "RIGHT", "RIGHT", "DOWN", "RIGHT"):
        *_, te, tr, info = env.step(a)
    ep = info["episode"]
    assert (ep["l"], ep["r"], ep["invalid_actions"]) == (7, pytest.approx(1.0 - 0.1), 1)
    assert ep["tokens"] == 3 + 1 + 5 and ep["chars"] == sum(
        map(len, ("I go DOWN", "fly", "DOWN", "RIGHT", "RIGHT", "DOWN", "RIGHT"))
    )
    assert ep["step_latency_max"] >= ep["step_latency_mean"] > 0 and ep["t"] > 0
    s = summarize(env.episodes)
    assert s["episodes"] == 1 and s["r"] == pytest.approx(0.9)


class _ToolEnv(gymllm.TextEnv):
    def _reset(self, *, seed, options):
        return "go", {}

    def _step(self, action):
        return "ok", 0.5, self.turn >= 2, {"tool_calls": [{"name": "calc"}] * 2, "num_tokens": 4}


def test_tool_calls_and_info_tokens_counted():
    env = RecordEpisodeStatistics(_ToolEnv())
    env.reset(seed=0)
    for _ in range(3):
        *_, info = env.step("x")
    assert info["episode"]["tool_calls"] == 6 and info["episode"]["tokens"] == 12


def test_async_twins_agree_with_sync():
    def build():
        return RewardTransform(
            Limits(
                RecordEpisodeStatistics(gymllm.make("gymllm/Echo-v0", episode_length=5)),
                max_turns=3,
            ),
            scale=2.0,
            shift=-1.0,
        )

    sync_env, async_env = build(), build()
    sync = _rollout(sync_env, 3, lambda o, i: "hello")

    async def run():
        await async_env.areset(seed=3)
        out = []
        while True:
            _, r, te, tr, info = await async_env.astep("hello")
            out.append((r, te, tr, info))
            if te or tr:
                return out

    a = asyncio.run(run())
    assert [x[:3] for x in a] == [x[:3] for x in sync]
    assert a[-1][3]["truncation_reason"] == sync[-1][3]["truncation_reason"] == "turn_limit"


def test_turn_limit_matches_gymnasium_time_limit():
    ours = TurnLimit(gym.make("CliffWalking-v1"), 7)
    ref = gym.wrappers.TimeLimit(gym.make("CliffWalking-v1"), 7)
    for seed in range(3):
        ra, rb = np.random.default_rng(seed), np.random.default_rng(seed)
        a = _rollout(ours, seed, lambda o, i: int(ra.integers(4)))
        b = _rollout(ref, seed, lambda o, i: int(rb.integers(4)))
        assert [x[:3] for x in a] == [x[:3] for x in b]
    with pytest.raises(ResetNeededError):
        ours.step(0)


def test_time_limit_with_a_fake_clock():
    now = [0.0]
    env = TimeLimit(gymllm.make("gymllm/Echo-v0", episode_length=100), 10.0, clock=lambda: now[0])
    env.reset(seed=0)
    now[0] = 5.0
    assert env.step("a")[3] is False
    now[0] = 10.5
    _, _, te, tr, info = env.step("a")
    assert (te, tr, info["truncation_reason"]) == (False, True, "time_limit")


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(-100, 100), min_size=1, max_size=20),
    st.floats(0, 2),
    st.floats(-3, 3),
    st.floats(-1, 1),
    st.booleans(),
)
def test_reward_transform_matches_reference(rewards, penalty, scale, shift, terminal):
    """RewardTransform against a NumPy reference of the same math on a scripted reward sequence."""

    class Scripted(gymllm.TextEnv):
        def _reset(self, *, seed, options):
            return "", {}

        def _step(self, action):
            return "", rewards[self.turn], self.turn + 1 == len(rewards), {}

    env = RewardTransform(
        Scripted(),
        step_penalty=penalty,
        scale=scale,
        shift=shift,
        clip=(-5.0, 5.0),
        terminal_only=terminal,
    )
    got = [r for r, *_ in _rollout(env, 0, lambda o, i: "a")]
    per_step = np.clip((np.asarray(rewards) - penalty) * scale + shift, -5.0, 5.0)
    expect = np.zeros_like(per_step) if terminal else per_step
    if terminal:
        expect[-1] = per_step.sum()
    np.testing.assert_allclose(got, expect, rtol=1e-9, atol=1e-9)


def test_transform_reward_matches_gymnasium():
    ours = TransformReward(gym.make("CliffWalking-v1"), lambda r: r / 100.0)
    ref = gym.wrappers.TransformReward(gym.make("CliffWalking-v1"), lambda r: r / 100.0)
    ra, rb = np.random.default_rng(0), np.random.default_rng(0)
    a = _rollout(ours, 0, lambda o, i: int(ra.integers(4)), max_steps=30)
    b = _rollout(ref, 0, lambda o, i: int(rb.integers(4)), max_steps=30)
    assert [x[0] for x in a] == [x[0] for x in b] and "raw_reward" in a[0][3]


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="max_turns"):
        Limits(gym.make("CliffWalking-v1"), max_turns=0)
    with pytest.raises(ConfigError, match="clip"):
        RewardTransform(gym.make("CliffWalking-v1"), clip=(1.0, -1.0))
    with pytest.raises(ConfigError, match="buffer_length"):
        RecordEpisodeStatistics(gym.make("CliffWalking-v1"), buffer_length=0)


@pytest.mark.parametrize("mode", ["next_step", "same_step"])
def test_vector_statistics_per_index_match_single_env_reference(mode):
    """Per-index returns/lengths through make_vec equal each sub-env run alone with the same seed."""
    vec = RecordVectorEpisodeStatistics(
        gymllm.make_vec("gymllm/Echo-v0", num_envs=3, episode_length=2, autoreset_mode=mode)
    )
    obs, infos = vec.reset(seed=10)
    for _ in range(8):
        vec.step(["hello"] * 3)
    vec.close()
    per = vec.per_index()
    for i in range(3):
        ref = RecordEpisodeStatistics(gymllm.make("gymllm/Echo-v0", episode_length=2))
        _rollout(ref, 10 + i, lambda o, info: "hello")
        assert per[i] and all(e.env_index == i and e.l == 2 for e in per[i])
        assert per[i][0].r == ref.episodes[0].r
    assert summarize(vec.episodes)["l"] == 2.0


def test_vector_statistics_through_send_recv():
    """Barrier-free use (recv a few, send back only those) gives the same per-index records as step()."""
    vec = RecordVectorEpisodeStatistics(
        gymllm.make_vec("gymllm/Echo-v0", num_envs=4, episode_length=3)
    )
    vec.reset(seed=7)
    vec.send(["hello"] * 4)
    for _ in range(30):
        _, _, _, _, _, ids = vec.recv(min_ready=1)
        vec.send(["hello"] * len(ids), ids)
    vec.recv(min_ready=4)
    vec.close()
    per = vec.per_index()
    for i in range(4):
        ref = RecordEpisodeStatistics(gymllm.make("gymllm/Echo-v0", episode_length=3))
        _rollout(ref, 7 + i, lambda o, info: "hello")
        assert per[i] and per[i][0].r == ref.episodes[0].r and all(e.l == 3 for e in per[i])
        assert all(e.step_latency_mean >= 0 for e in per[i])
