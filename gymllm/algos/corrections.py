"""Corrections for sampler/trainer mismatch and staleness: detached per-token weights ``w [B, T]``.

``log_rho = log pi_old - log mu`` per token (``mu``: the sampler's probability, ``pi_old``: the
trainer's). Every correction returns a weight that multiplies the token loss; the weight is always
wrapped in ``stop_gradient`` (it is a constant of the step, never a path for gradients). Several
corrections compose by multiplication (:func:`compose`).
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp

from gymllm.algos.policy_loss import masked_seq_mean

CorrectionFn = Callable[..., jnp.ndarray]


def token_tis(log_rho, mask, *, cap: float = 2.0, **_: float) -> jnp.ndarray:
    """Truncated importance sampling: ``w = min(rho, cap)``."""
    rho = jnp.exp(jnp.where(mask > 0, log_rho, 0.0))
    return jax.lax.stop_gradient(jnp.minimum(rho, cap))


def masked_is(log_rho, mask, *, low: float = 0.5, high: float = 2.0, **_: float) -> jnp.ndarray:
    """Masked IS (IcePop): ``w = rho`` if ``low <= rho <= high`` else 0."""
    rho = jnp.exp(jnp.where(mask > 0, log_rho, 0.0))
    return jax.lax.stop_gradient(jnp.where((rho >= low) & (rho <= high), rho, 0.0))


def geometric_seq_mask(
    log_rho, mask, *, geo_low: float = 0.99, geo_high: float = 1.01, **_: float
) -> jnp.ndarray:
    """Drop a whole sequence if its geometric-mean ratio ``exp(mean_t log rho)`` is outside
    ``[geo_low, geo_high]``; ``w`` is 1 or 0 per sequence, broadcast to its tokens."""
    g = jnp.exp(masked_seq_mean(jnp.where(mask > 0, log_rho, 0.0), mask))  # [B]
    keep = ((g >= geo_low) & (g <= geo_high)).astype(jnp.float32)
    return jax.lax.stop_gradient(jnp.broadcast_to(keep[:, None], jnp.shape(log_rho)))


CORRECTIONS: dict[str, CorrectionFn] = {
    "tis": token_tis,
    "mis": masked_is,
    "geo_mask": geometric_seq_mask,
}


def compose(names: Sequence[str], log_rho, mask, **params: float) -> jnp.ndarray:
    """Product of the named corrections' weights (1 everywhere for an empty list)."""
    w = jnp.ones(jnp.shape(log_rho), jnp.float32)
    for name in names:
        w = w * CORRECTIONS[name](log_rho, mask, **params)
    return w
