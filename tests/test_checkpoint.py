"""Orbax checkpoints: a learner round-trips exactly, and a run stopped mid-way then resumed from its
checkpoint trains the same samples to the same parameters as an uninterrupted run (eta = 0)."""

from __future__ import annotations

import dataclasses

import jax
import pytest
import numpy as np

from gymllm.algos import config as C
from gymllm.algos.checkpoint import Checkpointer
from gymllm.algos.learner import StreamingLearner
from gymllm.algos.learner_config import LearnerConfig
from gymllm.algos.optim import OptimizerConfig
from gymllm.train.trainer import train
from gymllm.inference.config import EngineConfig
from gymllm.train.train_config import EnvSection, ModelSection, RunSection, TrainConfig
from gymllm.rollout.config import RolloutConfig
from gymllm.inference.params import SamplingParams


def small_config(run_dir, *, steps=3, every=1) -> TrainConfig:
    return TrainConfig(
        model=ModelSection(
            name="tiny-qwen3", vocab_size=300, hidden_size=32, intermediate_size=64, num_layers=1
        ),
        env=EnvSection(id="gymllm/TinyRepeat-v0", kwargs={"num_letters": 2}, num_envs=8),
        engine=EngineConfig(
            num_slots=8, max_len=64, min_bucket=64, prefix_reuse=False, decode_chunk=8
        ),
        sampling=SamplingParams(max_tokens=4),
        rollout=RolloutConfig(group_size=4, max_concurrency=8, max_staleness=0, max_model_calls=1),
        loss=dataclasses.replace(C.async_agentic(), shaping=C.ShapingConfig()),
        optimizer=OptimizerConfig(learning_rate=1e-2),
        learner=LearnerConfig(
            groups_per_step=2,
            micro_batch_size=8,
            num_steps=steps,
            max_len=64,
            min_bucket=64,
            fast_compile=True,
        ),
        run=RunSection(run_dir=str(run_dir), console=False, report=False, checkpoint_every=every),
    )


def restored(run_dir):
    import orbax.checkpoint as ocp

    ck = Checkpointer(run_dir / "checkpoints")
    out = ck.manager.restore(
        ck.latest_step(),
        args=ocp.args.Composite(state=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore()),
    )
    ck.close()
    return out["state"], out["meta"]


def test_resume_after_stop_equals_uninterrupted_run(tmp_path):
    full = train(small_config(tmp_path / "full"))
    part = train(
        small_config(tmp_path / "resumed"), max_steps=1
    )  # "killed" after step 1's checkpoint
    assert part.steps == 1 and part.resumed_from is None
    rest = train(small_config(tmp_path / "resumed"))
    assert rest.resumed_from == 1 and rest.steps == 3
    assert (
        rest.counts["resume_skipped"] == 2
    )  # the 2 groups trained before the stop were not trained again
    trained = [sorted(ids) for ids in part.trained_ids + rest.trained_ids]
    assert trained == [sorted(ids) for ids in full.trained_ids]
    (sf, mf), (sr, mr) = restored(full.run_dir), restored(rest.run_dir)
    assert mf["version"] == mr["version"] == 3 and mf["consumed_groups"] == mr["consumed_groups"]
    for k in sf["trainable"]:
        np.testing.assert_allclose(sf["trainable"][k], sr["trainable"][k], atol=2e-4, err_msg=k)
    np.testing.assert_allclose(full.rewards(), part.rewards() + rest.rewards(), atol=1e-6)


def test_learner_state_round_trips_exactly(tmp_path):
    from gymllm.models import make_tiny

    lm = make_tiny(
        "qwen3", seed=0, vocab_size=300, hidden_size=32, intermediate_size=64, num_layers=1
    )

    def mk():
        return StreamingLearner(
            lm.config,
            lm.model.flat_params(),
            loss=C.async_agentic(),
            optimizer=OptimizerConfig(learning_rate=1e-2),
            config=LearnerConfig(groups_per_step=1, micro_batch_size=8, max_len=16, min_bucket=16),
        )

    a = mk()
    a.version = 7
    a.consumed_groups = {"g1", "g2"}
    a.counts["filtered_groups"] = 3
    a.trainable = jax.tree.map(lambda x: x + 0.5, a.trainable)
    ck = Checkpointer(tmp_path / "ck")
    ck.save(7, a, extra={"rng": np.random.default_rng(3).bit_generator.state})
    b = mk()
    meta = ck.restore_latest(b)
    ck.close()
    assert b.version == 7 and b.consumed_groups == {"g1", "g2"} and b.counts["filtered_groups"] == 3
    g = np.random.default_rng(0)
    g.bit_generator.state = meta["rng"]
    assert g.random() == np.random.default_rng(3).random()
    for k in a.trainable:
        np.testing.assert_array_equal(a.trainable[k], b.trainable[k])
    assert jax.tree.structure(a.opt_state) == jax.tree.structure(b.opt_state)


KILL_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from test_checkpoint import small_config
from gymllm.train.trainer import train
train(small_config({run_dir!r}, steps=3))
"""


@pytest.mark.slow
def test_resume_after_sigkill_equals_uninterrupted_run(tmp_path):
    """A real kill: a training process is SIGKILLed after its second checkpoint; the resumed run
    trains exactly the groups the uninterrupted run trained, to the same parameters."""
    import json
    import os
    import pathlib
    import signal
    import subprocess
    import sys
    import time

    full = train(small_config(tmp_path / "full"))
    run_dir = tmp_path / "killed"
    script = KILL_SCRIPT.format(tests=str(pathlib.Path(__file__).parent), run_dir=str(run_dir))
    proc = subprocess.Popen(
        [sys.executable, "-c", script], env=dict(os.environ, JAX_PLATFORMS="cpu")
    )
    try:
        deadline = time.time() + 600
        while time.time() < deadline and proc.poll() is None:
            ck = run_dir / "checkpoints"
            if ck.is_dir() and any(p.name == "2" for p in ck.iterdir()):
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the run finished before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    rest = train(small_config(run_dir))
    assert rest.resumed_from in (1, 2) and rest.steps == 3
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trained = {
        i
        for line in (run_dir / "trajectories.jsonl").read_text().splitlines()
        for i in [json.loads(line)["trajectory_id"]]
    }
    assert trained == {i for ids in full.trained_ids for i in ids}
    assert [r["step"] for r in rows][-len(rest.history) :] == [h["step"] for h in rest.history]
    (sf, _), (sr, _) = restored(full.run_dir), restored(rest.run_dir)
    for k in sf["trainable"]:
        np.testing.assert_allclose(sf["trainable"][k], sr["trainable"][k], atol=2e-4, err_msg=k)
