"""``EngineConfig.decode_attention``: the decode attention's products as batched dots or as
multiply-and-reduce in float32 give the same logits, k/v and completions (up to rounding), and
``"auto"`` picks the form measured faster for the dtype, head size and rows.

The two forms are compared on decode steps of a tiny model (float32 and a bf16-packed uint16 cache,
alone and with a decode chunk's recent k/v beside the cache, a row with nothing cached), then engines,
one per form, get the same seeded requests; "auto" is checked by its choice on each side of its rule."""

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
from gymllm.models.decode import decode_forward
from gymllm.models.layers import decode_attention

pytestmark = pytest.mark.highest_precision  # float32 on an accelerator: compared at full precision


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("with_recent", [False, True])
def test_both_forms_give_the_same_decode_step(packed, with_recent):
    lm = make_tiny("llama", seed=3, vocab_size=300, head_dim=32)  # D >= 32: "auto" would pick dots
    cfg, params = lm.model.config, lm.model.flat_params()
    W, S, steps = 8, 24, 3
    rng = np.random.default_rng(0)
    cache = lm.model.init_cache(W, S, jnp.float32)
    filled = rng.normal(size=cache.k.shape)
    if packed:  # bf16 bit patterns in uint16, as the engine keeps a bf16 cache on CPU
        cache = KVCache(
            *(jnp.asarray(x, jnp.bfloat16).view(jnp.uint16) for x in (filled, filled * 0.5))
        )
    else:
        cache = KVCache(jnp.asarray(filled, jnp.float32), jnp.asarray(filled * 0.5, jnp.float32))
    start = jnp.asarray([0, 2, 9, 20, 3, 5, 7, 11], jnp.int32)  # row 0: nothing cached below it
    tokens = jnp.asarray(rng.integers(0, 300, (steps, W)), jnp.int32)
    forward = jax.jit(decode_forward, static_argnums=(0,), static_argnames=("attention",))
    recent = RecentKV.empty(cache, start, steps) if with_recent else None
    for j in range(steps):
        pos = start + j if with_recent else start
        want, k_d, _ = forward(cfg, params, tokens[j], pos, cache, recent=recent, attention="dots")
        got, k_e, v_e = forward(
            cfg, params, tokens[j], pos, cache, recent=recent, attention="elementwise"
        )
        assert not np.array_equal(np.asarray(got), np.asarray(want)) or packed  # two real paths
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=5e-5, rtol=1e-5)
        if packed:  # bf16 bit patterns: compare the values (one rounding step apart at most)
            k_e, k_d = (jnp.asarray(x).view(jnp.bfloat16) for x in (k_e, k_d))
        np.testing.assert_allclose(
            np.asarray(k_e, np.float32), np.asarray(k_d, np.float32), atol=5e-5, rtol=1e-2
        )
        if with_recent:
            recent = recent.add(k_e, v_e)


def test_auto_takes_the_dots_in_low_precision_and_for_wide_heads():
    rng = np.random.default_rng(1)

    def run(dtype, d, rows, form):
        keys = jnp.asarray(rng.normal(size=(rows, 40, 2, d)), dtype)
        own = jnp.asarray(rng.normal(size=(rows, 2, d)), dtype)
        q = jnp.asarray(rng.normal(size=(rows, 4, d)), dtype)
        visible = jnp.ones((rows, 40), bool)
        return [
            np.asarray(decode_attention(q, keys, keys, own, own, visible, scale=0.1, form=f))
            for f in (form, "auto")
        ]

    for dtype, d, rows, form in [
        (jnp.bfloat16, 16, 2, "dots"),  # low precision: dots
        (jnp.float32, 64, 8, "dots"),  # float32, D >= 32 and >= 8 rows: dots
        (jnp.float32, 16, 8, "elementwise"),  # small heads: elementwise
        (jnp.float32, 64, 4, "elementwise"),  # few rows: elementwise
    ]:
        chosen, auto = run(dtype, d, rows, form)
        np.testing.assert_array_equal(auto, chosen)


def test_an_unknown_form_is_refused_with_the_choices():
    x = jnp.zeros((1, 1, 1, 2))
    with pytest.raises(
        ValueError, match="expected one of .*'auto', 'dots', 'elementwise'.*'flash'"
    ):
        decode_attention(
            x[0], x, x, x[:, 0], x[:, 0], jnp.ones((1, 1), bool), scale=1.0, form="flash"
        )
    with pytest.raises(ConfigError, match="decode_attention"):
        EngineConfig(decode_attention="flash")


@pytest.mark.parametrize("chunk,kv_write", [(1, "scatter"), (4, "chunk")])
def test_engines_with_either_form_give_the_same_completions(chunk, kv_write):
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
        for i in range(8)
    ]

    async def run(form):
        cfg = EngineConfig(
            num_slots=8,
            max_len=64,
            min_bucket=16,
            shapes="fixed",
            decode_chunk=chunk,
            kv_write=kv_write,
            decode_attention=form,
        )
        engine = JaxEngine.from_loaded(lm, config=cfg)
        try:
            return await asyncio.gather(*(engine.generate(p, sp) for p, sp in reqs))
        finally:
            await engine.close()

    for a, b in zip(asyncio.run(run("dots")), asyncio.run(run("elementwise"))):
        assert list(a.token_ids) == list(b.token_ids) and a.finish_reason == b.finish_reason
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
