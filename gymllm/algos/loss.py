"""The composed token loss of one micro-batch, built from the pure pieces by a :class:`LossConfig`.

``micro_batch_loss(cfg, logp, batch)`` returns the *un-normalized* weighted sum of the step's loss
over this micro-batch (see :mod:`gymllm.algos.aggregation`) and a dict of metric sums. Dividing the
sum of all micro-batches' values by ``step_denominator(cfg, step_stats)`` gives the step's loss.

Pipeline per token (each stage a small pure function picked from a table by name):
ratio (token | sequence, against mu or the proximal policy) -> objective (PPO clip | CISPO) ->
x detached correction weight (TIS | MIS | geometric mask) -> + beta KL (k1 | k2 | k3) -> - entropy
bonus -> aggregation.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from gymllm.algos import aggregation as agg
from gymllm.algos import kl as kl_mod
from gymllm.algos.config import LossConfig
from gymllm.algos.corrections import compose
from gymllm.algos.policy_loss import RATIO_LEVELS, cispo_loss, ppo_clip_loss


class LossBatch(NamedTuple):
    """Per-token arrays aligned on the *targets* of a micro-batch ([B, T] each) plus per-row ones."""

    mask: jnp.ndarray  # [B, T] float32, 1 on policy-sampled targets
    behaviour_logp: jnp.ndarray  # [B, T] mu (the sampler's logprobs)
    advantages: jnp.ndarray  # [B]
    group_tokens: jnp.ndarray  # [B] policy tokens of the row's group (prompt_mean)
    ref_logp: jnp.ndarray | None = None  # [B, T] frozen reference (KL in loss only)


def _objective(cfg: LossConfig, ratio, adv, logp):
    p = cfg.policy
    kw = dict(eps_low=p.eps_low, eps_high=p.eps_high, dual_clip=p.dual_clip)
    return (
        cispo_loss(ratio, adv, logp, **kw)
        if p.objective == "cispo"
        else ppo_clip_loss(ratio, adv, **kw)
    )


def old_logp(cfg: LossConfig, logp, behaviour_logp):
    """pi_old: the sampler's logprobs, or the trainer's own detached logprobs (proximal policy)."""
    return jax.lax.stop_gradient(logp) if cfg.policy.ratio_against == "proximal" else behaviour_logp


def token_losses(cfg: LossConfig, logp, batch: LossBatch, entropy=None):
    """Per-token loss ``[B, T]`` (before aggregation) and per-token diagnostics."""
    mask = batch.mask
    log_ratio = RATIO_LEVELS[cfg.policy.ratio_level](
        logp, old_logp(cfg, logp, batch.behaviour_logp), mask
    )
    ratio = jnp.exp(log_ratio)
    loss, clipped = _objective(cfg, ratio, batch.advantages[:, None], logp)
    log_rho = jnp.where(mask > 0, jax.lax.stop_gradient(logp) - batch.behaviour_logp, 0.0)
    w = compose(cfg.correction.kinds, log_rho, mask, **cfg.correction.params())
    loss = loss * w
    kl = jnp.zeros_like(logp)
    if batch.ref_logp is not None:
        kl = kl_mod.ESTIMATORS[cfg.kl.estimator](logp, batch.ref_logp)
        if cfg.kl.placement == "loss":
            loss = loss + cfg.kl.beta * kl
    if entropy is not None and cfg.entropy_coef > 0:
        loss = loss - cfg.entropy_coef * entropy
    diag = dict(clipped=clipped, ratio=ratio, weight=w, kl=kl, log_rho=log_rho)
    return loss, diag


def micro_batch_loss(cfg: LossConfig, logp, batch: LossBatch, entropy=None):
    """(un-normalized weighted loss sum, metric sums) of one micro-batch."""
    loss, d = token_losses(cfg, logp, batch, entropy)
    rows = agg.RowStats(group_tokens=batch.group_tokens)
    total = agg.weighted_sum(cfg.aggregation, loss, batch.mask, rows)
    m = batch.mask.astype(jnp.float32)
    sg = jax.lax.stop_gradient
    metrics = {
        "tokens": jnp.sum(m),
        "clipped_tokens": jnp.sum(d["clipped"] * m),
        "ratio_sum": jnp.sum(sg(d["ratio"]) * m),
        "weight_sum": jnp.sum(d["weight"] * m),
        "zero_weight_tokens": jnp.sum((d["weight"] == 0) * m),
        "kl_sum": jnp.sum(sg(d["kl"]) * m),
        "mismatch_abs_sum": jnp.sum(jnp.abs(d["log_rho"]) * m),
        "entropy_sum": jnp.sum(sg(entropy) * m) if entropy is not None else jnp.zeros(()),
    }
    return total, metrics


def step_denominator(cfg: LossConfig, step: agg.StepStats):
    return agg.AGGREGATIONS[cfg.aggregation].denominator(step)
