"""GroupSource: where the training loop gets its finished GRPO groups (the seam between the rollout
layer and the one loop of :class:`gymllm.train.run.Run`).

    source = RolloutOrchestrator(envs, engine, agent, sampling=sp, config=rcfg)   # or any GroupSource
    await source.start()
    try:
        while not done:
            try:
                groups = await source.next_groups()      # >= 1 complete group, oldest first
            except QueueClosed:
                break                                    # the source ran out: the run stops early
            ...train on groups; push weights...
            source.set_policy_version(step)              # after each pushed update
    finally:
        await source.close()
    counts = source.result()

The sources in gymllm: :class:`~gymllm.rollout.orchestrator.RolloutOrchestrator` (barrier-free
streaming, ``rollout.mode="async"``), :class:`~gymllm.rollout.sync_baseline.SyncBatchSource` (the
synchronous baseline: one lockstep batch per call, ``"sync"``) and
:class:`~gymllm.rollout.agent_programs.AgentProgramSource` (agent programs against the training
proxy, ``"proxy"``). A test or a new feature writes its own: any object with these members works.

Spec (what the loop relies on)
------------------------------
- **Yielding groups.** ``await next_groups()`` returns a non-empty list of complete
  :class:`~gymllm.types.Group` s: it waits for at least one, then adds every other group that is
  already complete, oldest admitted version first (the loop hands them to the learner one step's
  worth at a time). A group is final when returned: the source has already applied its filter
  (e.g. zero-variance groups), dropped groups past its staleness bound and counted both.
- **Weight versions and staleness.** The loop calls ``set_policy_version(v)`` once update ``v`` is
  live on the engine (after the weight push), from the loop's thread; a source that bounds
  staleness admits new work or drops old groups by it. Sources start at the engine's version.
- **Lifecycle.** ``await start()`` once before the first ``next_groups`` (a source may also start
  lazily on the first call); ``await close()`` stops producing, cancels work in flight, releases
  what ``start`` acquired (servers, subprocesses, tasks) and never hangs; it is called exactly once
  by the loop, also when the loop raised, and must be idempotent. ``result()`` after ``close``: the
  source's final counts, merged into ``TrainResult.counts``; ``stats()`` at any time: live figures
  the step log reads (``engine_busy_fraction``, ``stale_dropped``, ``concurrency_limit`` when the
  source has them; missing keys read as 0).
- **Ending and failures.** :class:`~gymllm.rollout.group_queue.QueueClosed` from ``next_groups``
  means "no more groups" (the run ends early with a warning naming the exception's message); any
  other exception is a failure and stops the run: :class:`~gymllm.errors.GymLLMError` s (e.g.
  :class:`~gymllm.rollout.producer.RolloutStalledError`) pass through as raised, anything else
  is wrapped in :class:`GroupSourceError` naming the source. A source isolates single failing
  trajectories itself (retry or drop the group); it raises only when the run cannot go on.
- **Stalls.** The loop waits on ``next_groups`` inside the watchdog stage ``"rollout"`` whose
  description is the source's ``waiting_for`` (e.g. "waiting for the next complete group"), so a
  source that stops producing is named in the log and trace after ``run.stall_timeout_s``.
- ``name``: a short label for messages ("rollout orchestrator").

Future sources plug in here without touching the loop: a suite mixture (each group drawn from one
env of a weighted mixture, its env id in ``group.info``, per-env figures in ``stats()``) or
multi-agent seats (groups per seat and policy, each seat's policy version from
``set_policy_version``) are sources like these.
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Protocol, runtime_checkable

from gymllm.errors import GymLLMError, explain
from gymllm.rollout.group_queue import QueueClosed
from gymllm.types import Group

__all__ = ["GroupSource", "GroupSourceError", "QueueSource"]


@runtime_checkable
class GroupSource(Protocol):
    """Finished GRPO groups for the training loop (see the module docstring for the contract)."""

    name: str
    waiting_for: str

    async def start(self) -> Any: ...

    async def next_groups(self) -> list[Group]: ...

    def set_policy_version(self, version: int) -> None: ...

    def stats(self) -> dict[str, Any]: ...

    def result(self) -> dict[str, Any]: ...

    async def close(self) -> None: ...


class GroupSourceError(GymLLMError, RuntimeError):
    """A group source raised something other than a :class:`~gymllm.errors.GymLLMError`: the run stops;
    ``cause`` is the original exception (also ``__cause__``)."""

    def __init__(self, source: str, cause: BaseException):
        super().__init__(
            explain(
                f"group source {source!r}",
                expected="complete groups (or QueueClosed when it has no more)",
                received=f"{type(cause).__name__}: {cause}",
                fix="see the traceback above for the source's own failure",
            )
        )
        self.source, self.cause = source, cause


class QueueSource:
    """``next_groups`` and ``groups`` for a queue-like source: one whose ``get_group()`` returns the
    next complete group (raising :class:`~gymllm.rollout.group_queue.QueueClosed` when drained) and
    whose ``ready_groups`` counts the groups already complete."""

    async def get_group(self) -> Group:
        raise NotImplementedError

    @property
    def ready_groups(self) -> int:
        raise NotImplementedError

    async def next_groups(self) -> list[Group]:
        """Wait for one group, then take every one already complete (``get_group`` orders them)."""
        batch = [await self.get_group()]
        while self.ready_groups > 0:
            batch.append(await self.get_group())
        return batch

    async def groups(self) -> AsyncIterator[Group]:
        """``async for group in source.groups()``: ends when the source is closed and drained."""
        while True:
            try:
                yield await self.get_group()
            except QueueClosed:
                return
