"""The fast chunked prefill path (``gymllm.models.prefill``) against the oracles: the generic cached
forward (``forward(..., cache=rows, logits_at=...)`` over the gathered rows) and the full forward
without a cache.

The caches are filled with noise first, so a chunk that reads a slot it must not (stale slots at or
past its start, slots outside a sliding window, other rows) changes the logits, and a write it must
not make (padding rows, a row's padded tail, other rows) changes the cache: both fail."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gymllm.models import FAMILIES, KVCache, make_tiny
from gymllm.models.prefill import prefill_forward, prefill_step, write_chunk_kv
from gymllm.models.transformer import forward
from gymllm.models.blocks import pack_bf16

from accel import tolerance

# float32 comparisons between code paths: full-precision matmuls on an accelerator too (tests/accel.py)
pytestmark = pytest.mark.highest_precision

S = 24  # cache slots
B = 3  # cache rows
T = 8  # chunk bucket
P = 3  # prefill rows (the last one a padding row in most tests)


def tiny_model(family: str, seed: int = 0, **kw):
    """The tiny shapes of tests/test_models_decode.py (Gemma 3: sliding window 5 on alternate layers)."""
    extra = dict(num_layers=4, sliding_window=5) if family == "gemma3" else dict(num_layers=3)
    return make_tiny(family, seed=seed, **extra, **kw)


@pytest.fixture(scope="module", params=list(FAMILIES) + ["softcaps"])
def lm(request):
    if request.param == "softcaps":  # every optional feature at once: softcaps on a Gemma 3 config
        return tiny_model("gemma3", seed=5, attn_logit_softcap=2.0, final_logit_softcap=3.0)
    return tiny_model(request.param, seed=1)


def _noisy_cache(lm, seed: int, dtype=jnp.float32) -> KVCache:
    rng = np.random.default_rng(seed)
    noise = [
        jnp.asarray(rng.normal(size=c.shape) * 3, jnp.float32) for c in lm.model.init_cache(B, S)
    ]
    if dtype == jnp.uint16:  # bf16 bit patterns
        return KVCache(
            *(jax.lax.bitcast_convert_type(n.astype(jnp.bfloat16), jnp.uint16) for n in noise)
        )
    return KVCache(*(n.astype(dtype) for n in noise))


def _chunk(lm, seed: int, rows, starts, lens, bucket: int = T):
    """Host inputs of one prefill call: tokens/positions [P, bucket] (pads continue the positions,
    clipped to the last slot, as the engine does), rows [P], logits_at [P]."""
    toks = np.random.default_rng(seed).integers(0, lm.config.vocab_size, (len(rows), bucket))
    pos = np.minimum(np.asarray(starts)[:, None] + np.arange(bucket), S - 1)
    last = np.asarray(lens) - 1
    return tuple(jnp.asarray(a, jnp.int32) for a in (toks, pos, rows, last))


def _oracle(cfg, params, cache, toks, pos, rows, last):
    """The generic cached forward over the gathered rows: (logits [P, V], rows' caches [L, P, S, K, D] x2)."""
    part = KVCache(*(c[:, jnp.minimum(rows, B - 1)] for c in cache))
    logits, part = forward(cfg, params, toks, pos, None, part, last)
    return logits[:, 0], part


_prefill = jax.jit(prefill_forward, static_argnums=(0, 6), static_argnames=("compute_dtype",))


def _check_cache(got, want_part, before, rows, starts, lens, close):
    """Real slots [0, start + len) of each written row equal the oracle's; every other slot of every
    row is the input cache's (padding rows, padded tails and other rows write nothing)."""
    expect = [np.asarray(c).copy() for c in before]
    for j, r in enumerate(np.asarray(rows)):
        if r < B:
            n = starts[j] + lens[j]
            for e, w in zip(expect, want_part):
                e[:, r, :n] = np.asarray(w[:, j, :n])
    for g, e in zip(got, expect):
        close(np.asarray(g), e)


def _close32(a, b):
    np.testing.assert_allclose(a, b, **tolerance("logits"))


def test_prefill_equals_the_cached_forward_logits_and_cache(lm):
    """Rows in permuted cache rows with reused prefixes (0, 4, 11: past the Gemma 3 window of 5), short
    chunks in the bucket and a padding row: logits and the written cache equal the generic cached
    forward's, for the whole cache and for a shorter length covering every start."""
    cfg, params = lm.config, lm.model.flat_params()
    rows, starts, lens = np.array([2, 0, 1, B]), np.array([11, 4, 0, 0]), np.array([5, 8, 3, 1])
    cache = _noisy_cache(lm, 0)
    toks, pos, r, last = _chunk(lm, 0, rows, starts, lens)
    want, want_part = _oracle(cfg, params, cache, toks, pos, r, last)
    for length in (S, 12):
        logits, k_new, v_new = _prefill(cfg, params, toks, pos, r, cache, length, last)
        assert logits.shape == (4, cfg.vocab_size) and logits.dtype == jnp.float32
        assert k_new.shape == (cfg.num_layers, 4, T, cfg.num_kv_heads, cfg.resolved_head_dim)
        np.testing.assert_allclose(
            np.asarray(logits[:3]), np.asarray(want[:3]), **tolerance("logits")
        )
        got = write_chunk_kv(cache, k_new, v_new, r, pos, last + 1)
        _check_cache(got, want_part, cache, rows, starts, lens, _close32)


def test_two_chunks_then_the_full_forward(lm):
    """A prompt prefilled in two chunks (the second reusing the first's slots, read with length 0 then
    8) beside another row, by the jitted step: the last token's logits equal the full forward's (no
    cache), and the padded tails and the other row are not written."""
    cfg, params = lm.config, lm.model.flat_params()
    cache = _noisy_cache(lm, 1)
    ids = np.random.default_rng(1).integers(0, cfg.vocab_size, (2, 14))
    full, _ = forward(
        cfg,
        params,
        jnp.asarray(ids, jnp.int32),
        jnp.broadcast_to(jnp.arange(14, dtype=jnp.int32), (2, 14)),
    )
    rows = jnp.asarray([1, 2], jnp.int32)
    noise = [np.asarray(c) for c in cache]
    for start, stop, length in ((0, 7, 0), (7, 14, 8)):
        toks = np.zeros((2, T), np.int32)
        toks[:, : stop - start] = ids[:, start:stop]
        pos = jnp.asarray(np.minimum(start + np.arange(T), S - 1)[None].repeat(2, 0), jnp.int32)
        last = jnp.full(2, stop - start - 1, jnp.int32)
        logits, cache = prefill_step(cfg, params, jnp.asarray(toks), pos, rows, cache, length, last)
        np.testing.assert_allclose(
            np.asarray(logits), np.asarray(full[:, stop - 1]), **tolerance("logits")
        )
    for got, before in zip(
        cache, noise
    ):  # the padded tails (slot 14 on) and row 0 keep their noise
        np.testing.assert_array_equal(np.asarray(got)[:, 1:, 14:], before[:, 1:, 14:])
        np.testing.assert_array_equal(np.asarray(got)[:, 0], before[:, 0])


def test_no_prefix_reads_nothing():
    """Every start 0: length 0 (no cache read) gives the same logits and k/v as reading the whole cache."""
    lm = tiny_model("gemma3", seed=4)
    cfg, params = lm.config, lm.model.flat_params()
    cache = _noisy_cache(lm, 4)
    toks, pos, r, last = _chunk(lm, 4, np.array([0, 2, B]), [0, 0, 0], [8, 6, 1])
    a = _prefill(cfg, params, toks, pos, r, cache, 0, last)
    b = _prefill(cfg, params, toks, pos, r, cache, S, last)
    for x, y in zip(a, b):
        np.testing.assert_allclose(
            np.asarray(x), np.asarray(y), atol=1e-5, rtol=1e-5
        )  # f32: summation order differs by path


def test_packed_bf16_weights_and_cache_match_the_cached_forward():
    """uint16 (bf16 bit pattern) weights and cache, bf16 compute: the chunk agrees with the generic cached
    forward over the same packed cache (bf16 rounding) and writes packed k/v at the real slots only."""
    lm = tiny_model("gemma3", seed=2)
    cfg = lm.config
    packed = pack_bf16(lm.model.flat_params())
    rows, starts, lens = np.array([1, 2, B]), np.array([9, 0, 0]), np.array([6, 8, 1])
    cache = _noisy_cache(lm, 2, jnp.uint16)
    toks, pos, r, last = _chunk(lm, 2, rows, starts, lens)
    want, want_part = _oracle(cfg, packed, cache, toks, pos, r, last)
    logits, k_new, v_new = _prefill(cfg, packed, toks, pos, r, cache, 12, last)
    assert k_new.dtype == jnp.uint16
    scale = float(jnp.abs(want).max())
    assert float(jnp.abs(logits[:2] - want[:2]).max()) < 0.02 * scale
    unpack = lambda c: np.asarray(jax.lax.bitcast_convert_type(c, jnp.bfloat16).astype(jnp.float32))  # noqa: E731
    got = write_chunk_kv(cache, k_new, v_new, r, pos, last + 1)
    close = lambda a, b: np.testing.assert_allclose(unpack(a), unpack(b), atol=0.05, rtol=0.02)  # noqa: E731
    _check_cache(got, want_part, cache, rows, starts, lens, close)


def test_compute_dtype_matches_precast_weights():
    """compute_dtype="bfloat16" over float32 masters == the same chunk over bf16-cast weights."""
    lm = tiny_model("qwen3", seed=3)
    cfg, params = lm.config, lm.model.flat_params()
    cache = _noisy_cache(lm, 3)
    toks, pos, r, last = _chunk(lm, 3, np.array([0, 1, B]), [5, 0, 0], [4, 8, 1])
    a, ka, _ = _prefill(cfg, params, toks, pos, r, cache, 12, last, compute_dtype="bfloat16")
    cast = {n: v.astype(jnp.bfloat16) for n, v in params.items()}
    b, kb, _ = _prefill(cfg, cast, toks, pos, r, cache, 12, last)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(np.asarray(ka), np.asarray(kb))


@pytest.fixture(scope="module")
def gemma():
    return tiny_model("gemma3", seed=6)


@settings(max_examples=15, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, S - 2), st.integers(1, T)), min_size=2, max_size=2),
    st.booleans(),
)
def test_any_starts_and_chunk_lengths_match_the_cached_forward(gemma, rows_spec, long_read):
    """Random starts (any, past the sliding window too) and chunk lengths (clipped to the context):
    the same logits and cache as the generic cached forward, reading the smallest covering length or
    the whole cache."""
    cfg, params = gemma.config, gemma.model.flat_params()
    starts = np.array([s for s, _ in rows_spec] + [0])
    lens = np.array(
        [min(n, S - 1 - s) for s, n in rows_spec] + [1]
    )  # real tokens stay below the last slot
    rows = np.array([2, 0, B])
    cache = _noisy_cache(gemma, 7)
    toks, pos, r, last = _chunk(gemma, int(starts.sum()), rows, starts, lens)
    want, want_part = _oracle(cfg, params, cache, toks, pos, r, last)
    length = S if long_read else (0 if starts.max() == 0 else (12 if starts.max() <= 12 else S))
    logits, k_new, v_new = _prefill(cfg, params, toks, pos, r, cache, length, last)
    np.testing.assert_allclose(np.asarray(logits[:2]), np.asarray(want[:2]), **tolerance("logits"))
    got = write_chunk_kv(cache, k_new, v_new, r, pos, last + 1)
    _check_cache(got, want_part, cache, rows, starts, lens, _close32)
