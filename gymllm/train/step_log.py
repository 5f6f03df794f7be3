"""What a run logs per optimizer step: :class:`StepLog` (the step's metrics record, its timing, the
trained trajectories) and :class:`RolloutTally` (figures over every completed rollout).

    log = StepLog(RolloutTally(heldout_seeds))
    log.open(run_dir, cfg, tokenizer)            # metrics.jsonl / tensorboard / console, trajectories.jsonl
    log.add_trained(groups)                      # groups handed to the learner for the coming step
    record = log.record(report, sync_s, source_stats, filtered=3)   # after the step's weights are pushed
    log.restart_step()
"""

from __future__ import annotations

import pathlib
import time
from typing import Any, Callable

import numpy as np

from gymllm.train.train_config import TrainConfig
from gymllm.errors import ConfigError, explain
from gymllm.trajectories.writers import TrajectoryRecordWriter

__all__ = ["StepLog", "RolloutTally"]


class RolloutTally:
    """Figures over every completed rollout (filtered groups included) since the last step: the
    honest progress of a run, beside the trained groups' ``reward_mean``. :meth:`add` each group as
    it completes; :meth:`pop` the step metrics ``rollout_reward_mean``, ``rollout_groups``,
    ``rollout_episodes``, ``tool_calls_per_episode`` and ``tool_call_share`` (episodes with at least
    one tool call), and the env-side figures of :func:`~gymllm.rollout.evaluation.episode_figures`
    (``valid_action_rate``; ``win_or_draw``, ``outcome/<result>`` for games). ``seeds``: every env seed a training group used (the whole run). ``heldout``: env
    seeds training must never use (the evaluation's): a group on one raises :class:`ConfigError`."""

    def __init__(self, heldout: range | None = None):
        self.heldout = heldout
        self.seeds: set[int] = set()
        self.rewards: list[float] = []  # per group: its mean reward
        self.tool_calls: list[int] = []  # per episode
        self.episodes: list[
            Any
        ] = []  # row 0 of each episode (its info: env steps, invalid replies, outcome)
        self.totals = {"episodes": 0, "with_tool_call": 0, "tool_calls": 0}

    def add(self, group: Any) -> None:
        from gymllm.rollout.evaluation import group_episodes, group_tool_calls

        seeds = {int(t.seed) for t in group.trajectories if t.seed is not None}
        bad = sorted(x for x in seeds if self.heldout is not None and x in self.heldout)
        if bad:
            raise ConfigError(
                explain(
                    f"training group {group.group_id}",
                    expected="an env seed outside the held-out "
                    f"seeds {self.heldout.start}..{self.heldout.stop - 1}",
                    received=bad,
                    fix="raise --eval.seed-base above every seed training reaches (run.seed + the "
                    "groups it admits)",
                )
            )
        self.seeds |= seeds
        self.rewards.append(float(np.mean(group.rewards)))
        calls = group_tool_calls(group)
        self.tool_calls += calls
        self.episodes += group_episodes(group)
        self.totals["episodes"] += len(calls)
        self.totals["with_tool_call"] += sum(c > 0 for c in calls)
        self.totals["tool_calls"] += sum(calls)

    def pop(self) -> dict[str, float]:
        from gymllm.rollout.evaluation import episode_figures

        out: dict[str, float] = {}
        if self.rewards:
            out.update(
                rollout_reward_mean=float(np.mean(self.rewards)), rollout_groups=len(self.rewards)
            )
        if self.tool_calls:
            calls = np.asarray(self.tool_calls, np.float64)
            out.update(
                rollout_episodes=int(calls.size),
                tool_calls_per_episode=float(calls.mean()),
                tool_call_share=float((calls > 0).mean()),
            )
        out.update(episode_figures(self.episodes))
        self.rewards.clear()
        self.tool_calls.clear()
        self.episodes.clear()
        return out


