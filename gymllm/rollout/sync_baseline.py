"""The synchronous baseline: generate a whole batch, step all envs, repeat (a barrier per turn).

Each batch fills the rollout resources, as a synchronous trainer does: it rolls out as many groups
as the envs, the engine's rows (``engine.config.num_slots`` where the engine has one) and
``config.max_concurrency`` hold (:func:`sync_batch_groups`), and never fewer than ``batch_groups``
(the groups the caller needs per batch, e.g. a step's ``groups_per_step``; ``fill=False`` rolls out
exactly ``batch_groups``, leaving the other envs idle); within a batch every
turn waits for *all* active trajectories' generations, then for *all* their env steps. The
per-trajectory logic is the same :class:`~gymllm.rollout.episode.Episode` the orchestrator drives,
with the same env and sampling seeds, so for a deterministic engine the trajectories are identical;
only the schedule differs. ``on_batch(groups)`` is called after each batch (e.g. a learner step that
pushes new weights) before the next batch is generated.

:class:`SyncBatchSource` is the same baseline as a :class:`~gymllm.rollout.sources.GroupSource` (what
the training loop reads with ``rollout.mode="sync"``): each ``next_groups`` call rolls out the next
batch at the engine's current policy; :func:`sync_rollout` drives it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable

from gymllm.rollout.group_queue import QueueClosed

from gymllm.rollout.agents import Agent
from gymllm.rollout.config import RolloutConfig
from gymllm.rollout.engine_meter import MeteredEngine
from gymllm.rollout.env_slots import as_env_slots
from gymllm.rollout.episode import Episode, EpisodeKey
from gymllm.rollout.group_buffer import GroupBuffer
from gymllm.rollout.token_buffer import check_prefix_preserving
from gymllm.telemetry import span
from gymllm.types import Group


def sync_batch_groups(
    num_envs: int, engine: Any, config: RolloutConfig, batch_groups: int = 8, *, fill: bool = True
) -> int:
    """Groups per synchronous batch: with ``fill``, as many as ``num_envs``, the engine's rows and
    ``config.max_concurrency`` hold, at least ``batch_groups`` (a step's groups); never more than the
    envs hold (a group of ``group_size`` needs that many envs)."""
    group_size = config.group_size
    need = batch_groups
    if fill:
        rows = getattr(getattr(engine, "config", None), "num_slots", None)
        width = min(num_envs, config.max_concurrency, rows if isinstance(rows, int) else num_envs)
        need = max(need, width // group_size)
    return min(need, max(1, num_envs // group_size))


class SyncBatchSource:
    """The synchronous baseline as a group source: ``next_groups`` rolls out the next lockstep batch of
    :func:`sync_batch_groups` groups (group k: env seed ``seed + k``) and returns it whole, in
    group order, after ``group_filter`` (called on every group; a group it rejects is not returned).
    ``QueueClosed`` once ``config.num_groups`` groups (None: never) were rolled out. A failing
    trajectory raises (the baseline has no isolation; it is a reference, not a runner)."""

    name = "synchronous baseline"
    waiting_for = "rolling out the next synchronous batch"

    def __init__(
        self,
        envs: Any,
        engine: Any,
        agent: Agent,
        *,
        sampling: Any,
        config: RolloutConfig,
        seed: int = 0,
        batch_groups: int = 8,
        fill: bool = True,
        group_filter: Callable[[Group], bool] | None = None,
    ):
        self.slots = as_env_slots(envs)
        self.engine = engine if isinstance(engine, MeteredEngine) else MeteredEngine(engine)
        self.agent, self.sampling, self.config, self.group_filter = (
            agent,
            sampling,
            config,
            group_filter,
        )
        self.seed = seed
        group_size = config.group_size
        self.batch_groups = sync_batch_groups(
            self.slots.num_envs, self.engine.engine, config, batch_groups, fill=fill
        )
        if self.batch_groups * group_size > self.slots.num_envs:
            raise ValueError(
                f"sync_rollout: a group of {group_size} needs {group_size} envs, received "
                f"{self.slots.num_envs}. "
                "Fix: pass more envs."
            )
        self.prefix = check_prefix_preserving(agent.tokenizer, agent.observation_roles)
        self.next_k, self.counts = 0, {"batches": 0, "groups": 0}

    async def start(self) -> "SyncBatchSource":
        return self

    async def next_groups(self) -> list[Group]:
        total = self.config.num_groups
        while total is None or self.next_k < total:
            end = (
                self.next_k + self.batch_groups
                if total is None
                else min(self.next_k + self.batch_groups, total)
            )
            ks, self.next_k = list(range(self.next_k, end)), end
            batch = await _run_batch(
                self.slots,
                self.engine,
                self.agent,
                self.sampling,
                self.config,
                self.seed,
                ks,
                self.prefix,
            )
            self.counts["batches"] += 1
            self.counts["groups"] += len(batch)
            kept = [g for g in batch if self.group_filter is None or self.group_filter(g)]
            if kept:
                return kept
        raise QueueClosed(f"the synchronous baseline rolled out its {total} groups")

    def set_policy_version(self, version: int) -> None:
        """Nothing to do: each batch is generated at the engine's version when it starts."""

    def stats(self) -> dict[str, Any]:
        """No live figures (the step log reads them as 0, as before this was a source)."""
        return {}

    def result(self) -> dict[str, Any]:
        return {}

    async def close(self) -> None:
        pass


async def sync_rollout(
    envs: Any,
    engine: Any,
    agent: Agent,
    *,
    on_batch: Callable[[list[Group]], Awaitable[None] | None] | None = None,
    **source_options: Any,
) -> list[Group]:
    """Run ``config.num_groups`` groups in lockstep batches; returns them in group order.

    ``source_options`` are :class:`SyncBatchSource`'s keyword arguments (``sampling``, ``config``,
    ``seed``, ``batch_groups``, ``fill``; their defaults live there). Each batch has
    :func:`sync_batch_groups` groups (``fill``: every env and engine row works; ``batch_groups`` is
    the least; group k: env seed ``seed + k``). ``on_batch`` gets all of a batch's groups. A failing
    trajectory raises (the baseline has no isolation; it is a reference, not a runner).
    """
    source = SyncBatchSource(envs, engine, agent, **source_options)
    if source.config.num_groups is None:
        raise ValueError(
            "sync_rollout: expected config.num_groups (an int), received None. Fix: set num_groups."
        )
    groups: list[Group] = []
    while True:
        try:
            batch = await source.next_groups()
        except QueueClosed:
            return groups
        groups.extend(batch)
        if on_batch is not None:
            out = on_batch(batch)
            if asyncio.iscoroutine(out):
                await out


async def _timed(aw: Awaitable[Any]) -> tuple[Any, float]:
    t = time.perf_counter()
    out = await aw
    return out, time.perf_counter() - t


async def _run_batch(
    slots: Any,
    engine: MeteredEngine,
    agent: Agent,
    sampling: Any,
    config: RolloutConfig,
    seed: int,
    ks: list[int],
    prefix: bool,
) -> list[Group]:
    group_size = config.group_size
    version = engine.version
    episodes = [
        Episode(
            EpisodeKey(k, m, 0, seed + k),
            agent,
            sampling,
            base_seed=seed,
            max_model_calls=config.max_model_calls,
            prefix_preserving=prefix,
            env_id=i * group_size + m,
        )
        for i, k in enumerate(ks)
        for m in range(group_size)
    ]
    with span("env_step", track="rollout", kind="reset_all", n=len(episodes)):
        resets = await asyncio.gather(
            *(_timed(slots.reset(ep.env_id, ep.key.env_seed)) for ep in episodes)
        )
    for ep, ((obs, info), dt) in zip(episodes, resets):
        ep.begin(obs, info, reset_s=dt)
    limit = config.prompt_limit(engine.engine)
    while True:
        active = [ep for ep in episodes if not ep.done and ep.fits(limit)]
        if not active:
            break
        requests = [ep.next_request() for ep in active]
        with span("generate", track="rollout", kind="batch", n=len(active)):
            outs = await asyncio.gather(
                *(
                    _timed(engine.generate(p, sp, session_id=ep.key.trajectory_id))
                    for ep, (p, sp) in zip(active, requests)
                )
            )
        actions = [ep.on_completion(c, dt) for ep, (c, dt) in zip(active, outs)]
        with span("env_step", track="rollout", kind="step_all", n=len(active)):
            steps = await asyncio.gather(
                *(_timed(slots.step(ep.env_id, a)) for ep, a in zip(active, actions))
            )
        for ep, ((obs, r, term, trunc, info), dt) in zip(active, steps):
            ep.on_step(obs, r, term, trunc, info, dt)
    end = getattr(engine.engine, "end_session", None)
    for ep in episodes if end is not None else ():
        end(ep.key.trajectory_id)  # free the engine's cached prefixes, as the orchestrator does
    buf = GroupBuffer(group_size=group_size, max_open_groups=len(ks))
    out: list[Group] = []
    for k in ks:
        buf.open(f"g{k}", seed=seed + k, admitted_version=version)
    for ep in episodes:
        g = buf.add(ep.key.group_id, ep.key.member, ep.trajectories())
        if g is not None:
            out.append(g)
    return sorted(out, key=lambda g: int(g.group_id[1:]))
