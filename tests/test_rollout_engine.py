"""Rollouts with the real JaxEngine and a tiny random model (real tokenizer and chat template).

* eta = 0 streaming equals the synchronous baseline for fixed seeds (seeded sampling);
* token-in/token-out: the trainer's recomputation of every sampled token's log-probability over
  the trajectory's ids (one forward, ``token_logprobs``) matches the sampler's behaviour logprobs.
"""

from __future__ import annotations

import asyncio
import functools

import numpy as np

from gymllm.inference import jax_engine  # noqa: E402
from gymllm.models import tiny  # noqa: E402

import jax.numpy as jnp  # noqa: E402

from gymllm.envs.basic import AsyncLatencyEnv  # noqa: E402
from gymllm.inference.config import EngineConfig  # noqa: E402
from gymllm.inference.params import SamplingParams  # noqa: E402
from gymllm.models.logprobs import token_logprobs  # noqa: E402
from gymllm.rollout import ModelAgent, QueueClosed, RolloutConfig, RolloutOrchestrator, sync_rollout  # noqa: E402

SAMPLING = SamplingParams(temperature=1.0, max_tokens=8)


@functools.lru_cache(maxsize=1)
def loaded():
    return tiny.make_tiny("llama", seed=0)


def engine():
    lm = loaded()
    return jax_engine.JaxEngine(
        lm.model,
        lm.tokenizer,
        config=EngineConfig(
            num_slots=8, max_len=256, min_bucket=128, max_prefill_batch=1, idle_wait_s=0.002
        ),
    )  # one prefill shape


def envs(n):
    return [AsyncLatencyEnv(median_s=0.002, p99_s=0.02, episode_length=2) for _ in range(n)]


def test_eta_zero_orchestrator_matches_sync_baseline_and_trainer_logprobs_on_a_real_engine():
    lm = loaded()
    agent = ModelAgent(lm.tokenizer)
    B, n = 2, 4
    cfg = RolloutConfig(group_size=2, max_concurrency=8, num_groups=n, max_staleness=0)

    async def streamed():
        eng = engine()
        orch = RolloutOrchestrator(
            envs(4), eng, agent, sampling=SAMPLING, config=cfg, seed=7, groups_per_step=B
        )
        out, step = [], 0
        try:
            async with orch:
                while True:
                    try:
                        out.append(await asyncio.wait_for(orch.get_group(), 600))
                    except QueueClosed:
                        break
                    if len(out) % B == 0:
                        step += 1
                        orch.set_policy_version(step)
        finally:
            await eng.close()
        return out

    async def synced():
        eng = engine()
        try:
            return await sync_rollout(
                envs(4), eng, agent, sampling=SAMPLING, config=cfg, seed=7, batch_groups=B
            )
        finally:
            await eng.close()

    got = {g.group_id: g for g in asyncio.run(streamed())}
    ref = asyncio.run(synced())
    assert sorted(got) == [g.group_id for g in ref]
    for r in ref:
        for a, b in zip(got[r.group_id].trajectories, r.trajectories):
            np.testing.assert_array_equal(a.token_ids, b.token_ids)
            np.testing.assert_array_equal(a.loss_mask, b.loss_mask)
            np.testing.assert_allclose(a.behaviour_logprobs, b.behaviour_logprobs, atol=1e-4)
            assert a.rewards == b.rewards

    # trainer-side recomputation over the TITO ids reproduces the behaviour logprobs:
    # one right-padded batch forward (causal, so padding after a row never changes its logits)
    trajs = [t for g in ref for t in g.trajectories]
    T = max(len(t.token_ids) for t in trajs)
    ids = np.zeros((len(trajs), T), np.int32)  # [N, T]
    for i, tr in enumerate(trajs):
        ids[i, : len(tr.token_ids)] = tr.token_ids
    pos = np.broadcast_to(np.arange(T, dtype=np.int32), ids.shape)  # [N, T]
    logits, _ = lm.model(jnp.asarray(ids), jnp.asarray(pos))  # [N, T, V]
    lp = np.asarray(token_logprobs(logits[:, :-1], jnp.asarray(ids[:, 1:]), 1.0))  # [N, T-1]
    for i, tr in enumerate(trajs):
        n = len(tr.token_ids)
        m = tr.loss_mask[1:].astype(bool)
        assert m.sum() == tr.num_sampled  # the first token is never sampled
        np.testing.assert_allclose(lp[i, : n - 1][m], tr.behaviour_logprobs[1:][m], atol=2e-3)
        assert len(tr.turn_boundaries) == 2 and tr.timings["generation_s"] > 0
