"""The GroupSource seam: the one training loop (:meth:`gymllm.train.run.Run.train`) driven by a source
written here (a plain class yielding prepared groups), a source that fails, a source that runs out,
and the built-in sources' conformance to the protocol."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import types

import numpy as np
import pytest

from gymllm.train.components import LocalComponents, RunParts
from gymllm.train.run import Run
from gymllm.rollout.agent_programs import AgentProgramSource
from gymllm.rollout.group_queue import QueueClosed
from gymllm.rollout.orchestrator import RolloutOrchestrator
from gymllm.rollout.sources import GroupSource, GroupSourceError
from gymllm.rollout.sync_baseline import SyncBatchSource

from synthetic_groups import StepCounter
from synthetic_groups import groups as synthetic_groups
from test_algos_trainer import small_config


class PreparedSource:
    """Yields prepared groups, ``per_call`` at a time, as sampled by the policy version it was last told
    (an on-policy source: eta = 0 keeps them all); records the lifecycle and every version it is told."""

    name = "prepared groups"
    waiting_for = "waiting for a prepared group"

    def __init__(self, groups, per_call=2, fail=None):
        self.groups, self.per_call, self.fail = list(groups), per_call, fail
        self.versions: list[int] = []
        self.events: list[str] = []
        self.version = 0

    async def start(self):
        self.events.append("start")
        return self

    async def next_groups(self):
        if self.fail is not None:
            raise self.fail
        if not self.groups:
            raise QueueClosed("the prepared groups ran out")
        batch, self.groups = self.groups[: self.per_call], self.groups[self.per_call :]
        for g in batch:
            g.admitted_version = self.version
            for t in g.trajectories:
                t.versions = np.where(np.asarray(t.loss_mask) > 0, self.version, -1).astype(
                    np.int32
                )
        return batch

    def set_policy_version(self, version):
        self.versions.append(version)
        self.version = version

    def stats(self):
        return {"stale_dropped": 0}

    def result(self):
        self.events.append("result")
        return {"prepared_left": len(self.groups)}

    async def close(self):
        self.events.append("close")


def test_builtin_sources_and_the_test_source_implement_the_protocol():
    members = [
        n
        for n in (
            "name",
            "waiting_for",
            "start",
            "next_groups",
            "set_policy_version",
            "stats",
            "result",
            "close",
        )
    ]
    for cls in (RolloutOrchestrator, SyncBatchSource, AgentProgramSource, PreparedSource):
        missing = [m for m in members if not hasattr(cls, m)]
        assert not missing, f"{cls.__name__} lacks {missing}"
    assert isinstance(PreparedSource([]), GroupSource)


def test_a_custom_source_drives_the_loop_to_completion(tmp_path):
    """3 steps of 2 groups from 8 prepared ones: the real learner takes 3 steps, each version is pushed
    to the engine and told to the source, and the 2 groups left are never taken."""
    cfg = small_config(tmp_path / "run", steps=3)
    prepared = synthetic_groups(8, seed=5)
    source = PreparedSource(prepared, per_call=2)

    async def go():
        run = Run(cfg)
        run.setup(LocalComponents())
        try:
            counts = await run.train(source)
        finally:
            await run.close()
        return run, counts

    run, counts = asyncio.run(go())
    assert run.learner.version == 3 and run.parts.engine.version == 3
    assert source.versions == [1, 2, 3]
    assert source.events == ["start", "close", "result"]
    assert counts == {"prepared_left": 2}
    assert [h["step"] for h in run.history] == [1, 2, 3]
    trained = [sorted(ids) for ids in run.log.trained_ids]
    expected = [
        sorted(t.trajectory_id for g in prepared[2 * k : 2 * k + 2] for t in g.trajectories)
        for k in range(3)
    ]
    assert trained == expected


def fake_run(tmp_path, steps=3):
    """A Run whose parts are stand-ins (no model): a learner that steps every 2 groups."""
    run = Run(small_config(tmp_path, steps=steps))
    run.parts = RunParts(
        tok=None,
        learner=StepCounter(2),
        ckpt=types.SimpleNamespace(latest_step=lambda: None),
        engine=None,
        gen_engine=None,
        envs=None,
        agent=None,
        pool=concurrent.futures.ThreadPoolExecutor(1),
        pusher=types.SimpleNamespace(push=lambda params, version: 0.0),
    )
    run.log.record = lambda rep, sync_s, stats, filtered: {"step": rep.step}
    return run


def test_a_source_that_raises_stops_the_run_with_a_clear_error(tmp_path):
    run = fake_run(tmp_path)
    source = PreparedSource(synthetic_groups(2, seed=1), fail=ValueError("the task file is empty"))
    with pytest.raises(GroupSourceError, match="prepared groups") as info:
        asyncio.run(run.train(source))
    run.parts.pool.shutdown()
    assert "ValueError: the task file is empty" in str(info.value)
    assert isinstance(info.value.__cause__, ValueError) and info.value.source == "prepared groups"
    assert source.events == ["start", "close"]  # closed although the loop raised
    assert run.watchdog.watched() == []  # the rollout stage ended with the failure


def test_a_source_that_runs_out_ends_the_run_early_with_a_warning(tmp_path, caplog):
    run = fake_run(tmp_path, steps=3)
    source = PreparedSource(synthetic_groups(2, seed=2), per_call=2)
    with caplog.at_level(logging.WARNING, logger="gymllm.algos"):
        asyncio.run(run.train(source))
    run.parts.pool.shutdown()
    assert run.learner.version == 1 and source.versions == [1]
    assert "the prepared groups ran out: the run stops at step 1 of 3" in caplog.text
