"""The JAX engine's fixed program set (``EngineConfig.shapes="fixed"``): a packed prefill of a fixed token
budget, one decode width, one copy size. References: the packed forward against the bucketed chunk
prefill (:mod:`gymllm.models.prefill`), and the fixed engine against the bucketed engine (same greedy
tokens, same logprobs, float32) through prompts of many lengths (longer than the budget too), multi-turn
prefix reuse, shared-prompt prefill, LoRA adapters, single-step and chunked decode. Then the count: the
programs a fixed engine compiles (its steps' ``trace_counts`` and JAX's backend-compile events) are the
ones ``program_shapes()`` lists, and more traffic compiles nothing. Interleavings are forced with
``engine.paused()`` / ``run_iterations``."""

from __future__ import annotations

import asyncio
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gymllm.errors import ConfigError
from gymllm.inference.adapters import AdapterConfig
from gymllm.telemetry import use_tracer
from gymllm.inference.config import EngineConfig
from gymllm.inference.jax_engine import JaxEngine
from gymllm.inference.params import SamplingParams
from gymllm.inference.token_budget import pack_pieces, plan_calls
from gymllm.models import lora
from gymllm.models.packed_prefill import packed_prefill_and_write
from gymllm.models.prefill import prefill_and_write
from gymllm.models.tiny import make_tiny
from gymllm.models.transformer import Transformer

# float32 references: on an accelerator the comparisons run at full matmul precision (tests/accel.py)
pytestmark = pytest.mark.highest_precision

# budget 32 tokens in up to 3 pieces: prompts of 40-90 tokens continue over calls
FIXED = EngineConfig(
    num_slots=8,
    max_len=96,
    min_bucket=16,
    max_prefill_batch=3,
    decode_lengths=1,
    shapes="fixed",
    prefill_tokens=32,
)
# the reference: the bucketed path with few shapes (one prompt per prefill, one length bucket)
BUCKETS = EngineConfig(
    num_slots=8, max_len=96, min_bucket=96, max_prefill_batch=1, decode_lengths=1
)
GREEDY = SamplingParams(temperature=0.0, max_tokens=6)
RNG = np.random.default_rng(0)
PROMPTS = [[int(x) for x in RNG.integers(3, 500, size=n)] for n in (3, 17, 31, 32, 45, 80)]


@pytest.fixture(scope="module")
def lm():
    return make_tiny("llama", num_layers=1)


def serve(lm, config, scenario, model=None, **kw):
    engine = JaxEngine(model or lm.model, lm.tokenizer, config=config, stop_token_ids=(), **kw)

    async def go():
        try:
            return await scenario(engine)
        finally:
            await engine.close()

    return asyncio.run(go()), engine


def same(got, want, atol=1e-5):
    assert len(got) == len(want)
    for x, y in zip(got, want):
        assert list(x.token_ids) == list(y.token_ids)
        np.testing.assert_allclose(x.logprobs, y.logprobs, atol=atol, rtol=1e-5)


# ---------------------------------------------------------------------------------------------- packing
@pytest.mark.parametrize("budget,segments", [(1, 1), (7, 2), (32, 3), (100, 8)])
def test_pieces_cover_every_token_once_in_order_within_the_budget(budget, segments):
    chunks = [int(x) for x in np.random.default_rng(budget).integers(1, 60, size=9)]
    calls = pack_pieces(chunks, budget, segments)
    seen = {i: [] for i in range(len(chunks))}
    for call in calls:
        assert 1 <= len(call) <= segments and sum(p.length for p in call) <= budget
        assert len({p.index for p in call}) == len(call)  # one piece of a request per call
        for p in call:
            assert p.length >= 1
            seen[p.index].append(p)
    for i, pieces in seen.items():
        offsets = [p.offset for p in pieces]
        assert offsets == sorted(offsets) and offsets[0] == 0
        assert sum(p.length for p in pieces) == chunks[i]
        assert [p.final for p in pieces] == [False] * (len(pieces) - 1) + [True]
        assert all(a.offset + a.length == b.offset for a, b in zip(pieces, pieces[1:]))
    # greedy: every call but the last is full (its budget or its segments used up)
    assert all(sum(p.length for p in c) == budget or len(c) == segments for c in calls[:-1])
    with pytest.raises(ConfigError, match="every request prefills at least one token"):
        pack_pieces([3, 0], budget, segments)


