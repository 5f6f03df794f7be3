"""What the streaming learner makes of a group's rewards before its rows train: the shaped rewards
(overlong punishment, a reward-placement KL penalty against the reference policy), the zero-variance
filter, and the advantages (a group estimator's program, or ``role_ema``'s per-role baseline).

    scorer = GroupScorer(loss, layout, ref_logp=ref_program, ref_params=ref, mesh=None)
    rewards = scorer.shaped_rewards(group)
    if not scorer.filtered(group, rewards):
        adv = np.asarray(scorer.advantages(rewards[None]))[0]

The learner owns the step and the checkpointed state (``role_baselines`` is passed in and returned).
"""

from __future__ import annotations

from typing import Any, Callable

import jax.numpy as jnp
import numpy as np

from gymllm.algos import advantages as adv_mod
from gymllm.algos.batching import Row
from gymllm.algos.config import LossConfig
from gymllm.algos.kl import kl_reward_penalty
from gymllm.algos.learner_layout import RowLayout
from gymllm.algos.learner_programs import advantage_program
from gymllm.algos.shaping import overlong_penalty
from gymllm.algos.sharding import shard_batch
from gymllm.multiagent.baseline import group_role_advantages
from gymllm.types import Group
from gymllm.validation import require

__all__ = ["GroupScorer"]


def _ready() -> None:
    """No program to wait for (the default of ``GroupScorer(before_program=...)``)."""


class GroupScorer:
    """A group's shaped rewards, filter decision and advantages (see the module docstring).

    ``loss``: the learner's loss config (its ``shaping``, ``kl`` and ``advantage`` sections); ``layout``:
    the learner's rows and host arrays (the KL penalty's reference forward reads them); ``ref_logp``: the
    reference log-prob program and ``ref_params`` its weights (None: no reward-placement KL); ``mesh``: the
    learner's (arrays are sharded over it); ``before_program``: called before any program runs (the
    learner waits for a background warm-up there)."""

    def __init__(
        self,
        loss: LossConfig,
        layout: RowLayout,
        *,
        ref_logp: Any,
        ref_params: Any,
        mesh: Any,
        before_program: Callable[[], None] = _ready,
    ):
        self.loss = loss
        self.layout = layout
        self.ref_logp = ref_logp
        self.ref_params = ref_params
        self.mesh = mesh
        self.before_program = before_program
        a = loss.advantage
        self.stateful = a.estimator in adv_mod.STATEFUL  # equal rewards still carry R - b[role]
        require(
            self.stateful or not a.ema_scale,
            "loss.advantage.ema_scale",
            expected="the role_ema estimator (it divides role_ema's advantages by each key's spread)",
            received=f"ema_scale=True with the estimator {a.estimator!r}",
            fix="add --multiagent.baseline role_ema (a game), or drop --loss.advantage.ema-scale",
        )
        self.step_global = (
            a.estimator in adv_mod.STEP_GLOBAL
        )  # advantages wait for the step's groups
        self.program = (
            None
            if self.stateful
            else advantage_program(a.estimator, a.ddof, a.eps, a.eps_placement)
        )

    @property
    def reward_kl(self) -> bool:
        """Whether a reward-placement KL penalty runs the reference forward."""
        return self.ref_params is not None and self.loss.kl.placement == "reward"

    def advantages(self, rewards: np.ndarray) -> jnp.ndarray:
        """The estimator's advantages of ``rewards`` [groups, group_size] (not ``role_ema``)."""
        self.before_program()
        return self.program(np.asarray(rewards, np.float32))

    def role_advantages(
        self, group: Group, rewards: np.ndarray, baselines: dict[str, float]
    ) -> tuple[np.ndarray, dict[str, float]]:
        """``role_ema``: R - b[role] with b read before it takes the group's mean reward (SPIRAL); a member
        whose ``info["baseline_key"]`` is set (``multiagent.baseline_key``) is compared with b[role/key]
        instead (:func:`~gymllm.multiagent.baseline.group_role_advantages`). Returns the advantages and the
        updated baselines."""
        role = str(group.info.get("role") or group.info.get("agent") or "all")
        keys = [
            f"{role}/{t.info['baseline_key']}" if "baseline_key" in t.info else role
            for t in group.trajectories
        ]
        if len(keys) != len(
            rewards
        ):  # rewards that are not one a trajectory: keyed by the seat alone
            keys = [role] * len(rewards)
        a = self.loss.advantage
        adv, baselines = group_role_advantages(
            rewards, keys, baselines, decay=a.ema_decay, scaled=a.ema_scale, floor=a.ema_scale_floor
        )
        return adv, baselines

    def filtered(self, group: Group, rewards: np.ndarray) -> bool:
        """Whether the zero-variance filter drops the group (shaping.nonzero_variance, on the host: no compile)."""
        return bool(
            self.loss.shaping.filter_zero_variance
            and not group.info.get("kept_zero_variance")
            and not self.stateful
            and rewards.max() == rewards.min()
        )

    def shaped_rewards(self, group: Group) -> np.ndarray:
        """The group's rewards with the overlong punishment and the reward-placement KL penalty applied."""
        r = group.rewards.astype(np.float32)
        sh = self.loss.shaping
        if sh.overlong_buffer and sh.overlong_max_len:
            lengths = np.array([t.num_sampled for t in group.trajectories])
            r = r + np.asarray(
                overlong_penalty(lengths, max_len=sh.overlong_max_len, buffer=sh.overlong_buffer)
            )
        if self.reward_kl:
            r = r - self.kl_penalty(group)
        return r.astype(np.float32)

    def kl_penalty(self, group: Group) -> np.ndarray:
        """Each trajectory's KL penalty against the reference policy (``kl.beta`` times the k1 estimate)."""
        self.before_program()
        layout, b = self.layout, self.layout.config.micro_batch_size
        rows = [
            layout.row(t, advantage=0.0, group_tokens=1.0, sample_id="") for t in group.trajectories
        ]
        if layout.config.fixed_shapes:
            return self.fixed_kl_penalty(rows)
        out = []
        for i in range(0, len(rows), b):
            chunk = rows[i : i + b]
            a = shard_batch(self.mesh, layout.ref_arrays(layout.micro_batch(chunk), chunk))
            ref = self.ref_logp(self.ref_params, a)
            # the behaviour logprobs stand in for pi_theta's (the sampled policy's) in the k1 estimate
            pen = kl_reward_penalty(a["mu"], ref, a["mask"], beta=self.loss.kl.beta)
            out.append(np.asarray(pen)[: len(chunk)])
        return np.concatenate(out)

    def fixed_kl_penalty(self, rows: list[Row]) -> np.ndarray:
        """:meth:`kl_penalty` through the fixed reference program (``fixed_shapes``), pass by pass."""
        b = self.layout.config.micro_batch_size
        out = np.zeros(len(rows), np.float32)
        for i in range(0, len(rows), b):
            for order, host in self.layout.fixed_hosts(rows[i : i + b]):
                ref = self.ref_logp(self.ref_params, shard_batch(self.mesh, host))
                pen = kl_reward_penalty(host["mu"], ref, host["mask"], beta=self.loss.kl.beta)
                out[[i + j for j in order]] = np.asarray(pen)[: len(order)]
        return out
