"""Group buffer, group queue and staleness controller: the pure scheduling logic of rollouts."""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gymllm.errors import ConfigError
from gymllm.rollout.group_buffer import GroupBuffer
from gymllm.rollout.group_queue import GroupQueue, QueueClosed
from gymllm.rollout.staleness import StalenessController
from gymllm.types import Trajectory


def _traj(gid: str, member: int, attempt: int = 0, task: str = "") -> Trajectory:
    z = np.zeros(3)
    return Trajectory(
        token_ids=z.astype(np.int32),
        loss_mask=z.astype(np.int8),
        behaviour_logprobs=z.astype(np.float32),
        versions=z.astype(np.int32),
        reward=float(member),
        trajectory_id=f"{gid}/m{member}/a{attempt}",
        group_id=gid,
        task_id=task or f"task-{gid}",
    )


# --- group buffer -----------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(n_groups=st.integers(1, 6), G=st.integers(1, 5), seed=st.integers(0, 2**31 - 1))
def test_groups_complete_only_with_all_members_under_random_arrival(n_groups, G, seed):
    rng = random.Random(seed)
    buf = GroupBuffer(group_size=G, max_open_groups=n_groups)
    for k in range(n_groups):
        buf.open(f"g{k}", task_id=f"task-{k}", seed=k)
    arrivals = [(f"g{k}", m) for k in range(n_groups) for m in range(G)]
    rng.shuffle(arrivals)
    released, seen = [], set()
    remaining = {f"g{k}": G for k in range(n_groups)}
    for gid, m in arrivals:
        out = buf.add(gid, m, _traj(gid, m, task=f"task-{gid[1:]}"))
        remaining[gid] -= 1
        if out is None:
            assert remaining[gid] > 0  # never released early
            continue
        assert remaining[gid] == 0
        assert len(out.trajectories) == G and {t.task_id for t in out.trajectories} == {out.task_id}
        ids = [t.trajectory_id for t in out.trajectories]
        assert [t.reward for t in out.trajectories] == list(range(G))  # ordered by member
        assert not (set(ids) & seen)
        seen |= set(ids)
        released.append(out.group_id)
    assert sorted(released) == sorted(f"g{k}" for k in range(n_groups)) and not buf.open_groups


def test_duplicate_member_and_bad_index_are_rejected_with_clear_errors():
    buf = GroupBuffer(group_size=2, max_open_groups=2)
    buf.open("g0")
    buf.add("g0", 0, _traj("g0", 0))
    with pytest.raises(ValueError, match="second trajectory for member 0"):
        buf.add("g0", 0, _traj("g0", 0))
    with pytest.raises(ValueError, match="0 <= member < 2"):
        buf.add("g0", 5, _traj("g0", 5))
    with pytest.raises(ValueError, match="a new group id"):
        buf.open("g0")


def test_open_groups_are_bounded():
    buf = GroupBuffer(group_size=2, max_open_groups=2)
    buf.open("g0")
    buf.open("g1")
    assert not buf.has_room()
    with pytest.raises(RuntimeError, match="full"):
        buf.open("g2")
    buf.add("g0", 0, _traj("g0", 0))
    buf.add("g0", 1, _traj("g0", 1))
    assert buf.has_room()


def test_failure_retries_whole_group_then_drops_and_ignores_stale_attempts():
    buf = GroupBuffer(group_size=3, max_open_groups=4, max_retries=1)
    buf.open("g0")
    buf.add("g0", 0, _traj("g0", 0))
    assert buf.fail("g0", RuntimeError("boom"), attempt=0) == "retry"
    assert buf.attempt("g0") == 1 and buf.open_groups["g0"].members == {}
    # a late member of attempt 0 must not join attempt 1
    assert buf.add("g0", 1, _traj("g0", 1), attempt=0) is None
    assert buf.open_groups["g0"].members == {}
    assert buf.fail("g0", RuntimeError("again"), attempt=0) == "ignored"
    assert buf.fail("g0", RuntimeError("again"), attempt=1) == "failed"
    assert "g0" not in buf.open_groups and buf.failed == 1 and buf.retried == 1
    assert buf.add("g0", 0, _traj("g0", 0), attempt=1) is None  # a dropped group never comes back


def test_stuck_groups_time_out():
    now = [0.0]
    buf = GroupBuffer(group_size=2, max_open_groups=4, timeout_s=5.0, clock=lambda: now[0])
    buf.open("g0")
    now[0] = 3.0
    buf.open("g1")
    now[0] = 6.0
    assert buf.expired() == ["g0"]
    now[0] = 9.0
    assert sorted(buf.expired()) == ["g0", "g1"]


def test_fallback_rows_of_one_member_stay_together():
    buf = GroupBuffer(group_size=2, max_open_groups=1)
    buf.open("g0")
    rows = [_traj("g0", 1), _traj("g0", 1)]
    assert buf.add("g0", 1, rows) is None
    g = buf.add("g0", 0, _traj("g0", 0))
    assert (
        g is not None
        and len(g.trajectories) == 3
        and [t.reward for t in g.trajectories] == [0.0, 1.0, 1.0]
    )


