"""The streaming learner: micro-batch invariance, filtering/staleness accounting, KL reference,
LoRA, ordering, and agreement of its step with a one-batch reference of the same loss."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gymllm.algos import config as C
from gymllm.algos.learner import StreamingLearner
from gymllm.algos.learner_config import LearnerConfig
from gymllm.models.lora import LoRAConfig
from gymllm.algos.optim import OptimizerConfig
from gymllm.models import make_tiny
from gymllm.models.logprobs import token_logprobs
from gymllm.types import Group, Trajectory

from accel import tolerance

# the one-batch reference gradient: full-precision matmuls on an accelerator too
pytestmark = pytest.mark.highest_precision


@functools.lru_cache(maxsize=1)
def tiny():
    return make_tiny(
        "qwen3", seed=0, vocab_size=300, hidden_size=32, intermediate_size=64, num_layers=1
    )


def make_groups(
    n_groups: int,
    g: int = 4,
    *,
    seed: int = 0,
    version: int = 0,
    noise: float = 0.05,
    equal_rewards: bool = False,
) -> list[Group]:
    """Random prompts + 'sampled' continuations with behaviour logprobs from the model itself (+ noise)."""
    lm = tiny()
    rng = np.random.default_rng(seed)
    groups = []
    for k in range(n_groups):
        trajs = []
        prompt = rng.integers(3, 290, 4)
        for m in range(g):
            resp = rng.integers(3, 290, int(rng.integers(2, 12)))
            ids = np.concatenate([prompt, resp]).astype(np.int32)
            mask = np.r_[np.zeros(len(prompt)), np.ones(len(resp))].astype(np.int8)
            padded = np.zeros(
                (1, 16), np.int32
            )  # one compiled shape; causal, so the padding changes nothing
            padded[0, : len(ids)] = ids
            logits, _ = lm.model(padded, np.arange(16)[None])
            lp = np.zeros(len(ids), np.float32)
            lp[1:] = np.asarray(token_logprobs(logits[:, :-1], jnp.asarray(padded[:, 1:])))[
                0, : len(ids) - 1
            ]
            mu = np.where(mask > 0, lp + rng.normal(0, noise, len(ids)), 0).astype(np.float32)
            trajs.append(
                Trajectory(
                    token_ids=ids,
                    loss_mask=mask,
                    behaviour_logprobs=mu,
                    versions=np.where(mask > 0, version, -1).astype(np.int32),
                    reward=1.0 if equal_rewards else float(rng.random() < 0.5) + 0.1 * m,
                    trajectory_id=f"s{seed}/g{k}/m{m}",
                    group_id=f"s{seed}/g{k}",
                )
            )
        groups.append(
            Group(
                group_id=f"s{seed}/g{k}", task_id="t", trajectories=trajs, admitted_version=version
            )
        )
    return groups


def learner(loss=None, *, opt="sgd", **kw):
    """Tests share compiled programs: same loss/optimizer/shape => compiled once (see _programs)."""
    lm = tiny()
    lcfg = dict(
        groups_per_step=2,
        micro_batch_size=8,
        num_steps=10,
        max_len=16,
        min_bucket=16,
        compute_entropy=True,
        fast_compile=True,
    )
    lora = kw.pop("lora", None)
    lcfg.update(kw)
    return StreamingLearner(
        lm.config,
        lm.model.flat_params(),
        loss=loss or C.async_agentic(),
        optimizer=OptimizerConfig(name=opt, learning_rate=1e-2, max_grad_norm=0.0),
        config=LearnerConfig(**lcfg),
        lora=lora,
    )


def max_diff(a, b):
    return max(float(jnp.max(jnp.abs(a[k] - b[k]))) for k in a)


BATCH_STD = dataclasses.replace(
    C.dapo(), advantage=C.AdvantageConfig(estimator="batch_std"), shaping=C.ShapingConfig()
)


@pytest.mark.parametrize(
    "loss",
    [C.async_agentic(), C.grpo(), pytest.param(BATCH_STD, marks=pytest.mark.slow)],
    ids=["async_agentic", "grpo", "batch_std"],
)
def test_update_invariant_to_micro_batch_split(loss):
    """SGD (an update linear in the gradient): 1 micro-batch of 8 rows == 4 micro-batches of 2
    (batch_std also defers its advantages to the end of the step)."""
    groups = make_groups(2)
    a, b = (
        learner(loss, opt="sgd", micro_batch_size=8),
        learner(loss, opt="sgd", micro_batch_size=2),
    )
    ra, rb = a.submit(groups), b.submit(groups)
    assert len(ra) == len(rb) == 1
    assert ra[0].metrics["micro_batches"] == 1 and rb[0].metrics["micro_batches"] == 4
    np.testing.assert_allclose(ra[0].metrics["loss"], rb[0].metrics["loss"], rtol=1e-5, atol=1e-6)
    base = tiny().model.flat_params()
    moved = max_diff(a.trainable, base)
    assert moved > 1e-5  # the update did something
    assert max_diff(a.trainable, b.trainable) < 1e-4 * moved
    assert sorted(ra[0].sample_ids) == sorted(rb[0].sample_ids)


def test_step_equals_one_batch_reference_gradient():
    """The learner's accumulated gradient / denominator == grad of the loss of the whole step in one
    batch, written directly from the pure functions (token-mean of PPO with TIS)."""
    from gymllm.algos.corrections import token_tis
    from gymllm.algos.policy_loss import ppo_clip_loss
    from gymllm.models.transformer import forward

    loss = C.async_agentic()
    groups = make_groups(2, seed=3)
    lrn = learner(loss, micro_batch_size=2, groups_per_step=3)  # 2 groups: no update yet
    lrn.submit(groups)
    trajs = [t for g in groups for t in g.trajectories]
    adv = np.concatenate([np.asarray(lrn.scorer.advantages(g.rewards[None]))[0] for g in groups])
    T = max(len(t.token_ids) for t in trajs)
    ids = np.zeros((len(trajs), T), np.int32)
    mask, mu = np.zeros((len(trajs), T - 1), np.float32), np.zeros((len(trajs), T - 1), np.float32)
    for i, t in enumerate(trajs):
        n = len(t.token_ids)
        ids[i, :n] = t.token_ids
        mask[i, : n - 1], mu[i, : n - 1] = t.loss_mask[1:], t.behaviour_logprobs[1:]
    cfg = tiny().config

    def f(params):
        logits, _ = forward(
            cfg, params, jnp.asarray(ids), jnp.broadcast_to(jnp.arange(T), ids.shape)
        )
        logp = token_logprobs(logits[:, :-1], jnp.asarray(ids[:, 1:]))
        ratio = jnp.exp(logp - jax.lax.stop_gradient(logp))
        tok, _ = ppo_clip_loss(ratio, jnp.asarray(adv)[:, None], eps_low=0.2, eps_high=0.28)
        w = token_tis(jax.lax.stop_gradient(logp) - mu, mask, cap=2.0)
        return jnp.sum(tok * w * mask) / mask.sum()

    from gymllm.algos.learner_programs import FAST_COMPILE

    want = jax.jit(jax.grad(f), compiler_options=FAST_COMPILE)(tiny().model.flat_params())
    denom = mask.sum()
    for k in want:
        np.testing.assert_allclose(
            np.asarray(lrn._acc[k]) / denom, np.asarray(want[k]), **tolerance("grad")
        )


def test_filtered_and_stale_groups_are_counted_not_trained():
    lrn = learner(
        C.async_agentic(), groups_per_step=2, max_staleness=1
    )  # filters zero-variance groups
    flat = make_groups(1, seed=1, equal_rewards=True)
    stale = make_groups(1, seed=2, version=-5)
    good = make_groups(2, seed=4)
    reports = lrn.submit(flat + stale + good)
    assert len(reports) == 1
    assert lrn.counts["filtered_groups"] == 1 and lrn.counts["stale_groups"] == 1
    assert lrn.counts["groups_trained"] == 2 and lrn.counts["groups_in"] == 4
    assert not any(s.startswith(("s1/", "s2/")) for s in reports[0].sample_ids)
    assert lrn.consumed_groups == {"s1/g0", "s2/g0", "s4/g0", "s4/g1"}
    assert reports[0].metrics["filtered_groups"] == 1 and reports[0].metrics["stale_groups"] == 1


@pytest.mark.parametrize("loss", [C.async_agentic(), BATCH_STD], ids=["per_group", "step_global"])
def test_warmup_compiles_every_program_a_step_runs(loss):
    """After ``warmup(group_size=G)`` a whole step (gradient, update, advantages) compiles nothing."""
    lrn = learner(
        loss, num_steps=11
    )  # a configuration no other test uses: its programs start uncompiled
    lrn.warmup(group_size=4)
    programs = (lrn._grad, lrn._apply, lrn.scorer.program)
    before = [p._cache_size() for p in programs]
    assert before[0] >= 1 and before[1] == 1
    assert len(lrn.submit(make_groups(2, seed=31))) == 1
    assert [p._cache_size() for p in programs] == before
    assert lrn.version == 1


def test_oldest_version_first_and_staleness_metric():
    lrn = learner(groups_per_step=1)
    new, old = make_groups(1, seed=5, version=0), make_groups(1, seed=6, version=0)
    old[0].trajectories[0].versions[
        old[0].trajectories[0].loss_mask > 0
    ] = -2  # one row two versions older
    reports = lrn.submit(new + old)
    assert [r.sample_ids[0].split("/")[0] for r in reports] == ["s6", "s5"]
    assert reports[0].metrics["staleness_max"] == 2.0


def test_kl_beta_zero_loads_no_reference_and_beta_positive_does():
    assert learner(C.dapo()).ref_params is None
    lrn = learner(C.grpo())
    assert lrn.ref_params is not None
    rep = lrn.submit(make_groups(2))[0]
    assert rep.metrics["kl"] == pytest.approx(
        0.0, abs=1e-6
    )  # policy == reference at the first step
    rep = lrn.submit(make_groups(2, seed=9))[0]
    assert rep.metrics["kl"] > 0.0  # after one update the policy moved away from the reference


def test_kl_in_reward_subtracts_beta_sum_k1_from_rewards():
    in_reward = dataclasses.replace(C.grpo(), kl=C.KLConfig(beta=0.1, placement="reward"))
    lrn = learner(in_reward)
    group = make_groups(1, seed=11, noise=0.3)[0]
    lm = tiny()
    want = []
    for t in group.trajectories:
        padded = np.zeros((1, 16), np.int32)
        padded[0, : len(t.token_ids)] = t.token_ids
        logits, _ = lm.model(padded, np.arange(16)[None])
        ref = np.asarray(token_logprobs(logits[:, :-1], jnp.asarray(padded[:, 1:])))[
            0, : len(t.token_ids) - 1
        ]
        m = t.loss_mask[1:] > 0
        want.append(t.reward - 0.1 * np.sum(t.behaviour_logprobs[1:][m] - ref[m]))
    np.testing.assert_allclose(lrn.scorer.shaped_rewards(group), want, rtol=1e-4, atol=1e-5)


def test_lora_trains_only_adapters_and_starts_at_the_base():
    lrn = learner(lora=LoRAConfig(rank=2, targets=("wq", "wv", "w_up")))
    base = tiny().model.flat_params()
    assert set(lrn.trainable) == {
        f"layers.{t}.lora_{x}" for t in ("wq", "wv", "w_up") for x in "ab"
    }
    assert max_diff(lrn.policy_params(), base) == 0.0
    lrn.submit(make_groups(2))
    merged = lrn.policy_params()
    assert float(jnp.max(jnp.abs(merged["layers.wq"] - base["layers.wq"]))) > 0
    assert float(jnp.max(jnp.abs(merged["embed"] - base["embed"]))) == 0.0
    assert max_diff(lrn.frozen, base) == 0.0


def test_too_long_trajectory_is_cut_to_max_len_and_counted():
    """Rows past max_len (a truncated episode's last observation can run past the engine's context) no
    longer abort the run: they train exactly as their first max_len positions, and are counted."""
    from gymllm.telemetry import get_tracer

    def cut(groups, n):
        for g in groups:
            for t in g.trajectories:
                t.token_ids, t.loss_mask = t.token_ids[:n], t.loss_mask[:n]
                t.behaviour_logprobs, t.versions = t.behaviour_logprobs[:n], t.versions[:n]
        return groups

    tracer = get_tracer()
    before = tracer.increment("rows_truncated", 0, track="trainer")
    long_run = learner(max_len=8, min_bucket=8)  # rows here are up to 15 tokens
    long_run.submit(make_groups(2))
    assert tracer.increment("rows_truncated", 0, track="trainer") > before
    short_run = learner(max_len=8, min_bucket=8)
    short_run.submit(cut(make_groups(2), 9))  # 9 ids: 8 positions
    assert max_diff(long_run.policy_params(), short_run.policy_params()) < 1e-6


def test_buckets_per_octave_cut_padding_and_keep_every_row():
    from gymllm.algos.batching import buckets, pick_bucket

    assert buckets(64, 128) == (64, 128)
    assert buckets(64, 128, 4) == (64, 80, 96, 112, 128)
    assert buckets(32, 100, 2) == (32, 48, 64, 96, 100)
    table = buckets(16, 512, 3)
    assert list(table) == sorted(set(table)) and table[0] == 16 and table[-1] == 512
    assert (
        pick_bucket(76, buckets(64, 128, 4)) == 80
    )  # the Tunix-config row: 45 prompt + 32 sampled - 1
    with pytest.raises(Exception, match="buckets_per_octave"):
        LearnerConfig(buckets_per_octave=0)


def test_bf16_mixed_precision_step_tracks_float32_and_keeps_float32_masters():
    """compute_dtype="bfloat16": the same step as float32 within bf16 rounding; the trainable
    weights (and so the optimizer) stay float32."""
    groups = make_groups(2, noise=0.0)
    a, b = learner(opt="sgd"), learner(opt="sgd", compute_dtype="bfloat16")
    ra, rb = a.submit(groups), b.submit(groups)
    assert len(ra) == len(rb) == 1
    assert all(v.dtype == jnp.float32 for v in jax.tree.leaves(b.trainable))
    # the bf16 forward really ran: its logprobs differ from the float32 sampler's by bf16 rounding
    assert rb[0].metrics["mismatch_abs_logprob"] > 10 * ra[0].metrics["mismatch_abs_logprob"] + 1e-4
    np.testing.assert_allclose(ra[0].metrics["loss"], rb[0].metrics["loss"], rtol=0.05, atol=0.02)
    base = tiny().model.flat_params()
    da = {k: np.ravel(a.trainable[k] - base[k]) for k in base}
    db = {k: np.ravel(b.trainable[k] - base[k]) for k in base}
    va, vb = (
        np.concatenate([da[k] for k in sorted(da)]),
        np.concatenate([db[k] for k in sorted(db)]),
    )
    assert np.linalg.norm(va) > 1e-5
    assert va @ vb / (np.linalg.norm(va) * np.linalg.norm(vb)) > 0.98


def test_compute_dtype_is_validated():
    with pytest.raises(Exception, match="compute_dtype"):
        LearnerConfig(compute_dtype="int8")


def test_keep_freed_memory_is_idempotent_and_can_be_disabled(monkeypatch):
    from gymllm.utils import host_memory

    monkeypatch.setattr(host_memory, "_done", None)
    monkeypatch.setenv("GYMLLM_KEEP_FREED_MEMORY", "0")
    assert host_memory.keep_freed_memory() is False
    monkeypatch.setattr(host_memory, "_done", None)
    monkeypatch.delenv("GYMLLM_KEEP_FREED_MEMORY")
    first = host_memory.keep_freed_memory()
    assert host_memory.keep_freed_memory() is first  # applied once per process
    x = np.ones((512, 1024), np.float32)  # allocations still work
    assert float(x.sum()) == 512 * 1024


def test_role_ema_advantages_are_reward_minus_the_roles_ema_and_equal_rewards_still_train():
    """``role_ema``: every member gets R - b[role] (b before the group), b then takes the group's mean;
    a group of equal rewards is not filtered (it carries R - b), and b is checkpointed."""
    loss = dataclasses.replace(
        C.async_agentic(),
        advantage=C.AdvantageConfig(estimator="role_ema", ema_decay=0.5),
        shaping=C.ShapingConfig(filter_zero_variance=True),
    )
    lrn = learner(loss)
    first, second = make_groups(2, equal_rewards=True, seed=7)
    first.info["role"], second.info["agent"] = "x", "o"  # a seat source's role, else the seat
    seen = []
    lrn._add_rows = lambda group, adv: seen.append(np.asarray(adv))  # what the rows would carry
    lrn._consume(first)
    lrn._consume(second)
    np.testing.assert_allclose(seen[0], [1.0] * 4)
    np.testing.assert_allclose(seen[1], [1.0] * 4)
    assert lrn.counts["filtered_groups"] == 0 and lrn.role_baselines == pytest.approx(
        {"x": 0.5, "o": 0.5}
    )
    third = make_groups(1, seed=8)[0]
    third.info["role"] = "x"
    lrn._consume(third)
    np.testing.assert_allclose(seen[2], third.rewards - 0.5, atol=1e-6)
    assert lrn.role_baselines["x"] == pytest.approx(0.5 * 0.5 + 0.5 * float(np.mean(third.rewards)))
    other = learner(loss)
    other.restore(lrn.state(), lrn.bookkeeping())
    assert other.role_baselines == lrn.role_baselines


def test_role_ema_with_a_baseline_key_compares_each_member_with_its_own_keys_ema():
    """A member whose ``info["baseline_key"]`` is set (``multiagent.baseline_key``) gets R - b[role/key], b
    read before the group; each key's b then takes the mean of its members' rewards."""
    loss = dataclasses.replace(
        C.async_agentic(), advantage=C.AdvantageConfig(estimator="role_ema", ema_decay=0.5)
    )
    lrn = learner(loss)
    group = make_groups(1, seed=3)[0]
    group.info["role"] = "x"
    cards = ["K", "J", "K", "J"]
    for t, card in zip(group.trajectories, cards):
        t.info["baseline_key"] = card
    lrn.role_baselines = {"x/K": 1.0, "x/J": -1.0, "x": 5.0}
    seen = []
    lrn._add_rows = lambda g, adv: seen.append(np.asarray(adv))
    lrn._consume(group)
    r = group.rewards.astype(np.float32)
    np.testing.assert_allclose(seen[0], r - np.array([1.0, -1.0, 1.0, -1.0]), atol=1e-6)
    assert lrn.role_baselines == pytest.approx(
        {
            "x/K": 0.5 * 1.0 + 0.5 * float(np.mean(r[[0, 2]])),
            "x/J": 0.5 * -1.0 + 0.5 * float(np.mean(r[[1, 3]])),
            "x": 5.0,  # the seat's own EMA is not touched by keyed members
        }
    )