def test_packed_forward_matches_the_chunked_prefill_with_sliding_windows():
    """Two rows continue cached prefixes (gemma3: sliding window 8 and global layers); the packed call holds
    both pieces and a padding tail; logits and the written cache equal the bucketed chunk prefill's."""
    tiny = make_tiny("gemma3", num_layers=2)
    cfg, params = tiny.config, tiny.model.flat_params()
    b, s = 4, 32
    rng = np.random.default_rng(1)
    first = rng.integers(3, 100, size=(b, 12)).astype(np.int32)
    pos = np.tile(np.arange(12, dtype=np.int32), (b, 1))
    ref = jax.jit(prefill_and_write, static_argnums=(0, 6))
    _, cache = ref(
        cfg,
        params,
        first,
        pos,
        np.arange(b, dtype=np.int32),
        tiny.model.init_cache(b, s),
        0,
        np.full(b, 11, np.int32),
    )
    chunks, starts = [rng.integers(3, 100, size=5), rng.integers(3, 100, size=9)], [12, 7]
    tokens, positions = np.zeros((2, 10), np.int32), np.zeros((2, 10), np.int32)
    for i, (c, st) in enumerate(zip(chunks, starts)):
        tokens[i, : len(c)], positions[i] = c, np.minimum(st + np.arange(10), s - 1)
    want, want_cache = ref(
        cfg,
        params,
        tokens,
        positions,
        np.array([1, 3], np.int32),
        cache,
        s,
        np.array([4, 8], np.int32),
    )
    n, p = 20, 3
    t, ps, seg = np.zeros(n, np.int32), np.full(n, s - 1, np.int32), np.full(n, p, np.int32)
    t[:5], ps[:5], seg[:5] = chunks[0], 12 + np.arange(5), 0
    t[5:14], ps[5:14], seg[5:14] = chunks[1], 7 + np.arange(9), 1
    got, got_cache = jax.jit(packed_prefill_and_write, static_argnums=(0, 8))(
        cfg,
        params,
        t,
        ps,
        seg,
        np.array([1, 3, b], np.int32),
        np.array([12, 7, 0], np.int32),
        cache,
        s,
        np.array([4, 13, 0], np.int32),
    )
    np.testing.assert_allclose(np.asarray(got[:2]), np.asarray(want), atol=1e-5, rtol=1e-5)
    for g, w in zip(got_cache, want_cache):
        np.testing.assert_allclose(
            np.asarray(g), np.asarray(w), atol=1e-5, rtol=1e-5
        )  # float32 summation order


# ---------------------------------------------------------------------------------------------- old vs new
async def two_turns(engine):
    """Every prompt at once (a round packed over several calls), then each session's second turn (its
    prompt, the completion and three new tokens: prefix reuse), with different max_tokens."""
    with engine.paused():
        futs = [
            asyncio.ensure_future(engine.generate(p, GREEDY, session_id=f"s{i}"))
            for i, p in enumerate(PROMPTS)
        ]
        await asyncio.sleep(0)
    first = await asyncio.gather(*futs)
    later = [
        engine.generate(
            p + list(c.token_ids) + [7, 8, 9],
            SamplingParams(temperature=0.0, max_tokens=2 + i),
            session_id=f"s{i}",
        )
        for i, (p, c) in enumerate(zip(PROMPTS, first))
    ]
    return list(first) + list(await asyncio.gather(*later))


@pytest.mark.parametrize("decode_chunk", [1, 4])
def test_fixed_shapes_serve_the_tokens_of_the_buckets_over_two_turns(lm, decode_chunk):
    want, _ = serve(lm, BUCKETS, two_turns)
    got, engine = serve(lm, FIXED, two_turns, decode_chunk=decode_chunk)
    same(got, want)
    assert [c.cached_prompt_len for c in got[len(PROMPTS) :]] == [
        len(p) + 5 for p in PROMPTS
    ]  # turn 2 reused
    assert engine.stats["prefill_tokens"] == sum(len(p) for p in PROMPTS) + 3 * len(PROMPTS) + len(
        PROMPTS
    )


def test_a_small_budget_serves_the_same_tokens_and_takes_the_calls_that_fit_it(lm):
    """``prefill_tokens_small=8``: the second turns (six pieces of 4 new tokens in one round: 24 tokens in
    three 8-token calls, not two 32-token ones) run the 8-token program, the first round (208 tokens)
    the 32-token one; tokens and logprobs stay the bucketed path's."""
    want, _ = serve(lm, BUCKETS, two_turns)
    with use_tracer() as tr:
        got, engine = serve(
            lm, dataclasses.replace(FIXED, prefill_tokens_small=8), two_turns, decode_chunk=4
        )
        sizes = [
            e["args"]["tokens"] for e in tr.events() if e["name"] == "prefill" and e["ph"] == "X"
        ]
    same(got, want)
    assert engine.program_shapes()[:2] == [
        ("prefill_packed", 8, 3, 96),
        ("prefill_packed", 32, 3, 96),
    ]
    assert sizes[-3:] == [8, 8, 8] and set(sizes[:-3]) == {32}
    assert engine.stats["prefill_tokens"] == sum(len(p) for p in PROMPTS) + 3 * len(PROMPTS) + len(
        PROMPTS
    )


