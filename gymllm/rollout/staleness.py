"""Admission control that bounds policy staleness (the AReaL rule).

A new group is admitted only while ``accepted + running < (eta + v + 1) * B``, so that after the
admission ``accepted + running <= (eta + v + 1) * B`` holds at all times:

* ``v``        the current policy version (set by the learner after each optimizer step),
* ``B``        groups per optimizer step,
* ``eta``      the maximum staleness in policy versions (``eta = 0`` == synchronous RL),
* ``accepted`` groups completed and handed on (filtered, failed or stale-dropped ones do not count),
* ``running``  groups admitted and not finished.

Groups that are filtered, fail or time out release their slot without counting as accepted, so a
run in which every group is filtered keeps admitting (no deadlock). At consumption time
:meth:`StalenessController.is_stale` gives the hard bound ``v - admitted_version <= eta``.
"""

from __future__ import annotations

import asyncio
import math
import threading

from gymllm.errors import explain
from gymllm.validation import check_range


class StalenessController:
    """Counts admitted/running/accepted groups and gates admissions on the policy version.

    All mutating methods must run on the event loop that called :meth:`bind` (or any thread before
    binding); :meth:`set_version` is also safe to call from another thread.
    """

    def __init__(self, *, max_staleness: int | None, groups_per_step: int, version: int = 0):
        check_range(
            "StalenessController",
            "max_staleness",
            max_staleness,
            lo=0,
            integer=True,
            optional=True,
            fix="pass eta = 0 for synchronous, 2-4 for async",
        )
        check_range(
            "StalenessController",
            "groups_per_step",
            groups_per_step,
            lo=1,
            integer=True,
            fix="pass the learner's groups per optimizer step",
        )
        self.max_staleness = max_staleness
        self.groups_per_step = groups_per_step
        self.version = int(version)
        self.accepted = 0
        self.running = 0
        self.admitted_total = 0
        self.max_observed_load = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: int | None = None
        self._changed: asyncio.Event | None = None

    # --- pure state -------------------------------------------------------------------------
    @property
    def capacity(self) -> float:
        """``(eta + v + 1) * B``; infinite when staleness is unbounded."""
        if self.max_staleness is None:
            return math.inf
        return (self.max_staleness + self.version + 1) * self.groups_per_step

    @property
    def load(self) -> int:
        return self.accepted + self.running

    def can_admit(self) -> bool:
        return self.load < self.capacity

    def admit(self) -> int:
        """Admit one group now; returns the policy version it is admitted at."""
        if not self.can_admit():
            raise RuntimeError(
                f"admission refused: accepted {self.accepted} + running {self.running} >= capacity "
                f"{self.capacity} at version {self.version}. Fix: await wait_admit() first."
            )
        self.running += 1
        self.admitted_total += 1
        self.max_observed_load = max(self.max_observed_load, self.load)
        return self.version

    def finish(self, *, accepted: bool) -> None:
        """A running group ended: accepted (handed on) or not (filtered, failed, timed out)."""
        if self.running <= 0:
            raise RuntimeError(
                "finish() without a running group: every finish must match one admit()"
            )
        self.running -= 1
        self.accepted += int(accepted)
        self._notify()

    def unaccept(self) -> None:
        """An accepted group was dropped before training (stale at consumption): free its slot."""
        self.accepted = max(0, self.accepted - 1)
        self._notify()

    def is_stale(self, admitted_version: int, version: int | None = None) -> bool:
        """True when a group admitted at ``admitted_version`` exceeds the staleness bound."""
        if self.max_staleness is None:
            return False
        v = self.version if version is None else version
        return v - admitted_version > self.max_staleness

    # --- async gating ----------------------------------------------------------------------
    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.get_ident()
        self._changed = asyncio.Event()

    def set_version(self, version: int) -> None:
        """Advance the policy version (never backwards); wakes waiting admissions. Thread-safe."""
        version = int(version)
        if version < self.version:
            raise ValueError(
                explain(
                    "policy version",
                    expected=f">= current version {self.version}",
                    received=version,
                    fix="versions only increase; pass the learner's step count after each update",
                )
            )
        if self._loop is not None and threading.get_ident() != self._thread:
            self._loop.call_soon_threadsafe(self._set_version_on_loop, version)
        else:
            self._set_version_on_loop(version)

    def _set_version_on_loop(self, version: int) -> None:
        self.version = max(self.version, version)
        self._notify()

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()

    async def wait_admit(self, stop: asyncio.Event | None = None) -> bool:
        """Wait until a group may be admitted; returns False if ``stop`` was set first."""
        if self._changed is None:
            self.bind(asyncio.get_running_loop())
        assert self._changed is not None
        while not self.can_admit():
            if stop is not None and stop.is_set():
                return False
            self._changed.clear()
            waiters = [asyncio.ensure_future(self._changed.wait())]
            if stop is not None:
                waiters.append(asyncio.ensure_future(stop.wait()))
            try:
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waiters:
                    w.cancel()
        return not (stop is not None and stop.is_set())
