"""Sharded learner on a (data, fsdp) mesh of 4 host CPU devices == the single-device learner.

Runs in a subprocess with ``XLA_FLAGS=--xla_force_host_platform_device_count=4`` so the rest of the
suite keeps one device."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import json
    import jax, jax.numpy as jnp, numpy as np
    from gymllm.algos import config as C
    from gymllm.algos.learner import LearnerConfig, StreamingLearner
    from gymllm.algos.optim import OptimizerConfig
    from gymllm.algos.sharding import ShardingConfig, make_mesh
    from gymllm.models import make_tiny
    import sys

    assert len(jax.devices()) == 4, jax.devices()
    lm = make_tiny("qwen3", seed=0, vocab_size=300, hidden_size=32, intermediate_size=64, num_layers=1)
    rng = np.random.default_rng(0)

    sys.path.insert(0, TESTS_DIR)
    from synthetic_groups import groups

    def run(sharding, loss, opt):
        mesh = make_mesh(sharding)
        lrn = StreamingLearner(lm.config, lm.model.flat_params(), loss=loss, mesh=mesh,
                               optimizer=OptimizerConfig(name=opt, learning_rate=1e-2, max_grad_norm=1.0),
                               config=LearnerConfig(groups_per_step=2, micro_batch_size=4, max_len=16, min_bucket=16,
                                                    fast_compile=True))
        losses = [r.metrics["loss"] for s in range(2) for r in lrn.submit(groups(2, s))]
        return lrn, losses

    import sys
    full = sys.argv[1] == "full"
    out = {}
    cases = (("async_agentic", C.async_agentic(), "adamw"), ("grpo", C.grpo(), "sgd"))
    for name, loss, opt in cases if full else cases[:1]:
        one, l1 = run(ShardingConfig(), loss, opt)
        for shape in ((2, 2), (4, 1)) if full else ((2, 2),):
            four, l4 = run(ShardingConfig(data=shape[0], fsdp=shape[1]), loss, opt)
            diff = max(float(jnp.max(jnp.abs(one.trainable[k] - jax.device_get(four.trainable[k]))))
                       for k in one.trainable)
            moved = max(float(jnp.max(jnp.abs(one.trainable[k] - lm.model.flat_params()[k]))) for k in one.trainable)
            specs = {str(v.sharding.spec) for v in four.trainable.values()}
            devices = {len(v.sharding.device_set) for v in four.trainable.values()}
            out[f"{name}/{shape}"] = dict(diff=diff, moved=moved, l1=l1, l4=l4, specs=sorted(specs),
                                         devices=sorted(devices))
    print("RESULT " + json.dumps(out))
""").replace("TESTS_DIR", repr(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("variant", ["quick", pytest.param("full", marks=pytest.mark.slow)])
def test_four_devices_equal_one_device(variant):
    """quick: async_agentic + AdamW on a 2 x 2 (data x fsdp) mesh; full (slow tier): also GRPO with its
    reference model (KL) + SGD, and a 4 x 1 data-parallel mesh."""
    env = dict(
        os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu"
    )
    p = subprocess.run(
        [sys.executable, "-c", SCRIPT, variant],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert p.returncode == 0, p.stderr[-4000:]
    import json

    out = json.loads(p.stdout.strip().splitlines()[-1][len("RESULT ") :])
    for key, r in out.items():
        assert r["moved"] > 1e-4, key
        assert r["diff"] < 1e-3 * r["moved"] + 1e-6, (key, r)
        assert all(abs(a - b) < 1e-5 + 1e-4 * abs(a) for a, b in zip(r["l1"], r["l4"])), (key, r)
        assert r["devices"] == [4], key  # every array lives on the 4-device mesh
        if key.endswith("(2, 2)"):
            assert any("fsdp" in s for s in r["specs"]), r[
                "specs"
            ]  # parameters really are FSDP-sharded
