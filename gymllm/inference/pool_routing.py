"""How an :class:`~gymllm.inference.pool.EnginePool` routes: its :class:`PoolConfig`, its record of
each replica (:class:`ReplicaSlot`) and the :class:`Router` that picks the replica of a request.

A session's turns stay on the replica that served its first turn (its cached prefix); a new
session, or a request without one, goes to the least-loaded live replica (the module doc of
:mod:`gymllm.inference.pool`, "Routing").
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any, Sequence

from gymllm.validation import check_range, require

__all__ = ["PoolConfig", "ReplicaSlot", "Router"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class PoolConfig:
    """How an EnginePool routes and recovers (frozen, keyword-only, validated).

    max_retries        other replicas one request may try after the attempt on its replica failed.
    request_timeout_s  an attempt not answered within this many seconds counts as its replica dying (a
                       hang); None: no watchdog (Ray and the HTTP client still report lost replicas).
    start_timeout_s    how long building (or recreating) a replica may take: load, compile, warm up.
    restart            recreate a dead replica that can be rebuilt (a Ray actor, a host from a spec).
    revive_after_s     a failed replica that cannot be rebuilt (a bare engine object, a remote server)
                       takes requests again after this many seconds.
    sticky_sessions    keep a session's turns on one replica (its prefix cache); False: every request
                       goes to the least-loaded replica.
    """

    max_retries: int = 2
    request_timeout_s: float | None = 600.0
    start_timeout_s: float = 600.0
    restart: bool = True
    revive_after_s: float = 30.0
    sticky_sessions: bool = True

    def __post_init__(self) -> None:
        c = "PoolConfig"
        check_range(
            c,
            "max_retries",
            self.max_retries,
            lo=0,
            integer=True,
            fix="use e.g. 2 (0: fail a request with its replica)",
        )
        for name, optional, fix in (
            ("request_timeout_s", True, "600.0 (longer than the longest generation)"),
            ("start_timeout_s", False, "600.0"),
            ("revive_after_s", False, "30.0"),
        ):
            check_range(
                c,
                name,
                getattr(self, name),
                lo=0,
                lo_open=True,
                optional=optional,
                fix=f"use e.g. {fix} seconds",
            )
        for name in ("restart", "sticky_sessions"):
            require(
                isinstance(getattr(self, name), bool),
                f"{c}.{name}",
                expected="a bool",
                received=getattr(self, name),
                fix="use True or False",
            )


@dataclasses.dataclass(eq=False)
class ReplicaSlot:
    """The pool's record of one replica."""

    index: int
    replica: Any  # LocalReplica | RayReplica
    load_tokens: int = 0  # queued plus running tokens of this pool's requests there
    inflight: int = 0
    served: int = 0
    failures: int = 0
    restarts: int = 0
    down: bool = False
    down_since: float = 0.0
    last_error: str | None = None
    max_len: int | None = None
    restarting: asyncio.Task | None = None

    @property
    def name(self) -> str:
        return self.replica.name

    @property
    def track(self) -> str:
        return f"engine/{self.replica.name}"


class Router:
    """Which replica serves a request: the session's home while it is live, else the least-loaded live
    replica not tried yet (queued plus running tokens, then requests in flight, then replica order),
    which becomes the session's home. Holds the session -> replica map."""

    def __init__(self, slots: list[ReplicaSlot], config: PoolConfig):
        self.slots, self.config = slots, config
        self.sessions: dict[str, int] = {}  # session id -> slot index

    def choose(self, session_id: str | None, tried: Sequence[int]) -> ReplicaSlot | None:
        """The replica for this attempt; None while every replica is down."""
        now = time.monotonic()
        for s in self.slots:  # a replica that cannot be rebuilt gets another chance after a while
            if s.down and s.restarting is None and now - s.down_since >= self.config.revive_after_s:
                s.down = False
        sticky = self.config.sticky_sessions and session_id is not None
        home = self.sessions.get(session_id) if sticky else None
        if home is not None and not self.slots[home].down and home not in tried:
            return self.slots[home]
        live = [s for s in self.slots if not s.down and s.index not in tried] or [
            s for s in self.slots if not s.down
        ]
        if not live:
            return None
        best = min(live, key=lambda s: (s.load_tokens, s.inflight, s.index))
        if sticky:
            self.sessions[session_id] = best.index
        return best

    def home_of(self, session_id: str) -> ReplicaSlot | None:
        i = self.sessions.get(session_id)
        return None if i is None else self.slots[i]

    def forget(self, session_id: str) -> ReplicaSlot | None:
        i = self.sessions.pop(session_id, None)
        return None if i is None else self.slots[i]

    def evict(self, slot: ReplicaSlot) -> None:
        """Drop every session homed on ``slot`` (a dead replica): each is re-homed on its next turn."""
        for sid in [k for k, i in self.sessions.items() if i == slot.index]:
            del self.sessions[sid]

    def homes(self) -> list[int]:
        """Sessions homed on each replica."""
        out = [0] * len(self.slots)
        for i in self.sessions.values():
            out[i] += 1
        return out
