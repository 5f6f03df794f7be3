"""Host-side scheduling state of the JAX engine: length buckets and the slot table.

Pure Python (no JAX), so its invariants are tested directly.

* Buckets: prefill chunks are padded to one of a small fixed set of lengths, and prefill batches
  to one of a small set of sizes, so the engine compiles a fixed set of shapes.
* :class:`SlotTable`: the fixed pool of cache rows. Each slot remembers the token ids whose k/v it
  holds (``cached``); a request is placed in the free slot that already holds the longest prefix of
  its prompt (its own session's slot first), so the next turn of a trajectory prefills only the new
  tokens. Sessions pin their slot against eviction while other free slots exist. Otherwise the
  lowest free row is taken, so active rows stay packed at the front and the engine's decode step
  can run over only the first ``width`` rows. A row's k/v are
  reused only under the policy version that computed them (``version``), so no new request
  attends to k/v of older weights. An engine serving LoRA adapters passes a tag (adapter, its
  version, the base version) as the version, so a prefix is never reused across adapters.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence


def power_of_two_buckets(limit: int, smallest: int) -> tuple[int, ...]:
    """Powers of two from ``smallest`` up to ``limit``; ``limit`` itself closes the set."""
    out, b = [], max(1, smallest)
    while b < limit:
        out.append(b)
        b *= 2
    out.append(limit)
    return tuple(out)


def decode_widths(limit: int, smallest: int = 8) -> tuple[int, ...]:
    """Decode step widths (rows) up to ``limit``: powers of two from ``smallest``, and from 24 rows on
    also 1.5x each power of two (24, 48, 96, ...), so a step over n active rows (packed at the front)
    pays for at most a third more rows than it needs where steps are wide; ``limit`` closes the set."""
    pow2 = power_of_two_buckets(limit, min(smallest, limit))
    mids = {3 * b // 2 for b in pow2 if 3 * b // 2 >= 24 and 3 * b // 2 < limit}
    return tuple(sorted(set(pow2) | mids))


def halving_buckets(limit: int, count: int) -> tuple[int, ...]:
    """Up to ``count`` sizes ``limit``, ``ceil(limit / 2)``, ``ceil(limit / 4)``, ... ascending (distinct)."""
    return tuple(sorted({-(-limit // 2**k) for k in range(count)}))


def pick_bucket(n: int, buckets: Sequence[int]) -> int:
    """The smallest bucket >= n (buckets sorted ascending)."""
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"length {n} exceeds the largest bucket {buckets[-1]}")


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of ``a`` and ``b`` (slices compared in bisection steps, so
    admission compares long prompts at C speed)."""
    a, b = list(a), list(b)
    lo, hi = 0, min(len(a), len(b))  # a[:lo] == b[:lo]; the prefix is at most hi long
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclasses.dataclass
class Slot:
    index: int
    busy: bool = False
    cached: list[int] = dataclasses.field(default_factory=list)  # ids whose k/v are in this row
    session_id: str | None = None  # the session pinning this slot's prefix
    last_used: int = 0
    version: Any = (
        None  # policy version (or adapter tag) of every k/v in ``cached`` (None: mixed or unknown)
    )


@dataclasses.dataclass(frozen=True)
class Placement:
    slot: int
    reuse_len: int  # prompt tokens already cached in that slot (not prefilled again)


