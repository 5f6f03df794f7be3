"""The Pallas decode attention (``EngineConfig.decode_attention="kernel"``) against references.

:func:`gymllm.models.pallas_decode.cached_attention` is compared with a NumPy softmax over each row's
own slots (rows with none, a row ending inside a block, on a block's edge, past the cache; several row
and slot blocks; a softcap; a bf16 cache); :func:`gymllm.models.decode.decode_forward` with the kernel
against XLA's form, alone and with a decode chunk's recent k/v beside the cache and a uint16-packed
cache; then engines over one tiny model, one per form, get the same seeded requests: every token,
logprob and finish reason must agree. Off a TPU the kernel runs in Pallas's interpreter (the same
kernel body), so these run in CI; on the chip (``scripts/tpu_run.sh tests``) it is compiled."""

from __future__ import annotations

import asyncio

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gymllm.errors import ConfigError
from gymllm.inference import EngineConfig, JaxEngine, SamplingParams
from gymllm.models import make_tiny
from gymllm.models.cache import KVCache, RecentKV
from gymllm.models.decode import check_attention, decode_forward
from gymllm.models.pallas_decode import NEG_INF, cached_attention, row_block, slot_block

pytestmark = pytest.mark.highest_precision  # float32 on an accelerator: compared at full precision


