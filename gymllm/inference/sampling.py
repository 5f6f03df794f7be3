"""Pure, jittable sampling functions over a batch of rows with per-row settings.

Every function takes logits ``[B, V]`` and per-row arrays ``[B]`` so one compiled step serves a
batch of requests with different temperatures, filters and keys. Log-probabilities are those of
the temperature-processed distribution, ``log_softmax(logits / T)`` (T = 1 for greedy rows), which
is what ``gymllm.models.token_logprobs`` computes for the trainer; top-k / top-p only restrict
which tokens can be drawn.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def effective_temperature(temperature: jax.Array) -> jax.Array:
    """[B] -> [B]: T where T > 0, else 1 (greedy rows report logprobs at T = 1)."""
    return jnp.where(temperature > 0, temperature, 1.0).astype(jnp.float32)


def scaled_logits(logits: jax.Array, temperature: jax.Array) -> jax.Array:
    """[B, V], [B] -> [B, V] float32: logits / T."""
    return logits.astype(jnp.float32) / effective_temperature(temperature)[:, None]


def filter_top_k_top_p(x: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """[B, V] scaled logits -> [B, V] with tokens outside top-k / the top-p nucleus set to -inf.

    ``top_k[b] == 0`` and ``top_p[b] == 1`` disable the filters for row b. The nucleus is the
    smallest set of most likely tokens (after top-k) whose probability reaches ``top_p``.
    """
    vocab = x.shape[-1]
    s = jnp.flip(jnp.sort(x, axis=-1), axis=-1)  # [B, V] descending
    rank = jnp.arange(vocab)[None, :]  # [1, V]
    k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)[:, None]  # [B, 1]
    s_k = jnp.where(rank < k, s, -jnp.inf)  # [B, V]
    probs = jax.nn.softmax(s_k, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # mass of strictly more likely tokens
    keep = (before < top_p[:, None]) & (rank < k)  # rank 0 is always kept
    threshold = jnp.min(jnp.where(keep, s_k, jnp.inf), axis=-1, keepdims=True)  # [B, 1]
    return jnp.where(x >= threshold, x, -jnp.inf)


def maybe_filter(x: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """Skip the sort entirely when no row filters (the common RL case)."""
    needed = jnp.any((top_k > 0) | (top_p < 1.0))
    return jax.lax.cond(needed, lambda v: filter_top_k_top_p(v, top_k, top_p), lambda v: v, x)


def step_keys(base_keys: jax.Array, steps: jax.Array) -> jax.Array:
    """[B, 2] uint32 raw keys, [B] int32 token index -> [B, 2]: one independent key per token."""
    return jax.vmap(jax.random.fold_in)(base_keys, steps)


def sample(
    logits: jax.Array,  # [B, V]
    keys: jax.Array,  # [B, 2] uint32, already specific to this token
    temperature: jax.Array,  # [B] float32
    top_k: jax.Array,  # [B] int32
    top_p: jax.Array,  # [B] float32
) -> tuple[jax.Array, jax.Array]:
    """Draw one token per row; returns (tokens [B] int32, logprobs [B] float32)."""
    x = scaled_logits(logits, temperature)  # [B, V]
    logp = jax.nn.log_softmax(x, axis=-1)  # [B, V]
    filtered = maybe_filter(x, top_k, top_p)
    drawn = jax.vmap(jax.random.categorical)(keys, filtered)  # [B]
    greedy = jnp.argmax(x, axis=-1)  # [B]
    tokens = jnp.where(temperature > 0, drawn, greedy).astype(jnp.int32)
    chosen = jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]
    return tokens, chosen.astype(jnp.float32)


def request_key(seed: int, sample_index: int) -> np.ndarray:
    """A raw [2] uint32 key for sample ``sample_index`` of a request seeded with ``seed`` (host side)."""
    return np.random.SeedSequence([seed & (2**63 - 1), sample_index]).generate_state(2, dtype=np.uint32)
