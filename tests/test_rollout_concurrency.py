"""Adaptive rollout concurrency: the control law driven by event sequences, the resizable gate, and
the orchestrator following a forced schedule (learner waiting -> the limit rises; groups queued and
unconsumed -> it falls). No assertion rests on wall-clock timing: the engine below answers only
when the test releases its calls.
"""

from __future__ import annotations

import asyncio
import zlib

import numpy as np
import pytest

from gymllm.envs.tiny_tasks import TinyRepeatEnv
from gymllm.errors import ConfigError
from gymllm.inference.completion import Completion
from gymllm.inference.params import SamplingParams
from gymllm.rollout import ModelAgent, RolloutConfig, RolloutOrchestrator
from gymllm.rollout.concurrency import AdaptiveConcurrency, ConcurrencyConfig, ConcurrencyGate

IM_END = 2


def law(**kw) -> AdaptiveConcurrency:
    kw = {
        "min_limit": 2,
        "max_limit": 10,
        "start": 4,
        "increase": 2,
        "decrease": 3,
        "target_queue_depth": 2,
        **kw,
    }
    return AdaptiveConcurrency(ConcurrencyConfig(**kw))


# --- the control law ---------------------------------------------------------------------------
def test_limit_rises_while_learner_waits_up_to_the_ceiling():
    c = law()
    assert [c.on_learner_waiting() for _ in range(5)] == [6, 8, 10, 10, 10]
    assert c.counts["raised"] == 3 and c.counts["learner_waits"] == 5


def test_limit_falls_only_beyond_target_queue_depth_down_to_the_floor():
    c = law(start=10)
    assert [c.on_group_queued() for _ in range(6)] == [
        10,
        10,
        7,
        4,
        2,
        2,
    ]  # depth 1, 2 at target; 3.. beyond
    assert c.queue_depth == 6 and c.counts["lowered"] == 3


def test_consumption_drains_the_depth_so_a_balanced_stream_holds_the_limit():
    c = law(start=6)
    for _ in range(20):  # one group queued, one consumed: depth never passes the target
        c.on_group_queued()
        c.on_group_consumed()
    assert c.limit == 6 and c.queue_depth == 0 and c.counts["lowered"] == 0 == c.counts["raised"]


def test_mixed_sequence_is_deterministic():
    events = [
        "learner_waiting",
        "group_queued",
        "group_queued",
        "group_queued",
        "group_consumed",
        "group_dropped",
        "learner_waiting",
        "group_queued",
    ]

    def run():
        c = law()
        return [getattr(c, f"on_{e}")() for e in events]

    assert run() == run() == [6, 6, 6, 3, 3, 2, 4, 4]


def test_waiting_learner_means_nothing_is_queued():
    c = law(start=10)
    for _ in range(3):
        c.on_group_queued()
    assert c.limit == 7
    c.on_learner_waiting()  # the learner found the queue empty: the tracked depth resets
    assert c.queue_depth == 0 and c.limit == 9
    assert c.on_group_queued() == 9


def test_start_defaults_to_the_ceiling():
    assert AdaptiveConcurrency(ConcurrencyConfig(min_limit=1, max_limit=16)).limit == 16


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"min_limit": 0}, "min_limit"),
        ({"max_limit": 1, "min_limit": 2}, "min_limit"),
        ({"start": 11}, "start"),
        ({"increase": 0}, "increase"),
        ({"target_queue_depth": -1}, "target_queue_depth"),
        ({"decrease": True}, "decrease"),
    ],
)
def test_config_rejects_bad_values_clearly(kw, field):
    base = {"min_limit": 2, "max_limit": 10}
    with pytest.raises(ConfigError, match=f"ConcurrencyConfig.{field}") as e:
        ConcurrencyConfig(**{**base, **kw})
    assert "expected" in str(e.value) and "Fix" in str(e.value) or "fix" in str(e.value).lower()


def test_rollout_config_derives_the_law_and_validates():
    cfg = RolloutConfig(group_size=4, max_concurrency=64, queue_size=16)
    c = cfg.concurrency_config(num_envs=48, groups_per_step=8)
    assert (c.max_limit, c.min_limit, c.start, c.increase, c.decrease, c.target_queue_depth) == (
        48,
        4,
        None,
        4,
        4,
        8,
    )
    assert RolloutConfig(queue_size=8).concurrency_config(64, 8).target_queue_depth == 7
    c = RolloutConfig(
        group_size=2,
        max_concurrency=8,
        concurrency_start=20 // 4,
        min_concurrency=3,
        concurrency_step=1,
        target_queue_depth=0,
    ).concurrency_config(4, 8)
    assert (c.max_limit, c.min_limit, c.start, c.increase, c.target_queue_depth) == (4, 3, 4, 1, 0)
    with pytest.raises(ConfigError, match="concurrency_start"):
        RolloutConfig(max_concurrency=8, concurrency_start=9)
    with pytest.raises(ConfigError, match="concurrency_start"):
        RolloutConfig(max_concurrency=8, min_concurrency=6, concurrency_start=4)
    with pytest.raises(ConfigError, match="adaptive_concurrency"):
        RolloutConfig(adaptive_concurrency="yes")


