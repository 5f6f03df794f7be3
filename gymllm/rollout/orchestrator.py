"""RolloutOrchestrator: an asyncio producer of complete GRPO groups, with bounded staleness.

    orch = RolloutOrchestrator(vec_env, engine, ModelAgent(tok), sampling=SamplingParams(max_tokens=64),
                               config=RolloutConfig(group_size=8, max_staleness=2), seed=0, groups_per_step=4)
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
* group k: ``group_size`` members, env seed ``seed + k``, distinct per-member sampling seeds (``seed``:
  a constructor argument, the run's ``run.seed``; ``groups_per_step``: the learner's groups per update,
  which the staleness bound counts in);
* admission: :class:`~gymllm.rollout.staleness.StalenessController` (eta = 0 is synchronous);
* :class:`~gymllm.rollout.group_buffer.GroupBuffer` releases only complete groups, bounds open
  groups, times out stuck ones and retries or drops a group whose member failed;
* complete groups go through ``group_filter`` (e.g. drop zero-variance groups) into a bounded
  :class:`~gymllm.rollout.group_queue.GroupQueue` (oldest admitted version first by default); no new
  group is admitted while it is full; groups older than the staleness bound at consumption are
  dropped and their slot freed;
* a producer error (or a group failure with ``raise_on_group_failure``) is raised from ``get_group``;
* :meth:`close` cancels everything in flight and never hangs;
* a :class:`~gymllm.rollout.sources.GroupSource` (``next_groups``, ``result``): what the training loop reads;
* the producing half (admission, members, failures, timeouts) is
  :class:`~gymllm.rollout.producer.GroupProducer`; this class keeps the queue, the concurrency law
  and the consumer side;
* telemetry: spans "rollout", "generate", "env_step", "tool", "reward", "queue_wait"; the event-loop
  lag is measured (:meth:`stats`).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Any

from gymllm.rollout.agents import Agent
from gymllm.rollout.concurrency import AdaptiveConcurrency, ConcurrencyGate
from gymllm.rollout.config import RolloutConfig
from gymllm.rollout.engine_meter import MeteredEngine
from gymllm.rollout.env_slots import as_env_slots
from gymllm.rollout.group_queue import GroupQueue
from gymllm.rollout.loop_lag import LoopLagMonitor
from gymllm.rollout.producer import GroupFilter, GroupProducer
from gymllm.rollout.sources import QueueSource
from gymllm.rollout.staleness import StalenessController
from gymllm.rollout.token_buffer import check_prefix_preserving
from gymllm.telemetry import counter, span
from gymllm.types import Group

__all__ = ["RolloutOrchestrator"]

log = logging.getLogger("gymllm.rollout")


class RolloutOrchestrator(QueueSource):
    """Streams complete groups from envs x engine (see the module docstring)."""

    name = "rollout orchestrator"
    waiting_for = "waiting for the next complete group"

    def __init__(
        self,
        envs: Any,
        engine: Any,
        agent: Agent,
        *,
        sampling: Any,
        config: RolloutConfig | None = None,
        seed: int = 0,
        groups_per_step: int = 8,
        group_filter: GroupFilter | None = None,
    ):
        self.config = config or RolloutConfig()
        self.slots = as_env_slots(envs)
        self.engine = engine if isinstance(engine, MeteredEngine) else MeteredEngine(engine)
        self.agent = agent
        self.sampling = sampling
        self.group_filter = group_filter
        cfg = self.config
        self.prefix_preserving = check_prefix_preserving(agent.tokenizer, agent.observation_roles)
        if not self.prefix_preserving:
            log.warning(
                "chat template is not prefix-preserving for roles %s: one training row per model call",
                agent.observation_roles,
            )
        self.staleness = StalenessController(
            max_staleness=cfg.max_staleness,
            groups_per_step=groups_per_step,
            version=self.engine.version,
        )
        self.lag = LoopLagMonitor(cfg.loop_lag_interval_s)
        self.counts = collections.Counter()
        self.errors: list[str] = []
        self.concurrency = AdaptiveConcurrency(
            cfg.concurrency_config(self.slots.num_envs, groups_per_step)
        )
        self.producer = GroupProducer(
            cfg,
            self.slots,
            self.engine,
            agent,
            sampling=sampling,
            group_filter=group_filter,
            seed=seed,
            prefix_preserving=self.prefix_preserving,
            prompt_limit=cfg.prompt_limit(engine),
            staleness=self.staleness,
            counts=self.counts,
            errors=self.errors,
            adapt=self._adapt,
            limit=self._limit,
        )
        self.buffer = self.producer.buffer
        self._queue: GroupQueue | None = None
        self._gate: ConcurrencyGate | None = None
        self._started_at = 0.0
        self._closed = False

    # --- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> "RolloutOrchestrator":
        if self._queue is not None:
            return self
        loop = asyncio.get_running_loop()
        self.staleness.bind(loop)
        key = (
            (lambda g: (g.admitted_version, int(g.group_id[1:])))
            if self.config.release_order == "oldest_version"
            else None
        )
        self._queue = GroupQueue(self.config.queue_size, key=key)
        self._gate = ConcurrencyGate(self._limit())
        self._started_at = time.perf_counter()
        self.engine.reset_clock()
        await self.lag.start()
        self.producer.start(self._queue, self._gate)
        return self

    async def close(self) -> None:
        """Stop admitting, cancel in-flight trajectories, close the queue. Never hangs."""
        if self._closed:
            return
        self._closed = True
        await self.producer.stop()
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
            self.producer.notify()  # room in the queue: the producer may admit again
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

    def stats(self) -> dict[str, Any]:
        wall = time.perf_counter() - self._started_at if self._started_at else 0.0
        return {
            **dict(self.counts),
            "wall_s": wall,
            "engine_busy_fraction": self.engine.busy_fraction(),
            "engine_max_inflight": self.engine.max_inflight,
            "open_groups": len(self.buffer.open_groups),
            "running_groups": self.staleness.running,
            "accepted_groups": self.staleness.accepted,
            "max_load": self.staleness.max_observed_load,
            "policy_version": self.staleness.version,
            "prefix_preserving": self.prefix_preserving,
            **self.lag.summary(),
            "errors": list(self.errors[-10:]),
            "concurrency_limit": self._limit(),
            "concurrency_max": self.concurrency.config.max_limit,
            "concurrency_min": self.concurrency.config.min_limit,
            "concurrency_raised": self.concurrency.counts["raised"],
            "concurrency_lowered": self.concurrency.counts["lowered"],
            "trajectories_inflight": self._gate.active if self._gate is not None else 0,
            "trajectories_inflight_mean": self._gate.inflight_mean()
            if self._gate is not None
            else 0.0,
            "trajectories_inflight_max": self._gate.max_active if self._gate is not None else 0,
        }

    def result(self) -> dict[str, Any]:
        """The final counts for the run's result; ``rollout_errors``: "<trajectory or group id>: <cause>"."""
        return {**self.counts, "rollout_errors": list(self.errors)}
