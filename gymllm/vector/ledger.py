"""The vector env's send/recv bookkeeping: per-sub-env slots, result sinks, deadlines and waiting.

One lock (the :class:`Ledger`'s condition) guards every :class:`Slot`. A send marks a slot pending
and busy and returns an :class:`Op` (a work item) that a sub-env runner executes; the runner hands
the outcome back with :meth:`Ledger.finish` / :meth:`Ledger.finish_many`, which drops stale
completions (an op timed out or the vector env closed meanwhile: ``slot.gen`` moved on), updates the
slot's state (:func:`gymllm.vector.autoreset.state_after`) and delivers the :class:`Result` to the
op's sink: the shared ready sink of ``send``/``recv``, a private sink of ``step``/``reset``, or a
:class:`FutureSink` of an awaiting per-env coroutine. ``recv`` waits on the condition (sync) or an
event (async) until enough results are in, expiring ops past ``step_timeout`` as it waits.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from gymllm.errors import EnvError, EnvTimeoutError, explain
from gymllm.telemetry import counter
from gymllm.vector.autoreset import state_after
from gymllm.vector.errors import VectorStateError

__all__ = ["Slot", "Result", "Op", "Sink", "FutureSink", "Ledger", "error_result", "running_loop"]

INF = math.inf


class Result:
    """One sub-env's outcome (a light record: built once per sub-env step)."""

    __slots__ = ("env_id", "obs", "reward", "terminated", "truncated", "info", "error")

    def __init__(
        self,
        env_id: int,
        obs: Any = None,
        reward: float = 0.0,
        terminated: bool = False,
        truncated: bool = False,
        info: dict | None = None,
        error: EnvError | None = None,
    ):
        self.env_id, self.obs, self.reward = env_id, obs, reward
        self.terminated, self.truncated, self.info, self.error = terminated, truncated, info, error


def error_result(env_id: int, op: str, e: BaseException) -> Result:
    """The result that reports sub-env ``env_id`` raising ``e`` in ``op`` (obs None, truncated True)."""
    err = EnvError(
        f"sub-env {env_id} raised {type(e).__name__} in {op.split('_')[0]}: {e}. Fix: see its "
        f"cause (err.cause); the vector env keeps the other sub-envs running and resets this one "
        f"on its next send.",
        env_id=env_id,
        cause=e,
    )
    return failure_result(env_id, err)


def failure_result(env_id: int, err: EnvError) -> Result:
    """A result carrying ``err`` (in ``info["error"]``; obs None, truncated True)."""
    return Result(env_id, None, 0.0, False, True, {"error": err}, err)


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running in this thread, or None."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[[], None]) -> None:
    """``loop.call_soon_threadsafe(fn)``, ignoring a loop that has already closed (its waiter is gone)."""
    try:
        loop.call_soon_threadsafe(fn)
    except RuntimeError:
        pass


class Sink:
    """Collects results; wakes sync waiters (the condition) and async waiters once ``need`` are in."""

    def __init__(self, cond: threading.Condition, need: int = 1):
        self.items: collections.deque[Result] = collections.deque()
        self.need = need
        self.cond = cond
        self.events: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()

    def deliver(self, res: Result) -> None:  # called with the lock held
        self.items.append(res)
        if len(self.items) >= self.need:
            self.wake()

    def wake(self) -> None:
        self.cond.notify_all()
        for loop, ev in tuple(self.events):
            call_soon(loop, ev.set)


