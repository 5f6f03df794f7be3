"""The trainer entry point end to end on a tiny model: run-dir contents, eta = 0 == synchronous
training for fixed seeds, config validation, and CLI (tyro) compatibility of TrainConfig."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from gymllm.algos import config as C
from gymllm.algos.learner_config import LearnerConfig
from gymllm.algos.optim import OptimizerConfig
from gymllm.train.trainer import train
from gymllm.inference.config import EngineConfig
from gymllm.train.train_config import EnvSection, ModelSection, RunSection, TrainConfig, preset
from gymllm.rollout.config import RolloutConfig
from gymllm.inference.params import SamplingParams
from gymllm.errors import ConfigError

NO_FILTER = dataclasses.replace(C.async_agentic(), shaping=C.ShapingConfig())


def small_config(run_dir, *, eta=0, mode="async", steps=3, **run_kw) -> TrainConfig:
    """Tiny model (d 32, 1 layer), G 4, 2 groups per step, 4 new tokens; deterministic engine settings."""
    return TrainConfig(
        model=ModelSection(
            name="tiny-qwen3", vocab_size=300, hidden_size=32, intermediate_size=64, num_layers=1
        ),
        env=EnvSection(id="gymllm/TinyRepeat-v0", kwargs={"num_letters": 2}, num_envs=8),
        engine=EngineConfig(
            num_slots=8, max_len=64, min_bucket=64, prefix_reuse=False, decode_chunk=8
        ),
        sampling=SamplingParams(max_tokens=4),
        rollout=RolloutConfig(
            group_size=4, max_concurrency=8, max_staleness=eta, max_model_calls=1, mode=mode
        ),
        loss=NO_FILTER,
        optimizer=OptimizerConfig(learning_rate=1e-2),
        learner=LearnerConfig(
            groups_per_step=2,
            micro_batch_size=8,
            num_steps=steps,
            max_len=64,
            min_bucket=64,
            fast_compile=True,
        ),
        run=RunSection(run_dir=str(run_dir), console=False, **{"report": False, **run_kw}),
    )


def final_params(run_dir):
    from gymllm.algos.checkpoint import Checkpointer

    import orbax.checkpoint as ocp

    ck = Checkpointer(run_dir / "checkpoints")
    step = ck.latest_step()
    out = ck.manager.restore(
        step, args=ocp.args.Composite(state=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore())
    )
    ck.close()
    return out["state"]["trainable"], out["meta"]


def test_eta_zero_equals_synchronous_training(tmp_path):
    a = train(small_config(tmp_path / "async", eta=0, mode="async", steps=2))
    b = train(small_config(tmp_path / "sync", eta=0, mode="sync", steps=2))
    assert a.steps == b.steps == 2
    assert [sorted(x) for x in a.trained_ids] == [sorted(x) for x in b.trained_ids]
    np.testing.assert_allclose(a.rewards(), b.rewards(), atol=1e-6)
    pa, _ = final_params(a.run_dir)
    pb, _ = final_params(b.run_dir)
    for k in pa:
        np.testing.assert_allclose(pa[k], pb[k], atol=2e-4, err_msg=k)
    assert all(
        h["staleness_max"] == 0 for h in a.history
    )  # eta = 0: every token from the current policy


def test_run_dir_has_every_artifact(tmp_path):
    res = train(small_config(tmp_path / "run", eta=1, steps=2, report=True))
    d = res.run_dir
    for name in ("config.json", "metrics.jsonl", "trajectories.jsonl", "trace.json", "reward.png"):
        assert (d / name).is_file(), name
    assert any((d / "tensorboard").iterdir())
    assert (d / "checkpoints").is_dir()
    rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for key in (
        "reward_mean",
        "tokens_per_s_generated",
        "engine_busy_fraction",
        "pipeline/trainer_idle_fraction",
        "trainer_wait_s",
        "staleness_mean",
        "clip_fraction",
        "kl",
        "entropy",
        "response_len_mean",
        "weight_sync_s",
    ):
        assert key in rows[0], key
    # every group that reached the learner was counted by the rollout-wide reward, filtered or not
    assert sum(r.get("rollout_groups", 0) for r in rows) >= 2 * 2
    assert all(0.0 <= r["rollout_reward_mean"] <= 1.0 for r in rows if "rollout_reward_mean" in r)
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["rollout"]["max_staleness"] == 1 and cfg["learner"]["groups_per_step"] == 2
    trajs = [json.loads(line) for line in (d / "trajectories.jsonl").read_text().splitlines()]
    assert len(trajs) == 2 * 2 * 4 and {t["step"] for t in trajs} == {1, 2}
    assert sorted(t["trajectory_id"] for t in trajs) == sorted(
        i for ids in res.trained_ids for i in ids
    )
    trace = json.loads((d / "trace.json").read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"train_step", "micro_batch", "weight_sync", "checkpoint"} <= names


def test_config_validation_names_fields():
    with pytest.raises(ConfigError, match=r"engine\.max_len.*--engine\.max-len"):
        dataclasses.replace(preset("tiny"), sampling=SamplingParams(max_tokens=64))
    with pytest.raises(ConfigError, match="num_envs"):
        dataclasses.replace(preset("tiny"), env=EnvSection(num_envs=2))
    with pytest.raises(ConfigError, match="mode"):
        RolloutConfig(mode="lockstep")
    with pytest.raises(ConfigError, match="name"):
        preset("huge")
    assert preset("tiny").with_loss("dapo").loss == C.dapo()


def test_default_preset_is_sized_for_a_cpu():
    """The embedded default computes in the host's fastest dtype ("auto": bf16 where native, else
    float32; engine and learner); the learner runs one fixed program set (``fixed_shapes``) whose length
    holds every trajectory the engine's context holds (an observation appended past it is cut: it carries
    no loss), its prompt slot no longer than ArithmeticTool's 97-token prompt."""
    cfg = preset("default")
    assert cfg.engine.compute_dtype == cfg.learner.compute_dtype == "auto"
    assert cfg.learner.fixed_shapes and cfg.learner.max_len >= cfg.engine.max_len
    assert (
        0 < cfg.learner.prefix_len <= 97 and cfg.learner.micro_batch_size == cfg.rollout.group_size
    )
    assert cfg.rollout.max_model_calls >= 2 and cfg.model.name == "smollm2-135m-instruct"


