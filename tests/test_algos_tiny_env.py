"""TinyRepeat-v0 (the learnable task of the tiny preset): conformance, scoring, seeded latency and
heavy-tailed episode lengths."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gymllm
from gymllm.envs.tiny_tasks import letter_fraction
from gymllm.errors import ConfigError


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {
            "num_letters": 2,
            "latency_median_s": 0.001,
            "latency_p99_s": 0.01,
            "continue_prob": 0.5,
            "max_replies": 3,
        },
    ],
)
def test_check_env(kw):
    from gymllm.utils import check_env

    check_env(gymllm.make("gymllm/TinyRepeat-v0", **kw))


@settings(max_examples=40, deadline=None)
@given(reply=st.text(max_size=20), letter=st.sampled_from("abcd"))
def test_letter_fraction_reference(reply, letter):
    chars = [c for c in reply if not c.isspace()]
    want = (chars.count(letter) / len(chars)) if chars else 0.0
    assert letter_fraction(reply, letter) == pytest.approx(want)
    assert 0.0 <= letter_fraction(reply, letter) <= 1.0


def test_rewards_and_seeded_episode_lengths():
    env = gymllm.make("gymllm/TinyRepeat-v0", num_letters=3, continue_prob=0.5, max_replies=5)
    lengths = []
    for seed in range(200):
        obs, info = env.reset(seed=seed)
        letter = info["answer"]
        assert obs == f"Repeat the letter {letter}."
        total, n, done = 0.0, 0, False
        while not done:
            _, r, term, trunc, _ = env.step(letter * 3)
            total, n, done = total + r, n + 1, term or trunc
        assert total == pytest.approx(1.0)  # perfect replies sum to 1 whatever the episode length
        lengths.append(n)
    lengths = np.array(lengths)
    assert (
        lengths.min() == 1 and lengths.max() == 5 and 0.4 < np.mean(lengths == 1) < 0.6
    )  # geometric
    again = [
        gymllm.make("gymllm/TinyRepeat-v0", num_letters=3, continue_prob=0.5, max_replies=5)
        for _ in range(2)
    ]
    runs = [[e.reset(seed=7)[1]["answer"], e.step("x")[2]] for e in again]
    assert runs[0] == runs[1]


def test_async_latency_is_seeded_and_concurrent():
    async def episode(seed):
        env = gymllm.make("gymllm/TinyRepeat-v0", latency_median_s=0.05, latency_p99_s=0.1)
        await env.unwrapped.areset(seed=seed)
        return await env.unwrapped.astep("a")

    async def many():
        import time

        t = time.perf_counter()
        out = await asyncio.gather(*(episode(s) for s in range(20)))
        return out, time.perf_counter() - t

    out, wall = asyncio.run(many())
    assert wall < 20 * 0.05  # the 20 delays overlap on one event loop
    assert all(o[2] for o in out)


def test_bad_arguments_are_clear():
    with pytest.raises(ConfigError, match="num_letters"):
        gymllm.make("gymllm/TinyRepeat-v0", num_letters=0)
    with pytest.raises(ConfigError, match="continue_prob"):
        gymllm.make("gymllm/TinyRepeat-v0", continue_prob=1.0)
