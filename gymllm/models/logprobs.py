"""``token_logprobs``: the one definition of a sampled token's log-probability.

The sampler records it and the trainer recomputes it with this same function, so behaviour and
policy log-probabilities agree bit for bit on the same logits.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def token_logprobs(
    logits: jax.Array, targets: jax.Array, temperature: float | jax.Array = 1.0
) -> jax.Array:
    """log softmax(logits / temperature) gathered at ``targets``.

    logits [B, T, V] (any float dtype), targets [B, T] int -> [B, T] float32.
    ``temperature`` must be > 0 (greedy sampling records temperature 1.0 log-probabilities).
    """
    scaled = logits.astype(jnp.float32) / jnp.asarray(temperature, jnp.float32)
    logz = jax.nn.logsumexp(scaled, axis=-1)  # [B, T]
    picked = jnp.take_along_axis(scaled, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return picked - logz
