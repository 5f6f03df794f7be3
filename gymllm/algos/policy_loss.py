"""Policy-gradient token losses: ratios (token or sequence level), PPO clip, dual clip, CISPO.

All functions are pure and shape-preserving on ``[B, T]`` token arrays; ``mask`` is 1 on tokens the
policy sampled. Losses are *to be minimized* (the negated surrogate objective). Tokens where the
mask is 0 get loss 0 and never produce NaN (their log-ratio is zeroed before ``exp``).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp


def token_log_ratio(logp, old_logp, mask) -> jnp.ndarray:  # [B, T]
    """``log pi_theta - log pi_old`` per token, 0 where the mask is 0."""
    return jnp.where(mask > 0, logp - old_logp, 0.0)


def masked_seq_mean(x, mask) -> jnp.ndarray:  # [B]
    m = mask.astype(jnp.float32)
    return jnp.sum(x * m, axis=-1) / jnp.maximum(jnp.sum(m, axis=-1), 1.0)


def sequence_log_ratio(logp, old_logp, mask) -> jnp.ndarray:  # [B, T]
    """GSPO: ``mean_t log r_{i,t}`` of each sequence, broadcast to its tokens (gradient flows through
    every token's log-probability with weight ``1/|y_i|``)."""
    lr = token_log_ratio(logp, old_logp, mask)
    return jnp.broadcast_to(masked_seq_mean(lr, mask)[:, None], lr.shape) * (mask > 0)


RATIO_LEVELS: dict[str, Callable[..., jnp.ndarray]] = {
    "token": token_log_ratio,
    "sequence": sequence_log_ratio,
}


def ppo_clip_loss(ratio, adv, *, eps_low: float, eps_high: float, dual_clip: float | None = None):
    """``-min(r A, clip(r, 1-eps_low, 1+eps_high) A)``; with ``dual_clip=c`` and ``A < 0`` the objective
    is further bounded below by ``c A``. Returns ``(loss [B, T], clipped [B, T] bool)`` where ``clipped``
    marks tokens whose gradient is exactly zero."""
    adv = jnp.broadcast_to(adv, ratio.shape)
    unclipped = ratio * adv
    clipped_ratio = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    clipped = clipped_ratio * adv
    is_clipped = clipped < unclipped
    obj = jnp.where(
        is_clipped, clipped, unclipped
    )  # == min(.,.); at a tie the unclipped branch owns the gradient
    if dual_clip is not None:
        floor = dual_clip * adv
        dual = (adv < 0) & (obj < floor)
        obj = jnp.where(dual, floor, obj)
        is_clipped = is_clipped | dual
    return -obj, is_clipped


def cispo_loss(
    ratio, adv, logp, *, eps_low: float, eps_high: float, dual_clip: float | None = None
):
    """CISPO: ``-sg(clip(r, 1-eps_low, 1+eps_high)) A log pi_theta``. Every token keeps its gradient
    (the clipped weight is detached); ``clipped`` marks tokens whose weight was clipped."""
    del dual_clip
    adv = jnp.broadcast_to(adv, ratio.shape)
    w = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    is_clipped = w != ratio
    return -jax.lax.stop_gradient(w) * adv * logp, is_clipped
