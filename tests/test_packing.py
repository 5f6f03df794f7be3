"""Sequence packing in the learner: the packed path (segment ids, fewer rows) gives the same loss,
gradients and update as the padded path on a tiny model."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gymllm.algos import config as C
from gymllm.algos.batching import (
    first_fit_decreasing,
    make_micro_batch,
    pack_rows,
    row_from_trajectory,
)
from gymllm.algos.learner_config import LearnerConfig
from gymllm.algos.learner_programs import build_loss_fn
from gymllm.errors import ConfigError
from test_learner import learner, make_groups, max_diff, tiny


def rows_of(groups):
    return [
        row_from_trajectory(
            t, advantage=0.3 * (i % 3) - 0.3, group_tokens=20.0, sample_id=t.trajectory_id
        )
        for i, t in enumerate(t for g in groups for t in g.trajectories)
    ]


def test_first_fit_decreasing_fills_bins_within_capacity():
    bins = first_fit_decreasing([9, 3, 7, 5, 1, 16], 16)
    assert sorted(i for b in bins for i in b) == list(range(6))
    assert all(sum([9, 3, 7, 5, 1, 16][i] for i in b) <= 16 for b in bins)
    assert len(bins) == 3  # 16 | 9+7 | 5+3+1
    with pytest.raises(ConfigError, match="packed length"):
        first_fit_decreasing([17], 16)


def test_pack_rows_gathers_back_to_the_padded_layout():
    rows = rows_of(make_groups(2))
    mb = make_micro_batch(rows, 8, 16)
    p = pack_rows(rows, 8, 16, quantum=1)
    assert p is not None and p["packed_tokens"].shape[0] < 8
    for i, r in enumerate(rows):
        n = r.length
        np.testing.assert_array_equal(
            p["packed_tokens"].reshape(-1)[p["gather"][i, :n]], mb.tokens[i, :n]
        )
        np.testing.assert_array_equal(
            p["packed_targets"].reshape(-1)[p["gather"][i, :n]], mb.targets[i, :n]
        )
        np.testing.assert_array_equal(
            p["packed_positions"].reshape(-1)[p["gather"][i, :n]], np.arange(n)
        )
        assert (
            len(set(p["segment_ids"].reshape(-1)[p["gather"][i, :n]])) == 1
        )  # one segment per sequence
    assert (
        pack_rows(rows, 8, 16, quantum=8) is None
    )  # 8 packed rows: no fewer than padded, so not packed


@pytest.mark.parametrize("loss", [C.grpo(), C.async_agentic()], ids=["grpo", "async_agentic"])
def test_packed_loss_and_gradients_equal_padded(loss):
    """The loss function on packed arrays (reference forward included for grpo) == on padded arrays."""
    lm = tiny()
    params = lm.model.flat_params()
    ref = {k: v * 1.01 for k, v in params.items()}  # a reference that differs from the policy
    rows = rows_of(make_groups(2, seed=3))
    mb = make_micro_batch(rows, 8, 16)
    padded = {k: jnp.asarray(v) for k, v in mb.arrays().items()}
    packed = dict(pack_rows(rows, 8, 16, quantum=1))
    packed.update({k: padded[k] for k in ("mask", "mu", "advantages", "group_tokens")})
    loss_fn = build_loss_fn(lm.config, loss, LearnerConfig(fast_compile=True), None)
    fn = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))
    (la, ma), ga = fn(params, None, padded, ref)
    (lb, mb_), gb = fn(params, None, {k: jnp.asarray(v) for k, v in packed.items()}, ref)
    np.testing.assert_allclose(float(la), float(lb), rtol=1e-5, atol=1e-6)
    for k in ma:
        np.testing.assert_allclose(float(ma[k]), float(mb_[k]), rtol=1e-5, atol=1e-5, err_msg=k)
    assert float(ma["kl_sum"]) != 0.0 or loss.kl.beta == 0  # the reference path was exercised
    assert max_diff(ga, gb) < 1e-5 * max(1.0, max(float(jnp.max(jnp.abs(g))) for g in ga.values()))


def test_packed_learner_step_equals_padded():
    """A whole SGD step with packing on == off (GSPO sequence ratios: per-sequence means stay exact)."""
    loss = dataclasses.replace(
        C.grpo(), policy=dataclasses.replace(C.grpo().policy, ratio_level="sequence")
    )
    groups = make_groups(2, seed=5)
    a, b = learner(loss, opt="sgd", packing=False), learner(loss, opt="sgd", packing=True)
    ra, rb = a.submit(groups), b.submit(groups)
    assert b.counts["packed_micro_batches"] == 1 and a.counts["packed_micro_batches"] == 0
    assert max_diff(a.trainable, b.trainable) < 1e-6
    for k in ("loss", "kl", "entropy", "ratio_mean", "clip_fraction", "grad_norm"):
        np.testing.assert_allclose(
            ra[0].metrics[k], rb[0].metrics[k], rtol=1e-4, atol=1e-6, err_msg=k
        )


COMPILES: list[str] = []  # the names of the functions XLA compiled
jax.monitoring.register_event_duration_secs_listener(
    lambda event, duration, fun_name="", **_: (
        COMPILES.append(fun_name) if event == "/jax/core/compile/backend_compile_duration" else None
    )
)


def test_packed_warmup_compiles_every_shape_a_step_runs():
    """After ``warmup()`` a packed step compiles no gradient program: every packed row count was compiled ahead."""
    ln = learner(
        C.async_agentic(), opt="sgd", packing=True, pack_row_steps=4
    )  # packed rows 2, 4, 6
    ln.warmup(group_size=4)
    before = len(COMPILES)
    ln.submit(make_groups(2, seed=0))
    ln.submit(make_groups(2, seed=1, version=1))
    assert ln.counts["packed_micro_batches"] == 2
    assert "jit(grad)" not in COMPILES[before:], COMPILES[before:]


MESH_SCRIPT = """
import jax, jax.numpy as jnp
from gymllm.algos import config as C
from gymllm.algos.learner import StreamingLearner
from gymllm.algos.learner_config import LearnerConfig
from gymllm.algos.optim import OptimizerConfig
from gymllm.algos.sharding import ShardingConfig, make_mesh
from test_learner import tiny, make_groups
lm = tiny()
def run(mesh, packing):
    ln = StreamingLearner(lm.config, lm.model.flat_params(), loss=C.grpo(), mesh=mesh,
                          optimizer=OptimizerConfig(name="sgd", learning_rate=1e-2, max_grad_norm=0.0),
                          config=LearnerConfig(groups_per_step=2, micro_batch_size=8, max_len=32, min_bucket=32,
                                               fast_compile=True, packing=packing))
    ln.submit(make_groups(2, seed=0))
    return ln
