"""RolloutOrchestrator: an asyncio producer of complete GRPO groups, with bounded staleness.

    orch = RolloutOrchestrator(vec_env, engine, ModelAgent(tok), sampling=SamplingParams(max_tokens=64),
                               config=RolloutConfig(group_size=8, groups_per_step=4, max_staleness=2))
    async with orch:
        async for group in orch.groups():     # or: group = await orch.get_group()
            ...train on group...
            orch.set_policy_version(step)     # admits more groups (AReaL rule)

* one coroutine per trajectory; at most ``max_concurrency`` run at once, each on its own env slot,
  so while one waits for its env or tool the others keep the engine busy;
* adaptive concurrency (``RolloutConfig.adaptive_concurrency``, on by default): the limit of
  trajectories in flight (``stats()["concurrency_limit"]``) rises while the learner waits for groups
  and falls while complete groups queue unconsumed, under the ceiling ``max_concurrency``
  (:class:`~gymllm.rollout.concurrency.AdaptiveConcurrency`);
* group k: G members, env seed ``seed + k``, distinct per-member sampling seeds;
* admission: :class:`~gymllm.rollout.staleness.StalenessController` (eta = 0 is synchronous);
* :class:`~gymllm.rollout.group_buffer.GroupBuffer` releases only complete groups, bounds open
  groups, times out stuck ones and retries or drops a group whose member failed;
* complete groups go through ``group_filter`` (e.g. drop zero-variance groups) into a bounded
  :class:`~gymllm.rollout.group_queue.GroupQueue` (oldest admitted version first by default); no new
  group is admitted while it is full; groups older than the staleness bound at consumption are
  dropped and their slot freed;
* a producer error (or a group failure with ``raise_on_group_failure``) is raised from ``get_group``;
* :meth:`close` cancels everything in flight and never hangs;
* telemetry: spans "rollout", "generate", "env_step", "tool", "reward", "queue_wait"; the event-loop
  lag is measured (:meth:`stats`).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Any, AsyncIterator, Callable

from gymllm.rollout.agents import Agent
from gymllm.rollout.concurrency import AdaptiveConcurrency, ConcurrencyGate
from gymllm.rollout.config import RolloutConfig
from gymllm.rollout.engine_meter import MeteredEngine
from gymllm.rollout.env_slots import EnvSlots, as_env_slots
from gymllm.rollout.episode import Episode, EpisodeKey
from gymllm.rollout.group_buffer import GroupBuffer, GroupFailedError
from gymllm.rollout.group_queue import GroupQueue, QueueClosed
from gymllm.rollout.loop_lag import LoopLagMonitor
from gymllm.rollout.staleness import StalenessController
from gymllm.rollout.token_buffer import check_prefix_preserving
from gymllm.errors import GymLLMError
from gymllm.telemetry import counter, span
from gymllm.types import Group

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


async def run_episode(slots: EnvSlots, engine: Any, episode: Episode, env_id: int,
                      max_prompt_len: int | None = None) -> Episode:
    """Drive one trajectory to its end on env slot ``env_id`` (the coroutine-per-trajectory loop)."""
    key = episode.key
    try:
        return await _drive(slots, engine, episode, env_id, max_prompt_len)
    finally:
        end = getattr(engine, "end_session", None)
        if end is not None:
            end(key.trajectory_id)  # free the engine's cached prefix of this trajectory


async def _drive(slots: EnvSlots, engine: Any, episode: Episode, env_id: int, max_prompt_len: int | None) -> Episode:
    key = episode.key
    with span("rollout", track="rollout", trajectory=key.trajectory_id):
        t = time.perf_counter()
        with span("env_step", track=f"env/{env_id}", kind="reset"):
            obs, info = await slots.reset(env_id, key.env_seed)
        episode.begin(obs, info, reset_s=time.perf_counter() - t)
        while not episode.done and episode.fits(max_prompt_len):
            prompt, params = episode.next_request()
            t = time.perf_counter()
            with span("generate", track="rollout", trajectory=key.trajectory_id, prompt_len=len(prompt)):
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
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved: no stray warnings
        self.pending = task
        return await asyncio.shield(task)


class RolloutOrchestrator:
    """Streams complete groups from envs x engine (see the module docstring)."""

    def __init__(self, envs: Any, engine: Any, agent: Agent, *, sampling: Any, config: RolloutConfig | None = None,
                 group_filter: GroupFilter | None = None):
        self.config = config or RolloutConfig()
        self.slots = as_env_slots(envs)
        self.engine = engine if isinstance(engine, MeteredEngine) else MeteredEngine(engine)
        self.agent = agent
        self.sampling = sampling
        self.group_filter = group_filter
        cfg = self.config
        self.prefix_preserving = check_prefix_preserving(agent.tokenizer, agent.observation_roles)
        if not self.prefix_preserving:
            log.warning("chat template is not prefix-preserving for roles %s: one training row per model call",
                        agent.observation_roles)
        self.staleness = StalenessController(max_staleness=cfg.max_staleness, groups_per_step=cfg.groups_per_step,
                                             version=self.engine.version)
        self.buffer = GroupBuffer(group_size=cfg.group_size, max_open_groups=cfg.open_group_limit,
                                  timeout_s=cfg.group_timeout_s, max_retries=cfg.max_group_retries)
        self.lag = LoopLagMonitor(cfg.loop_lag_interval_s)
        self.counts = collections.Counter()
        self._failed_streak = 0  # trajectory attempts failed in a row (max_failed_streak)
        self.errors: list[str] = []
        self._queue: GroupQueue | None = None
        self._stop: asyncio.Event | None = None
        self._changed: asyncio.Event | None = None
        self.concurrency = AdaptiveConcurrency(cfg.concurrency_config(self.slots.num_envs))
        self._gate: ConcurrencyGate | None = None
        self._free_envs: collections.deque[int] = collections.deque(range(self.slots.num_envs))
        self._members: dict[str, set[asyncio.Task]] = {}
        self._busy_envs: dict[int, asyncio.Future] = {}  # env calls still running after a cancel
        self._tasks: list[asyncio.Task] = []
        self._started_at = 0.0
        self._releasing = 0
        self._prompt_limit = self.config.prompt_limit(engine)
        self._closed = False

    # --- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> "RolloutOrchestrator":
        if self._queue is not None:
            return self
        loop = asyncio.get_running_loop()
        self.staleness.bind(loop)
        key = (lambda g: (g.admitted_version, int(g.group_id[1:]))) if self.config.release_order == "oldest_version" \
            else None
        self._queue = GroupQueue(self.config.queue_size, key=key)
        self._stop = asyncio.Event()
        self._changed = asyncio.Event()
        self._gate = ConcurrencyGate(self._limit())
        self._started_at = time.perf_counter()
        self.engine.reset_clock()
        await self.lag.start()
        self._tasks = [asyncio.create_task(self._produce(), name="rollout-producer")]
        if self.config.group_timeout_s is not None:
            self._tasks.append(asyncio.create_task(self._watchdog(), name="rollout-watchdog"))
        return self

    async def close(self) -> None:
        """Stop admitting, cancel in-flight trajectories, close the queue. Never hangs."""
        if self._closed:
            return
        self._closed = True
        if self._stop is not None:
            self._stop.set()
        tasks = [t for ts in self._members.values() for t in ts] + self._tasks + list(self._busy_envs.values())
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._queue is not None:
            await self._queue.close()
        await self.lag.stop()

    async def __aenter__(self) -> "RolloutOrchestrator":
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # --- concurrency ---------------------------------------------------------------------------
    def _limit(self) -> int:
        """Trajectories allowed in flight now: the law's limit, or the ceiling when it is off."""
        law = self.concurrency
        return law.limit if self.config.adaptive_concurrency else law.config.max_limit

    def _adapt(self, event: str) -> None:
        """Feed one event ("learner_waiting", "group_queued", "group_consumed", "group_dropped") to
        the control law and resize the gate."""
        getattr(self.concurrency, f"on_{event}")()
        if self._gate is not None:
            self._gate.set_limit(self._limit())

    # --- consumer API ------------------------------------------------------------------------
    def set_policy_version(self, version: int) -> None:
        """The learner finished optimizer step ``version``: admits more groups (thread-safe)."""
        self.staleness.set_version(version)

    async def get_group(self) -> Group:
        """The next complete group (oldest admitted version first, or completion order; see
        ``release_order``). Groups past the staleness bound are dropped here (their slot is freed).
        Raises the producer's error, or :class:`QueueClosed` when the run is over and drained."""
        if self._queue is None:
            await self.start()
        assert self._queue is not None
        while True:
            if self._queue.qsize() == 0 and not self._queue.closed:
                self._adapt("learner_waiting")
            with span("queue_wait", track="rollout"):
                group = await self._queue.get()
            self._notify()  # room in the queue: the producer may admit again
            now = time.perf_counter()
            wait = now - group.info.get("completed_at", now)
            for traj in group.trajectories:
                traj.timings["queue_wait_s"] = wait
            if self.staleness.is_stale(group.admitted_version):
                self.staleness.unaccept()
                self._adapt("group_dropped")
                self.counts["stale_dropped"] += 1
                counter("groups_stale_dropped", self.counts["stale_dropped"], track="rollout")
                continue
            self.counts["consumed"] += 1
            self._adapt("group_consumed")
            group.info["consumed_version"] = self.staleness.version
            return group

    @property
    def ready_groups(self) -> int:
        """Complete groups waiting in the queue (``get_group`` returns at once while > 0, unless the
        waiting groups turn out to be stale and are dropped)."""
        return self._queue.qsize() if self._queue is not None else 0

    async def groups(self) -> AsyncIterator[Group]:
        """``async for group in orch.groups()``: ends when the run is over."""
        while True:
            try:
                yield await self.get_group()
            except QueueClosed:
                return

    def stats(self) -> dict[str, Any]:
        wall = time.perf_counter() - self._started_at if self._started_at else 0.0
        return {
            **dict(self.counts), "wall_s": wall, "engine_busy_fraction": self.engine.busy_fraction(),
            "engine_max_inflight": self.engine.max_inflight, "open_groups": len(self.buffer.open_groups),
            "running_groups": self.staleness.running, "accepted_groups": self.staleness.accepted,
            "max_load": self.staleness.max_observed_load, "policy_version": self.staleness.version,
            "prefix_preserving": self.prefix_preserving, **self.lag.summary(), "errors": list(self.errors[-10:]),
            "concurrency_limit": self._limit(), "concurrency_max": self.concurrency.config.max_limit,
            "concurrency_min": self.concurrency.config.min_limit,
            "concurrency_raised": self.concurrency.counts["raised"],
            "concurrency_lowered": self.concurrency.counts["lowered"],
            "trajectories_inflight": self._gate.active if self._gate is not None else 0,
            "trajectories_inflight_mean": self._gate.inflight_mean() if self._gate is not None else 0.0,
            "trajectories_inflight_max": self._gate.max_active if self._gate is not None else 0,
        }

    # --- producer -----------------------------------------------------------------------------
    async def _produce(self) -> None:
        assert self._queue is not None and self._stop is not None
        cfg = self.config
        try:
            k = 0
            while not self._stop.is_set() and (cfg.num_groups is None or k < cfg.num_groups):
                if not await self.staleness.wait_admit(self._stop):
                    break
                if not await self._wait(lambda: self.buffer.has_room() and not self._backlogged()):
                    break
                version = self.staleness.admit()
                gid = EpisodeKey(k, 0).group_id
                self.buffer.open(gid, seed=cfg.seed + k, admitted_version=version)
                self._spawn_members(k, attempt=0)
                self.counts["admitted"] += 1
                counter("groups_running", self.staleness.running, track="rollout")
                k += 1
            await self._wait(lambda: not self.buffer.open_groups and not self._releasing)
            if not self._stop.is_set():
                await self._queue.close()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # anything unexpected reaches the consumer
            await self._abort(e)

    async def _wait(self, ready: Callable[[], bool]) -> bool:
        assert self._changed is not None and self._stop is not None
        while not ready():
            if self._stop.is_set():
                return False
            self._changed.clear()
            await self._changed.wait()
        return not self._stop.is_set()

    def _backlogged(self) -> bool:
        """The consumer is behind: the queue is full or complete groups wait to enter it."""
        assert self._queue is not None
        return self._queue.full() or self._releasing > 0

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()

    def _spawn_members(self, k: int, attempt: int) -> None:
        cfg = self.config
        key0 = EpisodeKey(k, 0, attempt, cfg.seed + k)
        tasks = {asyncio.create_task(self._member(EpisodeKey(k, m, attempt, cfg.seed + k)),
                                     name=f"{key0.group_id}/m{m}/a{attempt}") for m in range(cfg.group_size)}
        self._members[key0.group_id] = tasks

    async def _member(self, key: EpisodeKey) -> None:
        assert self._gate is not None
        gid = key.group_id
        try:
            await self._gate.acquire()
            env_id = self._free_envs.popleft()
            guarded = _ShieldedSlots(self.slots)
            try:
                ep = Episode(key, self.agent, self.sampling, base_seed=self.config.seed,
                             max_model_calls=self.config.max_model_calls,
                             prefix_preserving=self.prefix_preserving, env_id=env_id)
                await run_episode(guarded, self.engine, ep, env_id, self._prompt_limit)
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
        self._failed_streak = 0
        group = self._add(gid, key, trajs)
        if group is None:
            return
        self._releasing += 1
        try:
            await self._release(group)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # e.g. a group_filter that raised: the consumer must hear of it
            await self._abort(e)
        finally:
            self._releasing -= 1
            self._notify()

    async def _count_failure(self) -> None:
        """One more failed trajectory attempt in a row; at ``max_failed_streak`` the run stops clearly."""
        self._failed_streak += 1
        limit = self.config.max_failed_streak
        if limit is None or self._failed_streak != limit:
            return
        self.counts["stalled"] += 1
        last = self.errors[-3:]
        await self._abort(RolloutStalledError(
            f"rollouts: expected some trajectory to succeed, received {limit} failed attempts in a row "
            f"(admitted {self.counts['admitted']} groups, {self.counts['groups_failed']} failed for good; last errors: "
            f"{'; '.join(last)}). Fix: check the env/tool/engine error above (gymllm check ENV_ID runs the env alone), "
            "or raise RolloutConfig.max_failed_streak (gymllm train: --rollout.max-failed-streak; None never stops)",
            failures=limit, last_errors=last))

    async def _abort(self, error: BaseException) -> None:
        """Stop the run and hand ``error`` to the consumer (after the groups already queued)."""
        assert self._queue is not None
        await self._queue.put_exception(error)
        if self._stop is not None:
            self._stop.set()
        self._notify()

    def _return_env(self, env_id: int, pending: asyncio.Future | None) -> None:
        """Give the env slot back, or, if an env call is still running (the member was cancelled
        mid-step), only once that call has finished: a hung env is never handed to a new trajectory."""
        assert self._gate is not None
        sem = self._gate

        def give_back(_: Any = None) -> None:
            self._busy_envs.pop(env_id, None)
            self._free_envs.append(env_id)
            sem.release()

        if pending is None or pending.done():
            give_back()
        else:
            self.counts["envs_quarantined"] += 1
            self._busy_envs[env_id] = pending
            pending.add_done_callback(give_back)

    def _add(self, gid: str, key: EpisodeKey, trajs: list) -> Group | None:
        group = self.buffer.add(gid, key.member, trajs, attempt=key.attempt)
        if group is not None:
            self._members.pop(gid, None)
            self._notify()
        return group

    async def _release(self, group: Group) -> None:
        assert self._queue is not None
        keep = False
        try:
            keep = True if self.group_filter is None else bool(self.group_filter(group))
        finally:
            self.staleness.finish(accepted=keep)
        self._notify()
        if not keep:
            self.counts["filtered"] += 1
            return
        self.counts["released"] += 1
        group.info["completed_at"] = time.perf_counter()
        group.info["released_version"] = self.staleness.version
        try:
            await self._queue.put(group)
        except QueueClosed:
            return
        self._adapt("group_queued")
        counter("rollout_concurrency", self._limit(), track="rollout")
        counter("queue_depth", self._queue.qsize(), track="rollout")

    async def _fail_group(self, gid: str, error: BaseException, attempt: int, current: Any = None) -> None:
        assert self._queue is not None
        decision = self.buffer.fail(gid, error, attempt=attempt)
        if decision == "ignored":
            return
        siblings = self._members.pop(gid, set())
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
        self._notify()
        if self.config.raise_on_group_failure:
            exc_type = GroupTimeoutError if isinstance(error, TimeoutError) else GroupFailedError
            err = exc_type(f"group {gid} failed after {attempt + 1} attempt(s): {error!r}", group_id=gid, cause=error)
            await self._abort(err)

    async def _watchdog(self) -> None:
        timeout = self.config.group_timeout_s
        assert timeout is not None
        period = min(1.0, timeout / 4)
        while True:
            await asyncio.sleep(period)
            for gid in self.buffer.expired():
                self.counts["group_timeouts"] += 1
                self.errors.append(f"{gid}: timed out after {timeout} s")
                attempt = self.buffer.attempt(gid)
                await self._fail_group(gid, TimeoutError(f"group {gid} open longer than {timeout} s"), attempt)
                await self._count_failure()  # a hung group counts as a failed attempt