def reference(q, k, v, layer, lens, scale, softcap=0.0):
    """Each row's softmax over its slots [0, lens[w]) in float64 NumPy: (out, lse)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    w, kh, g, d = q.shape
    out = np.zeros((w, kh, g, d))
    lse = np.full((w, kh, g), NEG_INF)
    for r in range(w):
        n = min(max(int(lens[r]), 0), k.shape[2])
        if n == 0:
            continue
        sc = np.einsum("kgd,skd->kgs", q[r], k[layer, r, :n]) * scale
        if softcap:
            sc = softcap * np.tanh(sc / softcap)
        top = sc.max(-1, keepdims=True)
        p = np.exp(sc - top)
        lse[r] = top[..., 0] + np.log(p.sum(-1))
        out[r] = np.einsum("kgs,skd->kgd", p / p.sum(-1, keepdims=True), v[layer, r, :n])
    return out, lse


@pytest.mark.parametrize("form", ["mxu", "vpu"])
@pytest.mark.parametrize(
    "dtype,blocks,softcap",
    [(jnp.float32, (4, 128), 0.0), (jnp.float32, (8, 256), 30.0), (jnp.bfloat16, (2, 128), 0.0)],
)
def test_the_kernel_attends_each_rows_own_slots(dtype, blocks, softcap, form):
    rng = np.random.default_rng(7)
    L, B, S, K, G, D, W = 2, 10, 256, 2, 3, 32, 8  # B > W: rows past W are never read
    k = jnp.asarray(rng.normal(size=(L, B, S, K, D)), dtype)
    v = jnp.asarray(rng.normal(size=(L, B, S, K, D)), dtype)
    q = jnp.asarray(rng.normal(size=(W, K, G, D)), dtype)
    lens = np.array([0, 1, 127, 128, 129, 256, 400, 37], np.int32)  # none, edges, past the cache
    for layer in (0, 1):
        out, lse = cached_attention(
            q,
            k,
            v,
            jnp.int32(layer),
            jnp.asarray(lens),
            scale=0.2,
            softcap=softcap,
            rows_block=blocks[0],
            slots_block=blocks[1],
            form=form,
        )
        want_out, want_lse = reference(q, k, v, layer, lens, 0.2, softcap)
        tol = 2e-2 if dtype == jnp.bfloat16 else 2e-5
        np.testing.assert_allclose(np.asarray(out), want_out, atol=tol, rtol=tol)
        np.testing.assert_allclose(np.asarray(lse), want_lse, atol=tol, rtol=tol)
    assert np.all(np.asarray(lse)[0] == NEG_INF) and np.all(np.asarray(out)[0] == 0.0)


def test_the_blocks_fit_the_cache():
    assert [slot_block(s) for s in (64, 160, 256, 384, 1024, 2048)] == [64, 160, 256, 128, 512, 512]
    assert [row_block(w) for w in (1, 2, 6, 8, 256)] == [1, 2, 2, 8, 8]
    q = jnp.zeros((6, 1, 1, 8))
    kv = jnp.zeros((1, 6, 256, 1, 8))
    with pytest.raises(ValueError, match="must divide by the blocks"):
        cached_attention(q, kv, kv, 0, jnp.zeros(6, jnp.int32), scale=1.0, rows_block=4)
    with pytest.raises(ValueError, match="expected one of .*'mxu', 'vpu'.*received 'gpu'"):
        cached_attention(q, kv, kv, 0, jnp.zeros(6, jnp.int32), scale=1.0, form="gpu")


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("with_recent", [False, True])
def test_decode_with_the_kernel_matches_xlas_form(packed, with_recent):
    lm = make_tiny("llama", seed=3, vocab_size=300)
    cfg, params = lm.model.config, lm.model.flat_params()
    W, S, steps = 4, 24, 3
    rng = np.random.default_rng(0)
    cache = lm.model.init_cache(W, S, jnp.float32)
    filled = rng.normal(size=cache.k.shape)
    if packed:  # bf16 bit patterns in uint16, as the engine keeps a bf16 cache on CPU
        cache = KVCache(
            *(jnp.asarray(x, jnp.bfloat16).view(jnp.uint16) for x in (filled, filled * 0.5))
        )
    else:
        cache = KVCache(jnp.asarray(filled, jnp.float32), jnp.asarray(filled * 0.5, jnp.float32))
    start = jnp.asarray([0, 2, 9, 20], jnp.int32)  # row 0: nothing cached below it
    tokens = jnp.asarray(rng.integers(0, 300, (steps, W)), jnp.int32)
    forward = jax.jit(decode_forward, static_argnums=(0,), static_argnames=("attention",))
    recent = RecentKV.empty(cache, start, steps) if with_recent else None
    for j in range(steps):
        pos = start + j if with_recent else start
        want, k_x, _ = forward(cfg, params, tokens[j], pos, cache, recent=recent)
        got, k_k, v_k = forward(
            cfg, params, tokens[j], pos, cache, recent=recent, attention="kernel"
        )
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=5e-5, rtol=1e-5)
        if packed:  # bf16 bit patterns: compare the values (one rounding step apart at most)
            k_k, k_x = (jnp.asarray(x).view(jnp.bfloat16) for x in (k_k, k_x))
        np.testing.assert_allclose(
            np.asarray(k_k, np.float32), np.asarray(k_x, np.float32), atol=5e-5, rtol=1e-2
        )
        if with_recent:
            recent = recent.add(k_k, v_k)


def test_a_model_or_name_the_kernel_cannot_serve_is_refused():
    gemma = make_tiny("gemma3", seed=1, vocab_size=300).model.config  # sliding-window layers
    with pytest.raises(ValueError, match='sliding-window layers.*Fix: use "xla"'):
        check_attention(gemma, "kernel")
    llama = make_tiny("llama", seed=1, vocab_size=300).model.config
    with pytest.raises(ValueError, match="expected one of .*'xla', 'kernel'.*received 'flash'"):
        check_attention(llama, "flash")
    with pytest.raises(ConfigError, match="decode_attention"):
        EngineConfig(decode_attention="flash")


@pytest.mark.parametrize("chunk,kv_write", [(1, "scatter"), (4, "chunk")])
def test_engines_with_either_attention_give_the_same_completions(chunk, kv_write):
    lm = make_tiny(
        "llama", seed=5, vocab_size=300, hidden_size=32, intermediate_size=64, num_layers=2
    )
    rng = np.random.default_rng(1)
    reqs = [
        (
            [int(t) for t in rng.integers(3, 290, int(rng.integers(3, 30)))],
            SamplingParams(
                temperature=0.0 if i % 2 == 0 else 1.0,
                max_tokens=int(rng.integers(1, 10)),
                seed=int(rng.integers(0, 2**31)),
                stop_token_ids=tuple(lm.tokenizer.stop_token_ids),
            ),
        )
        for i in range(6)
    ]

    async def run(attention):
        cfg = EngineConfig(
            num_slots=4,
            max_len=64,
            min_bucket=16,
            shapes="fixed",
            decode_chunk=chunk,
            kv_write=kv_write,
            decode_attention=attention,
        )
        engine = JaxEngine.from_loaded(lm, config=cfg)
        try:
            return await asyncio.gather(*(engine.generate(p, sp) for p, sp in reqs))
        finally:
            await engine.close()

    for a, b in zip(asyncio.run(run("xla")), asyncio.run(run("kernel"))):
        assert list(a.token_ids) == list(b.token_ids) and a.finish_reason == b.finish_reason
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
