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
    nucleus = (before < top_p[:, None]) | (top_p[:, None] >= 1.0)  # top_p = 1: off, whatever the rounding
    keep = nucleus & (rank < k)  # rank 0 is always kept
    threshold = jnp.min(jnp.where(keep, s_k, jnp.inf), axis=-1, keepdims=True)  # [B, 1]
    return jnp.where(x >= threshold, x, -jnp.inf)


def maybe_filter(x: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """Skip the sort entirely when no row filters (the common RL case)."""
    needed = jnp.any((top_k > 0) | (top_p < 1.0))
    return jax.lax.cond(needed, lambda v: filter_top_k_top_p(v, top_k, top_p), lambda v: v, x)


def step_keys(base_keys: jax.Array, steps: jax.Array) -> jax.Array:
    """[B, 2] uint32 raw keys, [B] int32 token index -> [B, 2]: one independent key per token."""
    return jax.vmap(jax.random.fold_in)(base_keys, steps)


_BLOCK = 256  # inverse-CDF sampling scans blocks of this many tokens


def fast_argmax(x: jax.Array) -> jax.Array:
    """[B, V] -> [B] int32: the first index of each row's maximum (two plain reductions, which XLA:CPU
    runs far faster than the variadic reduce behind ``jnp.argmax``)."""
    v = x.shape[-1]
    m = jnp.max(x, axis=-1, keepdims=True)
    return jnp.min(jnp.where(x == m, jnp.arange(v, dtype=jnp.int32), v), axis=-1).astype(jnp.int32)


def _last_positive(w: jax.Array) -> jax.Array:
    return jnp.max(jnp.where(w > 0, jnp.arange(w.shape[-1]), 0), axis=-1)


def _first_positive(w: jax.Array) -> jax.Array:
    n = w.shape[-1]
    return jnp.min(jnp.where(w > 0, jnp.arange(n), n - 1), axis=-1)


def _pick(w: jax.Array, target: jax.Array) -> jax.Array:
    """[B, n] weights, [B] target in [0, sum) -> [B]: the index whose cumulative weight first exceeds
    target; rounding can never select a zero-weight entry."""
    cdf = jnp.cumsum(w, axis=-1)
    i = jnp.sum(cdf <= target[:, None], axis=-1)
    return jnp.clip(i, _first_positive(w), _last_positive(w))


def inverse_cdf_sample(weights: jax.Array, u: jax.Array) -> jax.Array:
    """Draw index i with probability weights[b, i] / sum(weights[b]) using one uniform u [B] per row.

    weights [B, V] >= 0 (unnormalized, zero = never drawn). Two levels (blocks of ``_BLOCK``, then
    within the chosen block) keep every scan short: O(V) work and one random number per row, where
    Gumbel-max needs V random numbers per row.
    """
    b, v = weights.shape
    c = min(_BLOCK, v)
    nb = -(-v // c)
    w = jnp.pad(weights, ((0, 0), (0, nb * c - v))).reshape(b, nb, c)  # [B, nb, c]
    bsum = jnp.sum(w, axis=-1)  # [B, nb]
    target = u * jnp.sum(bsum, axis=-1)  # [B]
    bi = _pick(bsum, target)  # [B] block index
    before = jnp.take_along_axis(jnp.cumsum(bsum, axis=-1) - bsum, bi[:, None], axis=-1)[:, 0]
    inner = jnp.take_along_axis(w, bi[:, None, None], axis=1)[:, 0]  # [B, c]
    j = _pick(inner, jnp.maximum(target - before, 0.0))
    return (bi * c + j).astype(jnp.int32)


def sample(
    logits: jax.Array,  # [B, V]
    keys: jax.Array,  # [B, 2] uint32, already specific to this token
    temperature: jax.Array,  # [B] float32
    top_k: jax.Array,  # [B] int32
    top_p: jax.Array,  # [B] float32
) -> tuple[jax.Array, jax.Array]:
    """Draw one token per row; returns (tokens [B] int32, logprobs [B] float32).

    logprob = x[token] - logsumexp(x) with x = logits / T: the log-softmax the trainer computes.
    """
    x = scaled_logits(logits, temperature)  # [B, V]
    m = jnp.max(x, axis=-1, keepdims=True)
    e = jnp.exp(x - m)  # [B, V], shared by the normalizer and the sampler
    logz = jnp.log(jnp.sum(e, axis=-1)) + m[:, 0]  # [B]
    filtered = maybe_filter(x, top_k, top_p)
    weights = jnp.where(filtered == -jnp.inf, 0.0, e)
    u = jax.vmap(jax.random.uniform)(keys)  # [B] one uniform per row
    drawn = inverse_cdf_sample(weights, u)
    any_greedy = jnp.any(temperature <= 0)
    greedy = jax.lax.cond(any_greedy, fast_argmax, lambda v: jnp.zeros(v.shape[0], jnp.int32), x)
    tokens = jnp.where(temperature > 0, drawn, greedy).astype(jnp.int32)
    chosen = jnp.take_along_axis(x, tokens[:, None], axis=-1)[:, 0] - logz
    return tokens, chosen.astype(jnp.float32)


def request_key(seed: int, sample_index: int) -> np.ndarray:
    """A raw [2] uint32 key for sample ``sample_index`` of a request seeded with ``seed`` (host side)."""
    return np.random.SeedSequence([seed & (2**63 - 1), sample_index]).generate_state(2, dtype=np.uint32)
