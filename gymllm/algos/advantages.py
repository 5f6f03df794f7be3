"""Advantage estimators: one scalar per trajectory from the outcome rewards of its group.

Every estimator is a pure function ``rewards [N, G] -> advantages [N, G]`` (N groups of G members)
that works on NumPy or JAX arrays. A group whose rewards are all equal gets advantage exactly 0 for
every member, whatever the estimator (no division of round-off by round-off).

| name       | A_i                                                     |
|------------|---------------------------------------------------------|
| grpo       | (R_i - mean R) / (std_ddof R + eps)   (or sqrt(var + eps)) |
| dr_grpo    | R_i - mean R                                            |
| rloo       | R_i - mean_{j != i} R_j = G / (G - 1) (R_i - mean R)     |
| batch_std  | (R_i - group mean) / (std_ddof of all centred rewards of the step + eps) |


:func:`role_ema_advantages` (multi-agent self-play, SPIRAL's RAE) is not a group estimator: it keeps
an EMA baseline per role across steps (see :mod:`gymllm.multiagent.baseline`). The learner runs it as
the estimator ``role_ema`` (:data:`STATEFUL`): ``A_i = R_i - b[role]`` for every member of a group,
with the group's role (``group.info["role"]``, else its seat ``"agent"``) and ``b`` the EMA the learner
keeps (and checkpoints), then updated with the group's mean reward, as SPIRAL updates it per batch.
"""

from __future__ import annotations

from typing import Callable

import jax.numpy as jnp


AdvantageFn = Callable[..., jnp.ndarray]


def _centred(rewards: jnp.ndarray) -> jnp.ndarray:  # [N, G]
    r = jnp.asarray(rewards, jnp.float32)
    return r - jnp.mean(r, axis=-1, keepdims=True)


def _constant_groups(rewards: jnp.ndarray) -> jnp.ndarray:  # [N, 1] bool
    r = jnp.asarray(rewards, jnp.float32)
    return jnp.max(r, axis=-1, keepdims=True) == jnp.min(r, axis=-1, keepdims=True)


def _scale(centred: jnp.ndarray, axis, *, ddof: int, eps: float, eps_placement: str) -> jnp.ndarray:
    """std (with ``ddof``) of ``centred`` over ``axis``, with eps added to the std or to the variance."""
    n = centred.size if axis is None else centred.shape[-1]
    var = jnp.sum(centred * centred, axis=axis, keepdims=axis is not None) / max(n - ddof, 1)
    return jnp.sqrt(var + eps) if eps_placement == "var" else jnp.sqrt(var) + eps


def grpo(rewards, *, ddof: int = 0, eps: float = 1e-6, eps_placement: str = "std") -> jnp.ndarray:
    """Group z-score: ``(R - mean) / (std + eps)`` per group."""
    c = _centred(rewards)
    a = c / _scale(c, -1, ddof=ddof, eps=eps, eps_placement=eps_placement)
    return jnp.where(_constant_groups(rewards), 0.0, a)


def dr_grpo(rewards, **_: object) -> jnp.ndarray:
    """Dr. GRPO: the centred reward, no std division."""
    return jnp.where(_constant_groups(rewards), 0.0, _centred(rewards))


def rloo(rewards, **_: object) -> jnp.ndarray:
    """Leave-one-out baseline: ``R_i - mean_{j != i} R_j``; needs G >= 2."""
    g = jnp.shape(rewards)[-1]
    return jnp.where(_constant_groups(rewards), 0.0, _centred(rewards) * (g / max(g - 1, 1)))


def batch_std(
    rewards, *, ddof: int = 0, eps: float = 1e-6, eps_placement: str = "std"
) -> jnp.ndarray:
    """Centre per group, scale by the std of all centred rewards of the step (all N groups)."""
    c = jnp.where(_constant_groups(rewards), 0.0, _centred(rewards))
    return c / _scale(c, None, ddof=ddof, eps=eps, eps_placement=eps_placement)


ESTIMATORS: dict[str, AdvantageFn] = {
    "grpo": grpo,
    "dr_grpo": dr_grpo,
    "rloo": rloo,
    "batch_std": batch_std,
}
# Estimators whose value for one group depends on the other groups of the optimizer step.
STEP_GLOBAL = frozenset({"batch_std"})
# Estimators with state across groups, run by the learner itself (not a jitted rewards -> advantages fn).
STATEFUL = frozenset({"role_ema"})
