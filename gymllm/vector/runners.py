"""Sub-env runners: where the vector env's sub-envs live and run.

A runner builds the sub-env instances of a :class:`~gymllm.vector.ledger.Ledger`'s slots, executes
the work items (:class:`~gymllm.vector.ledger.Op`) that ``send`` / ``step`` / ``reset`` start, and
hands each outcome back through ``ledger.finish`` / ``ledger.finish_many``. The interface
(:class:`SubEnvRunner`):

- ``build()``: create every sub-env (raise :class:`~gymllm.errors.EnvError` naming the one whose
  factory failed) and set each slot's ``env`` / ``kind`` / ``check`` / ``step``;
- ``dispatch(ops, caller_loop=None)``: run or hand off the work items (called without the lock);
  ``caller_loop`` is the running event loop of a caller that awaits the result right away
  (``areset_env`` / ``astep_env``), where an async-native sub-env's op may run as a task;
- ``abandon(slot)``: stop waiting on a timed-out op (lock held);
- ``close(idle, busy)``: close the sub-envs; never waits on a hung one.

Implementations: :class:`ThreadRunner` (``backend="thread"``: sync sub-envs inline on the calling
thread when cheap, else on daemon worker threads; async-native sub-envs in the awaiting caller's
task or event loop, or on one event-loop thread for the blocking API), :class:`ProcessRunner`
(``backend="process"``: one child process per sub-env) and
:class:`gymllm.vector.ray_backend.RayRunner` (``backend="ray"``: Ray actors).
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from gymllm.core import TextEnv, overrides_hook
from gymllm.errors import EnvError, explain
from gymllm.telemetry import span
from gymllm.vector.autoreset import arun_op, run_op, state_after
from gymllm.vector.config import VectorEnvConfig
from gymllm.vector.infos import batch_infos
from gymllm.vector.ledger import Ledger, Op, Result, Slot, error_result, running_loop
from gymllm.vector.process import ProcessEnv
from gymllm.vector.workers import LoopThread, WorkerPool

__all__ = [
    "SubEnvRunner",
    "ThreadRunner",
    "ProcessRunner",
    "action_validator",
    "step_function",
    "is_async_native",
    "close_quietly",
]


def is_async_native(env: Any) -> bool:
    """Whether ``env`` is a TextEnv with a native ``async def _astep`` (run as a task, not on a thread)."""
    u = getattr(env, "unwrapped", env)
    return (
        callable(getattr(env, "astep", None))
        and isinstance(u, TextEnv)
        and overrides_hook(u, "_astep")
    )


class LoopTask:
    """A runner's handle on an op running as a task on a caller's loop; ``cancel()`` is thread-safe."""

    __slots__ = ("loop", "task")

    def __init__(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task):
        self.loop, self.task = loop, task

    def cancel(self) -> None:
        try:
            self.loop.call_soon_threadsafe(self.task.cancel)
        except RuntimeError:
            pass  # the loop has closed: the task is gone with it


def action_validator(space: gym.Space) -> Callable[[Any], str | None]:
    """``action -> reason it is not in space (or None)``: gymllm spaces' ``why_not``, else ``contains``."""
    why = getattr(space, "why_not", None)
    if why is not None:
        return why
    return lambda action: None if space.contains(action) else f"{action!r} not in {space!r}"


def step_function(env: Any) -> Callable[[Any], tuple]:
    """``env.step``, or for a bare TextEnv that keeps the base ``step`` its checked-once step (the
    vector env has already checked the action against the same space: no second check)."""
    if isinstance(env, TextEnv) and type(env).step is TextEnv.step:
        return env.step_prechecked
    return env.step


def close_quietly(envs: Sequence[Any]) -> None:
    """``env.close()`` for each env, ignoring errors (closing must always return)."""
    for env in envs:
        try:
            if env is not None:
                env.close()
        except Exception:  # noqa: BLE001 - close() must always return
            pass