# --- the gate ----------------------------------------------------------------------------------
def test_gate_follows_its_limit_without_preempting_holders():
    async def main():
        g = ConcurrencyGate(2)
        await g.acquire()
        await g.acquire()
        waiter = asyncio.create_task(g.acquire())
        await asyncio.sleep(0)
        assert not waiter.done() and g.active == 2
        g.set_limit(3)  # raising wakes the waiter at once
        await asyncio.sleep(0)
        assert waiter.done() and g.active == 3
        g.set_limit(1)  # lowering preempts nobody...
        assert g.active == 3
        w2 = asyncio.create_task(g.acquire())
        g.release()
        g.release()
        await asyncio.sleep(0)
        assert not w2.done() and g.active == 1  # ...but new holders wait until active < limit
        g.release()
        await asyncio.sleep(0)
        assert w2.done() and g.active == 1
        w3 = asyncio.create_task(g.acquire())  # a cancelled waiter leaves no trace
        await asyncio.sleep(0)
        w3.cancel()
        await asyncio.gather(w3, return_exceptions=True)
        g.release()
        assert g.active == 0 and g.max_active == 3
        await g.acquire()  # nothing left queued ahead of a new holder
        assert g.active == 1

    asyncio.run(main())


# --- the orchestrator under a forced schedule --------------------------------------------------
class HeldEngine:
    """Test double of the Engine protocol whose ``generate`` calls wait until the test releases them
    (FIFO), so the schedule is forced; tokens are a deterministic function of (prompt, seed)."""

    def __init__(self):
        self.version = 0
        self.pending: list[asyncio.Future] = []
        self.open = False

    def end_session(self, session_id):
        pass

    def release(self, n: int) -> None:
        for fut in self.pending[:n]:
            fut.set_result(None)
        del self.pending[:n]

    async def generate(self, prompt_ids, params, *, session_id=None):
        if not self.open:
            fut = asyncio.get_running_loop().create_future()
            self.pending.append(fut)
            await fut
        h = zlib.crc32(np.asarray(prompt_ids, np.int32).tobytes())
        rng = np.random.default_rng([h, params.seed or 0])
        ids = rng.integers(3, 500, 3).tolist() + [IM_END]
        return Completion(
            token_ids=ids,
            logprobs=-rng.random(len(ids)),
            finish_reason="stop",
            versions=[0] * len(ids),
            prompt_len=len(prompt_ids),
        )


async def until(cond, what: str, limit_s: float = 20.0) -> None:
    """Wait for ``cond`` (a watchdog, not a timing assertion: the schedule is forced)."""
    for _ in range(int(limit_s / 0.002)):
        if cond():
            return
        await asyncio.sleep(0.002)
    raise AssertionError(f"never reached: {what}")


def orchestrator(**kw):
    from gymllm.models.tiny import tiny_tokenizer

    cfg = RolloutConfig(
        **{
            "group_size": 2,
            "max_concurrency": 8,
            "max_staleness": None,
            "queue_size": 8,
            "concurrency_start": 2,
            "min_concurrency": 2,
            "concurrency_step": 2,
            "target_queue_depth": 1,
            **kw,
        }
    )
    eng = HeldEngine()
    envs = [TinyRepeatEnv(num_letters=2) for _ in range(8)]  # instant, single-turn episodes
    orch = RolloutOrchestrator(
        envs,
        eng,
        ModelAgent(tiny_tokenizer(512)),
        sampling=SamplingParams(temperature=1.0, max_tokens=4),
        config=cfg,
        seed=3,
    )
    return orch, eng


def test_orchestrator_raises_limit_while_learner_waits_and_backs_off_when_groups_queue():
    async def main():
        orch, eng = orchestrator()
        limits = []
        async with orch:
            await until(lambda: len(eng.pending) == 2, "2 trajectories in flight (the start)")
            assert orch.stats()["concurrency_limit"] == 2
            for expected in (
                4,
                6,
                8,
                8,
            ):  # the learner waits: each wait admits one more group's worth
                learner = asyncio.create_task(orch.get_group())
                await until(
                    lambda: len(eng.pending) == expected, f"{expected} trajectories in flight"
                )
                limits.append(orch.stats()["concurrency_limit"])
                assert orch.stats()["trajectories_inflight"] == expected
                eng.release(2)  # the oldest group's two members answer: the learner gets it
                group = await asyncio.wait_for(learner, 20)
                assert len(group.trajectories) == 2
            assert limits == [4, 6, 8, 8]  # capped by max_concurrency (8 env slots)
            # the learner stops consuming: complete groups queue up beyond the target and the limit falls
            eng.open = True
            eng.release(len(eng.pending))
            await until(
                lambda: orch.stats()["concurrency_limit"] == 2, "the limit back at its floor"
            )
            s = orch.stats()
            assert s["concurrency_lowered"] >= 3 and s["concurrency_raised"] == 3
            assert orch.ready_groups > 1  # the queue that made it back off
            # while the limit is 2, no more than 2 trajectories start at once
            await until(
                lambda: orch.stats()["trajectories_inflight"] <= 2, "running trajectories drained"
            )
            assert orch.stats()["trajectories_inflight_max"] == 8

    asyncio.run(main())


def test_fixed_concurrency_when_adaptation_is_off():
    async def main():
        orch, eng = orchestrator(
            adaptive_concurrency=False, concurrency_start=None, min_concurrency=None
        )
        async with orch:
            await until(lambda: len(eng.pending) == 8, "the ceiling in flight at once")
            learner = asyncio.create_task(orch.get_group())
            eng.open = True
            eng.release(len(eng.pending))
            await asyncio.wait_for(learner, 20)
            await until(lambda: orch.ready_groups >= 4, "groups queued")
            assert orch.stats()["concurrency_limit"] == 8

    asyncio.run(main())
