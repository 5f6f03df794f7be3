"""The shared-prefix forward (``gymllm.models.shared_prefix``, ``LearnerConfig.shared_prefix``): each
group's prompt runs once, its samples attend to the prompt's keys/values, and the logits, the loss,
every metric and every gradient equal the flat forward's on the concatenated rows."""

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
    prompt_length,
    row_from_trajectory,
    shared_prefix_layout,
    shared_prefix_table,
)
from gymllm.algos.learner import StreamingLearner
from gymllm.algos.learner_programs import FAST_COMPILE, build_loss_fn
from gymllm.algos.learner_config import LearnerConfig
from gymllm.algos.optim import OptimizerConfig
from gymllm.errors import ConfigError
from gymllm.models import make_tiny
from gymllm.models.shared_prefix import shared_prefix_logits
from gymllm.models.transformer import forward
from gymllm.types import Group, Trajectory
from test_learner import max_diff, tiny

MAX_LEN = 32


@pytest.mark.parametrize("family", ["gemma3", pytest.param("qwen2", marks=pytest.mark.slow)])
def test_logits_equal_the_flat_forward(family):
    """float32, prompts padded to different lengths: every real token's logits == the flat forward's on
    prompt + continuation. gemma3: sliding window 8 (rows run past it), qk-norm, softcap-free scaling,
    post norms; qwen2: attention biases."""
    lm = make_tiny(
        family, seed=1, vocab_size=300, hidden_size=32, intermediate_size=64, num_layers=2
    )
    cfg, params = lm.config, lm.model.flat_params()
    rng = np.random.default_rng(0)
    gp, s, tp, ts = 2, 3, 8, 10
    lens, cont = np.array([5, 8]), rng.integers(1, ts + 1, (gp, s))
    pre, suf = np.zeros((gp, tp), np.int32), np.zeros((gp, s, ts), np.int32)
    flat = np.zeros(
        (gp * s, tp + ts), np.int32
    )  # the same rows, right-padded, for one flat forward
    for g in range(gp):
        pre[g, : lens[g]] = rng.integers(3, 290, lens[g])
        for j in range(s):
            suf[g, j, : cont[g, j]] = rng.integers(3, 290, cont[g, j])
            flat[g * s + j, : lens[g] + cont[g, j]] = np.r_[
                pre[g, : lens[g]], suf[g, j, : cont[g, j]]
            ]
    jit = lambda f: jax.jit(f, compiler_options=FAST_COMPILE)  # noqa: E731
    lp, ls = jit(lambda p, *a: shared_prefix_logits(cfg, p, *a))(params, pre, lens, suf)
    ref, _ = jit(lambda p, t: forward(cfg, p, t, jnp.broadcast_to(jnp.arange(tp + ts), t.shape)))(
        params, flat
    )
    ref, lp, ls = np.asarray(ref), np.asarray(lp), np.asarray(ls)
    assert np.abs(ref).max() > 0.5
    for g in range(gp):
        for j in range(s):
            n, m = lens[g], cont[g, j]
            np.testing.assert_allclose(lp[g, :n], ref[g * s + j, :n], rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(
                ls[g, j, :m], ref[g * s + j, n : n + m], rtol=1e-5, atol=1e-5
            )


def groups_with(prompt_lens=(20, 17), g=4, *, seed=0, differ=False, differ_from=None, turns=False):
    """GRPO groups with prompts long enough that sharing them pays (rows <= 32 tokens); ``differ``: the
    samples of a group get prompts that differ in one token; ``differ_from``: every sample's prompt is
    its own from that token on (a game dealt differently after the same rules; a shorter prompt stays
    whole); ``turns``: every other
    sample has a 2-token observation (mask 0) inside its reply."""
    rng = np.random.default_rng(seed)
    out = []
    for k, plen in enumerate(prompt_lens):
        prompt = rng.integers(3, 290, plen)
        trajs = []
        for m in range(g):
            p = prompt.copy()
            if differ:
                p[m % plen] = 3 + (p[m % plen] + m) % 280
            if differ_from is not None and differ_from < plen:
                p[differ_from:] = rng.integers(3, 290, plen - differ_from)
            resp = rng.integers(3, 290, int(rng.integers(2, MAX_LEN - plen)))
            ids = np.concatenate([p, resp]).astype(np.int32)
            mask = np.r_[np.zeros(plen), np.ones(len(resp))].astype(np.int8)
            if turns and m % 2 and len(resp) >= 6:
                mask[plen + 2 : plen + 4] = 0
            mu = np.where(mask > 0, -5.7 + rng.normal(0, 0.3, len(ids)), 0).astype(np.float32)
            trajs.append(
                Trajectory(
                    token_ids=ids,
                    loss_mask=mask,
                    behaviour_logprobs=mu,
                    versions=np.where(mask > 0, 0, -1).astype(np.int32),
                    reward=float(rng.random()),
                    trajectory_id=f"{seed}/{k}/{m}",
                    group_id=f"{seed}/{k}",
                )
            )
        out.append(
            Group(group_id=f"{seed}/{k}", task_id="t", trajectories=trajs, admitted_version=0)
        )
    return out


def rows_of(groups):
    return [
        row_from_trajectory(
            t, advantage=0.4 * (i % 3) - 0.4, group_tokens=40.0, sample_id=t.trajectory_id
        )
        for i, t in enumerate(t for g in groups for t in g.trajectories)
    ]


def test_layout_groups_rows_by_prompt_ids():
    rows = rows_of(groups_with(turns=True))
    assert [prompt_length(r) for r in rows] == [20] * 4 + [17] * 4  # up to the first sampled target
    rows = rows[:6]  # the second group split: two of its samples only
    sp = shared_prefix_layout(rows, 8, MAX_LEN, shared_prefix_table(MAX_LEN))
    assert sp is not None
    # prompts of 20 and 17 cut to 16 (2*16 + 2*4*16 positions) rather than padded to 32 (2*32 + 2*4*16)
    assert sp["sp_prefix_tokens"].shape == (2, 16) and sp["sp_suffix_tokens"].shape == (2, 4, 16)
    np.testing.assert_array_equal(sp["sp_prefix_lens"], [16, 16])
    assert_reads_back(sp, rows)
    differ = rows_of(groups_with(differ=True))
    assert (
        shared_prefix_layout(differ, 8, MAX_LEN, shared_prefix_table(MAX_LEN)) is None
    )  # nothing shared


def assert_reads_back(sp, rows):
    """Every padded position of every row reads its own input token back through ``sp_gather``."""
    flat = np.concatenate([sp["sp_prefix_tokens"].reshape(-1), sp["sp_suffix_tokens"].reshape(-1)])
    for i, r in enumerate(rows):
        np.testing.assert_array_equal(flat[sp["sp_gather"][i, : r.length]], r.inputs)
        np.testing.assert_array_equal(sp["sp_targets"][i, : r.length], r.targets)


def test_a_groups_rows_share_their_common_prefix_when_their_prompts_differ():
    """Self-play's shape: one group's games are dealt differently, so its rows' prompts agree on the rules
    (the first 14 tokens here) and differ after; they share those 14 tokens. Without group indices the
    same rows share nothing (no two prompts are equal)."""
    groups = groups_with((20, 17), differ_from=14, seed=4)
    rows = rows_of(groups)
    assert len({r.inputs[: prompt_length(r)].tobytes() for r in rows}) == 8  # every prompt its own
    table = shared_prefix_table(MAX_LEN)
    assert shared_prefix_layout(rows, 8, MAX_LEN, table) is None
    for r in rows:
        r.group_index = int(r.sample_id.split("/")[1])
    sp = shared_prefix_layout(rows, 8, MAX_LEN, table)
    assert sp is not None
    np.testing.assert_array_equal(sp["sp_prefix_lens"], [14, 14])
    assert sp["sp_prefix_tokens"].shape == (2, 16) and sp["sp_suffix_tokens"].shape == (2, 4, 16)
    assert_reads_back(sp, rows)
    # one group of the two alone: a cluster of four
    sp = shared_prefix_layout(rows[:4], 4, MAX_LEN, table)
    assert sp["sp_prefix_tokens"].shape == (1, 16) and sp["sp_suffix_tokens"].shape == (1, 4, 16)
    assert_reads_back(sp, rows[:4])


def test_a_group_member_that_shares_nothing_does_not_spoil_the_others_prompt():
    """One row of a group whose prompt differs from its first token (a one-row-per-call fallback row, say):
    clustered by group the common prefix would be empty, so the prompt ids alone decide and the other
    three still share their 20-token prompt."""
    rows = rows_of(groups_with((20,), seed=5))
    for r in rows:
        r.group_index = 0
    rows[3].inputs = rows[3].inputs.copy()
    rows[3].inputs[0] = 3 + (rows[3].inputs[0] + 1) % 280
    sp = shared_prefix_layout(rows, 8, MAX_LEN, shared_prefix_table(MAX_LEN))
    assert sp is not None
    assert sp["sp_prefix_lens"].tolist() == [
        16,
        16,
    ]  # two clusters: the three alike, then the odd one
    assert sp["sp_suffix_tokens"].shape == (2, 3, 16)
    assert_reads_back(sp, rows)


LOSSES = [
    dataclasses.replace(C.grpo(), entropy_coef=0.01),  # KL reference in the loss + entropy bonus
    dataclasses.replace(
        C.async_agentic(),
        policy=dataclasses.replace(C.async_agentic().policy, ratio_level="sequence"),
    ),
]


@pytest.mark.parametrize(
    "head_on_loss_positions",
    [pytest.param(False, marks=pytest.mark.slow), True],
    ids=["full-head", "loss-positions"],
)
def test_loss_metrics_and_gradients_equal_the_flat_path(head_on_loss_positions):
    """float32, a GRPO micro-batch (two groups, one multi-turn sample in each): the shared-prefix path's
    loss, metric sums and every gradient == the flat path's, reference forward included."""
    loss = LOSSES[0]
    lm = tiny()
    params = lm.model.flat_params()
    ref = {k: v * 1.01 for k, v in params.items()}
    rows = rows_of(groups_with(turns=True, seed=1))
    mb = make_micro_batch(rows, 8, MAX_LEN)
    flat = mb.arrays()
    sp = shared_prefix_layout(rows, 8, MAX_LEN, shared_prefix_table(MAX_LEN))
    assert sp is not None
    shared = {**{k: flat[k] for k in ("mask", "mu", "advantages", "group_tokens")}, **sp}
    if head_on_loss_positions:
        flat = on_loss_positions(flat, loss_positions(mb.mask, 24))
        shared = on_loss_positions(shared, loss_positions(mb.mask, 24, sp["sp_gather"]))
        assert "sp_gather" not in shared and shared["sp_targets"].shape == (8, 24)
    loss_fn = build_loss_fn(lm.config, loss, LearnerConfig(fast_compile=True), None)
    fn = jax.jit(jax.value_and_grad(loss_fn, has_aux=True), compiler_options=FAST_COMPILE)
    (la, ma), ga = fn(params, None, {k: jnp.asarray(v) for k, v in flat.items()}, ref)
    (lb, mb_), gb = fn(params, None, {k: jnp.asarray(v) for k, v in shared.items()}, ref)
    np.testing.assert_allclose(float(lb), float(la), rtol=1e-5, atol=1e-7)
    for k in ma:
        np.testing.assert_allclose(float(mb_[k]), float(ma[k]), rtol=1e-5, atol=1e-6, err_msg=k)
    assert (
        float(ma["kl_sum"]) != 0.0 and float(ma["entropy_sum"]) > 0
    )  # the reference and entropy paths ran
    scale = max(float(jnp.max(jnp.abs(g))) for g in ga.values())
    assert scale > 0 and max_diff(ga, gb) < 1e-5 * scale


def learner(loss=LOSSES[1], **kw):
    lm = tiny()
    cfg = dict(
        groups_per_step=2,
        micro_batch_size=8,
        num_steps=10,
        max_len=MAX_LEN,
        min_bucket=16,
        fast_compile=True,
    )
    cfg.update(kw)
    return StreamingLearner(
        lm.config,
        lm.model.flat_params(),
        loss=loss,
        optimizer=OptimizerConfig(name="sgd", learning_rate=1e-2, max_grad_norm=0.0),
        config=LearnerConfig(**cfg),
    )


@pytest.mark.parametrize(
    "differ", ["no", "early", "late"], ids=["shared", "fallback", "group-prefix"]
)
def test_learner_update_equals_the_flat_path(differ):
    """Whole SGD steps, 3 groups of 4 in micro-batches of 4: shared prefix on == off (sequence-level ratios:
    per-row sums over the gathered layout), each micro-batch one whole group (rows of two groups would
    share nothing worth running); samples whose prompts differ in one of their first tokens take the flat
    path, and still train the same; samples whose prompts differ from token 18 on (a game dealt apart)
    share their group's first 18 tokens."""
    groups = groups_with(
        (20, 17, 20),
        differ=differ == "early",
        differ_from=18 if differ == "late" else None,
        seed=2,
    )
    kw = dict(groups_per_step=3, micro_batch_size=4)
    a, b = learner(shared_prefix=False, **kw), learner(shared_prefix=True, **kw)
    ra, rb = a.submit(groups), b.submit(groups)
    assert b.counts["shared_prefix_micro_batches"] == (0 if differ == "early" else 3)
    assert a.counts["shared_prefix_micro_batches"] == 0
    assert max_diff(a.trainable, tiny().model.flat_params()) > 1e-5
    assert max_diff(a.trainable, b.trainable) < 1e-6
    for k in ("loss", "entropy", "ratio_mean", "clip_fraction", "grad_norm"):
        np.testing.assert_allclose(
            rb[0].metrics[k], ra[0].metrics[k], rtol=1e-5, atol=1e-7, err_msg=k
        )


def test_kl_reward_reference_forward_equals_the_flat_path():
    """The reward-placement reference forward (a group's rows, one micro-batch) runs shared too."""
    loss = dataclasses.replace(
        C.grpo(), kl=dataclasses.replace(C.grpo().kl, placement="reward", beta=0.5)
    )
    group = groups_with(seed=3)[0]
    a, b = learner(loss, shared_prefix=False), learner(loss, shared_prefix=True)
    ra, rb = a.scorer.shaped_rewards(group), b.scorer.shaped_rewards(group)
    assert np.any(ra != group.rewards)
    assert (
        a.counts["shared_prefix_reference_batches"],
        b.counts["shared_prefix_reference_batches"],
    ) == (0, 1)
    np.testing.assert_allclose(rb, ra, rtol=1e-5, atol=1e-6)


def test_config_rejects_a_non_bool():
    with pytest.raises(ConfigError, match="shared_prefix"):
        LearnerConfig(shared_prefix="yes")


MESH_SCRIPT = """
import jax, jax.numpy as jnp
from gymllm.algos.learner import StreamingLearner
from gymllm.algos.learner_config import LearnerConfig
from gymllm.algos.optim import OptimizerConfig
from gymllm.algos.sharding import ShardingConfig, make_mesh
from test_learner import tiny
from test_shared_prefix import LOSSES, groups_with
lm = tiny()
def run(mesh, shared, groups):
    ln = StreamingLearner(lm.config, lm.model.flat_params(), loss=LOSSES[0], mesh=mesh,
                          optimizer=OptimizerConfig(name="sgd", learning_rate=1e-2, max_grad_norm=0.0),
                          config=LearnerConfig(groups_per_step=len(groups), micro_batch_size=4 * len(groups),
                                               max_len=32, min_bucket=16, fast_compile=True, shared_prefix=shared))
    ln.submit(groups)
    return ln
out = []
for n in (4, 2):  # 4 prompts split over 4 devices; 2 prompts do not: the flat path
    groups = groups_with((20, 17, 20, 17)[:n], seed=4)
    a, b = run(None, False, groups), run(make_mesh(ShardingConfig(data=2, fsdp=2)), True, groups)
    diff = max(float(jnp.max(jnp.abs(a.trainable[k] - jax.device_get(b.trainable[k])))) for k in a.trainable)
    moved = max(float(jnp.max(jnp.abs(a.trainable[k] - lm.model.flat_params()[k]))) for k in a.trainable)
    out += [b.counts["shared_prefix_micro_batches"], diff, moved]
print("RESULT", *out)
"""


@pytest.mark.slow
def test_shared_step_on_a_four_device_mesh_equals_flat_on_one():
    """Prompts split over the mesh's devices: the same update as the flat rows on one device; a layout
    whose prompts do not split evenly takes the flat path."""
    import os
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(
        os.environ,
        XLA_FLAGS="--xla_force_host_platform_device_count=4",
        JAX_PLATFORMS="cpu",
        PYTHONPATH=os.pathsep.join([os.path.dirname(here), here]),
    )
    p = subprocess.run(
        [sys.executable, "-c", MESH_SCRIPT], env=env, capture_output=True, text=True, timeout=600
    )
    assert p.returncode == 0, p.stderr[-4000:]
    shared4, diff4, moved4, shared2, diff2, moved2 = map(
        float, p.stdout.strip().splitlines()[-1].split()[1:]
    )
    assert (shared4, shared2) == (1, 0)
    assert moved4 > 1e-4 and diff4 < 1e-6 and moved2 > 1e-4 and diff2 < 1e-6
