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


def sortable_keys(x: jax.Array) -> jax.Array:
    """float32 [..., V] -> int32 [..., V] that order like the floats (-0.0 taken as +0.0): the bit pattern,
    with the magnitude bits of negatives flipped."""
    i = jax.lax.bitcast_convert_type(jnp.where(x == 0, 0.0, x).astype(jnp.float32), jnp.int32)
    return jnp.where(i < 0, i ^ jnp.int32(0x7FFFFFFF), i)


def _midpoint(lo: jax.Array, hi: jax.Array) -> jax.Array:
    """floor((lo + hi) / 2) of int32 arrays without overflow."""
    return (lo & hi) + ((lo ^ hi) >> 1)


def _bisect(lo: jax.Array, hi: jax.Array, pred) -> tuple[jax.Array, jax.Array]:
    """Rows' (lo, hi) int32 [B] with ``pred(lo)`` true and ``pred(hi)`` false (``pred``: [B] keys -> [B]
    bool, monotone: true up to a point) -> the adjacent (lo, hi) at that point. 32 halvings cover the
    whole int32 range, whatever the row."""

    def body(_, lh):
        lo, hi = lh
        mid = _midpoint(lo, hi)
        ok = pred(mid)
        return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)

    return jax.lax.fori_loop(0, 32, body, (lo, hi))


def filter_top_k_top_p(x: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """[B, V] scaled logits -> [B, V] with tokens outside top-k / the top-p nucleus set to -inf.

    ``top_k[b] == 0`` and ``top_p[b] == 1`` disable the filters for row b. The nucleus is the
    smallest set of most likely tokens (after top-k) whose probability reaches ``top_p``; tokens tied
    with its least likely member are kept too.

    No sort: each threshold is found by bisection over the logits' values (as order-preserving int32
    keys), 32 halvings of [B, V] counts or masses. The k-th largest value is the largest key ``t`` with
    ``count(keys >= t) >= k``; the nucleus threshold is the smallest key ``t`` whose strictly larger
    tokens hold less than ``top_p`` of the (top-k renormalised) mass. The same sets as a descending sort
    with a cumulative sum (tests/test_inference_sampling.py checks it against that reference), but a
    sort over a 49k vocabulary took 8.6 s of every engine program's compile on a TPU v5e
    (benchmarks/compile_anatomy.py), and this compiles in a fraction of it.
    """
    vocab = x.shape[-1]
    keys = sortable_keys(x)  # [B, V]
    k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)  # [B]
    top = jnp.minimum(jnp.max(keys, axis=-1), jnp.int32(0x7F800000))  # [B] (+inf's key caps NaNs)
    kth, _ = _bisect(
        jnp.min(keys, axis=-1), top + 1, lambda t: jnp.sum(keys >= t[:, None], axis=-1) >= k
    )  # [B] key of the k-th largest
    # the top-k set holds exactly k tokens: of the tokens tied at the k-th value, as many as fit (their
    # mass shared out evenly: which of them a sort would take does not change a sum over values)
    above, tied = keys > kth[:, None], keys == kth[:, None]
    share = (k - jnp.sum(above, axis=-1)) / jnp.sum(tied, axis=-1)  # [B] in (0, 1]
    xf = x.astype(jnp.float32)
    e = jnp.exp(xf - jnp.max(xf, axis=-1, keepdims=True)) * jnp.where(
        above, 1.0, jnp.where(tied, share[:, None], 0.0)
    )
    probs = e / jnp.sum(e, axis=-1, keepdims=True)  # [B, V], 0 outside top-k

    def light(t: jax.Array) -> jax.Array:  # mass of the tokens strictly above t is under top_p
        return jnp.sum(jnp.where(keys > t[:, None], probs, 0.0), axis=-1) < top_p

    _, nucleus = _bisect(kth - 1, top, lambda t: ~light(t))  # smallest key t with light(t)
    threshold = jnp.where(
        top_p >= 1.0, kth, jnp.maximum(nucleus, kth)
    )  # top_p = 1: off, whatever the rounding
    return jnp.where(keys >= threshold[:, None], x, -jnp.inf)


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
    return np.random.SeedSequence([seed & (2**63 - 1), sample_index]).generate_state(
        2, dtype=np.uint32
    )
