"""The mixed decode + prompt-chunk forward (``gymllm.models.mixed``) against the oracles: the generic
cached forward for each part on its own (decode rows: ``T == 1``; chunks: ``T`` tokens over a reused
prefix) and the written cache.

Caches start as noise, so a part that reads a slot it must not (a chunk reading its own row past its
start, a decode row reading past its position, rows of the other part) changes the logits and fails."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from gymllm.models import FAMILIES, KVCache, make_tiny
from gymllm.models.mixed import mixed_forward, mixed_step, write_mixed_kv
from gymllm.models.transformer import forward
from gymllm.models.blocks import pack_bf16

# float32 comparisons between code paths: full-precision matmuls on an accelerator too (tests/accel.py)
pytestmark = pytest.mark.highest_precision

S = 24  # cache slots
B = 5  # cache rows: decode over rows [0, 2), chunks into rows 2..4
W = 2
T = 6  # chunk bucket


def tiny_model(family: str, seed: int = 0, **kw):
    extra = dict(num_layers=4, sliding_window=5) if family == "gemma3" else dict(num_layers=3)
    return make_tiny(family, seed=seed, **extra, **kw)


@pytest.fixture(scope="module", params=list(FAMILIES) + ["softcaps"])
def lm(request):
    if request.param == "softcaps":
        return tiny_model("gemma3", seed=5, attn_logit_softcap=2.0, final_logit_softcap=3.0)
    return tiny_model(request.param, seed=1)


def _cache(lm, seed: int, dtype=jnp.float32) -> KVCache:
    rng = np.random.default_rng(seed)
    noise = [
        jnp.asarray(rng.normal(size=c.shape) * 3, jnp.float32) for c in lm.model.init_cache(B, S)
    ]
    if dtype == jnp.uint16:
        return KVCache(
            *(jax.lax.bitcast_convert_type(n.astype(jnp.bfloat16), jnp.uint16) for n in noise)
        )
    return KVCache(*(n.astype(dtype) for n in noise))


def _fill(lm, cache: KVCache, toks: jnp.ndarray, lengths) -> KVCache:
    """Write each row's first lengths[b] tokens of toks [B, S] with the generic cached forward."""
    pos = jnp.broadcast_to(jnp.arange(S, dtype=jnp.int32), (B, S))
    pos = jnp.where(pos < jnp.asarray(lengths)[:, None], pos, S)
    return forward(lm.config, lm.model.flat_params(), toks, pos, None, cache)[1]


def _case(lm, seed: int, dec_len, starts, chunk_lens, dtype=jnp.float32):
    """Decode rows 0..W-1 at positions dec_len; chunk p (row 2 + p) of chunk_lens[p] real tokens after a
    cached prefix of starts[p]; the last chunk is padding (row B: dropped)."""
    v = lm.config.vocab_size
    rng = np.random.default_rng(seed)
    toks = jnp.asarray(rng.integers(0, v, (B, S)), jnp.int32)
    lengths = list(dec_len) + list(starts) + [0] * (B - W - len(starts))
    cache = _fill(lm, _cache(lm, seed, dtype), toks, lengths)
    p = len(starts) + 1
    pre_tok = np.zeros((p, T), np.int32)
    pre_pos = np.zeros((p, T), np.int32)
    rows = np.full(p, B, np.int32)
    last = np.zeros(p, np.int32)
    for i, (s, n) in enumerate(zip(starts, chunk_lens)):
        pre_tok[i, :n] = np.asarray(toks[W + i, s : s + n])
        pre_pos[i] = np.minimum(s + np.arange(T), S - 1)
        rows[i], last[i] = W + i, n - 1
    dec_tok = toks[jnp.arange(W), jnp.asarray(dec_len)]
    return (
        toks,
        cache,
        (
            dec_tok,
            jnp.asarray(dec_len, jnp.int32),
            jnp.asarray(pre_tok),
            jnp.asarray(pre_pos),
            jnp.asarray(rows),
            jnp.asarray(last),
        ),
    )


_mixed = jax.jit(mixed_forward, static_argnums=(0, 9), static_argnames=("compute_dtype",))


def _oracle(lm, cache, args):
    """Each part alone through the generic cached forward: (decode logits [W, V], chunk logits [P, V],
    the cache after both)."""
    cfg, params = lm.config, lm.model.flat_params()
    dec_tok, dec_pos, pre_tok, pre_pos, rows, last = args
    part = KVCache(*(c[:, :W] for c in cache))
    dlog, part = forward(cfg, params, dec_tok[:, None], dec_pos[:, None], None, part)
    cache = KVCache(*(c.at[:, :W].set(n) for c, n in zip(cache, part)))
    real = rows < B
    sub = KVCache(*(c[:, rows[real]] for c in cache))
    plog, sub = forward(cfg, params, pre_tok[real], pre_pos[real], None, sub, logits_at=last[real])
    cache = KVCache(*(c.at[:, rows[real]].set(n) for c, n in zip(cache, sub)))
    return dlog[:, 0], plog[:, 0], cache