def creation_error(env_id: int, e: BaseException) -> EnvError:
    """The error for a sub-env whose factory raised ``e``."""
    return EnvError(
        explain(
            f"VectorEnv: creating sub-env {env_id}",
            expected="its factory to return an env",
            received=f"{type(e).__name__}: {e}",
            fix="check that env id / factory and its "
            "kwargs on their own, e.g. gymllm.make(id, **kwargs)",
        ),
        env_id=env_id,
        cause=e,
    )


class SubEnvRunner:
    """Where sub-envs run (the interface; see the module docstring)."""

    def __init__(self, config: VectorEnvConfig, ledger: Ledger):
        self.config = config
        self.ledger = ledger

    def build(self) -> None:
        raise NotImplementedError

    def dispatch(self, ops: list[Op], caller_loop: asyncio.AbstractEventLoop | None = None) -> None:
        raise NotImplementedError

    def abandon(self, slot: Slot) -> None:
        raise NotImplementedError

    def can_run_here(self, slot: Slot, caller_loop: asyncio.AbstractEventLoop) -> bool:
        """Whether ``slot``'s op may run in the awaiting caller's coroutine (``run_here``); else ``dispatch``."""
        return False

    async def run_here(self, item: Op, sink: Any) -> Result:
        raise NotImplementedError

    def close(self, idle: list[Slot], busy: list[Slot]) -> None:
        raise NotImplementedError

    def can_step_inline(self, slots: list[Slot]) -> bool:
        """Whether ``step()`` may run every sub-env right here in one pass (:meth:`step_inline`)."""
        return False

    def step_inline(
        self, actions: list[Any], ops: list[str], gens: list[int]
    ) -> tuple[tuple, list[Result]]:
        raise NotImplementedError

    def describe(self, slot: Slot) -> dict[str, Any]:
        """Where ``slot``'s sub-env runs (for logs and tests)."""
        return {"backend": self.config.backend, "kind": slot.kind}


