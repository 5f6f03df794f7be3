"""Prompt sharing in the JAX engine (``EngineConfig.share_prompt_prefill``): a request whose prompt shares a
prefix with a row still decoding copies that row's k/v and prefills only the rest; a GRPO group (the same
prompt, several requests at once) prefills the prompt once. The reference is the same engine with the
switch off: same greedy tokens, same logprobs (float32, up to rounding). Interleavings are forced with
``engine.paused()`` / ``run_iterations``."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from gymllm.inference.adapters import AdapterConfig
from gymllm.inference.config import EngineConfig
from gymllm.inference.jax_engine import JaxEngine
from gymllm.inference.params import SamplingParams
from gymllm.models import lora
from gymllm.models.tiny import make_tiny

# few compiled shapes (prefill: up to 2 prompts, buckets 16/32/64; decode: 8 rows over 64 slots)
CFG = EngineConfig(num_slots=8, max_len=64, min_bucket=16, max_prefill_batch=2, decode_lengths=1)
OFF = EngineConfig(
    num_slots=8,
    max_len=64,
    min_bucket=16,
    max_prefill_batch=2,
    decode_lengths=1,
    share_prompt_prefill=False,
)
GREEDY = SamplingParams(temperature=0.0, max_tokens=6)
PROMPT = [int(x) for x in np.random.default_rng(0).integers(3, 500, size=40)]


@pytest.fixture(scope="module")
def lm():
    return make_tiny("llama", num_layers=1)


async def submit(engine, n, prompt=PROMPT, **kw):
    """``n`` requests queued now (inside ``paused()`` they wait for the next iteration together)."""
    futs = [
        asyncio.ensure_future(engine.generate(prompt, GREEDY, session_id=f"s{i}-{id(kw)}", **kw))
        for i in range(n)
    ]
    for _ in range(3):
        await asyncio.sleep(0)
    return futs


def run(engine_cfg, lm, scenario):
    engine = JaxEngine(lm.model, lm.tokenizer, config=engine_cfg, stop_token_ids=())

    async def go():
        try:
            return await scenario(engine)
        finally:
            await engine.close()

    return asyncio.run(go()), dict(engine.stats)


def same(a, b):
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x.token_ids, y.token_ids)
        np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-5, rtol=1e-5)


async def group(engine):
    with engine.paused():
        futs = await submit(engine, 6)
    return await asyncio.gather(*futs)


def test_group_of_identical_prompts_prefills_once(lm):
    on, st_on = run(CFG, lm, group)
    off, st_off = run(OFF, lm, group)
    assert st_off["prefill_tokens"] == 6 * len(PROMPT) and st_off["shared_prefill_tokens"] == 0
    # the first prefills the prompt; the five others copy its row and prefill its last token
    assert st_on["prefill_tokens"] == len(PROMPT) + 5
    assert st_on["shared_prefill_tokens"] == 5 * (len(PROMPT) - 1)
    assert sorted(c.cached_prompt_len for c in on) == [0] + [len(PROMPT) - 1] * 5
    same(on, off)
    same(on[1:], on[:-1])  # greedy: every sample of the group is the same


async def mid_decode(engine):
    with engine.paused():
        (a,) = await submit(engine, 1)
        await asyncio.to_thread(engine.run_iterations, 3)  # prefilled, and two decode steps in
        (b,) = await submit(engine, 1, prompt=PROMPT + [7, 8])  # extends the decoding row's prompt
    return await asyncio.gather(a, b)


def test_request_copies_prefix_of_a_decoding_row(lm):
    on, st_on = run(CFG, lm, mid_decode)
    off, st_off = run(OFF, lm, mid_decode)
    assert st_on["shared_prefill_tokens"] == len(PROMPT) and on[1].cached_prompt_len == len(PROMPT)
    assert st_on["prefill_tokens"] == len(PROMPT) + 2
    assert st_off["prefill_tokens"] == 2 * len(PROMPT) + 2 and st_off["shared_prefill_tokens"] == 0
    same(on, off)


def test_no_sharing_across_weight_versions(lm):
    async def scenario(engine):
        with engine.paused():
            (a,) = await submit(engine, 1)
            await asyncio.to_thread(engine.run_iterations, 2)
            engine.update_weights(
                lm.model, version=1
            )  # same values, a new version: the row's k/v are older
            (b,) = await submit(engine, 1)
        return await asyncio.gather(a, b)

    (a, b), st = run(CFG, lm, scenario)
    assert st["shared_prefill_tokens"] == 0 and b.cached_prompt_len == 0
    assert st["prefill_tokens"] == 2 * len(PROMPT)
    assert b.versions.tolist() == [1] * len(b.token_ids)


@pytest.mark.slow  # compiles the adapter steps (~9 s)
def test_adapters_of_different_names_never_share(lm):
    cfg = lora.LoRAConfig(rank=4, alpha=8.0, targets=lora.PROJECTIONS)
    base = lm.model.flat_params()
    engine = JaxEngine(
        lm.model,
        lm.tokenizer,
        config=CFG,
        stop_token_ids=(),
        adapters=AdapterConfig(lora=cfg, names=("a", "b")),
    )

    async def go():
        try:
            with engine.paused():
                for i, name in enumerate(("a", "b")):
                    ads = lora.init_adapters(
                        lora.LoRAConfig(rank=4, alpha=8.0, targets=lora.PROJECTIONS, seed=i), base
                    )
                    engine.update_adapter(
                        name,
                        {k: v + 0.1 if k.endswith("lora_b") else v for k, v in ads.items()},
                        version=1,
                    )
                # one of each adapter in the same round: different tags, both prefill the whole prompt
                first = await submit(engine, 1, adapter="a") + await submit(engine, 1, adapter="b")
                await asyncio.to_thread(engine.run_iterations, 2)
                assert engine.stats["prefill_tokens"] == 2 * len(PROMPT)
                # a later "b" request copies the "b" row, never the "a" one (which comes first)
                (late,) = await submit(engine, 1, adapter="b")
            out = await asyncio.gather(*first, late)
            return out
        finally:
            await engine.close()

    a, b, late = asyncio.run(go())
    assert engine.stats["shared_prefill_tokens"] == len(PROMPT) - 1
    np.testing.assert_array_equal(late.token_ids, b.token_ids)
    np.testing.assert_allclose(late.logprobs, b.logprobs, atol=1e-5, rtol=1e-5)
    assert not np.allclose(
        a.logprobs, b.logprobs
    )  # the adapters differ: a copy of the wrong row would show
