"""RolloutConfig: how the orchestrator (and the synchronous baseline) run trajectories, and which
source produces a training run's groups (``mode``)."""

from __future__ import annotations

import dataclasses
import shlex
from typing import Any

from gymllm.rollout.concurrency import ConcurrencyConfig
from gymllm.validation import check_choice, check_fields, check_range, require

MODES = ("async", "sync", "proxy")
#: the placeholders of ``RolloutConfig.agent_program``, with sample values of their kinds
AGENT_PROGRAM_FIELDS = {
    "base_url": "u",
    "python": "p",
    "model": "m",
    "group_size": 1,
    "seed": 0,
    "api_key": "k",
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class RolloutConfig:
    """Settings of a rollout run (frozen, keyword-only, validated)."""

    group_size: int = 4
    """Trajectories per group, all with the group's env seed (task)."""
    max_concurrency: int = 32
    """the ceiling of trajectories in flight at once (also bounded by the number of envs); with
    ``adaptive_concurrency`` also the start unless ``concurrency_start``."""
    num_groups: int | None = None
    """groups to admit in total (filtered, failed and stale-dropped ones included); None = until closed."""
    max_staleness: int | None = 2
    """eta of the AReaL admission rule; 0 = synchronous; None = unbounded."""
    max_open_groups: int | None = None
    """Groups admitted and not complete; None = 2 * ceil(max_concurrency / group_size) + 1 (room for a second wave
    of groups: a group whose other members finished waits for its straggler without idling their env slots);
    open_group_limit is the one place it is computed."""
    group_timeout_s: float | None = None
    """fail (or retry) a group open longer than this, counted from its admission (or its retry); None = never."""
    max_group_retries: int = 0
    """retries of a whole group after a member fails or it times out."""
    raise_on_group_failure: bool = False
    """a group that fails for good stops the run (error reaches the consumer); otherwise it is dropped, counted and
    reported."""
    queue_size: int = 8
    """complete groups buffered for the consumer; while it is full no new group is admitted (backpressure reaches
    the producer, memory stays bounded)."""
    release_order: str = "oldest_version"
    """"oldest_version": the consumer gets the queued group admitted at the oldest policy version first (counters
    completion-order bias); "completion": FIFO."""
    max_model_calls: int = 16
    """safety cap on model calls per trajectory (the env's own turn limit normally ends it)."""
    max_prompt_len: int | None = None
    """longest prompt sent to the engine; a trajectory whose next prompt is longer ends as truncated
    (``info["context_exhausted"]``) instead of failing its group. None = the engine's ``max_len - 1`` when it has
    one, else no limit."""
    loop_lag_interval_s: float = 0.01
    """sampling period of the event-loop lag monitor."""
    max_failed_streak: int | None = 64
    """stop the run (``RolloutStalledError`` from ``get_group``) when this many trajectory attempts in a row failed
    (env, tool or engine errors, timeouts): a run that cannot make progress says so instead of retrying forever.
    None = never stop on failures."""
    adaptive_concurrency: bool = True
    """(default on) the limit of trajectories in flight follows the learner
    (:class:`~gymllm.rollout.concurrency.AdaptiveConcurrency`): it rises by ``concurrency_step`` each time the
    learner finds no complete group queued and falls by as much for each group queued beyond
    ``target_queue_depth`` (or dropped as stale), between ``min_concurrency`` and the ceiling
    ``min(max_concurrency, number of envs)``; the staleness bound (eta) and ``max_open_groups`` still gate
    admissions. Off: the limit stays at the ceiling. Engine rows are not a separate cap: a trajectory holds a row
    only while it generates (set max_concurrency to the rows to bound it)."""
    min_concurrency: int | None = None
    """the lowest limit; None = ``group_size`` (one group in flight)."""
    concurrency_start: int | None = None
    """the limit at the start; None = the ceiling (never less supply than a fixed run)."""
    concurrency_step: int | None = None
    """trajectories per raise / per back-off; None = ``group_size``."""
    target_queue_depth: int | None = None
    """Complete groups allowed to wait unconsumed; None = min(groups_per_step, queue_size - 1) (a step's worth ready
    when the learner comes back; groups_per_step is the learner's, given to the source)."""
    mode: str = "async"
    """where a training run's groups come from (:func:`gymllm.train.trainer.train`): "async" (the barrier-free
    orchestrator), "sync" (the baseline: roll out a whole step, then train) or "proxy" (an agent program that
    speaks the OpenAI API plays the episodes against the run's engine served on 127.0.0.1 in training mode; see
    :mod:`gymllm.inference.session_recorder`). The orchestrator itself ignores it."""
    agent_program: str = ""
    """proxy mode's command line, formatted with {base_url} (``http://127.0.0.1:PORT/v1``), {python} (this
    interpreter), {model} (the served name), {group_size}, {seed} (the run's seed + 1000000 * process index) and
    {api_key}; it also gets OPENAI_BASE_URL / OPENAI_API_KEY. Only with mode "proxy"."""
    agent_processes: int = 1
    """Copies of the agent program (proxy mode)."""
    agent_start_timeout_s: float = 300.0
    """The run fails if no session closes within this bound (proxy mode)."""

    def __post_init__(self) -> None:
        c = "RolloutConfig"
        positive = (
            "group_size",
            "max_concurrency",
            "queue_size",
            "max_model_calls",
            "agent_processes",
        )
        check_fields(c, self, positive, lo=1, integer=True, fix="set {field}=1 or more")
        optional = (
            "num_groups",
            "max_open_groups",
            "max_prompt_len",
            "max_failed_streak",
            "min_concurrency",
            "concurrency_start",
            "concurrency_step",
        )
        fix = "set {field}=None or a positive int"
        check_fields(c, self, optional, lo=1, integer=True, optional=True, fix=fix)
        check_range(
            c,
            "max_staleness",
            self.max_staleness,
            lo=0,
            integer=True,
            optional=True,
            fix="use 0 for synchronous RL, 2-4 for asynchronous",
        )
        check_range(
            c,
            "max_group_retries",
            self.max_group_retries,
            lo=0,
            integer=True,
            fix="use 0 (drop) or a small retry count",
        )
        check_range(
            c,
            "group_timeout_s",
            self.group_timeout_s,
            lo=0,
            lo_open=True,
            optional=True,
            fix="use e.g. 600.0 (seconds) or None",
        )
        check_range(
            c, "loop_lag_interval_s", self.loop_lag_interval_s, lo=0, lo_open=True, fix="use 0.01"
        )
        check_range(
            c,
            "agent_start_timeout_s",
            self.agent_start_timeout_s,
            lo=0,
            lo_open=True,
            fix="use e.g. 300.0",
        )
        check_choice(
            c,
            "release_order",
            self.release_order,
            ("oldest_version", "completion"),
            fix="use release_order='oldest_version'",
        )
        require(
            isinstance(self.adaptive_concurrency, bool),
            f"{c}.adaptive_concurrency",
            expected="a bool",
            received=self.adaptive_concurrency,
            fix="use adaptive_concurrency=True (or False: a fixed limit)",
        )
        for name in ("min_concurrency", "concurrency_start"):
            v = getattr(self, name)
            require(
                v is None or v <= self.max_concurrency,
                f"{c}.{name}",
                expected=f"None or <= max_concurrency ({self.max_concurrency}, the ceiling)",
                received=v,
                fix=f"lower {name} or raise max_concurrency",
            )
        if self.min_concurrency is not None and self.concurrency_start is not None:
            require(
                self.concurrency_start >= self.min_concurrency,
                f"{c}.concurrency_start",
                expected=f">= min_concurrency ({self.min_concurrency})",
                received=self.concurrency_start,
                fix="raise concurrency_start or lower min_concurrency",
            )
        check_range(
            c,
            "target_queue_depth",
            self.target_queue_depth,
            lo=0,
            integer=True,
            optional=True,
            fix="use None (groups_per_step) or a small int",
        )
        check_choice(c, "mode", self.mode, MODES)
        require(
            (self.mode == "proxy") == bool(self.agent_program.strip()),
            f"{c}.agent_program",
            expected="a command line with mode='proxy' (and none otherwise)",
            received={"mode": self.mode, "agent_program": self.agent_program},
            fix="e.g. --rollout.agent-program '{python} examples/openai_agent.py --base-url {base_url} "
            "--problems 0' with --rollout.mode proxy",
        )
        if (
            self.mode == "proxy"
        ):  # its {placeholders} are checked now, not after the model has compiled
            try:
                shlex.split(self.agent_program.format(**AGENT_PROGRAM_FIELDS))
            except (KeyError, IndexError, ValueError) as e:
                require(
                    False,
                    f"{c}.agent_program",
                    expected="a command line whose {placeholders} are "
                    + ", ".join(AGENT_PROGRAM_FIELDS),
                    received=self.agent_program,
                    fix=f"fix it ({type(e).__name__}: {e}); write literal braces as {{{{ }}}}",
                )

    def prompt_limit(self, engine: Any) -> int | None:
        """``max_prompt_len``, else the engine's ``max_len - 1``, else None."""
        if self.max_prompt_len is not None:
            return self.max_prompt_len
        max_len = getattr(engine, "max_len", None)
        return int(max_len) - 1 if isinstance(max_len, int) else None

    def concurrency_config(self, num_envs: int, groups_per_step: int) -> ConcurrencyConfig:
        """The control law's bounds for ``num_envs`` env slots (the ceiling: ``min(max_concurrency,
        num_envs)``; the start and the minimum are clipped to it); ``groups_per_step``: the learner's
        groups per update (the default queue depth)."""
        ceiling = max(1, min(self.max_concurrency, int(num_envs)))
        low = min(
            ceiling, self.min_concurrency if self.min_concurrency is not None else self.group_size
        )
        start = (
            None
            if self.concurrency_start is None
            else max(low, min(ceiling, self.concurrency_start))
        )
        step = self.concurrency_step if self.concurrency_step is not None else self.group_size
        target = self.target_queue_depth
        if target is None:
            target = max(0, min(groups_per_step, self.queue_size - 1))
        return ConcurrencyConfig(
            min_limit=low,
            max_limit=ceiling,
            start=start,
            increase=step,
            decrease=step,
            target_queue_depth=target,
        )

    @property
    def open_group_limit(self) -> int:
        """Groups admitted and not complete: ``max_open_groups``, else ``2 * ceil(max_concurrency /
        group_size) + 1`` (the one place this bound is computed)."""
        if self.max_open_groups is not None:
            return self.max_open_groups
        return 2 * -(-self.max_concurrency // self.group_size) + 1