@pytest.mark.parametrize(
    "chunks,want",
    [
        ([97, 1, 1], [128]),
        ([16, 16, 16], [32, 32]),
        ([16], [32]),
        ([40, 30, 30], [128]),
        ([3] * 9, [32, 32, 32]),
        ([200], [128, 128]),
    ],
)
def test_a_round_runs_the_plan_that_processes_fewer_tokens(chunks, want):
    plan = plan_calls(chunks, (32, 128), 4)
    assert [b for b, _ in plan] == want
    assert all(sum(p.length for p in call) <= b for b, call in plan)
    got = [(p.index, p.offset, p.length) for _, call in plan for p in call]
    assert [n for *_, n in got] and sum(n for *_, n in got) == sum(
        chunks
    )  # every token once, in order
    assert plan_calls(chunks, (128,), 4) == [(128, c) for c in pack_pieces(chunks, 128, 4)]


def test_the_small_budget_is_checked():
    with pytest.raises(ValueError, match="prefill_tokens_small"):
        dataclasses.replace(FIXED, prefill_tokens_small=32)  # not below prefill_tokens=32


async def group(engine):
    """A GRPO group (five identical prompts) and two other prompts in one round."""
    with engine.paused():
        futs = [asyncio.ensure_future(engine.generate(PROMPTS[4], GREEDY)) for _ in range(5)]
        futs += [asyncio.ensure_future(engine.generate(PROMPTS[i], GREEDY)) for i in (1, 5)]
        await asyncio.sleep(0)
    return list(await asyncio.gather(*futs))


def test_a_group_prefills_its_prompt_once_with_fixed_shapes(lm):
    want, _ = serve(lm, BUCKETS, group)
    got, engine = serve(lm, FIXED, group)
    same(got, want)
    n = len(PROMPTS[4])
    assert sorted(c.cached_prompt_len for c in got[:5]) == [0] + [n - 1] * 4
    assert engine.stats["shared_prefill_tokens"] == 4 * (n - 1)


def test_adapters_ride_the_packed_prefill_and_the_fixed_decode(lm):
    """Rows of two adapters and the base model, prefilled in one packed call and decoded together, each
    matching a bucketed engine over its merged weights."""
    targets = lora.LoRAConfig(rank=4, alpha=8.0, targets=lora.PROJECTIONS)
    base = lm.model.flat_params()
    rng = np.random.default_rng(3)
    ads = {}
    for k, name in enumerate(("a", "b")):
        init = lora.init_adapters(
            lora.LoRAConfig(rank=4, alpha=8.0, targets=lora.PROJECTIONS, seed=k), base
        )
        ads[name] = {
            key: v
            if key.endswith("lora_a")
            else jnp.asarray(rng.standard_normal(v.shape) * 0.3, v.dtype)
            for key, v in init.items()
        }
    names = ("a", "b", None)

    async def mixed(engine):
        with engine.paused():
            for name, a in ads.items():
                engine.update_adapter(name, a, version=1)
            futs = [
                asyncio.ensure_future(engine.generate(PROMPTS[2 + i], GREEDY, adapter=n))
                for i, n in enumerate(names)
            ]
            await asyncio.sleep(0)
        return list(await asyncio.gather(*futs))

    got, _ = serve(lm, FIXED, mixed, adapters=AdapterConfig(lora=targets, names=("a", "b")))
    for i, name in enumerate(names):
        flat = base if name is None else dict(lora.merge(targets, base, ads[name]))
        want, _ = serve(
            lm,
            BUCKETS,
            lambda e, p=PROMPTS[2 + i]: e.generate(p, GREEDY),
            model=Transformer(lm.config, params=flat),
        )
        same([got[i]], [want], atol=2e-4)


def test_fixed_shapes_refuse_piggybacking_clearly():
    with pytest.raises(ConfigError, match="piggyback_tokens"):
        EngineConfig(shapes="fixed", piggyback_tokens=64)
    with pytest.raises(ConfigError, match="shapes"):
        EngineConfig(shapes="ragged")


# ---------------------------------------------------------------------------------------------- the count
STEP_COUNTS = {
    "prefill_packed": "packed_trace_counts",
    "decode_chunk": "chunk_trace_counts",
    "decode": "trace_counts",
    "copy_rows": None,
}