class ThreadRunner(SubEnvRunner):
    """``backend="thread"``: inline when cheap, daemon worker threads when not, async-native on a loop."""

    def __init__(self, config: VectorEnvConfig, ledger: Ledger):
        super().__init__(config, ledger)
        self.pool: WorkerPool | None = None
        self.loop: LoopThread | None = None
        self.async_limits: weakref.WeakKeyDictionary = (
            weakref.WeakKeyDictionary()
        )  # loop -> its async ops' cap

    # ------------------------------------------------------------------ building
    def build(self) -> None:
        slots = self.ledger.slots
        self.create(slots)
        for slot in slots:
            slot.kind = "async" if is_async_native(slot.env) else "sync"
            slot.check = action_validator(slot.env.action_space)
            slot.step = step_function(slot.env)
        limit = self.config.max_concurrency or len(slots)
        n_sync = sum(s.kind == "sync" for s in slots)
        if n_sync:
            self.pool = WorkerPool(min(limit, n_sync))
        if n_sync < len(slots):
            self.loop = LoopThread()

    def create(self, slots: list[Slot]) -> None:
        building = 0
        try:
            for slot in slots:
                building = slot.env_id
                slot.env = slot.make()
        except Exception as e:
            close_quietly([s.env for s in slots])
            raise creation_error(building, e) from e

    def rebuild(self, slot: Slot, gen: int) -> Any:
        env = slot.make()
        with self.ledger.cond:
            if slot.gen == gen:
                slot.env, slot.step = env, step_function(env)
        return env

    # ------------------------------------------------------------------ running
    def note_cost(self, slot: Slot, dt: float) -> None:
        """Decide whether this sub-env's ops run on the calling thread (``slot.inline``).

        Only thread-backed sync sub-envs measured to take under ``inline_below_s`` per step, and
        only without a ``step_timeout`` (an inline op cannot be timed out). Such steps are CPU-bound
        Python, which gains nothing from threads under the GIL; skipping the hand-off saves its
        switching cost. With hysteresis: 3 steps in a row under the limit move a sub-env inline, 3 in
        a row above 10x the limit move it back to the pool (one preempted step does not flip it).
        """
        limit = self.config.inline_below_s
        if slot.inline:
            slot.streak = slot.streak + 1 if dt > 10 * limit else 0
        else:
            slot.streak = slot.streak + 1 if dt < limit else 0
        if slot.streak >= 3:
            slot.inline, slot.streak = not slot.inline, 0

    def dispatch(self, ops: list[Op], caller_loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Hand pooled work items to the workers and async ones to their loop, then run the inline ones here."""
        inline = []
        for item in ops:
            slot = item.slot
            if slot.kind == "async":
                self.start_async(item, caller_loop)
            elif item.inline:
                inline.append(item)
            else:
                self.pool.submit(functools.partial(self.run_pooled, item))
        if not inline:
            return
        done = []
        perf = time.perf_counter
        slow = 10 * self.config.inline_below_s
        for item in inline:
            slot, op, action = item.slot, item.op, item.action
            t0 = perf()
            try:
                if op == "step":  # the hot path, spelled out
                    res = Result(slot.env_id, *slot.step(action))
                else:
                    res = Result(
                        slot.env_id,
                        *run_op(slot.env, op, action, item.seed, item.options, slot.step),
                    )
            except BaseException as e:  # noqa: BLE001 - isolate the sub-env, report it
                res = error_result(slot.env_id, op, e)
            else:
                dt = perf() - t0
                if (dt > slow or slot.streak) and op != "reset":
                    self.note_cost(slot, dt)
            done.append((slot, item.gen, op, res))
        self.ledger.finish_many(done)

    def exec_sync(self, item: Op) -> Result:
        slot, op = item.slot, item.op
        try:
            env = self.rebuild(slot, item.gen) if item.rebuild else slot.env
            t0 = time.perf_counter()
            res = Result(
                slot.env_id,
                *run_op(env, op, item.action, item.seed, item.options, step_function(env)),
            )
            if op != "reset":  # steps decide inlining (a reset's cost says little about a step's)
                self.note_cost(slot, time.perf_counter() - t0)
            return res
        except BaseException as e:  # noqa: BLE001 - isolate the sub-env, report it
            return error_result(slot.env_id, op, e)

    def run_pooled(self, item: Op) -> None:
        # Pooled ops take >= inline_below_s, so a span per op (on the sub-env's track) is affordable.
        with span(f"env.{item.op}", track=f"env/{item.slot.env_id}"):
            res = self.exec_sync(item)
        self.ledger.finish(item.slot, item.gen, item.op, res)

    def start_async(self, item: Op, caller_loop: asyncio.AbstractEventLoop | None) -> None:
        """Run an async-native sub-env's op as a task on the loop its slot is pinned to.

        A slot is pinned to the loop of its first op: the awaiting caller's loop (``areset_env`` /
        ``astep_env`` from a coroutine: no thread hop either way, the env's coroutine runs where the
        caller awaits it) or, for the blocking API, the runner's loop thread. It stays there (an
        async env may hold loop-bound resources, e.g. an HTTP client) until that loop stops; a
        blocking call made on the pinned loop's own thread goes to the loop thread (waiting there
        for a task of the same loop would never return)."""
        slot = item.slot
        pinned = self.pin(slot, caller_loop)
        if pinned is caller_loop:
            slot.handle = LoopTask(pinned, pinned.create_task(self.run_async(item)))
        elif pinned is not self.loop.loop and running_loop() is pinned:
            slot.handle = self.loop.submit(
                self.run_async(item)
            )  # blocking call on the pinned loop's thread
        else:
            slot.handle = asyncio.run_coroutine_threadsafe(self.run_async(item), pinned)

    def pin(
        self, slot: Slot, caller_loop: asyncio.AbstractEventLoop | None
    ) -> asyncio.AbstractEventLoop:
        """The loop ``slot``'s async ops run on (pinned at its first op; see :meth:`start_async`)."""
        pinned = slot.loop
        if pinned is not None and (
            pinned.is_closed() or (pinned is not self.loop.loop and not pinned.is_running())
        ):
            pinned = None  # that caller's loop has ended
        if pinned is None:
            pinned = slot.loop = caller_loop if caller_loop is not None else self.loop.loop
        return pinned

    def can_run_here(self, slot: Slot, caller_loop: asyncio.AbstractEventLoop) -> bool:
        """Whether an awaiting caller may run ``slot``'s op in its own coroutine (:meth:`run_here`):
        an async-native sub-env pinned to the caller's loop, and no ``step_timeout`` to enforce."""
        return (
            slot.kind == "async"
            and self.config.step_timeout is None
            and self.pin(slot, caller_loop) is caller_loop
        )

    async def run_here(self, item: Op, sink: Any) -> Result:
        """Run an async-native sub-env's op in the awaiting caller's coroutine: no task, no hand-off,
        so an env that does not suspend costs no event-loop iteration. The op's outcome is recorded
        as :meth:`run_async` records it; a cancelled caller cancels the op (the op is abandoned, as a
        timed-out one is: the next reset rebuilds the sub-env). ``close()`` during the op cancels it
        through ``slot.handle`` and the caller gets the close's answer, as a dispatched op's would."""
        task = asyncio.current_task()
        slot = item.slot
        with self.ledger.cond:
            if slot.gen == item.gen and slot.pending:
                slot.handle = LoopTask(sink.loop, task)
        try:
            await self.run_async(item, reraise_cancel=True)
        except asyncio.CancelledError:
            with self.ledger.cond:
                mine = slot.gen == item.gen and slot.pending
                if mine:
                    self.ledger.expire(slot)  # the caller gave up: abandon the op like a timeout
            if mine or not sink.future.done():
                raise
            # the vector env closed (or expired the op) and cancelled it: answer as it said, unless the
            # caller's task was cancelled as well (Python >= 3.11 counts the requests)
            if hasattr(task, "uncancel") and task.uncancel() > 0:
                raise
        fut = sink.future
        return fut.result() if fut.done() else await fut

    def async_limit(self, loop: asyncio.AbstractEventLoop) -> asyncio.Semaphore:
        """The cap on concurrent async ops (``max_concurrency``) of ``loop`` (a semaphore binds to one loop)."""
        sem = self.async_limits.get(loop)
        if sem is None:
            sem = self.async_limits.setdefault(
                loop, asyncio.Semaphore(self.config.max_concurrency or len(self.ledger.slots))
            )
        return sem

    async def run_async(self, item: Op, reraise_cancel: bool = False) -> None:
        slot, op = item.slot, item.op
        try:
            async with self.async_limit(asyncio.get_running_loop()):
                env = self.rebuild(slot, item.gen) if item.rebuild else slot.env
                with span(f"env.{op}", track=f"env/{slot.env_id}"):
                    res = Result(
                        slot.env_id, *await arun_op(env, op, item.action, item.seed, item.options)
                    )
        except asyncio.CancelledError:
            if reraise_cancel:
                raise
            return  # timed out or closed: the canceller reports it
        except BaseException as e:  # noqa: BLE001
            res = error_result(slot.env_id, op, e)
        self.ledger.finish(slot, item.gen, op, res)

    def abandon(self, slot: Slot) -> None:
        if slot.handle is not None:
            slot.handle.cancel()
        elif self.pool is not None:
            self.pool.add_worker(
                replacement=True
            )  # the stuck worker is gone for good; keep the pool's capacity

    # ------------------------------------------------------------------ the one-pass step
    def can_step_inline(self, slots: list[Slot]) -> bool:
        return self.config.step_timeout is None and all(s.inline and not s.lost for s in slots)

    def step_inline(
        self, actions: list[Any], ops: list[str], gens: list[int]
    ) -> tuple[tuple, list[Result]]:
        """``step()`` when every sub-env runs inline: one pass, straight into the output arrays.

        Returns the batch ``(obs, rewards, terms, truncs, infos)`` and the error results.
        """
        slots = self.ledger.slots
        n = len(slots)
        obs = np.empty(n, dtype=object)
        rewards = np.zeros(n, dtype=np.float64)
        terms = np.zeros(n, dtype=np.bool_)
        truncs = np.zeros(n, dtype=np.bool_)
        pairs, errors = [], []
        perf, slow = time.perf_counter, 10 * self.config.inline_below_s
        for i, (slot, action, op) in enumerate(zip(slots, actions, ops)):
            t0 = perf()
            try:
                if op == "step":
                    o, r, te, tr, info = slot.step(action)
                else:
                    o, r, te, tr, info = run_op(slot.env, op, action, None, None, slot.step)
            except BaseException as e:  # noqa: BLE001 - isolate the sub-env, report it
                res = error_result(i, op, e)
                errors.append(res)
                o, r, te, tr, info = res.obs, res.reward, res.terminated, res.truncated, res.info
            else:
                dt = perf() - t0
                if (dt > slow or slot.streak) and op != "reset":
                    self.note_cost(slot, dt)
            obs[i] = o
            rewards[i] = r
            terms[i] = te
            truncs[i] = tr
            if info:
                pairs.append((i, info))
        failed = {res.env_id for res in errors}
        with self.ledger.cond:
            for i, (slot, op, gen) in enumerate(zip(slots, ops, gens)):
                if slot.gen != gen:
                    continue  # the vector env was closed meanwhile
                slot.pending = slot.busy = False
                slot.state = state_after(op, terms[i], truncs[i], i in failed)
                if i not in failed:
                    slot.last_obs = obs[i]
        return (obs, rewards, terms, truncs, batch_infos(pairs, n)), errors

    # ------------------------------------------------------------------ closing
    def close(self, idle: list[Slot], busy: list[Slot]) -> None:
        closer = threading.Thread(
            target=self.close_instances, args=(idle, busy), daemon=True, name="gymllm-vec-close"
        )
        closer.start()
        closer.join(timeout=5.0)
        if self.pool is not None:
            self.pool.shutdown()
        if self.loop is not None:
            self.loop.stop()

    def close_instances(self, idle: list[Slot], busy: list[Slot]) -> None:
        close_quietly([s.env for s in idle])


