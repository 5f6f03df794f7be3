"""The fast one-token decode path (``gymllm.models.decode``) against the oracles: the full forward
without a cache, and the generic cached forward (``forward(..., cache=...)`` with T == 1).

The caches are filled with noise before the prompt is written, so a step that reads a slot it must not
(its own stale slot, slots past its position, slots outside a sliding window, rows past W) changes
the logits and fails."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gymllm.models import FAMILIES, KVCache, make_tiny
from gymllm.models.decode import decode_forward, decode_step, write_new_kv
from gymllm.models.transformer import forward
from gymllm.models.blocks import pack_bf16

from accel import tolerance

# float32 comparisons between code paths: full-precision matmuls on an accelerator too (tests/accel.py)
pytestmark = pytest.mark.highest_precision

S = 16  # cache slots
B = 3  # cache rows (decode runs over the first W)


def tiny_model(family: str, seed: int = 0, **kw):
    """The tiny shapes of tests/test_models.py (Gemma 3: sliding window 5 on alternate layers)."""
    extra = dict(num_layers=4, sliding_window=5) if family == "gemma3" else dict(num_layers=3)
    return make_tiny(family, seed=seed, **extra, **kw)


@pytest.fixture(scope="module", params=list(FAMILIES) + ["softcaps", "wide_heads"])
def lm(request):
    if request.param == "softcaps":  # every optional feature at once: softcaps on a Gemma 3 config
        return tiny_model("gemma3", seed=5, attn_logit_softcap=2.0, final_logit_softcap=3.0)
    if (
        request.param == "wide_heads"
    ):  # head_dim >= 32: float32 decode attention takes the batched-dot path
        return tiny_model("llama", seed=6, head_dim=32)
    return tiny_model(request.param, seed=1)


def _noisy_cache(lm, seed: int, dtype=jnp.float32) -> KVCache:
    rng = np.random.default_rng(seed)
    cache = lm.model.init_cache(B, S, dtype)
    noise = [jnp.asarray(rng.normal(size=c.shape) * 3, jnp.float32) for c in cache]
    if dtype == jnp.uint16:  # bf16 bit patterns
        return KVCache(
            *(jax.lax.bitcast_convert_type(n.astype(jnp.bfloat16), jnp.uint16) for n in noise)
        )
    return KVCache(*(n.astype(dtype) for n in noise))


def _prefilled(lm, seed: int, lengths, dtype=jnp.float32):
    """(tokens [B, S], cache with each row's first lengths[b] tokens written over the noise)."""
    cfg, params = lm.config, lm.model.flat_params()
    toks = jnp.asarray(np.random.default_rng(seed).integers(0, cfg.vocab_size, (B, S)), jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(S, dtype=jnp.int32), (B, S))
    # positions at or past a row's length are pushed out of the cache (dropped), so their noise stays
    pos = jnp.where(pos < jnp.asarray(lengths)[:, None], pos, S)
    _, cache = forward(cfg, params, toks, pos, None, _noisy_cache(lm, seed, dtype))
    return toks, cache


_decode = jax.jit(decode_forward, static_argnums=(0, 5), static_argnames=("compute_dtype",))


def test_decode_equals_the_cached_forward_logits_and_written_kv(lm):
    """Rows at different positions (past the Gemma 3 window of 5 for some): logits and the k/v written
    at each row's slot equal the generic cached forward's; every other slot is untouched."""
    cfg, params = lm.config, lm.model.flat_params()
    lengths = np.array([3, 9, 12])
    toks, cache = _prefilled(lm, 0, lengths)
    tok, pos = toks[jnp.arange(B), lengths], jnp.asarray(lengths, jnp.int32)
    want, want_cache = forward(cfg, params, tok[:, None], pos[:, None], None, cache)
    for length in (S, 13):  # the whole cache, and a shorter window covering every position
        logits, k_new, v_new = _decode(cfg, params, tok, pos, cache, length)
        assert logits.shape == (B, cfg.vocab_size) and logits.dtype == jnp.float32
        assert k_new.shape == (cfg.num_layers, B, cfg.num_kv_heads, cfg.resolved_head_dim)
        np.testing.assert_allclose(
            np.asarray(logits), np.asarray(want[:, 0]), **tolerance("logits")
        )
        got = write_new_kv(cache, k_new, v_new, pos)
        for g, w in zip(got, want_cache):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), **tolerance("logits"))


