"""What a resumed run carries over, and the group filter whose decisions it replays.

:class:`ResumeState` is restored from the latest checkpoint (``run.resume``): the step it resumes
from, the run's RNG, the ids of the groups filtered before the checkpoint and the decision on every
group already seen (``decided``: consumed -> True, filtered -> False), so the replayed deterministic
group sequence is admitted and filtered exactly as before; the log records past the checkpoint are
set aside (``rewound``). :func:`make_group_filter` is the zero-variance filter the group sources apply.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from gymllm.train.train_config import TrainConfig

__all__ = ["ResumeState", "make_group_filter", "filter_patience"]


def filter_patience(groups_per_step: int) -> int:
    """Zero-variance groups filtered in a row before :func:`make_group_filter` keeps the next one."""
    return max(8, 4 * groups_per_step)


@dataclasses.dataclass
class ResumeState:
    """``resumed_from``: the restored step (None: a fresh run); ``rng``: the run's generator (its state
    is checkpointed); ``filtered``: ids of groups the filter dropped (this run and before); ``decided``:
    the filter's decision per group id restored from the checkpoint; ``rewound``: log file -> the
    :class:`~gymllm.telemetry.run_log.RewindReport` of the records set aside at resume."""

    rng: np.random.Generator
    resumed_from: int | None = None
    filtered: set[str] = dataclasses.field(default_factory=set)
    decided: dict[str, bool] = dataclasses.field(default_factory=dict)
    rewound: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def restore(cls, cfg: TrainConfig, ckpt: Any, learner: Any) -> "ResumeState":
        """A fresh state, or (``run.resume`` and a checkpoint exists) the latest checkpoint restored
        into ``learner`` and the state saved with it."""
        state = cls(rng=np.random.default_rng(cfg.run.seed))
        meta = ckpt.restore_latest(learner) if cfg.run.resume else None
        if meta is not None:
            state.resumed_from = learner.version
            state.rng.bit_generator.state = meta["rng"]
            state.filtered = set(meta.get("filtered_groups", []))
            state.decided = {g: True for g in learner.consumed_groups} | {
                g: False for g in state.filtered
            }
        return state

    def rewind_logs(self, run_dir: Any) -> None:
        """Set aside the records of ``metrics.jsonl`` and ``trajectories.jsonl`` past the restored step
        (a killed run's records past its checkpoint are a lost lineage)."""
        from gymllm.telemetry.run_log import rewind_jsonl

        self.rewound = {
            name: rewind_jsonl(run_dir / name, step=self.resumed_from or 0)
            for name in ("metrics.jsonl", "trajectories.jsonl")
        }

    def generation_engine(self, engine: Any, tok: Any) -> Any:
        """``engine`` for rollouts; on resume wrapped so the groups consumed before the checkpoint are
        replayed without generating (:class:`~gymllm.rollout.engine_wrappers.SkipConsumed`)."""
        if not self.decided:
            return engine
        from gymllm.rollout.engine_wrappers import SkipConsumed

        return SkipConsumed(
            engine, set(self.decided), int(tok.eos_token_id if tok.eos_token_id is not None else 0)
        )

    def checkpoint_extra(self) -> dict[str, Any]:
        """What a checkpoint saves besides the learner: the RNG state and the filtered group ids."""
        return {"rng": self.rng.bit_generator.state, "filtered_groups": sorted(self.filtered)}


def make_group_filter(
    cfg: TrainConfig, decided: dict[str, bool], filtered: set[str], seen: Any = None
):
    """Drop groups whose (overlong-shaped) rewards are all equal, if the loss asks; replayed groups
    keep the decision recorded before the checkpoint (so admission accounting matches).

    A task the policy always fails (or always solves) would filter every group and the run would
    never take a step: after ``patience`` filtered groups in a row the next one is kept (marked
    ``info["kept_zero_variance"]``; its advantages are zero, so it moves no weights) and the run says so.
    ``seen`` (a :class:`~gymllm.train.step_log.RolloutTally`) tallies every newly decided group,
    filtered or not (the unbiased ``rollout_reward_mean`` and the tool-call figures of the step
    metrics; it also rejects a held-out seed).
    """
    import logging

    from gymllm.algos.shaping import nonzero_variance, overlong_penalty

    from gymllm.algos.advantages import STATEFUL
    from gymllm.train.wiring import learner_loss

    sh = cfg.loss.shaping
    role_ema = learner_loss(cfg).advantage.estimator in STATEFUL
    patience = filter_patience(cfg.learner.groups_per_step)
    streak = [0]

    def keep(group) -> bool:
        if group.group_id in decided:
            return decided[group.group_id]
        if seen is not None:
            seen.add(group)
        if (
            not sh.filter_zero_variance or role_ema
        ):  # role_ema: equal rewards still carry R - b[role]
            return True
        r = group.rewards
        if sh.overlong_buffer:
            lengths = np.array([t.num_sampled for t in group.trajectories])
            r = r + np.asarray(
                overlong_penalty(
                    lengths,
                    max_len=sh.overlong_max_len or cfg.sample_budget,
                    buffer=sh.overlong_buffer,
                )
            )
        ok = bool(nonzero_variance(r[None])[0])
        if ok:
            streak[0] = 0
            return True
        streak[0] += 1
        if streak[0] >= patience:
            streak[0] = 0
            group.info["kept_zero_variance"] = True
            logging.getLogger("gymllm.algos").warning(
                "%d groups in a row had equal rewards (%.3g): keeping one so the run still steps; "
                "the task may be too hard or too easy for this policy",
                patience,
                float(r[0]),
            )
            return True
        filtered.add(group.group_id)
        return False

    return keep
