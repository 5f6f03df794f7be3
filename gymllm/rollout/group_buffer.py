"""The GRPO group buffer: G trajectories of one task and seed are released together or not at all.

* a group is released only when all ``group_size`` members of its current attempt are done;
* at most ``max_open_groups`` groups are open at once (:meth:`GroupBuffer.has_room`);
* a group open longer than ``timeout_s`` is reported by :meth:`GroupBuffer.expired`;
* a failed member fails the whole group: it is retried as a new attempt (members of an older attempt
  that arrive late are ignored) or, once ``max_retries`` is spent, dropped and reported.

The buffer is plain synchronous bookkeeping; the orchestrator drives it from the event loop.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

from gymllm.errors import GymLLMError
from gymllm.validation import require
from gymllm.types import Group, Trajectory


class GroupFailedError(GymLLMError, RuntimeError):
    """A group was dropped because a member failed (or it timed out) and no retry was left."""

    def __init__(self, message: str, *, group_id: str, cause: BaseException | None = None):
        super().__init__(message)
        self.group_id = group_id
        self.cause = cause


@dataclasses.dataclass
class OpenGroup:
    """Bookkeeping of one group while its members run."""

    group_id: str
    task_id: str
    seed: int | None
    admitted_version: int
    opened_at: float
    attempt: int = 0
    members: dict[int, list[Trajectory]] = dataclasses.field(default_factory=dict)
    errors: list[str] = dataclasses.field(default_factory=list)
    info: dict[str, Any] = dataclasses.field(default_factory=dict)


class GroupBuffer:
    """Collects trajectories per group and hands out complete :class:`Group` records."""

    def __init__(
        self,
        *,
        group_size: int,
        max_open_groups: int,
        timeout_s: float | None = None,
        max_retries: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ):
        for name, value, low in (
            ("group_size", group_size, 1),
            ("max_open_groups", max_open_groups, 1),
            ("max_retries", max_retries, 0),
        ):
            require(
                isinstance(value, int) and value >= low,
                f"GroupBuffer.{name}",
                expected=f"an int >= {low}",
                received=value,
                fix=f"pass {name}={low} or more",
                error=ValueError,
            )
        self.group_size = group_size
        self.max_open_groups = max_open_groups
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.clock = clock
        self.open_groups: dict[str, OpenGroup] = {}
        self.released = 0
        self.failed = 0
        self.retried = 0

    def has_room(self) -> bool:
        return len(self.open_groups) < self.max_open_groups

    def open(
        self,
        group_id: str,
        *,
        task_id: str = "",
        seed: int | None = None,
        admitted_version: int = 0,
    ) -> OpenGroup:
        require(
            group_id not in self.open_groups,
            "GroupBuffer.open",
            expected="a new group id",
            received=group_id,
            fix="use a fresh id per group",
            error=ValueError,
        )
        if not self.has_room():
            raise RuntimeError(
                f"GroupBuffer is full ({self.max_open_groups} open groups). Fix: wait for has_room()."
            )
        g = OpenGroup(group_id, task_id, seed, admitted_version, opened_at=self.clock())
        self.open_groups[group_id] = g
        return g

    def attempt(self, group_id: str) -> int:
        return self.open_groups[group_id].attempt

    def add(
        self, group_id: str, member: int, traj: Trajectory | list[Trajectory], *, attempt: int = 0
    ) -> Group | None:
        """Record a finished member (one trajectory, or its rows in the one-row-per-call fallback);
        returns the complete group once all G members are in, rows ordered by member.

        Arrivals for a group that is no longer open, or from an older attempt, are ignored (None).
        """
        rows = list(traj) if isinstance(traj, (list, tuple)) else [traj]
        require(
            rows,
            "GroupBuffer.add",
            expected="at least one trajectory row",
            received=rows,
            fix="submit the member's Trajectory",
            error=ValueError,
        )
        g = self.open_groups.get(group_id)
        if g is None or attempt != g.attempt:
            return None
        require(
            0 <= member < self.group_size,
            "GroupBuffer.add member",
            expected=f"0 <= member < {self.group_size}",
            received=member,
            fix="pass the member index the group assigned",
            error=ValueError,
        )
        require(
            member not in g.members,
            "GroupBuffer.add",
            expected=f"one trajectory per member of {group_id}",
            received=f"a second trajectory for member {member}",
            fix="never submit a member twice",
            error=ValueError,
        )
        g.members[member] = rows
        if not g.task_id and rows[0].task_id:
            g.task_id = rows[0].task_id
        if len(g.members) < self.group_size:
            return None
        del self.open_groups[group_id]
        self.released += 1
        trajs = [row for i in range(self.group_size) for row in g.members[i]]
        info = dict(g.info, attempts=g.attempt + 1, seed=g.seed)
        return Group(
            group_id=group_id,
            task_id=g.task_id,
            trajectories=trajs,
            admitted_version=g.admitted_version,
            info=info,
        )

    def fail(self, group_id: str, error: BaseException | str, *, attempt: int = 0) -> str:
        """A member failed. Returns "retry" (start a new attempt), "failed" (group dropped) or "ignored"."""
        g = self.open_groups.get(group_id)
        if g is None or attempt != g.attempt:
            return "ignored"
        g.errors.append(f"attempt {g.attempt}: {error!r}")
        if g.attempt < self.max_retries:
            g.attempt += 1
            g.members.clear()
            g.opened_at = self.clock()
            self.retried += 1
            return "retry"
        del self.open_groups[group_id]
        self.failed += 1
        return "failed"

    def expired(self) -> list[str]:
        """Ids of groups open longer than ``timeout_s`` (the caller fails them)."""
        if self.timeout_s is None:
            return []
        now = self.clock()
        return [gid for gid, g in self.open_groups.items() if now - g.opened_at > self.timeout_s]

    def errors(self, group_id: str) -> list[str]:
        g = self.open_groups.get(group_id)
        return list(g.errors) if g else []
