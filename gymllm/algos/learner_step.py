"""One unfinished step of the streaming learner, on the host: the groups and rows it holds, the rows not
yet in a micro-batch, the groups whose advantages wait for the step (step-global estimators), and the
running figures its :class:`~gymllm.algos.learner.StepReport` metrics are made of.

    tally = StepTally()
    tally.add_group(group)                   # its rewards and lengths join the step's figures
    ...                                      # rows into tally.rows / tally.pending, sums from each pass
    stats = tally.stats(max_len=160)         # the step's counts for the loss's denominator
    metrics = tally.metrics(stats, denom, grad_norm, learning_rate, counts)

The learner starts a new tally each step; the device-side gradient accumulator stays with the learner.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np

from gymllm.algos import aggregation as agg
from gymllm.algos.batching import Row
from gymllm.types import Group

__all__ = ["StepTally"]


@dataclasses.dataclass
class StepTally:
    """The host-side state of one unfinished optimizer step (a fresh one per step)."""

    groups: int = 0
    """Groups the step holds so far (``groups_per_step`` complete it)."""
    rows: list[Row] = dataclasses.field(default_factory=list)
    """Every row the step trains, in the order they were added (the report's ``sample_ids``)."""
    pending: list[Row] = dataclasses.field(default_factory=list)
    """Rows not yet in a micro-batch."""
    deferred: list[tuple[Group, np.ndarray]] = dataclasses.field(default_factory=list)
    """Groups and shaped rewards waiting for the step's advantages (step-global estimators, e.g. batch_std)."""
    rewards: list[float] = dataclasses.field(default_factory=list)
    """The step's trajectories' rewards (unshaped: the reward metrics)."""
    lengths: list[int] = dataclasses.field(default_factory=list)
    """The step's trajectories' sampled tokens (the response-length metrics)."""
    sums: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    """Running sums of the gradient program's per-pass figures and of the tokens' staleness."""
    micro_batches: int = 0
    """Micro-batches the step ran so far."""
    busy_s: float = 0.0
    """Seconds the step spent in its micro-batches and update."""

    def add_group(self, group: Group) -> None:
        """Count ``group`` towards the step and its rewards and lengths towards the step's figures."""
        self.groups += 1
        self.rewards += [float(t.reward) for t in group.trajectories]
        self.lengths += [t.num_sampled for t in group.trajectories]

    def stats(self, max_len: int) -> agg.StepStats:
        """The step's counts (tokens, sequences, groups) for the loss's denominator."""
        return agg.StepStats(
            num_tokens=float(sum(r.mask.sum() for r in self.rows)),
            num_seqs=float(len(self.rows)),
            num_groups=float(self.groups),
            max_len=float(max_len),
        )

    def metrics(
        self,
        stats: agg.StepStats,
        denom: float,
        gnorm: float,
        lr: float,
        counts: collections.Counter,
    ) -> dict[str, float]:
        """The step's report metrics (``counts``: the learner's running counters)."""
        s, tok = self.sums, max(stats.num_tokens, 1.0)
        rewards = np.asarray(self.rewards, np.float64)
        lengths = np.asarray(self.lengths, np.float64)
        return {
            "loss": s["loss_sum"] / denom,
            "grad_norm": gnorm,
            "learning_rate": lr,
            "reward_mean": float(rewards.mean()),
            "reward_std": float(rewards.std()),
            "reward_max": float(rewards.max()),
            "clip_fraction": s["clipped_tokens"] / tok,
            "kl": s["kl_sum"] / tok,
            "entropy": s["entropy_sum"] / tok,
            "ratio_mean": s["ratio_sum"] / tok,
            "is_weight_mean": s["weight_sum"] / tok,
            "masked_token_fraction": s["zero_weight_tokens"] / tok,
            "mismatch_abs_logprob": s["mismatch_abs_sum"] / tok,
            "staleness_mean": s["staleness_sum"] / tok,
            "staleness_max": s["staleness_max"],
            "response_len_mean": float(lengths.mean()),
            "response_len_max": float(lengths.max()),
            "tokens": stats.num_tokens,
            "sequences": stats.num_seqs,
            "groups": stats.num_groups,
            "micro_batches": float(self.micro_batches),
            "train_busy_s": self.busy_s,
            "filtered_groups": float(counts["filtered_groups"]),
            "stale_groups": float(counts["stale_groups"]),
        }
