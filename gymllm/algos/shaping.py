"""Reward shaping and group filtering before the advantage: overlong shaping, zero-variance filter."""

from __future__ import annotations

import jax.numpy as jnp


def overlong_penalty(lengths, *, max_len: int, buffer: int) -> jnp.ndarray:  # [N] -> [N]
    """DAPO soft overlong punishment of a response of ``|y|`` sampled tokens:
    0 if ``|y| <= max_len - buffer``; ``((max_len - buffer) - |y|) / buffer`` inside the buffer;
    -1 beyond ``max_len``."""
    y = jnp.asarray(lengths, jnp.float32)
    start = float(max_len - buffer)
    inside = (start - y) / float(max(buffer, 1))
    return jnp.where(y <= start, 0.0, jnp.where(y <= max_len, inside, -1.0))


def nonzero_variance(rewards) -> jnp.ndarray:  # [N, G] -> [N] bool
    """True for groups whose rewards are not all equal (DAPO dynamic sampling keeps only these)."""
    r = jnp.asarray(rewards, jnp.float32)
    return jnp.max(r, axis=-1) != jnp.min(r, axis=-1)
