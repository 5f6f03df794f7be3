"""Adaptive rollout concurrency: how many trajectories the orchestrator runs at once.

:class:`AdaptiveConcurrency` is the control law, a pure state machine (no clock, no asyncio) fed by
the orchestrator's events:

* ``on_learner_waiting()``  the learner asked for a group and none was queued: the supply is short,
  admit ``increase`` more trajectories (up to ``max_limit``);
* ``on_group_queued()``     a complete group entered the queue; when more than ``target_queue_depth``
  groups now wait unconsumed the supply is ahead of the learner (its groups only grow stale): run
  ``decrease`` fewer trajectories (down to ``min_limit``);
* ``on_group_consumed()``   the learner took a group (the tracked depth goes down);
* ``on_group_dropped()``    a queued group was dropped as too stale at consumption: it waited too
  long, so the supply was too far ahead: back off as for a deep queue.

Trajectories already running are never cancelled by a lower limit: the limit gates new starts.
:class:`ConcurrencyGate` is the asyncio side: a semaphore whose size follows the limit; it also
integrates the number of trajectories in flight over time (``inflight_mean``).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import time

from gymllm.validation import check_order, check_range, is_int, require


@dataclasses.dataclass(frozen=True, kw_only=True)
class ConcurrencyConfig:
    """Bounds and steps of the control law (frozen, keyword-only, validated).

    min_limit           fewest trajectories in flight the law goes down to (>= 1).
    max_limit           most trajectories in flight (the orchestrator passes
                        ``min(RolloutConfig.max_concurrency, number of env slots)``).
    start               the limit at the start; None = ``max_limit`` (so an adaptive run never starts
                        with less supply than a fixed one).
    increase            trajectories added per learner wait.
    decrease            trajectories removed per group queued beyond ``target_queue_depth`` (and per
                        group dropped as stale).
    target_queue_depth  complete groups allowed to wait unconsumed before backing off (>= 0).
    """

    min_limit: int = 1
    max_limit: int = 32
    start: int | None = None
    increase: int = 4
    decrease: int = 4
    target_queue_depth: int = 8

    def __post_init__(self) -> None:
        for name in ("min_limit", "max_limit", "increase", "decrease"):
            check_range(
                "ConcurrencyConfig",
                name,
                getattr(self, name),
                lo=1,
                integer=True,
                fix=f"set {name}=1 or more",
            )
        check_order("ConcurrencyConfig", "min_limit", self.min_limit, "max_limit", self.max_limit)
        s = self.start
        require(
            s is None or (is_int(s) and self.min_limit <= s <= self.max_limit),
            "ConcurrencyConfig.start",
            expected=f"None or an int in [min_limit {self.min_limit}, max_limit {self.max_limit}]",
            received=s,
            fix="use start=None (begin at max_limit)",
        )
        check_range(
            "ConcurrencyConfig",
            "target_queue_depth",
            self.target_queue_depth,
            lo=0,
            integer=True,
            fix="use the learner's groups per step",
        )


class AdaptiveConcurrency:
    """The control law (see the module docstring): additive increase while the learner waits,
    additive decrease while complete groups queue beyond the target. Deterministic; no clock."""

    def __init__(self, config: ConcurrencyConfig):
        self.config = config
        self.limit = config.max_limit if config.start is None else config.start
        self.queue_depth = 0  # complete groups queued and not yet consumed (as the events told)
        self.counts: collections.Counter[str] = collections.Counter()

    def _set(self, limit: int, reason: str) -> int:
        c = self.config
        new = max(c.min_limit, min(c.max_limit, limit))
        if new != self.limit:
            self.counts["raised" if new > self.limit else "lowered"] += 1
        self.counts[reason] += 1
        self.limit = new
        return new

    def on_learner_waiting(self) -> int:
        """The learner waits for a group (none queued): raise the limit. Returns the limit."""
        self.queue_depth = 0
        return self._set(self.limit + self.config.increase, "learner_waits")

    def on_group_queued(self) -> int:
        """A complete group entered the queue: back off when the queue is deeper than the target."""
        self.queue_depth += 1
        if self.queue_depth > self.config.target_queue_depth:
            return self._set(self.limit - self.config.decrease, "queue_deep")
        return self.limit

    def on_group_consumed(self) -> int:
        """The learner took a group from the queue."""
        self.queue_depth = max(0, self.queue_depth - 1)
        self.counts["consumed"] += 1
        return self.limit

    def on_group_dropped(self) -> int:
        """A queued group was too stale when the learner reached it: the supply ran too far ahead."""
        self.queue_depth = max(0, self.queue_depth - 1)
        return self._set(self.limit - self.config.decrease, "stale_dropped")


class ConcurrencyGate:
    """An asyncio semaphore whose size follows ``set_limit`` (single event loop).

    ``acquire`` waits while ``active >= limit``; lowering the limit never preempts holders, it only
    delays new acquisitions; raising it wakes waiters at once (FIFO)."""

    def __init__(self, limit: int):
        self.limit = int(limit)
        self.active = 0
        self.max_active = 0
        self._waiters: collections.deque[asyncio.Future] = collections.deque()
        self._t0 = self._t_last = time.perf_counter()
        self._area = 0.0  # integral of active over time (inflight_mean)

    def _account(self) -> None:
        now = time.perf_counter()
        self._area += self.active * (now - self._t_last)
        self._t_last = now

    def set_limit(self, limit: int) -> None:
        self.limit = int(limit)
        self._wake()

    async def acquire(self) -> None:
        if self.active < self.limit and not self._waiters:
            self._take()
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if (
                fut.done() and not fut.cancelled()
            ):  # granted and cancelled in the same tick: hand it on
                self.release()
            else:
                try:
                    self._waiters.remove(fut)
                except ValueError:
                    pass
            raise

    def _take(self) -> None:
        self._account()
        self.active += 1
        self.max_active = max(self.max_active, self.active)

    def release(self) -> None:
        self._account()
        self.active -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self.active < self.limit:
            fut = self._waiters.popleft()
            if not fut.done():
                self._take()
                fut.set_result(None)

    def inflight_mean(self) -> float:
        """Time-averaged number of holders since creation."""
        self._account()
        wall = self._t_last - self._t0
        return self._area / wall if wall > 0 else float(self.active)
