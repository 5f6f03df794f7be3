"""Multi-LoRA serving (gymllm.inference.adapters): one JaxEngine holds the base weights and a stack of
named adapters, and each request names its adapter. The reference for a row served with adapter k is a
plain JaxEngine over ``lora.merge(base, adapter_k)``: same greedy tokens, same logprobs (float32), for
prefill, decode, and a step that mixes adapters (the interleaving forced with ``engine.paused()``)."""

from __future__ import annotations

import asyncio

import jax.numpy as jnp
import numpy as np
import pytest

from gymllm.errors import EngineError
from gymllm.inference.adapters import AdapterConfig, AdapterView
from gymllm.inference.config import EngineConfig
from gymllm.inference.jax_engine import JaxEngine
from gymllm.inference.params import SamplingParams
from gymllm.models import lora
from gymllm.models.tiny import make_tiny
from gymllm.models.transformer import Transformer

LORA = lora.LoRAConfig(
    rank=4, alpha=8.0, targets=lora.PROJECTIONS
)  # every projection: every adapted path
# few compiled shapes (prefill: 1 or 2 prompts, one length bucket; decode: 8 rows, 64 slots), shared by every test
CFG = EngineConfig(num_slots=8, max_len=64, min_bucket=16, max_prefill_batch=2, decode_lengths=1)
GREEDY = SamplingParams(temperature=0.0, max_tokens=8)
PROMPTS = {"a": [5, 9, 14, 3], "b": [7, 7, 21, 40, 2], None: [11, 4, 30]}


def random_adapters(base, seed):
    """Adapters with a random B (not the zeros a fresh LoRA starts from), so each one changes the model."""
    rng = np.random.default_rng(seed)
    out = {}
    for k, v in lora.init_adapters(
        lora.LoRAConfig(rank=LORA.rank, alpha=LORA.alpha, targets=LORA.targets, seed=seed), base
    ).items():
        out[k] = (
            v if k.endswith("lora_a") else jnp.asarray(rng.standard_normal(v.shape) * 0.3, v.dtype)
        )
    return out


@pytest.fixture(scope="module")
def setup():
    lm = make_tiny("llama", num_layers=2)
    base = lm.model.flat_params()
    ads = {"a": random_adapters(base, 1), "b": random_adapters(base, 2)}
    return lm, base, ads


def adapter_engine(lm, ads, config=CFG, **kw):
    engine = JaxEngine(
        lm.model,
        lm.tokenizer,
        config=config,
        stop_token_ids=(),
        adapters=AdapterConfig(lora=LORA, names=("a", "b")),
        **kw,
    )
    with engine.paused():  # both land in one iteration, before any request (none waits yet)
        for name, a in ads.items():
            engine.update_adapter(name, a, version=1)
        engine.run_iterations(1)
    assert engine.adapters.versions == [0, 1, 1] and not engine.adapters.pending
    return engine


def reference(lm, base, ads, name, prompt, params=GREEDY, config=CFG):
    """A plain engine over the merged weights of adapter ``name`` (None: the base model), alone."""
    flat = base if name is None else dict(lora.merge(LORA, base, ads[name]))
    engine = JaxEngine(
        Transformer(lm.config, params=flat), lm.tokenizer, config=config, stop_token_ids=()
    )

    async def go():
        try:
            return await engine.generate(prompt, params)
        finally:
            await engine.close()

    return asyncio.run(go())


async def interleaved(engine, first, later, params=GREEDY):
    """``first`` (adapter name) is prefilled and decoding before ``later``'s requests arrive, so they join
    its rows (a separate prefill, or riding along its decode step) and decode in the same steps."""
    with engine.paused():
        head = asyncio.ensure_future(engine.generate(PROMPTS[first], params, adapter=first))
        await asyncio.sleep(0)
        await asyncio.to_thread(
            engine.run_iterations, 1
        )  # its prefill: the row decodes from now on
        tail = [
            asyncio.ensure_future(engine.generate(PROMPTS[n], params, adapter=n)) for n in later
        ]
        await asyncio.sleep(0)
    return await asyncio.gather(head, *tail)


