"""The synchronous baseline fills its rollout resources (issue 21: fair baselines).

* ``sync_batch_groups``: as many groups per batch as the envs, the engine's rows and
  ``max_concurrency`` hold, never fewer than the caller's ``batch_groups``; ``fill=False`` keeps
  exactly ``batch_groups``;
* ``sync_rollout`` on the real JaxEngine (tiny random model): every batch given to ``on_batch`` is
  that wide, and filling changes the schedule only: the trajectories equal those of the unfilled
  run (same seeds).
"""

from __future__ import annotations

import asyncio
import functools

import numpy as np

from gymllm.envs.basic import AsyncLatencyEnv
from gymllm.inference import jax_engine
from gymllm.inference.config import EngineConfig
from gymllm.inference.params import SamplingParams
from gymllm.models import tiny
from gymllm.rollout import ModelAgent, RolloutConfig, sync_rollout
from gymllm.rollout.sync_baseline import sync_batch_groups

SAMPLING = SamplingParams(temperature=1.0, max_tokens=6)


@functools.lru_cache(maxsize=1)
def loaded():
    return tiny.make_tiny("llama", seed=0)


def engine(slots: int):
    lm = loaded()
    return jax_engine.JaxEngine(
        lm.model,
        lm.tokenizer,
        config=EngineConfig(
            num_slots=slots, max_len=256, min_bucket=128, max_prefill_batch=1, idle_wait_s=0.002
        ),
    )


def test_batch_width_is_what_the_envs_rows_and_concurrency_hold():
    cfg = RolloutConfig(group_size=4, max_concurrency=64)
    assert (
        sync_batch_groups(64, None, cfg, 8) == 16
    )  # the train benchmark: 64 envs, G 4 -> 16 groups
    assert (
        sync_batch_groups(64, None, cfg, 8, fill=False) == 8
    )  # the old lockstep: half the envs idle
    small = RolloutConfig(group_size=4, max_concurrency=32)
    assert sync_batch_groups(64, None, small, 2) == 8  # capped by max_concurrency
    eng = engine(8)
    try:
        assert sync_batch_groups(64, eng, small, 2) == 2  # capped by the engine's 8 rows
    finally:
        eng.shutdown()
    assert sync_batch_groups(64, None, RolloutConfig(group_size=4, max_concurrency=4), 3) == 3
    assert sync_batch_groups(8, None, cfg, 8) == 2  # never more than the envs hold


def test_sync_rollout_fills_the_envs_and_keeps_the_trajectories():
    lm = loaded()
    cfg = RolloutConfig(group_size=2, max_concurrency=8, num_groups=8, max_staleness=0)

    def run(fill: bool, slots: int):
        widths: list[int] = []

        async def go():
            eng = engine(slots)
            try:
                envs = [
                    AsyncLatencyEnv(median_s=0.001, p99_s=0.005, episode_length=2) for _ in range(8)
                ]
                return await sync_rollout(
                    envs,
                    eng,
                    ModelAgent(lm.tokenizer),
                    sampling=SAMPLING,
                    config=cfg,
                    seed=5,
                    batch_groups=1,
                    on_batch=lambda b: widths.append(len(b)),
                    fill=fill,
                )
            finally:
                await eng.close()

        return asyncio.run(go()), widths

    filled, w_filled = run(True, 8)
    narrow, w_narrow = run(False, 8)
    rows, w_rows = run(True, 4)
    assert w_filled == [4, 4]  # 8 envs, G 2: four groups per batch
    assert w_narrow == [1] * 8  # groups_per_step at a time, six envs idle
    assert w_rows == [2] * 4  # the engine's 4 rows hold two groups
    for other in (narrow, rows):
        assert [g.group_id for g in filled] == [g.group_id for g in other]
        for a, b in zip(filled, other):
            for ta, tb in zip(a.trajectories, b.trajectories):
                np.testing.assert_array_equal(ta.token_ids, tb.token_ids)
                assert ta.reward == tb.reward