class StepLog:
    """The run's step records and their timing.

    ``history``: every step's record as metrics.jsonl holds it (flat: ``step``, ``time``, the step's
    metrics and the logger's ``pipeline/...`` figures for the step's window); ``trained_ids``: per step, the
    trajectory ids the update used; ``tally``: the :class:`RolloutTally`; ``pending_eval``: held-out
    metrics to add to the next record. Timing: ``t_step`` (the current step's start; time spent in
    held-out evaluation is added to it, so it is left out of the step's wall time), ``wait_s`` (time
    the loop waited for groups this step) and ``gen_tokens`` (sampled tokens of the groups trained).
    ``compiles``: the run's :class:`~gymllm.telemetry.compiles.CompileLog` (None: not counted); each
    record then has ``compile_s`` (seconds of XLA compiles and cache loads since the previous step's
    record, the first step's since the run started) and ``compiles`` (how many)."""

    def __init__(self, tally: RolloutTally):
        self.tally = tally
        self.history: list[dict[str, Any]] = []
        self.trained_ids: list[list[str]] = []
        self.pending_eval: dict[str, float] = {}
        self.wait_s, self.t_step, self.gen_tokens = 0.0, time.perf_counter(), 0
        self.step_groups: list[Any] = []  # trained groups whose trajectories are not yet logged
        self.extra: list[Callable[[], dict[str, float]]] = []  # more figures for each step's record
        self.logger: Any = None
        self.traj_log: Any = None
        self.tok: Any = None
        self.compiles: Any = None  # the run's CompileLog
        self.compile_cursor = 0

    def open(self, run_dir: pathlib.Path, cfg: TrainConfig, tok: Any) -> None:
        """Open the run directory's metrics logger and (``run.log_trajectories``) ``trajectories.jsonl``."""
        from gymllm.telemetry.sinks import MetricsLogger

        self.tok = tok
        self.logger = MetricsLogger(
            run_dir, total_steps=cfg.learner.num_steps, console=cfg.run.console
        )
        self.traj_log = (
            TrajectoryRecordWriter(run_dir / "trajectories.jsonl", tokenizer=tok, per_token=True)
            if cfg.run.log_trajectories
            else None
        )

    def restart_clock(self) -> None:
        """The current step starts now."""
        self.t_step = time.perf_counter()

    def restart_step(self) -> None:
        """After a step's record: the next step starts now, with no wait and no tokens yet."""
        self.wait_s, self.t_step, self.gen_tokens = 0.0, time.perf_counter(), 0

    def add_trained(self, groups: list[Any]) -> None:
        """``groups`` go to the learner: their tokens count for the step, their trajectories get logged."""
        self.gen_tokens += sum(t.num_sampled for g in groups for t in g.trajectories)
        self.step_groups += groups

    def record(
        self, rep: Any, sync_s: float, stats: dict[str, Any], filtered: int
    ) -> dict[str, Any]:
        """Log the step of learner report ``rep`` (its metrics, ``sync_s`` of weight push, the group
        source's ``stats``, ``filtered`` groups so far) and return its record."""
        wall = time.perf_counter() - self.t_step
        m = dict(rep.metrics)
        m.update(
            weight_sync_s=sync_s,
            step_wall_s=wall,
            trainer_wait_s=self.wait_s,
            tokens_per_s_generated=self.gen_tokens / wall if wall > 0 else 0.0,
            engine_busy_fraction=float(stats.get("engine_busy_fraction", 0.0)),
            groups_filtered_rollout=float(filtered),
            groups_stale_rollout=float(stats.get("stale_dropped", 0)),
        )
        if "concurrency_limit" in stats:
            m["rollout_concurrency"] = float(stats["concurrency_limit"])
        if (
            self.compiles is not None
        ):  # a step that compiled shows it (the first steps, a new shape)
            done = self.compiles.since(self.compile_cursor)
            self.compile_cursor += len(done)
            m.update(compile_s=sum(c.seconds for c in done), compiles=len(done))
        m.update(
            self.tally.pop()
        )  # over every group completed since the last step, filtered ones included
        for figures in self.extra:  # e.g. a suite mixture's env/<name>/... figures
            m.update(figures())
        m.update(self.pending_eval)
        self.pending_eval = {}
        # the record is what metrics.jsonl holds: the logger adds the step window's pipeline figures
        # (``pipeline/trainer_idle_fraction``, the one trainer-idle figure: 1 - the trainer spans' union)
        record = self.logger.log(rep.step, m)
        self.history.append(record)
        self.trained_ids.append(rep.sample_ids)
        if self.traj_log is not None:
            used = set(rep.sample_ids)
            mine = [
                g for g in self.step_groups if any(t.trajectory_id in used for t in g.trajectories)
            ]
            self.traj_log.write([t for g in mine for t in g.trajectories], step=rep.step)
            self.step_groups = [g for g in self.step_groups if g not in mine]
        return record

    def close(self) -> None:
        if self.traj_log is not None:
            self.traj_log.close()
        if self.logger is not None:
            self.logger.close()
