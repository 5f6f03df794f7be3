"""RolloutConfig: how the orchestrator (and the synchronous baseline) run trajectories."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from gymllm.errors import ConfigError, explain


def _need(ok: bool, field: str, *, expected: str, received: Any, fix: str) -> None:
    if not ok:
        raise ConfigError(explain(f"RolloutConfig.{field}", expected=expected, received=received, fix=fix))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RolloutConfig:
    """Settings of a rollout run (frozen, keyword-only, validated).

    group_size            G trajectories per group, all with the group's env seed (task).
    max_concurrency       trajectories in flight at once (also bounded by the number of envs).
    num_groups            groups to admit in total (filtered, failed and stale-dropped ones included);
                          None = until closed.
    max_staleness         eta of the AReaL admission rule; 0 = synchronous; None = unbounded.
    groups_per_step       B: groups per optimizer step (the learner's batch).
    max_open_groups       groups admitted and not complete; None = 2 * ceil(max_concurrency / G) + 1
                          (room for a second wave of groups: a group whose other members finished
                          waits for its straggler without idling their env slots).
    group_timeout_s       fail (or retry) a group open longer than this, counted from its admission
                          (or its retry); None = never.
    max_group_retries     retries of a whole group after a member fails or it times out.
    raise_on_group_failure  a group that fails for good stops the run (error reaches the consumer);
                          otherwise it is dropped, counted and reported.
    queue_size            complete groups buffered for the consumer; while it is full no new group is
                          admitted (backpressure reaches the producer, memory stays bounded).
    release_order         "oldest_version": the consumer gets the queued group admitted at the oldest
                          policy version first (counters completion-order bias); "completion": FIFO.
    seed                  base seed: group k uses env seed ``seed + k``; sampling seeds derive from it.
    max_model_calls       safety cap on model calls per trajectory (the env's own turn limit normally ends it).
    max_prompt_len        longest prompt sent to the engine; a trajectory whose next prompt is longer
                          ends as truncated (``info["context_exhausted"]``) instead of failing its
                          group. None = the engine's ``max_len - 1`` when it has one, else no limit.
    loop_lag_interval_s   sampling period of the event-loop lag monitor.
    max_failed_streak     stop the run (``RolloutStalledError`` from ``get_group``) when this many
                          trajectory attempts in a row failed (env, tool or engine errors, timeouts):
                          a run that cannot make progress says so instead of retrying forever.
                          None = never stop on failures.
    """

    group_size: int = 4
    max_concurrency: int = 32
    num_groups: int | None = None
    max_staleness: int | None = 2
    groups_per_step: int = 8
    max_open_groups: int | None = None
    group_timeout_s: float | None = None
    max_group_retries: int = 0
    raise_on_group_failure: bool = False
    queue_size: int = 8
    release_order: str = "oldest_version"
    seed: int = 0
    max_model_calls: int = 16
    max_prompt_len: int | None = None
    loop_lag_interval_s: float = 0.01
    max_failed_streak: int | None = 64

    def __post_init__(self) -> None:
        for name in ("group_size", "max_concurrency", "groups_per_step", "queue_size", "max_model_calls"):
            v = getattr(self, name)
            _need(_is_int(v) and v >= 1, name, expected="an int >= 1", received=v, fix=f"set {name}=1 or more")
        for name in ("num_groups", "max_open_groups", "max_prompt_len", "max_failed_streak"):
            v = getattr(self, name)
            _need(v is None or (_is_int(v) and v >= 1), name, expected="None or an int >= 1", received=v,
                  fix=f"set {name}=None or a positive int")
        _need(self.max_staleness is None or (_is_int(self.max_staleness) and self.max_staleness >= 0),
              "max_staleness", expected="None or an int >= 0", received=self.max_staleness,
              fix="use 0 for synchronous RL, 2-4 for asynchronous")
        _need(_is_int(self.max_group_retries) and self.max_group_retries >= 0, "max_group_retries",
              expected="an int >= 0", received=self.max_group_retries, fix="use 0 (drop) or a small retry count")
        t = self.group_timeout_s
        _need(t is None or (isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t > 0),
              "group_timeout_s", expected="None or a float > 0 (seconds)", received=t, fix="use e.g. 600.0 or None")
        _need(isinstance(self.loop_lag_interval_s, (int, float)) and self.loop_lag_interval_s > 0,
              "loop_lag_interval_s", expected="a float > 0", received=self.loop_lag_interval_s, fix="use 0.01")
        _need(self.release_order in ("oldest_version", "completion"), "release_order",
              expected="'oldest_version' or 'completion'", received=self.release_order,
              fix="use release_order='oldest_version'")
        _need(_is_int(self.seed), "seed", expected="an int", received=self.seed, fix="use e.g. seed=0")

    def prompt_limit(self, engine: Any) -> int | None:
        """``max_prompt_len``, else the engine's ``max_len - 1``, else None."""
        if self.max_prompt_len is not None:
            return self.max_prompt_len
        max_len = getattr(engine, "max_len", None)
        return int(max_len) - 1 if isinstance(max_len, int) else None

    @property
    def open_group_limit(self) -> int:
        if self.max_open_groups is not None:
            return self.max_open_groups
        return 2 * -(-self.max_concurrency // self.group_size) + 1