def test_a_fixed_engine_compiles_its_listed_programs_and_nothing_more():
    """Warmup compiles exactly ``program_shapes()`` (the steps' trace counts and JAX's backend-compile
    events); a mixed workload (many prompt lengths, groups, second turns, different max_tokens) and then
    more of it compile nothing."""
    tiny = make_tiny("qwen3", num_layers=1, hidden_size=48)  # a graph no other test compiles
    compiled: list[str] = []

    def listen(event, duration, **kw):
        if event == "/jax/core/compile/backend_compile_duration":
            compiled.append(
                str(kw.get("fun_name")).removeprefix("jit(").removesuffix(")")
            )  # "jit(decode)"

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        engine = JaxEngine(
            tiny.model, tiny.tokenizer, config=FIXED, stop_token_ids=(), decode_chunk=4
        )

        def counts():
            return {name: getattr(engine, attr)[name] for name, attr in STEP_COUNTS.items() if attr}

        shapes = engine.program_shapes()
        assert sorted(shapes) == sorted(
            [("prefill_packed", 32, 3, 96), ("decode_chunk", 8, 96), ("copy_rows", 8)]
        )
        before, compiled[:] = counts(), []
        engine.warmup()
        warm = counts()
        assert {k: warm[k] - before[k] for k in warm} == {
            "prefill_packed": 1,
            "decode_chunk": 1,
            "decode": 0,
        }
        assert sorted(n for n in compiled if n in STEP_COUNTS) == sorted(s[0] for s in shapes)
        compiled[:] = []

        async def traffic(seed):
            rng = np.random.default_rng(seed)
            prompts = [
                [int(x) for x in rng.integers(3, 500, size=int(n))]
                for n in rng.integers(1, 80, size=10)
            ]
            params = [
                SamplingParams(temperature=1.0, max_tokens=int(m), seed=i)
                for i, m in enumerate(rng.integers(1, 9, 10))
            ]
            with engine.paused():
                futs = [
                    asyncio.ensure_future(engine.generate(p, q, session_id=f"{seed}-{i}"))
                    for i, (p, q) in enumerate(zip(prompts, params))
                ]
                futs += [
                    asyncio.ensure_future(engine.generate(prompts[0], GREEDY)) for _ in range(4)
                ]  # a group
                await asyncio.sleep(0)
            done = await asyncio.gather(*futs)
            await asyncio.gather(
                *(
                    engine.generate(p + list(c.token_ids) + [5], q, session_id=f"{seed}-{i}")
                    for i, (p, q, c) in enumerate(zip(prompts, params, done))
                )
            )

        async def go():
            await traffic(1)
            after_one = (counts(), list(compiled))
            await traffic(2)
            await engine.close()
            return after_one

        (after_one, compiled_one) = asyncio.run(go())
        assert engine.stats["shared_prefill_tokens"] > 0 and engine.stats["reused_tokens"] > 0
        assert after_one == warm and counts() == warm
        assert compiled_one == [] and compiled == []
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)


def test_the_presets_use_the_fixed_set():
    from gymllm.train.train_config import preset

    for name in ("default", "tiny"):
        cfg = preset(name).engine
        assert cfg.shapes == "fixed" and cfg.piggyback_tokens == 0


def test_a_failing_packed_call_fails_only_the_requests_in_it(lm):
    """Budget 32: the first call holds the 10-token prompt whole and the head of the 40-token one, the
    second the rest of it; the second call raises: the long request fails, the short one is served."""
    from gymllm.inference.request import RequestFailed

    short, long_ = PROMPTS[1][:10], PROMPTS[5][:40]
    want, _ = serve(lm, BUCKETS, lambda e: e.generate(short, GREEDY))

    async def scenario(engine):
        real, calls = engine._steps.prefill_packed, []

        def flaky(*args, **kw):
            calls.append(1)
            if len(calls) == 2:
                raise RuntimeError("injected")
            return real(*args, **kw)

        engine._steps.prefill_packed = flaky
        with engine.paused():
            futs = [asyncio.ensure_future(engine.generate(p, GREEDY)) for p in (short, long_)]
            await asyncio.sleep(0)
        got = await asyncio.gather(*futs, return_exceptions=True)
        engine._steps.prefill_packed = real
        again = await engine.generate(long_, GREEDY)  # the engine still serves
        return got, again, len(calls)

    (got, again, n), _ = serve(lm, FIXED, scenario)
    assert n == 2
    same([got[0]], [want])
    assert isinstance(got[1], RequestFailed) and "injected" in str(got[1])
    assert "in prefill_packed (tokens 32, segments" in str(got[1])  # the call that raised, named
    assert len(again.token_ids) == GREEDY.max_tokens
