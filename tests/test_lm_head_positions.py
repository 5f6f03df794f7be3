"""The LM head on the loss positions only (``LearnerConfig.loss_positions_only``): the learner projects
to the vocabulary (and takes the log-softmax) only where the loss reads a log-probability, and gets
the same loss, gradients and update as the full projection, padded and packed."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gymllm.algos import config as C
from gymllm.algos.batching import (
    loss_positions,
    make_micro_batch,
    on_loss_positions,
    pack_rows,
    row_from_trajectory,
)
from gymllm.algos.learner_programs import FAST_COMPILE, build_loss_fn
from gymllm.algos.learner_config import LearnerConfig
from gymllm.models.transformer import forward, hidden_states, lm_logits
from test_learner import learner, make_groups, max_diff, tiny

# float32 comparisons between code paths: full-precision matmuls on an accelerator too (tests/accel.py)
pytestmark = pytest.mark.highest_precision

BUDGET = 12  # make_groups' replies are 2..11 tokens; rows are 16 long


def multi_turn(groups):
    """The same groups with every other trajectory's reply cut by a 2-token observation (mask 0 inside
    the sampled span, as a tool turn leaves it): the selected positions are not one contiguous window."""
    out = []
    for g in groups:
        trajs = []
        for i, t in enumerate(g.trajectories):
            if i % 2 and int(t.loss_mask.sum()) >= 6:
                mask = t.loss_mask.copy()
                j = int(np.flatnonzero(mask)[2])
                mask[j : j + 2] = 0
                mu = np.where(mask > 0, t.behaviour_logprobs, 0).astype(np.float32)
                t = dataclasses.replace(t, loss_mask=mask, behaviour_logprobs=mu)
            trajs.append(t)
        out.append(dataclasses.replace(g, trajectories=trajs))
    return out


def rows_of(groups):
    return [
        row_from_trajectory(
            t, advantage=0.3 * (i % 3) - 0.3, group_tokens=20.0, sample_id=t.trajectory_id
        )
        for i, t in enumerate(t for g in groups for t in g.trajectories)
    ]


def test_loss_positions_cover_every_masked_position_once():
    mask = np.zeros((3, 10), np.float32)
    mask[0, 6:9] = 1
    mask[1, [2, 3, 7]] = 1  # a multi-turn row: an observation between two replies
    sel = loss_positions(mask, 4)
    assert sel is not None and sel["select"].shape == (3, 4)
    for b in range(3):
        s = sel["select"][b]
        assert len(set(s)) == 4 and list(s) == sorted(s)
        assert set(np.flatnonzero(mask[b])) <= set(s)
    np.testing.assert_array_equal(sel["select_flat"], np.arange(3)[:, None] * 10 + sel["select"])
    assert loss_positions(mask, 2) is None  # a row has 3 masked positions: the full head
    assert loss_positions(mask, 10) is None  # nothing to save
    arrays = on_loss_positions(
        {"mask": mask, "mu": mask * 2.0, "tokens": np.zeros((3, 10), np.int32)}, sel
    )
    assert arrays["mask"].shape == arrays["mu"].shape == (3, 4) and arrays["tokens"].shape == (
        3,
        10,
    )
    np.testing.assert_array_equal(
        arrays["mask"].sum(axis=1), mask.sum(axis=1)
    )  # every loss position kept
    np.testing.assert_array_equal(arrays["mu"], 2.0 * arrays["mask"])
    gather = np.arange(30, dtype=np.int32).reshape(3, 10)[::-1].copy()
    np.testing.assert_array_equal(
        loss_positions(mask, 4, gather)["select_flat"],
        np.take_along_axis(gather, sel["select"], axis=1),
    )


def test_hidden_states_then_lm_logits_is_the_forward():
    lm = tiny()
    params = lm.model.flat_params()
    toks = jnp.asarray(np.random.default_rng(0).integers(3, 290, (2, 9)), jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(9, dtype=jnp.int32), (2, 9))
    full, _ = forward(lm.config, params, toks, pos)
    h = hidden_states(lm.config, params, toks, pos)
    np.testing.assert_allclose(
        np.asarray(lm_logits(lm.config, params, h[:, 3:6])),
        np.asarray(full[:, 3:6]),
        rtol=1e-6,
        atol=1e-6,
    )


CISPO_SEQ = dataclasses.replace(
    C.async_agentic(),
    policy=dataclasses.replace(C.async_agentic().policy, objective="cispo", ratio_level="sequence"),
)


@pytest.mark.parametrize(
    "loss,packed",
    [(C.grpo(), False), (C.grpo(), True), (CISPO_SEQ, True)],
    ids=["grpo_ref-padded", "grpo_ref-packed", "cispo_seq_entropy-packed"],
)
def test_loss_and_gradients_equal_the_full_head(loss, packed):
    """float32: the loss, every metric sum and every gradient of the selected-head path == the full head's
    on the same micro-batch (reference forward included for grpo; entropy bonus for cispo)."""
    if loss.entropy_coef == 0:
        loss = dataclasses.replace(loss, entropy_coef=0.01)  # the entropy path carries gradient too
    lm = tiny()
    params = lm.model.flat_params()
    ref = {k: v * 1.01 for k, v in params.items()}
    rows = rows_of(multi_turn(make_groups(2, seed=3)))
    mb = make_micro_batch(rows, 8, 16)
    base = {k: v for k, v in mb.arrays().items()}
    gather = None
    if packed:
        p = pack_rows(rows, 8, 16, quantum=1)
        assert p is not None
        base = {**{k: base[k] for k in ("mask", "mu", "advantages", "group_tokens")}, **p}
        gather = p["gather"]
    sel = loss_positions(mb.mask, BUDGET, gather)
    assert sel is not None
    loss_fn = build_loss_fn(lm.config, loss, LearnerConfig(fast_compile=True), None)
    fn = jax.jit(jax.value_and_grad(loss_fn, has_aux=True), compiler_options=FAST_COMPILE)
    (la, ma), ga = fn(params, None, {k: jnp.asarray(v) for k, v in base.items()}, ref)
    (lb, mb_), gb = fn(
        params, None, {k: jnp.asarray(v) for k, v in on_loss_positions(base, sel).items()}, ref
    )
    np.testing.assert_allclose(float(lb), float(la), rtol=1e-5, atol=1e-7)
    for k in ma:
        np.testing.assert_allclose(float(mb_[k]), float(ma[k]), rtol=1e-5, atol=1e-6, err_msg=k)
    assert float(ma["kl_sum"]) != 0.0 or loss.kl.beta == 0  # the reference path ran
    scale = max(float(jnp.max(jnp.abs(g))) for g in ga.values())
    assert max_diff(ga, gb) < 1e-5 * scale
    assert scale > 0


def test_learner_update_equals_the_full_head_and_falls_back_past_the_budget():
    """Whole SGD steps (grpo: KL reference in the loss): selected head == full head; a micro-batch whose
    rows outgrow the budget projects every position, is counted, and still trains the same."""
    groups = multi_turn(make_groups(2, seed=5))
    a = learner(C.grpo(), opt="sgd", loss_positions_only=False, max_response_len=BUDGET)
    b = learner(C.grpo(), opt="sgd", max_response_len=BUDGET)
    ra, rb = a.submit(groups), b.submit(groups)
    assert max_diff(a.trainable, b.trainable) < 1e-6
    for k in ("loss", "kl", "entropy", "ratio_mean", "clip_fraction", "grad_norm"):
        np.testing.assert_allclose(
            rb[0].metrics[k], ra[0].metrics[k], rtol=1e-5, atol=1e-7, err_msg=k
        )
    assert b.counts["full_head_micro_batches"] == 0
    c = learner(C.grpo(), opt="sgd", max_response_len=4)  # replies up to 11 tokens: past the budget
    rc = c.submit(groups)
    assert c.counts["full_head_micro_batches"] >= 1
    assert max_diff(a.trainable, c.trainable) < 1e-6
    np.testing.assert_allclose(rc[0].metrics["loss"], ra[0].metrics["loss"], rtol=1e-5)


def test_kl_reward_reference_forward_on_loss_positions_equals_full():
    kl = dataclasses.replace(C.grpo().kl, placement="reward", beta=0.5)
    loss = dataclasses.replace(C.grpo(), kl=kl)
    groups = make_groups(1, seed=7)
    a = learner(
        loss, opt="sgd", loss_positions_only=False, max_response_len=BUDGET, shared_prefix=False
    )
    b = learner(
        loss, opt="sgd", max_response_len=BUDGET, shared_prefix=False
    )  # the head alone differs
    np.testing.assert_allclose(
        b.scorer.shaped_rewards(groups[0]), a.scorer.shaped_rewards(groups[0]), rtol=1e-6, atol=1e-7
    )
    assert np.any(a.scorer.shaped_rewards(groups[0]) != groups[0].rewards)


def test_auto_skips_the_head_only_where_it_is_a_large_share():
    from gymllm.algos.learner import StreamingLearner
    from gymllm.algos.learner_config import HEAD_SHARE_AUTO, head_flops_share
    from gymllm.models.tiny import tiny_config
    from gymllm.models.transformer import init_params

    assert (
        learner().config.loss_positions_only is True
    )  # vocab 300 at d 32: the head is half the FLOPs
    medium = tiny_config(
        "qwen3",
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_layers=4,
        num_heads=8,
        num_kv_heads=4,
    )  # the peers' medium config: 0.10
    assert head_flops_share(medium) < HEAD_SHARE_AUTO
    assert StreamingLearner(medium, init_params(medium, 0)).config.loss_positions_only is False
    on = StreamingLearner(
        medium, init_params(medium, 0), config=LearnerConfig(loss_positions_only=True)
    )
    assert on.config.loss_positions_only is True  # an explicit choice stands