class ProcessRunner(ThreadRunner):
    """``backend="process"``: each sub-env in its own child process (a :class:`ProcessEnv` proxy),
    driven from worker threads; a timed-out child is killed and rebuilt on its next reset."""

    def build(self) -> None:
        ctx = self.config.mp_context
        self.factories = [slot.make for slot in self.ledger.slots]
        for slot in self.ledger.slots:  # a rebuild starts a fresh child and waits for it
            slot.make = functools.partial(_started_process_env, slot.make, ctx)
        super().build()

    def create(self, slots: list[Slot]) -> None:
        building = 0
        ctx = self.config.mp_context
        try:  # start every child first, then wait for them together
            for slot in slots:
                building = slot.env_id
                slot.env = ProcessEnv(self.factories[slot.env_id], ctx)
            for slot in slots:
                building = slot.env_id
                slot.env.wait_ready()
        except Exception as e:
            for s in slots:
                if isinstance(s.env, ProcessEnv):
                    s.env.kill()
            raise creation_error(building, e) from e

    def note_cost(self, slot: Slot, dt: float) -> None:
        return  # a proxy's step time is a blocking round trip, not GIL-bound work: keep it pooled

    def abandon(self, slot: Slot) -> None:
        if isinstance(slot.env, ProcessEnv):
            slot.env.kill()

    def close_instances(self, idle: list[Slot], busy: list[Slot]) -> None:
        for s in busy:
            if isinstance(s.env, ProcessEnv):
                s.env.kill()
        super().close_instances(idle, busy)


def _started_process_env(fn: Callable[[], gym.Env], ctx: str) -> ProcessEnv:
    return ProcessEnv(fn, ctx).wait_ready()
