"""GroupProducer: the producing half of :class:`~gymllm.rollout.orchestrator.RolloutOrchestrator`.

It admits groups (staleness bound, open-group bound, backlog), runs one coroutine per trajectory on a
lent env slot, collects members into complete groups (:class:`~gymllm.rollout.group_buffer.GroupBuffer`),
filters them and puts them into the orchestrator's queue; a member's failure retries or drops its
group, ``max_failed_streak`` failures in a row stop the run (:class:`RolloutStalledError` from the
queue), and groups open past ``group_timeout_s`` are failed by :meth:`GroupProducer.expire_groups`.
The orchestrator owns the queue, the concurrency gate and the consumer side; see its docstring.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Any, Callable

from gymllm.errors import GymLLMError
from gymllm.rollout.agents import Agent
from gymllm.rollout.concurrency import ConcurrencyGate
from gymllm.rollout.config import RolloutConfig
from gymllm.rollout.env_slots import EnvSlots
from gymllm.rollout.episode import Episode, EpisodeKey
from gymllm.rollout.group_buffer import GroupBuffer, GroupFailedError
from gymllm.rollout.group_queue import GroupQueue, QueueClosed
from gymllm.rollout.staleness import StalenessController
from gymllm.telemetry import counter, span
from gymllm.types import Group

__all__ = [
    "GroupProducer",
    "GroupTimeoutError",
    "RolloutStalledError",
    "run_episode",
    "GroupFilter",
]

log = logging.getLogger("gymllm.rollout")

GroupFilter = Callable[[Group], bool]


class GroupTimeoutError(GroupFailedError, TimeoutError):
    """A group stayed open longer than ``group_timeout_s``."""


class RolloutStalledError(GymLLMError, RuntimeError):
    """``max_failed_streak`` trajectory attempts in a row failed: the run cannot make progress."""

    def __init__(self, message: str, *, failures: int, last_errors: list[str]):
        super().__init__(message)
        self.failures = failures
        self.last_errors = last_errors


async def run_episode(
    slots: EnvSlots, engine: Any, episode: Episode, env_id: int, max_prompt_len: int | None = None
) -> Episode:
    """Drive one trajectory to its end on env slot ``env_id`` (the coroutine-per-trajectory loop)."""
    key = episode.key
    try:
        return await _drive(slots, engine, episode, env_id, max_prompt_len)
    finally:
        end = getattr(engine, "end_session", None)
        if end is not None:
            end(key.trajectory_id)  # free the engine's cached prefix of this trajectory


async def _drive(
    slots: EnvSlots, engine: Any, episode: Episode, env_id: int, max_prompt_len: int | None
) -> Episode:
    key = episode.key
    with span("rollout", track="rollout", trajectory=key.trajectory_id):
        t = time.perf_counter()
        with span("env_step", track=f"env/{env_id}", kind="reset"):
            obs, info = await slots.reset(env_id, key.env_seed)
        episode.begin(obs, info, reset_s=time.perf_counter() - t)
        while not episode.done and episode.fits(max_prompt_len):
            prompt, params = episode.next_request()
            t = time.perf_counter()
            with span(
                "generate", track="rollout", trajectory=key.trajectory_id, prompt_len=len(prompt)
            ):
                completion = await engine.generate(prompt, params, session_id=key.trajectory_id)
            action = episode.on_completion(completion, time.perf_counter() - t)
            name = "tool" if getattr(episode.agent, "last_tool_calls", None) else "env_step"
            t = time.perf_counter()
            with span(name, track=f"env/{env_id}", trajectory=key.trajectory_id):
                obs, reward, terminated, truncated, info = await slots.step(env_id, action)
            dt = time.perf_counter() - t
            if terminated or truncated:
                with span("reward", track=f"env/{env_id}", reward=float(reward)):
                    pass  # the terminal step computed the outcome reward (its time is in env_step)
            episode.on_step(obs, reward, terminated, truncated, info, dt)
    return episode


class _ShieldedSlots:
    """Env slots whose calls survive the caller's cancellation; ``pending`` is the last call."""

    def __init__(self, slots: EnvSlots):
        self.slots = slots
        self.num_envs = slots.num_envs
        self.pending: asyncio.Future | None = None

    async def reset(self, env_id: int, seed: int | None) -> tuple[Any, dict]:
        return await self._run(self.slots.reset(env_id, seed))

    async def step(self, env_id: int, action: str) -> tuple[Any, float, bool, bool, dict]:
        return await self._run(self.slots.step(env_id, action))

    async def _run(self, coro: Any) -> Any:
        task = asyncio.ensure_future(coro)
        task.add_done_callback(
            lambda t: t.cancelled() or t.exception()
        )  # retrieved: no stray warnings
        self.pending = task
        return await asyncio.shield(task)