def test_greedy_decoding_equals_the_full_forward(lm):
    """Decode 4 tokens one at a time over the first W = 2 rows (row 2 keeps its noise): each step's
    logits equal the full forward's (no cache) at that position."""
    cfg, params = lm.config, lm.model.flat_params()
    lengths = np.array([4, 7, 0])
    toks, cache = _prefilled(lm, 1, lengths)
    full, _ = forward(cfg, params, toks, jnp.broadcast_to(jnp.arange(S, dtype=jnp.int32), (B, S)))
    for step in range(4):
        pos = jnp.asarray(lengths[:2] + step, jnp.int32)
        logits, cache = decode_step(cfg, params, toks[jnp.arange(2), pos], pos, cache, 12)
        want = full[jnp.arange(2), pos]
        np.testing.assert_allclose(np.asarray(logits), np.asarray(want), **tolerance("logits"))


def test_packed_bf16_weights_and_cache_match_the_cached_forward():
    """uint16 (bf16 bit pattern) weights and cache, bf16 compute: the decode step agrees with the
    generic cached forward over the same packed cache (bf16 rounding), and writes packed k/v."""
    lm = tiny_model("gemma3", seed=2)
    cfg = lm.config
    packed = pack_bf16(lm.model.flat_params())
    lengths = np.array([2, 6, 11])
    toks, cache = _prefilled(lm, 2, lengths, jnp.uint16)
    tok, pos = toks[jnp.arange(B), lengths], jnp.asarray(lengths, jnp.int32)
    want, want_cache = forward(cfg, packed, tok[:, None], pos[:, None], None, cache)
    logits, k_new, v_new = _decode(cfg, packed, tok, pos, cache, S)
    assert k_new.dtype == jnp.uint16
    scale = float(jnp.abs(want).max())
    assert float(jnp.abs(logits - want[:, 0]).max()) < 0.02 * scale
    got = write_new_kv(cache, k_new, v_new, pos)
    unpack = lambda c: np.asarray(jax.lax.bitcast_convert_type(c, jnp.bfloat16).astype(jnp.float32))  # noqa: E731
    for g, w in zip(got, want_cache):
        np.testing.assert_allclose(unpack(g), unpack(w), atol=0.05, rtol=0.02)


def test_compute_dtype_matches_precast_weights():
    """compute_dtype="bfloat16" over float32 masters == the same step over bf16-cast weights."""
    lm = tiny_model("qwen3", seed=3)
    cfg, params = lm.config, lm.model.flat_params()
    lengths = np.array([5, 1, 8])
    toks, cache = _prefilled(lm, 3, lengths)
    tok, pos = toks[jnp.arange(B), lengths], jnp.asarray(lengths, jnp.int32)
    a, ka, _ = _decode(cfg, params, tok, pos, cache, S, compute_dtype="bfloat16")
    cast = {n: v.astype(jnp.bfloat16) for n, v in params.items()}
    b, kb, _ = _decode(cfg, cast, tok, pos, cache, S)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(np.asarray(ka), np.asarray(kb))


@pytest.mark.parametrize("w, d", [(8, 32), (3, 32), (8, 16)])
def test_decode_attention_paths_equal_a_numpy_reference(w, d):
    """Both float32 forms of decode_attention (batched dots at >= 8 rows and head_dim >= 32, else the
    elementwise one) equal one softmax over the visible cached slots plus the token itself."""
    from gymllm.models.layers import decode_attention

    rng = np.random.default_rng(w * d)
    s, k, g = 10, 2, 3
    q, keys, values = (
        rng.normal(size=(w, k * g, d)),
        rng.normal(size=(w, s, k, d)),
        rng.normal(size=(w, s, k, d)),
    )
    k_self, v_self = rng.normal(size=(w, k, d)), rng.normal(size=(w, k, d))
    visible = rng.random((w, s)) < 0.6
    got = decode_attention(
        *(jnp.asarray(a, jnp.float32) for a in (q, keys, values, k_self, v_self)),
        jnp.asarray(visible),
        scale=0.3,
    )
    want = np.zeros((w, k * g, d))
    for r in range(w):
        for h in range(k * g):
            kv = h // g
            ks = np.concatenate([keys[r, visible[r], kv], k_self[r, kv][None]])
            vs = np.concatenate([values[r, visible[r], kv], v_self[r, kv][None]])
            p = np.exp(0.3 * ks @ q[r, h] - np.max(0.3 * ks @ q[r, h]))
            want[r, h] = (p / p.sum()) @ vs
    np.testing.assert_allclose(np.asarray(got), want.reshape(w, -1), atol=1e-5, rtol=1e-5)