def check_like(got, want):
    assert list(got.token_ids) == list(want.token_ids)
    np.testing.assert_allclose(got.logprobs, want.logprobs, atol=2e-4)


def test_rows_of_different_adapters_in_one_step_match_engines_over_the_merged_weights(setup):
    lm, base, ads = setup
    refs = {n: reference(lm, base, ads, n, PROMPTS[n]) for n in ("a", "b", None)}
    plain = reference(lm, base, ads, None, PROMPTS["a"])  # the adapter changes what the model says
    assert not np.allclose(np.asarray(refs["a"].logprobs), np.asarray(plain.logprobs), atol=1e-3)
    engine = adapter_engine(lm, ads)

    async def go():
        try:
            batched = await interleaved(engine, "a", ["b", None, "a"])
            with (
                engine.paused()
            ):  # prefilled two to a call (mixing adapters), then every step decodes the three
                together = [
                    asyncio.ensure_future(engine.generate(PROMPTS[n], GREEDY, adapter=n))
                    for n in ("b", "a", None)
                ]
                await asyncio.sleep(0)
            return batched, await asyncio.gather(*together)
        finally:
            await engine.close()

    batched, together = asyncio.run(go())
    for got, name in zip(batched, ["a", "b", None, "a"]):
        check_like(got, refs[name])
        assert list(got.versions) == [1 if name else 0] * len(
            got.token_ids
        )  # its own adapter's version (base: 0)
    for got, name in zip(together, ("b", "a", None)):
        check_like(got, refs[name])


def test_updating_one_adapter_moves_only_its_rows_and_versions(setup):
    lm, base, ads = setup
    new_a = random_adapters(base, 3)
    ref_b = reference(lm, base, ads, "b", PROMPTS["b"])
    engine = adapter_engine(lm, ads)
    view_a, view_b = engine.for_adapter("a"), engine.for_adapter("b")

    async def go():
        try:
            with engine.paused():
                ta = asyncio.ensure_future(view_a.generate(PROMPTS["a"], GREEDY))
                tb = asyncio.ensure_future(view_b.generate(PROMPTS["b"], GREEDY))
                await asyncio.sleep(0)
                await asyncio.to_thread(
                    engine.run_iterations, 2
                )  # prefill + a decode step, then one more
                view_a.update_weights(new_a, 7)  # lands between two steps, a's rows only
                assert view_a.version == 7 and view_b.version == 1 and engine.version == 0
            return await asyncio.gather(ta, tb)
        finally:
            await engine.close()

    a, b = asyncio.run(go())
    assert list(a.versions) == [1, 1, 1] + [7] * 5
    assert list(b.versions) == [1] * 8
    check_like(b, ref_b)  # b's rows never saw a's update
    # a's first three tokens are the old adapter's, the next ones come from the new adapter
    ref_a = reference(lm, base, ads, "a", PROMPTS["a"])
    assert list(a.token_ids[:3]) == list(ref_a.token_ids[:3])
    np.testing.assert_allclose(a.logprobs[:3], ref_a.logprobs[:3], atol=2e-4)
    assert abs(a.logprobs[3] - ref_a.logprobs[3]) > 1e-3