def test_train_config_is_tyro_compatible():
    """`gymllm train --learner.num-steps 7` parses into the frozen configs."""
    import tyro

    cfg = tyro.cli(
        TrainConfig,
        default=preset("tiny"),
        args=["--learner.num-steps", "7", "--loss.policy.eps-high", "0.3"],
    )
    assert cfg.learner.num_steps == 7 and cfg.loss.policy.eps_high == 0.3
    assert cfg.env.kwargs == {"num_letters": 2}


def test_update_is_pushed_before_the_next_steps_groups_are_trained(tmp_path):
    """Groups that arrive together are handed to the learner one step's worth at a time, oldest
    version first: a finished update is pushed (and admits new groups) before the next step trains."""
    import asyncio
    import concurrent.futures
    import types

    from synthetic_groups import StepCounter

    from gymllm.train.components import RunParts
    from gymllm.train.run import Run
    from gymllm.types import Group

    events: list[tuple] = []
    run = Run(small_config(tmp_path, steps=3), None)
    push = types.SimpleNamespace(
        push=lambda params, version: events.append(("push", version)) or 0.0
    )
    run.parts = RunParts(
        tok=None,
        learner=StepCounter(2, events),
        ckpt=None,
        engine=None,
        gen_engine=None,
        envs=None,
        agent=None,
        pusher=push,
        pool=concurrent.futures.ThreadPoolExecutor(1),
    )
    run.listeners.versions.append(lambda v: events.append(("version", v)))
    run.log.record = lambda rep, sync_s, stats, filtered: {"step": rep.step}
    groups = [
        Group(group_id=f"g{k}", task_id="t", trajectories=[], admitted_version=v)
        for k, v in enumerate([1, 0, 0, 1, 1, 1, 1])
    ]
    asyncio.run(run.consume(groups))
    run.parts.pool.shutdown()
    assert events == [
        ("train", ["g1", "g2"]),
        ("push", 1),
        ("version", 1),
        ("train", ["g0", "g3"]),
        ("push", 2),
        ("version", 2),
        ("train", ["g4", "g5"]),
        ("push", 3),
        ("version", 3),
    ]  # num_steps 3: g6 untouched