def _real_slots(cache: KVCache, dec_len, starts, chunk_lens):
    """The cache slots holding real tokens after the step, per row: [(row, upto)]."""
    return [(w, dec_len[w] + 1) for w in range(W)] + [
        (W + i, s + n) for i, (s, n) in enumerate(zip(starts, chunk_lens))
    ]


def test_mixed_equals_each_part_alone(lm):
    """Decode rows past a Gemma 3 window, chunks over no prefix, a short prefix and a long one, and a
    short chunk in the bucket: logits of both parts and the written k/v equal the generic cached forward's."""
    dec_len, starts, chunk_lens = [4, 13], [0, 3, 11], [6, 2, 5]
    toks, cache, args = _case(lm, 0, dec_len, starts, chunk_lens)
    dlog, plog, want = _oracle(lm, cache, args)
    cfg, params = lm.config, lm.model.flat_params()
    for length in (S, 16):  # the whole cache, and a shorter read covering every position and start
        logits, dkv, pkv = _mixed(cfg, params, *args, cache, length)
        assert logits.shape == (W + 4, cfg.vocab_size) and logits.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(logits[:W]), np.asarray(dlog), atol=3e-5, rtol=1e-5)
        np.testing.assert_allclose(
            np.asarray(logits[W : W + 3]), np.asarray(plog), atol=3e-5, rtol=1e-5
        )
        got = write_mixed_kv(cache, dkv, args[1], pkv, args[3], args[4], args[5])
        for row, upto in _real_slots(got, dec_len, starts, chunk_lens):
            for g, w in zip(got, want):
                np.testing.assert_allclose(
                    np.asarray(g[:, row, :upto]), np.asarray(w[:, row, :upto]), atol=3e-5, rtol=1e-5
                )


def test_mixed_then_decode_equals_the_full_forward():
    """A chunk prefilled in a mixed step, then decoded greedily: each later logit equals the full
    forward (no cache) over the row's whole sequence."""
    lm = tiny_model("llama", seed=3)
    cfg, params = lm.config, lm.model.flat_params()
    toks, cache, args = _case(lm, 1, [5, 7], [0, 4], [6, 3])
    logits, cache = mixed_step(cfg, params, *args, cache, S)
    seq = list(np.asarray(toks[W + 1, : 4 + 3]))  # row 3: prefix 4 + chunk 3
    nxt = int(jnp.argmax(logits[W + 1]))
    for _ in range(3):
        full, _ = forward(cfg, params, jnp.asarray([seq + [nxt]]), jnp.arange(len(seq) + 1)[None])
        pos = len(seq)
        dec_tok = jnp.asarray([0, 0, 0, nxt], jnp.int32)
        dec_pos = jnp.asarray([S - 1, S - 1, S - 1, pos], jnp.int32)  # rows 0-2 idle (scratch slot)
        empty = jnp.zeros((1, 2), jnp.int32)
        lg, cache = mixed_step(
            cfg,
            params,
            dec_tok,
            dec_pos,
            empty,
            empty,
            jnp.asarray([B]),
            jnp.zeros(1, jnp.int32),
            cache,
            S,
        )
        np.testing.assert_allclose(np.asarray(lg[3]), np.asarray(full[0, -1]), atol=3e-5, rtol=1e-5)
        seq.append(nxt)
        nxt = int(jnp.argmax(lg[3]))


def test_mixed_bf16_compute_packed_weights_and_cache():
    """bf16 compute over uint16-packed weights and cache: close to the float32 oracle (bf16 rounding)."""
    lm = tiny_model("qwen2", seed=2)
    cfg = lm.config
    toks, cache32, args = _case(lm, 2, [3, 9], [0, 5], [6, 4])
    dlog, plog, _ = _oracle(lm, cache32, args)
    _, cache16, _ = _case(lm, 2, [3, 9], [0, 5], [6, 4], dtype=jnp.uint16)
    logits, _, _ = _mixed(
        cfg, pack_bf16(lm.model.flat_params()), *args, cache16, S, compute_dtype=jnp.bfloat16
    )
    scale = float(jnp.std(dlog))
    assert float(jnp.max(jnp.abs(logits[:W] - dlog))) < 0.1 * scale
    assert float(jnp.max(jnp.abs(logits[W : W + 2] - plog))) < 0.1 * scale


@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_mixed_property_random_starts_and_lengths(data):
    """Random decode positions, chunk starts and chunk lengths: both parts equal the oracle."""
    lm = tiny_model("gemma3", seed=4)
    dec_len = [data.draw(st.integers(1, S - 2)) for _ in range(W)]
    starts = [data.draw(st.integers(0, S - T - 1)) for _ in range(3)]
    chunk_lens = [data.draw(st.integers(1, T)) for _ in range(3)]
    toks, cache, args = _case(lm, 5, dec_len, starts, chunk_lens)
    dlog, plog, _ = _oracle(lm, cache, args)
    logits, _, _ = _mixed(lm.config, lm.model.flat_params(), *args, cache, S)
    np.testing.assert_allclose(np.asarray(logits[:W]), np.asarray(dlog), atol=3e-5, rtol=1e-5)
    np.testing.assert_allclose(
        np.asarray(logits[W : W + 3]), np.asarray(plog), atol=3e-5, rtol=1e-5
    )