class SlotTable:
    """Assigns requests to cache rows and tracks which prefix each row holds."""

    def __init__(self, num_slots: int, *, min_reuse: int = 1):
        self.slots = [Slot(i) for i in range(num_slots)]
        self.sessions: dict[str, int] = {}
        self.min_reuse = min_reuse
        self._clock = 0
        self._version = 0

    @property
    def num_free(self) -> int:
        return sum(not s.busy for s in self.slots)

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _reuse(self, slot: Slot, prompt: Sequence[int]) -> int:
        if slot.version != self._version:
            return 0
        # at least one prompt token is always prefilled: its logits give the first sample
        return min(common_prefix_len(slot.cached, prompt), len(prompt) - 1)

    def acquire(
        self, prompt: Sequence[int], session_id: str | None = None, version: int = 0
    ) -> Placement | None:
        """Reserve a free slot for ``prompt`` to be run under policy ``version``; None when all are busy."""
        free = [s for s in self.slots if not s.busy]
        if not free:
            return None
        self._version = version
        own = self.sessions.get(session_id) if session_id is not None else None
        chosen = self.slots[own] if own is not None and not self.slots[own].busy else None
        if chosen is None:
            chosen = self._best_free(free, prompt)
        reuse = self._reuse(chosen, prompt)
        if reuse < self.min_reuse:
            reuse = 0
        self._bind(chosen, session_id)
        chosen.busy = True
        chosen.last_used = self._tick()
        return Placement(chosen.index, reuse)

    def best_reuse(self, prompt: Sequence[int], version: Any) -> int:
        """The most prompt tokens a free slot holds under ``version`` (what :meth:`acquire` could reuse at
        best; at most ``len(prompt) - 1``)."""
        return max(
            (
                min(common_prefix_len(s.cached, prompt), len(prompt) - 1)
                for s in self.slots
                if not s.busy and s.version == version
            ),
            default=0,
        )

    def _best_free(self, free: list[Slot], prompt: Sequence[int]) -> Slot:
        unpinned = [s for s in free if s.session_id is None]
        pool = unpinned or free  # evict a pinned prefix only when nothing else is free
        best = max(pool, key=lambda s: (self._reuse(s, prompt), -s.last_used))
        if self._reuse(best, prompt) >= self.min_reuse:
            return best
        return min(
            pool, key=lambda s: s.index
        )  # low rows first: the decode step covers only a prefix of rows

    def _bind(self, slot: Slot, session_id: str | None) -> None:
        if slot.session_id is not None and slot.session_id != session_id:
            self.sessions.pop(slot.session_id, None)  # evicted: that session re-prefills next turn
            slot.session_id = None
        if session_id is not None:
            old = self.sessions.get(session_id)
            if old is not None and old != slot.index:
                self.slots[old].session_id = None
            self.sessions[session_id] = slot.index
            slot.session_id = session_id

    def release(self, slot: int, cached: Sequence[int], version: int | None = 0) -> None:
        """The request in ``slot`` finished; its row holds k/v for exactly ``cached``, all computed
        under policy ``version`` (None when they span versions: never reused)."""
        s = self.slots[slot]
        s.busy = False
        s.cached = list(cached)
        s.version = version
        s.last_used = self._tick()

    def swap(self, a: int, b: int) -> None:
        """Rows ``a`` and ``b`` exchanged their k/v (the caller copied them): each row's request, prefix
        and session now belong to the other index."""
        x, y = self.slots[a], self.slots[b]
        for f in ("busy", "cached", "session_id", "last_used", "version"):
            vx, vy = getattr(x, f), getattr(y, f)
            setattr(x, f, vy)
            setattr(y, f, vx)
        for s in (x, y):
            if s.session_id is not None:
                self.sessions[s.session_id] = s.index

    def compaction(self, widths: Sequence[int], limit: int | None = None) -> list[tuple[int, int]]:
        """Swaps ``[(busy, idle)]`` that pack the busy rows into the narrowest width bucket holding them:
        each busy row at or above it trades places with an idle row below it (empty rows first, then
        unpinned cached ones, then the least recently used pinned ones: a waiting session keeps its
        prefix, in a higher row). Empty when the busy rows already fit; at most ``limit`` swaps, the
        highest busy rows first. The caller copies the rows, then calls :meth:`swap` for each."""
        busy = [s.index for s in self.slots if s.busy]
        if not busy:
            return []
        target = pick_bucket(len(busy), widths)
        if pick_bucket(max(busy) + 1, widths) == target:
            return []
        out = sorted((i for i in busy if i >= target), reverse=True)[:limit]
        idle = sorted(
            (s for s in self.slots[:target] if not s.busy),
            key=lambda s: (s.session_id is not None, bool(s.cached), s.last_used),
        )
        return [(a, s.index) for a, s in zip(out, idle)]

    def invalidate(self, slot: int) -> None:
        """Forget what a row holds (after a failure)."""
        s = self.slots[slot]
        s.busy = False
        s.cached = []
        if s.session_id is not None:
            self.sessions.pop(s.session_id, None)
            s.session_id = None

    def end_session(self, session_id: str) -> None:
        """Unpin a session's slot (its prefix stays reusable until evicted)."""
        idx = self.sessions.pop(session_id, None)
        if idx is not None:
            self.slots[idx].session_id = None