def test_a_second_adapter_compiles_nothing_new_and_prefixes_stay_with_their_adapter(setup):
    lm, base, ads = setup
    engine = adapter_engine(lm, ads)
    turn = PROMPTS["a"] + [8, 8, 8, 8, 8]

    async def pair(
        first, second, k
    ):  # prefilled together in one call, decoded in the same steps; prompts that
        with (
            engine.paused()
        ):  # share no prefix with any other (no reuse: every prefill reads no cached slot)
            tasks = [
                asyncio.ensure_future(engine.generate([100 + 2 * k + i] + turn, GREEDY, adapter=n))
                for i, n in enumerate((first, second))
            ]
            await asyncio.sleep(0)
        return await asyncio.gather(*tasks)

    async def go():
        try:
            first = await engine.generate(turn, GREEDY, session_id="s", adapter="a")
            await pair("a", "a", 0)
            counts = dict(engine.trace_counts)
            # the same session and prompt under adapter b: a's row is the session's, its prefix is not b's
            other = await engine.generate(turn, GREEDY, session_id="s", adapter="b")
            mixed = await pair("b", "a", 1)
            after = dict(engine.trace_counts)
            nxt = turn + list(other.token_ids) + [9]  # b's next turn reuses b's own prefix
            same = await engine.generate(nxt, GREEDY, session_id="s", adapter="b")
            return first, other, mixed, same, counts, after
        finally:
            await engine.close()

    first, other, mixed, same, before, after = asyncio.run(go())
    assert (
        after == before
    )  # a second adapter, and a step mixing two, run the programs already compiled
    assert other.cached_prompt_len == 0 and same.cached_prompt_len >= len(turn)
    check_like(other, reference(lm, base, ads, "b", turn))
    check_like(mixed[0], reference(lm, base, ads, "b", [102] + turn))
    assert list(same.versions) == [1] * len(same.token_ids)


def test_unknown_adapters_and_bad_updates_are_clear_errors(setup):
    lm, base, ads = setup
    engine = adapter_engine(lm, ads)
    plain = JaxEngine(lm.model, lm.tokenizer, config=CFG)

    async def go():
        try:
            with pytest.raises(
                EngineError,
                match=r"adapter: expected one of this engine's adapters \['a', 'b'\].*"
                r"received 'c'.*Fix",
            ):
                await engine.generate([1, 2], GREEDY, adapter="c")
            with pytest.raises(EngineError, match="engine built with adapters"):
                await plain.generate([1, 2], GREEDY, adapter="a")
        finally:
            await engine.close()
            await plain.close()

    asyncio.run(go())
    with pytest.raises(EngineError, match="adapters"):
        engine.for_adapter("zz")
    with pytest.raises(EngineError, match=r"update_adapter\('a', adapters\): expected exactly"):
        engine.update_adapter("a", {"layers.wq.lora_a": np.zeros((2, 3, 4))}, 1)
    with pytest.raises(EngineError, match="update_weights"):
        engine.update_adapter(None, ads["a"], 1)
    assert isinstance(engine.for_adapter("b"), AdapterView) and engine.adapters.names == ("a", "b")


@pytest.mark.slow  # two more engine configurations (~20 s of compiles on a shared 2-core machine)
@pytest.mark.parametrize(
    "config",
    [
        EngineConfig(
            num_slots=8,
            max_len=64,
            min_bucket=16,
            max_prefill_batch=2,
            decode_lengths=1,
            piggyback_tokens=16,
        ),
        EngineConfig(
            num_slots=8,
            max_len=64,
            min_bucket=16,
            max_prefill_batch=2,
            decode_lengths=1,
            decode_chunk=4,
        ),
    ],
    ids=["piggyback", "decode_chunk"],
)
def test_piggybacked_and_chunked_steps_serve_each_row_its_adapter(setup, config):
    lm, base, ads = setup
    refs = {n: reference(lm, base, ads, n, PROMPTS[n]) for n in ("a", "b", None)}
    engine = adapter_engine(lm, ads, config=config)

    async def go():
        try:
            return await interleaved(engine, "a", ["b", None, "b"])
        finally:
            await engine.close()

    for got, name in zip(asyncio.run(go()), ["a", "b", None, "b"]):
        check_like(got, refs[name])
    ran = (
        engine.mixed_trace_counts["mixed"]
        if config.piggyback_tokens
        else engine.chunk_trace_counts["decode_chunk"]
    )
    assert ran > 0  # the path under test did run