class GroupProducer:
    """Admits groups and runs their trajectories into ``queue`` (see the module docstring).

    Shares with its orchestrator: ``staleness``, ``counts`` and ``errors`` (read by ``stats``), and
    the callbacks ``adapt(event)`` / ``limit()`` of the concurrency law."""

    def __init__(
        self,
        config: RolloutConfig,
        slots: EnvSlots,
        engine: Any,
        agent: Agent,
        *,
        sampling: Any,
        group_filter: GroupFilter | None,
        seed: int,
        prefix_preserving: bool,
        prompt_limit: int | None,
        staleness: StalenessController,
        counts: collections.Counter,
        errors: list[str],
        adapt: Callable[[str], None],
        limit: Callable[[], int],
    ):
        self.config, self.slots, self.engine, self.agent, self.sampling = (
            config,
            slots,
            engine,
            agent,
            sampling,
        )
        self.seed = seed  # group k: env seed seed + k
        self.group_filter, self.prefix_preserving, self.prompt_limit = (
            group_filter,
            prefix_preserving,
            prompt_limit,
        )
        self.staleness, self.counts, self.errors, self.adapt, self.limit = (
            staleness,
            counts,
            errors,
            adapt,
            limit,
        )
        self.buffer = GroupBuffer(
            group_size=config.group_size,
            max_open_groups=config.open_group_limit,
            timeout_s=config.group_timeout_s,
            max_retries=config.max_group_retries,
        )
        self.failed_streak = 0  # trajectory attempts failed in a row (max_failed_streak)
        self.queue: GroupQueue | None = None
        self.gate: ConcurrencyGate | None = None
        self.stop_event: asyncio.Event | None = None
        self.changed: asyncio.Event | None = None
        self.free_envs: collections.deque[int] = collections.deque(range(slots.num_envs))
        self.members: dict[str, set[asyncio.Task]] = {}
        self.busy_envs: dict[int, asyncio.Future] = {}  # env calls still running after a cancel
        self.tasks: list[asyncio.Task] = []
        self.releasing = 0

    def start(self, queue: GroupQueue, gate: ConcurrencyGate) -> None:
        """Start the admission loop (and the group-timeout watch) into ``queue`` under ``gate``."""
        self.queue, self.gate = queue, gate
        self.stop_event, self.changed = asyncio.Event(), asyncio.Event()
        self.tasks = [asyncio.create_task(self.produce(), name="rollout-producer")]
        if self.config.group_timeout_s is not None:
            self.tasks.append(asyncio.create_task(self.expire_groups(), name="rollout-watchdog"))

    async def stop(self) -> None:
        """Stop admitting and cancel every task and env call in flight (waits for them; never hangs)."""
        if self.stop_event is not None:
            self.stop_event.set()
        tasks = (
            [t for ts in self.members.values() for t in ts]
            + self.tasks
            + list(self.busy_envs.values())
        )
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def produce(self) -> None:
        assert self.queue is not None and self.stop_event is not None
        cfg = self.config
        try:
            k = 0
            while not self.stop_event.is_set() and (cfg.num_groups is None or k < cfg.num_groups):
                if not await self.staleness.wait_admit(self.stop_event):
                    break
                if not await self._wait(lambda: self.buffer.has_room() and not self._backlogged()):
                    break
                version = self.staleness.admit()
                gid = EpisodeKey(k, 0).group_id
                self.buffer.open(gid, seed=self.seed + k, admitted_version=version)
                self._spawn_members(k, attempt=0)
                self.counts["admitted"] += 1
                counter("groups_running", self.staleness.running, track="rollout")
                k += 1
            await self._wait(lambda: not self.buffer.open_groups and not self.releasing)
            if not self.stop_event.is_set():
                await self.queue.close()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # anything unexpected reaches the consumer
            await self._abort(e)

    async def _wait(self, ready: Callable[[], bool]) -> bool:
        assert self.changed is not None and self.stop_event is not None
        while not ready():
            if self.stop_event.is_set():
                return False
            self.changed.clear()
            await self.changed.wait()
        return not self.stop_event.is_set()

    def _backlogged(self) -> bool:
        """The consumer is behind: the queue is full or complete groups wait to enter it."""
        assert self.queue is not None
        return self.queue.full() or self.releasing > 0

    def notify(self) -> None:
        if self.changed is not None:
            self.changed.set()

    def _spawn_members(self, k: int, attempt: int) -> None:
        cfg = self.config
        key0 = EpisodeKey(k, 0, attempt, self.seed + k)
        tasks = {
            asyncio.create_task(
                self._member(EpisodeKey(k, m, attempt, self.seed + k)),
                name=f"{key0.group_id}/m{m}/a{attempt}",
            )
            for m in range(cfg.group_size)
        }
        self.members[key0.group_id] = tasks

    async def _member(self, key: EpisodeKey) -> None:
        assert self.gate is not None
        gid = key.group_id
        try:
            await self.gate.acquire()
            env_id = self.free_envs.popleft()
            guarded = _ShieldedSlots(self.slots)
            try:
                ep = Episode(
                    key,
                    self.agent,
                    self.sampling,
                    base_seed=self.seed,
                    max_model_calls=self.config.max_model_calls,
                    prefix_preserving=self.prefix_preserving,
                    env_id=env_id,
                )
                await run_episode(guarded, self.engine, ep, env_id, self.prompt_limit)
            finally:
                self._return_env(env_id, guarded.pending)
            trajs = ep.trajectories()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # isolate: the group fails or retries, the run continues
            self.counts["member_errors"] += 1
            self.errors.append(f"{key.trajectory_id}: {e!r}")
            log.warning("trajectory %s failed: %r", key.trajectory_id, e)
            await self._fail_group(gid, e, key.attempt, current=asyncio.current_task())
            await self._count_failure()
            return
        self.failed_streak = 0
        group = self._add(gid, key, trajs)
        if group is None:
            return
        self.releasing += 1
        try:
            await self._release(group)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # e.g. a group_filter that raised: the consumer must hear of it
            await self._abort(e)
        finally:
            self.releasing -= 1
            self.notify()

    async def _count_failure(self) -> None:
        """One more failed trajectory attempt in a row; at ``max_failed_streak`` the run stops clearly."""
        self.failed_streak += 1
        limit = self.config.max_failed_streak
        if limit is None or self.failed_streak != limit:
            return
        self.counts["stalled"] += 1
        last = self.errors[-3:]
        await self._abort(
            RolloutStalledError(
                f"rollouts: expected some trajectory to succeed, received {limit} failed attempts in a row "
                f"(admitted {self.counts['admitted']} groups, {self.counts['groups_failed']} failed for good; last errors: "
                f"{'; '.join(last)}). Fix: check the env/tool/engine error above (gymllm check ENV_ID runs the env alone), "
                "or raise RolloutConfig.max_failed_streak (gymllm train: --rollout.max-failed-streak; None never stops)",
                failures=limit,
                last_errors=last,
            )
        )

    async def _abort(self, error: BaseException) -> None:
        """Stop the run and hand ``error`` to the consumer (after the groups already queued)."""
        assert self.queue is not None
        await self.queue.put_exception(error)
        if self.stop_event is not None:
            self.stop_event.set()
        self.notify()

    def _return_env(self, env_id: int, pending: asyncio.Future | None) -> None:
        """Give the env slot back, or, if an env call is still running (the member was cancelled
        mid-step), only once that call has finished: a hung env is never handed to a new trajectory."""
        assert self.gate is not None
        sem = self.gate

        def give_back(_: Any = None) -> None:
            self.busy_envs.pop(env_id, None)
            self.free_envs.append(env_id)
            sem.release()

        if pending is None or pending.done():
            give_back()
        else:
            self.counts["envs_quarantined"] += 1
            self.busy_envs[env_id] = pending
            pending.add_done_callback(give_back)

    def _add(self, gid: str, key: EpisodeKey, trajs: list) -> Group | None:
        group = self.buffer.add(gid, key.member, trajs, attempt=key.attempt)
        if group is not None:
            self.members.pop(gid, None)
            self.notify()
        return group

    async def _release(self, group: Group) -> None:
        assert self.queue is not None
        keep = False
        try:
            keep = True if self.group_filter is None else bool(self.group_filter(group))
        finally:
            self.staleness.finish(accepted=keep)
        self.notify()
        if not keep:
            self.counts["filtered"] += 1
            return
        self.counts["released"] += 1
        group.info["completed_at"] = time.perf_counter()
        group.info["released_version"] = self.staleness.version
        try:
            await self.queue.put(group)
        except QueueClosed:
            return
        self.adapt("group_queued")
        counter("rollout_concurrency", self.limit(), track="rollout")
        counter("queue_depth", self.queue.qsize(), track="rollout")

    async def _fail_group(
        self, gid: str, error: BaseException, attempt: int, current: Any = None
    ) -> None:
        assert self.queue is not None
        decision = self.buffer.fail(gid, error, attempt=attempt)
        if decision == "ignored":
            return
        siblings = self.members.pop(gid, set())
        for t in siblings:
            if t is not current:
                t.cancel()
        k = int(gid[1:])
        if decision == "retry":
            self.counts["group_retries"] += 1
            self._spawn_members(k, self.buffer.attempt(gid))
            return
        self.counts["groups_failed"] += 1
        self.staleness.finish(accepted=False)
        self.notify()
        if self.config.raise_on_group_failure:
            exc_type = GroupTimeoutError if isinstance(error, TimeoutError) else GroupFailedError
            err = exc_type(
                f"group {gid} failed after {attempt + 1} attempt(s): {error!r}",
                group_id=gid,
                cause=error,
            )
            await self._abort(err)

    async def expire_groups(self) -> None:
        timeout = self.config.group_timeout_s
        assert timeout is not None
        period = min(1.0, timeout / 4)
        while True:
            await asyncio.sleep(period)
            for gid in self.buffer.expired():
                self.counts["group_timeouts"] += 1
                self.errors.append(f"{gid}: timed out after {timeout} s")
                attempt = self.buffer.attempt(gid)
                await self._fail_group(
                    gid, TimeoutError(f"group {gid} open longer than {timeout} s"), attempt
                )
                await self._count_failure()  # a hung group counts as a failed attempt