class FutureSink:
    """Delivers one result to an asyncio future on the caller's loop."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.future: asyncio.Future[Result] = self.loop.create_future()

    def deliver(self, res: Result) -> None:
        def _set() -> None:
            if not self.future.done():
                self.future.set_result(res)

        if running_loop() is self.loop:
            _set()  # on the waiter's own loop: no hand-off needed
        else:
            call_soon(self.loop, _set)


@dataclasses.dataclass(eq=False)
class Slot:
    """One sub-env's place in the vector env (guarded by the ledger's lock)."""

    env_id: int
    make: Callable[[], Any]  # builds the instance (a gym.Env, or a runner's proxy)
    env: Any = None
    kind: str = "sync"  # "sync": worker thread; "async": task on an event loop; "ray": a Ray actor
    state: str = "new"  # "new" | "running" | "done"
    pending: bool = False  # an operation is running
    busy: bool = (
        False  # sent and its result not yet handed to the caller (pending, or waiting in a sink)
    )
    gen: int = 0  # bumped per operation and on timeout: stale completions are dropped
    deadline: float = INF
    sink: Any = None
    handle: Any = None  # a runner's handle on the op in flight (a future), cancelled on timeout
    loop: Any = (
        None  # the event loop an async-native sub-env's ops run on (see ThreadRunner.start_async)
    )
    lost: bool = False  # abandoned after a timeout; rebuilt by the next reset
    last_obs: Any = None
    inline: bool = False  # run its ops on the calling thread (see ThreadRunner.note_cost)
    check: Callable[[Any], str | None] = lambda action: None  # action validator
    step: Callable[[Any], tuple] | None = None  # the env's step function
    streak: int = 0  # consecutive step times on the other side of the inline threshold


class Op:
    """A work item: run ``op`` on ``slot`` (generation ``gen``); ``rebuild`` first makes a fresh instance."""

    __slots__ = ("slot", "gen", "op", "action", "seed", "options", "rebuild", "inline")

    def __init__(
        self,
        slot: Slot,
        gen: int,
        op: str,
        action: Any,
        seed: Any,
        options: Any,
        rebuild: bool,
        inline: bool,
    ):
        self.slot, self.gen, self.op, self.action = slot, gen, op, action
        self.seed, self.options, self.rebuild, self.inline = seed, options, rebuild, inline


class Ledger:
    """The slots, the shared ready sink and the lock; starts, finishes, expires and waits for ops.

    Args:
        slots: one :class:`Slot` per sub-env.
        step_timeout: seconds an op may take (None: no limit).
        abandon: ``slot -> None``, called (lock held) when an op of ``slot`` timed out: the runner
            stops waiting on it (cancels, kills, replaces a stuck worker).
    """

    def __init__(
        self, slots: list[Slot], step_timeout: float | None, abandon: Callable[[Slot], None]
    ):
        self.slots = slots
        self.step_timeout = step_timeout
        self.abandon = abandon
        self.cond = threading.Condition(threading.Lock())
        self.ready = Sink(self.cond)
        self.closed = False

    def check_open(self) -> None:
        if self.closed:
            raise VectorStateError(
                explain(
                    "VectorEnv",
                    expected="an open vector env",
                    received="closed",
                    fix="create a new vector env with gymllm.make_vec(...)",
                )
            )

    # ------------------------------------------------------------------ starting and finishing
    def start(
        self,
        slot: Slot,
        op: str,
        sink: Any,
        action: Any = None,
        seed: int | None = None,
        options: dict | None = None,
    ) -> Op:
        """Mark one operation on ``slot`` started (lock held) and return its work item; the caller
        hands it to the runner after releasing the lock (so workers never queue on it)."""
        slot.gen += 1
        slot.pending = slot.busy = True
        slot.sink = sink
        timeout = self.step_timeout
        if timeout is not None:
            slot.deadline = time.monotonic() + timeout
        rebuild = slot.lost
        slot.lost = False
        inline = slot.inline and not rebuild and timeout is None
        return Op(slot, slot.gen, op, action, seed, options, rebuild, inline)

    def finish(self, slot: Slot, gen: int, op: str, res: Result) -> None:
        with self.cond:
            self.finish_locked(slot, gen, op, res)

    def finish_many(self, done: list[tuple[Slot, int, str, Result]]) -> None:
        with self.cond:
            for slot, gen, op, res in done:
                if (
                    slot.gen != gen
                    or self.closed
                    or res.error is not None
                    or not isinstance(slot.sink, Sink)
                ):
                    self.finish_locked(slot, gen, op, res)
                    continue
                slot.pending = False  # the common case, inlined: a step or reset that returned
                slot.state = (
                    "done" if op == "step" and (res.terminated or res.truncated) else "running"
                )
                slot.last_obs = res.obs
                sink = slot.sink
                slot.sink = None
                sink.items.append(res)
                if len(sink.items) >= sink.need:
                    sink.wake()

    def finish_locked(self, slot: Slot, gen: int, op: str, res: Result) -> None:
        if slot.gen != gen or self.closed:
            return  # stale (timed out, or the vector env closed meanwhile)
        slot.pending, slot.handle, slot.deadline = False, None, INF
        slot.state = state_after(op, res.terminated, res.truncated, res.error is not None)
        if res.error is None:
            slot.last_obs = res.obs
        sink, slot.sink = slot.sink, None
        if not isinstance(sink, Sink):
            slot.busy = False  # a future sink hands the result over directly
        sink.deliver(res)

    # ------------------------------------------------------------------ timeouts
    def expire_overdue(self, now: float) -> float:
        """Report every pending op past its deadline as timed out (lock held); returns the next deadline."""
        nxt = INF
        for slot in self.slots:
            if slot.pending:
                if slot.deadline <= now:
                    self.expire(slot)
                else:
                    nxt = min(nxt, slot.deadline)
        return nxt

    def expire(self, slot: Slot) -> None:
        """Report ``slot``'s op as timed out (lock held); the runner abandons it, the next reset rebuilds."""
        slot.gen += 1
        slot.pending, slot.state, slot.lost, slot.deadline = False, "done", True, INF
        self.abandon(slot)
        slot.handle = None
        err = EnvTimeoutError(
            explain(
                f"sub-env {slot.env_id}",
                expected=f"a reply within step_timeout={self.step_timeout}s",
                received="no reply",
                fix="raise step_timeout, or fix the env; it is rebuilt on its next reset",
            ),
            env_id=slot.env_id,
        )
        counter("env_timeouts", 1, track=f"env/{slot.env_id}")
        sink, slot.sink = slot.sink, None
        if not isinstance(sink, Sink):
            slot.busy = False
        sink.deliver(failure_result(slot.env_id, err))

    # ------------------------------------------------------------------ waiting
    def in_flight_ids(self) -> list[int]:
        with self.cond:
            return [s.env_id for s in self.slots if s.pending] + [
                r.env_id for r in self.ready.items
            ]

    def count_for_recv(self) -> int:
        """Ops sent through ``send`` whose results ``recv`` has not handed out yet (lock held)."""
        return sum(s.pending and s.sink is self.ready for s in self.slots) + len(self.ready.items)

    def wait(self, sink: Sink, need: int, timeout: float | None) -> list[Result]:
        end = INF if timeout is None else time.monotonic() + timeout
        with self.cond:
            sink.need = need
            try:
                while True:
                    self.check_open()
                    now = time.monotonic()
                    nxt = self.expire_overdue(now)
                    if len(sink.items) >= need or now >= end:
                        return self.take(sink)
                    wake = min(nxt, end)
                    self.cond.wait(None if wake == INF else max(wake - now, 0.0))
            finally:
                sink.need = 1

    def take(self, sink: Sink) -> list[Result]:
        """Hand every result in ``sink`` to the caller (lock held)."""
        out = list(sink.items)
        sink.items.clear()
        for r in out:
            self.slots[r.env_id].busy = False
        return out

    async def await_results(self, sink: Sink, need: int, timeout: float | None) -> list[Result]:
        loop = asyncio.get_running_loop()
        event = asyncio.Event()
        end = INF if timeout is None else time.monotonic() + timeout
        waiter = (loop, event)
        try:
            while True:
                with self.cond:
                    self.check_open()
                    now = time.monotonic()
                    nxt = self.expire_overdue(now)
                    if len(sink.items) >= need or now >= end:
                        return self.take(sink)
                    sink.need = need
                    sink.events.add(waiter)
                    event.clear()
                    wake = min(nxt, end)
                try:
                    await asyncio.wait_for(
                        event.wait(), None if wake == INF else max(wake - now, 0.0)
                    )
                except asyncio.TimeoutError:
                    pass
        finally:
            with self.cond:
                sink.events.discard(waiter)
                sink.need = 1

    async def await_one(self, slot: Slot, gen: int, sink: FutureSink) -> Result:
        """The result of ``slot``'s op ``gen`` for a per-env coroutine, timed out at the op's deadline
        (``step_timeout`` after it started, unless the runner moved it: e.g. while a Ray actor is placed)."""
        try:
            while True:
                with self.cond:
                    deadline = slot.deadline if slot.gen == gen and slot.pending else INF
                timeout = None if deadline == INF else max(deadline - time.monotonic(), 0.0)
                try:
                    return await asyncio.wait_for(asyncio.shield(sink.future), timeout)
                except asyncio.TimeoutError:
                    with self.cond:
                        if slot.gen == gen and slot.pending:
                            if slot.deadline > time.monotonic():
                                continue  # the deadline was moved meanwhile
                            self.expire(slot)  # delivers the timeout result to sink.future
                    return await sink.future
        except asyncio.CancelledError:
            with self.cond:  # the caller gave up: abandon the op like a timeout, silently
                if slot.gen == gen and slot.pending:
                    self.expire(slot)
            raise

    # ------------------------------------------------------------------ closing
    def close(self) -> list[Slot]:
        """Mark closed, answer awaiting coroutines, wake every waiter; returns the slots that were pending."""
        with self.cond:
            if self.closed:
                return []
            self.closed = True
            busy = [s for s in self.slots if s.pending]
            for s in busy:
                s.gen += 1
                if s.handle is not None:
                    s.handle.cancel()
                if isinstance(
                    s.sink, FutureSink
                ):  # an awaiting astep_env/areset_env gets an answer
                    err = VectorStateError(
                        f"sub-env {s.env_id}: the vector env was closed during this call. Fix: "
                        "do not close it while coroutines still use it"
                    )
                    s.sink.deliver(Result(s.env_id, None, 0.0, False, True, {"error": err}, err))
            self.ready.wake()
            self.cond.notify_all()
        return busy
