"""ProxyGroupSource: closed training-proxy sessions -> complete GRPO groups for the learner.

    source = ProxyGroupSource(ProxySourceConfig(group_size=4, max_queued_groups=8))
    recorder = SessionRecorder(tokenizer, on_closed=source.add)             # gymllm.inference.session_recorder
    app = build_app(engine, tokenizer, "policy", recorder=recorder, admission=source.wait_for_room)
    async for group in source.groups():                                     # like RolloutOrchestrator
        ...train on group...; source.set_policy_version(step)

Each :class:`~gymllm.inference.session_recorder.ClosedSession` becomes one :class:`~gymllm.types.Trajectory` per
segment, built with :class:`~gymllm.rollout.token_buffer.Row` (the orchestrator's machinery): context
ids with mask 0, logprob 0 and version -1, sampled ids verbatim with mask 1, their behaviour logprobs
and the policy version of each token. Sessions naming the same group id are held until
``group_size`` of them closed, then released as one :class:`~gymllm.types.Group` into a bounded
queue (oldest first). While ``max_queued_groups`` groups wait, :meth:`wait_for_room` (the server's
admission hook) holds new sessions back, so agents slow down instead of piling up stale work;
rewards are never refused or lost. Thread-safe: the server's thread adds, the learner's event loop
reads; a waiter on any loop is woken with ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import threading
import time
from typing import Any, Callable

from gymllm.errors import ConfigError, explain
from gymllm.rollout.group_queue import QueueClosed
from gymllm.rollout.sources import QueueSource
from gymllm.rollout.token_buffer import Row
from gymllm.types import Group, Trajectory
from gymllm.validation import check_fields, check_range


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProxySourceConfig:
    """group_size: sessions per group (G); max_queued_groups: complete groups waiting for the learner
    before new sessions are held; admission_timeout_s: how long a new session waits for room before
    the server answers 503; max_staleness: groups whose oldest token is more than this many policy
    versions behind at consumption are dropped (None: keep all)."""

    group_size: int = 1
    max_queued_groups: int = 8
    admission_timeout_s: float = 600.0
    max_staleness: int | None = None

    def __post_init__(self) -> None:
        names = ("group_size", "max_queued_groups")
        check_fields(
            "ProxySourceConfig", self, names, lo=1, integer=True, fix="pass e.g. {field}=4"
        )
        if not self.admission_timeout_s > 0:
            raise ConfigError(
                explain(
                    "ProxySourceConfig.admission_timeout_s",
                    expected="a number > 0",
                    received=self.admission_timeout_s,
                    fix="pass e.g. 600",
                )
            )
        check_range(
            "ProxySourceConfig",
            "max_staleness",
            self.max_staleness,
            lo=0,
            integer=True,
            optional=True,
            fix="pass e.g. 2",
        )


def session_trajectories(closed: Any, member: int = 0) -> list[Trajectory]:
    """One Trajectory per segment of a closed session (``row_index`` counts the segments)."""
    rows = []
    for seg in closed.segments:
        row = Row()
        for piece in seg.pieces:
            if piece[0] == "context":
                row.extend_context(piece[1])
            else:
                row.extend_sampled(piece[1], piece[2], piece[3])
        rows.append(row)
    finish = "length" if closed.finish_reason == "length" else "terminated"
    out = []
    for i, row in enumerate(rows):
        out.append(
            Trajectory(
                **row.arrays(),
                reward=float(closed.reward),
                rewards=[float(closed.reward)],
                trajectory_id=f"{closed.group_id}/{closed.session_id}",
                group_id=closed.group_id,
                task_id=closed.task_id,
                turn_boundaries=list(row.turn_boundaries),
                finish_reason=finish,
                row_index=i,
                info={
                    **closed.info,
                    "session_id": closed.session_id,
                    "model_calls": closed.model_calls,
                    "segments_started": closed.segments_started,
                    "num_rows": len(rows),
                    "member": member,
                    "attempt": 0,
                    "source": "proxy",
                },
            )
        )
    return out


class ProxyGroupSource(QueueSource):
    """Groups closed sessions and queues complete groups (see the module docstring)."""

    def __init__(
        self,
        config: ProxySourceConfig | None = None,
        *,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.config = config or ProxySourceConfig()
        self.clock = clock
        self._lock = threading.Lock()
        self._open: dict[str, list[Any]] = {}
        self._ready: collections.deque[Group] = collections.deque()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []
        self._closed = False
        self._version = 0
        self.counts: collections.Counter = collections.Counter()

    # --- producer side (any thread) -----------------------------------------------------------
    def add(self, closed: Any) -> Group | None:
        """Take one closed session; returns the group it completed, if any."""
        with self._lock:
            members = self._open.setdefault(closed.group_id, [])
            members.append(closed)
            self.counts["sessions"] += 1
            if not closed.segments:
                self.counts["empty_sessions"] += 1
            if len(members) < self.config.group_size:
                return None
            del self._open[closed.group_id]
            trajs = [t for m, c in enumerate(members) for t in session_trajectories(c, m)]
            group = Group(
                group_id=closed.group_id,
                task_id=members[0].task_id,
                trajectories=trajs,
                admitted_version=min(c.admitted_version for c in members),
                info={
                    "completed_at": self.clock(),
                    "source": "proxy",
                    "segments_started": sum(c.segments_started for c in members),
                },
            )
            self._ready.append(group)
            self.counts["released"] += 1
        self._wake()
        return group

    def has_room(self) -> bool:
        with self._lock:
            return len(self._ready) < self.config.max_queued_groups

    async def wait_for_room(self) -> bool:
        """Until fewer than ``max_queued_groups`` groups wait (the server's admission hook); False after
        ``admission_timeout_s`` or when the source closed."""
        try:
            return (
                await asyncio.wait_for(
                    self._wait(
                        lambda: self._closed or len(self._ready) < self.config.max_queued_groups
                    ),
                    self.config.admission_timeout_s,
                )
                and not self._closed
            )
        except asyncio.TimeoutError:
            return False

    # --- consumer side (the learner's loop) -----------------------------------------------------
    def set_policy_version(self, version: int) -> None:
        with self._lock:
            self._version = int(version)

    async def get_group(self) -> Group:
        """The next complete group (oldest first); :class:`QueueClosed` once closed and drained."""
        while True:
            await self._wait(lambda: self._closed or bool(self._ready))
            with self._lock:
                if not self._ready:
                    raise QueueClosed("ProxyGroupSource is closed and drained")
                group = self._ready.popleft()
                version = self._version
            self._wake()  # room for a held-back session
            bound = self.config.max_staleness
            if bound is not None and version - group.min_version > bound:
                self.counts["stale_dropped"] += 1
                continue
            now = self.clock()
            for traj in group.trajectories:
                traj.timings["queue_wait_s"] = now - group.info["completed_at"]
            group.info["consumed_version"] = version
            self.counts["consumed"] += 1
            return group

    @property
    def ready_groups(self) -> int:
        with self._lock:
            return len(self._ready)

    @property
    def waiting(self) -> int:
        """Coroutines waiting for a group or for room (for tests that force an interleaving)."""
        with self._lock:
            return len(self._waiters)

    def close(self) -> None:
        """No more groups: waiting readers get what is queued, then :class:`QueueClosed`; held-back
        sessions are answered 503."""
        with self._lock:
            self._closed = True
        self._wake()

    async def __aenter__(
        self,
    ) -> "ProxyGroupSource":  # ``async with source:`` as with the orchestrator
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                **dict(self.counts),
                "open_groups": len(self._open),
                "ready_groups": len(self._ready),
            }

    # --- cross-thread waiting -----------------------------------------------------------------
    async def _wait(self, ready: Callable[[], bool]) -> bool:
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                if ready():
                    return True
                fut = loop.create_future()
                self._waiters.append((loop, fut))
            try:
                await fut
            finally:
                with self._lock:
                    if (loop, fut) in self._waiters:
                        self._waiters.remove((loop, fut))

    def _wake(self) -> None:
        with self._lock:
            waiters, self._waiters = self._waiters, []
        for loop, fut in waiters:
            try:
                loop.call_soon_threadsafe(_resolve, fut)
            except RuntimeError:  # that loop is closed
                pass


def _resolve(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)