a, b = run(None, False), run(make_mesh(ShardingConfig(data=2, fsdp=2)), True)
diff = max(float(jnp.max(jnp.abs(a.trainable[k] - jax.device_get(b.trainable[k])))) for k in a.trainable)
moved = max(float(jnp.max(jnp.abs(a.trainable[k] - lm.model.flat_params()[k]))) for k in a.trainable)
print("RESULT", b.pack_quantum, b.counts["packed_micro_batches"], diff, moved)
"""


@pytest.mark.slow
def test_packed_step_on_a_four_device_mesh_equals_padded_on_one():
    """Packed rows come in multiples of the mesh's devices and the gather crosses shards: same update."""
    import os
    import subprocess
    import sys

    env = dict(
        os.environ,
        XLA_FLAGS="--xla_force_host_platform_device_count=4",
        JAX_PLATFORMS="cpu",
        PYTHONPATH=os.pathsep.join(
            [
                os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                os.path.dirname(os.path.abspath(__file__)),
            ]
        ),
    )
    p = subprocess.run(
        [sys.executable, "-c", MESH_SCRIPT], env=env, capture_output=True, text=True, timeout=600
    )
    assert p.returncode == 0, p.stderr[-4000:]
    quantum, packed, diff, moved = p.stdout.strip().splitlines()[-1].split()[1:]
    assert int(quantum) == 4 and int(packed) == 1
    assert float(moved) > 1e-4 and float(diff) < 1e-6