# --- group queue ------------------------------------------------------------------------------


def test_queue_backpressure_then_exception_after_queued_items_then_close():
    async def main():
        q = GroupQueue(2)
        await q.put(1)
        await q.put(2)
        blocked = asyncio.create_task(q.put(3))
        await asyncio.sleep(0.01)
        assert not blocked.done()  # full: the producer waits
        assert await q.get() == 1
        await asyncio.wait_for(blocked, 1.0)
        await q.put_exception(ValueError("producer broke"))
        assert await q.get() == 2 and await q.get() == 3
        with pytest.raises(ValueError, match="producer broke"):
            await q.get()
        getter = asyncio.create_task(q.get())
        await asyncio.sleep(0.01)
        await q.close()
        with pytest.raises(QueueClosed):
            await asyncio.wait_for(getter, 1.0)
        with pytest.raises(QueueClosed):
            await q.put(4)

    asyncio.run(main())


# --- staleness controller ---------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(
    eta=st.integers(0, 3),
    B=st.integers(1, 4),
    ops=st.lists(st.integers(0, 3), min_size=1, max_size=200),
)
def test_admission_never_exceeds_capacity(eta, B, ops):
    """Random admit / accept / filter / version steps keep accepted + running <= (eta + v + 1) B."""
    sc = StalenessController(max_staleness=eta, groups_per_step=B)
    for op in ops:
        if op == 0 and sc.can_admit():
            sc.admit()
        elif op == 1 and sc.running:
            sc.finish(accepted=True)
        elif op == 2 and sc.running:
            sc.finish(accepted=False)  # filtered / failed: frees the slot
        elif op == 3 and sc.accepted >= (sc.version + 1) * B:
            sc.set_version(sc.version + 1)  # the learner consumed a full step
        assert sc.load <= sc.capacity
        assert sc.running >= 0 and sc.accepted >= 0


def test_eta_zero_admits_exactly_one_step_per_version_and_rejects_bad_config():
    sc = StalenessController(max_staleness=0, groups_per_step=3)
    assert [sc.can_admit() and sc.admit() is not None for _ in range(4)] == [
        True,
        True,
        True,
        False,
    ]
    for _ in range(3):
        sc.finish(accepted=True)
    assert not sc.can_admit()
    sc.set_version(1)
    assert sc.can_admit() and sc.capacity == 6
    assert sc.is_stale(0, version=1) and not sc.is_stale(1, version=1)
    with pytest.raises(ValueError, match="versions only increase"):
        sc.set_version(0)
    with pytest.raises(ConfigError, match="max_staleness"):
        StalenessController(max_staleness=-1, groups_per_step=1)
    with pytest.raises(ConfigError, match="groups_per_step"):
        StalenessController(max_staleness=0, groups_per_step=0)


def test_wait_admit_wakes_on_version_from_another_thread_and_on_stop():
    async def main():
        sc = StalenessController(max_staleness=0, groups_per_step=1)
        sc.bind(asyncio.get_running_loop())
        sc.admit()
        sc.finish(accepted=True)
        waiter = asyncio.create_task(sc.wait_admit())
        await asyncio.sleep(0.01)
        assert not waiter.done()
        await asyncio.to_thread(sc.set_version, 1)  # the learner thread
        assert await asyncio.wait_for(waiter, 1.0) is True
        sc.admit()
        sc.finish(accepted=True)
        stop = asyncio.Event()
        waiter = asyncio.create_task(sc.wait_admit(stop))
        await asyncio.sleep(0.01)
        stop.set()
        assert await asyncio.wait_for(waiter, 1.0) is False

    asyncio.run(main())


def test_keyed_queue_serves_the_smallest_key_first_but_never_skips_an_exception():
    async def main():
        q = GroupQueue(8, key=lambda x: x[0])
        for item in [(2, "a"), (0, "b"), (1, "c")]:
            await q.put(item)
        await q.put_exception(RuntimeError("late"))
        await q.put((-1, "after"))
        assert [await q.get() for _ in range(3)] == [(0, "b"), (1, "c"), (2, "a")]
        with pytest.raises(RuntimeError, match="late"):
            await q.get()
        assert await q.get() == (-1, "after")

    asyncio.run(main())


def test_default_open_group_limit_leaves_room_for_a_second_wave_of_groups():
    from gymllm.rollout.config import RolloutConfig

    # every running group may hold finished members waiting for one straggler: the default limit
    # admits a second wave so their env slots keep running trajectories
    cfg = RolloutConfig(group_size=4, max_concurrency=64)
    assert cfg.open_group_limit == 2 * 16 + 1
    assert RolloutConfig(group_size=4, max_concurrency=6).open_group_limit == 2 * 2 + 1
    assert RolloutConfig(group_size=4, max_concurrency=64, max_open_groups=5).open_group_limit == 5
