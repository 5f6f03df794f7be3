"""KL estimators against a frozen reference policy, per token, on samples from pi_theta.

With ``log_x = log pi_ref - log pi_theta``:

* ``k1 = -log_x``: unbiased value of KL(pi||ref); as a loss its gradient has zero expectation.
* ``k2 = 0.5 log_x^2``: as a loss, its expected gradient is the gradient of reverse KL(pi||ref).
* ``k3 = exp(log_x) - 1 - log_x``: as a loss, its expected gradient is that of forward KL(ref||pi).

"In reward" placement subtracts ``beta * sum_t sg(k1)`` from each trajectory's outcome reward before
the advantage (the textbook reverse-KL policy gradient). ``beta == 0`` means no reference model is
ever built or run.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp


def k1(logp, ref_logp) -> jnp.ndarray:
    return logp - ref_logp


def k2(logp, ref_logp) -> jnp.ndarray:
    return 0.5 * jnp.square(ref_logp - logp)


def k3(logp, ref_logp) -> jnp.ndarray:
    log_x = ref_logp - logp
    return jnp.exp(log_x) - 1.0 - log_x


ESTIMATORS: dict[str, Callable[[jnp.ndarray, jnp.ndarray], jnp.ndarray]] = {
    "k1": k1,
    "k2": k2,
    "k3": k3,
}


def kl_reward_penalty(logp, ref_logp, mask, *, beta: float) -> jnp.ndarray:  # [B]
    """``beta * sum_t sg(k1)`` per sequence: the amount to subtract from the outcome reward."""
    m = mask.astype(jnp.float32)
    return beta * jnp.sum(jax.lax.stop_gradient(k1(logp, ref_logp)) * m, axis=-1)
