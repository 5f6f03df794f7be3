"""JaxEngine on a real tiny model (gymllm.models.make_tiny), checked against the trainer's full forward.

One engine (12 slots, context 64, one length bucket, prefill batches 1/2, decode widths 8/12 x cache
lengths 32/64) is shared by the module and warmed up once, so the file compiles six engine shapes (CPU
compiles dominate the run time);
reference forwards are padded to the context length so they compile once. Async code runs under
asyncio.run.
"""

from __future__ import annotations

import asyncio

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gymllm.errors import EngineError
from gymllm.inference import Completion, Engine, EngineConfig, JaxEngine, SamplingParams
from gymllm.inference.request import RequestFailed
from gymllm.inference.jit_steps import make_steps
from gymllm.models import make_tiny, token_logprobs
from gymllm.telemetry import get_tracer

from accel import tolerance

# float32 comparisons against the trainer's forward: full-precision matmuls on an accelerator too
pytestmark = pytest.mark.highest_precision

# decode widths 8 and 12 x cache lengths 32 and 64
CFG = EngineConfig(num_slots=12, max_len=64, min_bucket=64, max_prefill_batch=2, decode_lengths=2)


@pytest.fixture(scope="module")
def lm():
    return make_tiny("llama")


#: the traces the module engine's warm-up itself made: engines over equal model graphs share their
#: step programs and trace counters (``make_steps`` is cached per graph), so an engine an earlier
#: test module built over the same tiny model has already counted its own
WARMUP_TRACES: dict[str, int] = {}


@pytest.fixture(scope="module")
def engine(lm):
    eng = JaxEngine.from_loaded(lm, config=CFG, stop_token_ids=())  # lengths set by max_tokens only
    shared = dict(eng.trace_counts)
    eng.warmup()
    WARMUP_TRACES.update({k: v - shared.get(k, 0) for k, v in eng.trace_counts.items()})
    yield eng
    eng.shutdown()


def prompts(n: int, seed: int = 0, lo: int = 3, hi: int = 40) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [list(map(int, rng.integers(3, 500, size=int(rng.integers(lo, hi))))) for _ in range(n)]


def full_logprobs(
    model, prompt: list[int], completion: Completion, temperature: float
) -> np.ndarray:
    """The trainer's view: token_logprobs of the sampled ids from one forward over prompt ++ sampled
    (right-padded to the context length: causal attention makes the pad invisible)."""
    ids = prompt + [int(t) for t in completion.token_ids]
    padded = np.zeros((1, CFG.max_len), np.int32)
    padded[0, : len(ids)] = ids
    logits, _ = model(jnp.asarray(padded), jnp.arange(CFG.max_len)[None])
    targets = np.zeros((1, CFG.max_len), np.int32)
    targets[0, : len(ids) - 1] = ids[1:]
    lp = np.asarray(token_logprobs(logits, jnp.asarray(targets), temperature))[0]
    return lp[len(prompt) - 1 : len(ids) - 1]


def run(coro):
    return asyncio.run(coro)


async def gather(engine, ps, params, **kw):
    return await asyncio.gather(*(engine.generate(p, params, **kw) for p in ps))


# ------------------------------------------------------------------ device steps
def test_cached_prefill_and_decode_equal_full_forward(lm):
    """Prefill in two chunks (the prefix-reuse path) into row 1 beside a padding row, then decode
    attending over the first 32 cache slots: every greedy token and its logprob equal the full
    forward's argmax and log-softmax. Shapes are the module engine's (12 rows x 64, bucket 64,
    prefill batch 2, decode length 32), so the compiled steps are shared."""
    model = lm.model
    graphdef, state = nnx.split(model)
    prefill, decode, _ = make_steps(graphdef)
    rows, length, scratch = CFG.num_slots, CFG.max_len, CFG.max_len - 1
    cache = model.init_cache(rows, length)
    ids = prompts(1, seed=3, lo=12, hi=13)[0]
    z = lambda n, dt=np.int32: np.zeros(n, dt)  # noqa: E731
    greedy = (
        np.zeros((2, 2), np.uint32),
        z(2),
        np.zeros(2, np.float32),
        z(2),
        np.ones(2, np.float32),
    )

    def chunk(start: int, stop: int, bucket: int = 64):
        t = np.zeros((2, bucket), np.int32)
        t[0, : stop - start] = ids[start:stop]
        pos = np.minimum(start + np.arange(bucket), scratch)[None].repeat(2, 0).astype(np.int32)
        return (
            t,
            pos,
            np.array([1, rows], np.int32),
            np.array([stop - start - 1, 0], np.int32),
        )  # row `rows` = pad

    cache, _, _ = prefill(state, cache, *chunk(0, 7), *greedy)
    cache, tok, lp = prefill(state, cache, *chunk(7, 12), *greedy)
    seq, lps = ids + [int(tok[0])], [float(lp[0])]
    for _ in range(6):
        toks = np.zeros(rows, np.int32)
        toks[1] = seq[-1]
        pos = np.full(rows, scratch, np.int32)  # idle rows write only to the scratch index
        pos[1] = len(seq) - 1
        cache, tok, lp = decode(
            state,
            cache,
            toks,
            pos,
            np.zeros((rows, 2), np.uint32),
            z(rows),
            np.zeros(rows, np.float32),
            z(rows),
            np.ones(rows, np.float32),
            32,
        )  # slots [0, 32)
        seq.append(int(tok[1]))
        lps.append(float(lp[1]))
    padded = np.zeros((1, length), np.int32)
    padded[0, : len(seq)] = seq
    logits, _ = model(jnp.asarray(padded), jnp.arange(length)[None])
    ref = jax.nn.log_softmax(logits[0, len(ids) - 1 : len(seq) - 1], axis=-1)  # [7, V]
    np.testing.assert_array_equal(np.asarray(jnp.argmax(ref, -1)), seq[len(ids) :])
    np.testing.assert_allclose(lps, np.asarray(ref.max(-1)), **tolerance("reference"))
    others = np.asarray(cache.k)[
        :, [r for r in range(rows) if r != 1], :scratch
    ]  # nothing written below scratch
    assert np.abs(others).max() == 0.0


# ------------------------------------------------------------------ sampler == trainer
@pytest.mark.parametrize("temperature", [0.6, 1.0, 1.2])
def test_engine_logprobs_equal_trainer_logprobs(engine, lm, temperature):
    ps = prompts(6, seed=int(temperature * 10))
    comps = run(gather(engine, ps, SamplingParams(temperature=temperature, max_tokens=20, seed=1)))
    diffs = np.concatenate(
        [c.logprobs - full_logprobs(lm.model, p, c, temperature) for p, c in zip(ps, comps)]
    )
    assert abs(diffs.mean()) < 1e-3 and np.quantile(np.abs(diffs), 0.99) < 5e-2
    if temperature != 1.0:  # the check can fail: logprobs without the temperature are far off
        wrong = np.concatenate(
            [c.logprobs - full_logprobs(lm.model, p, c, 1.0) for p, c in zip(ps, comps)]
        )
        assert np.abs(wrong).mean() > 1e-2


# ------------------------------------------------------------------ continuous batching
def test_continuous_batching_gives_each_request_its_solo_tokens(engine):
    lengths = (3, 17, 5, 24, 2, 11, 8, 6, 19, 4, 9, 2, 14, 7, 21, 3)
    ps = prompts(len(lengths), seed=11)
    params = [SamplingParams(temperature=0.0, max_tokens=m) for m in lengths]

    async def together():  # 16 requests on 12 slots: requests join and leave, the decode width changes
        return await asyncio.gather(*(engine.generate(p, sp) for p, sp in zip(ps, params)))

    async def alone():
        return [await engine.generate(p, sp) for p, sp in zip(ps, params)]

    batched, solo = run(together()), run(alone())
    for b, s, sp in zip(batched, solo, params):
        assert b.token_ids.tolist() == s.token_ids.tolist()
        assert b.num_tokens == sp.max_tokens and b.finish_reason == "length"
        assert set(b.versions.tolist()) == {engine.version}


def test_seeds_reproduce_and_fresh_keys_differ(engine):
    p = prompts(1, seed=5)[0]
    sp = SamplingParams(temperature=1.0, max_tokens=12)
    a, b = run(gather(engine, [p, p], sp.replace(seed=123)))
    assert a.token_ids.tolist() == b.token_ids.tolist()
    group = run(gather(engine, [p] * 4, sp))  # no seed: a fresh key per request
    assert len({tuple(c.token_ids.tolist()) for c in group}) == 4
    many = run(engine.generate_n(p, sp.replace(n=3, seed=9)))
    again = run(engine.generate_n(p, sp.replace(n=3, seed=9)))
    assert len({tuple(c.token_ids.tolist()) for c in many}) == 3
    assert [c.token_ids.tolist() for c in many] == [c.token_ids.tolist() for c in again]


# ------------------------------------------------------------------ stopping
def test_stop_token_ids_and_stop_strings(engine, lm):
    p = prompts(1, seed=21)[0]
    base = run(engine.generate(p, SamplingParams(temperature=0.0, max_tokens=16)))
    ref = base.token_ids.tolist()
    stop_id = ref[5]
    c = run(
        engine.generate(
            p, SamplingParams(temperature=0.0, max_tokens=16, stop_token_ids=(stop_id,))
        )
    )
    cut = ref.index(stop_id) + 1
    assert (
        c.token_ids.tolist() == ref[:cut] and c.finish_reason == "stop" and c.stop_reason == stop_id
    )

    text = lm.tokenizer.decode(ref)
    needle = next(
        text[i : i + 3] for i in range(len(text) // 2, len(text)) if text[i : i + 3].strip()
    )
    c = run(engine.generate(p, SamplingParams(temperature=0.0, max_tokens=16, stop=(needle,))))
    assert c.finish_reason == "stop" and c.stop_reason == needle
    assert c.token_ids.tolist() == ref[: c.num_tokens] and needle in c.text
    assert needle not in lm.tokenizer.decode(
        c.token_ids[:-1].tolist()
    )  # stops at the first token completing it


def test_max_tokens_and_context_limit(engine):
    c = run(engine.generate(prompts(1)[0], SamplingParams(temperature=1.0, max_tokens=7)))
    assert c.num_tokens == 7 and c.finish_reason == "length"
    long_prompt = prompts(1, lo=60, hi=61)[0]
    c = run(engine.generate(long_prompt, SamplingParams(max_tokens=50)))
    assert c.num_tokens == CFG.max_len - 60 and c.finish_reason == "length"


def test_default_stop_ids_come_from_the_tokenizer(lm):
    eng = JaxEngine.from_loaded(lm, config=CFG)
    try:
        assert eng.default_stop_ids == set(lm.tokenizer.stop_token_ids)
    finally:
        eng.shutdown()


# ------------------------------------------------------------------ prefix reuse
def test_session_prefix_reuse_skips_the_cached_prefix(engine, lm):
    p1 = prompts(1, seed=31, lo=20, hi=21)[0]
    sp = SamplingParams(temperature=1.0, max_tokens=8, seed=4)
    t1 = run(engine.generate(p1, sp, session_id="traj-1"))
    p2 = (
        p1 + t1.token_ids.tolist() + [17, 18, 19]
    )  # next turn: previous prompt ++ sampled ++ observation
    before = engine.stats["prefill_tokens"]
    t2 = run(engine.generate(p2, sp, session_id="traj-1"))
    assert (
        t2.cached_prompt_len == len(p1) + t1.num_tokens - 1
    )  # the last sampled id was never fed back
    assert engine.stats["prefill_tokens"] - before == len(p2) - t2.cached_prompt_len
    diff = t2.logprobs - full_logprobs(lm.model, p2, t2, 1.0)  # reuse is exact
    assert np.abs(diff).max() < tolerance("logprob")["atol"]
    engine.end_session("traj-1")


def test_prefill_reads_only_the_smallest_length_covering_the_reused_prefix(engine, lm):
    """A fresh prompt's prefill reads no cached slot (length 0); a next turn reusing 35 tokens reads the
    first 64 (32 does not cover its start) and stays exact; a turn reusing 26 reads the first 32."""
    tracer = get_tracer()
    sp = SamplingParams(temperature=1.0, max_tokens=6, seed=5)
    for first, want in ((30, 64), (21, 32)):
        p1 = prompts(1, seed=first, lo=first, hi=first + 1)[0]
        cursor = tracer.cursor()
        t1 = run(engine.generate(p1, sp, session_id="traj-len"))
        p2 = p1 + t1.token_ids.tolist() + [21, 22]
        t2 = run(engine.generate(p2, sp, session_id="traj-len"))
        engine.end_session("traj-len")
        spans = [e["args"] for e in tracer.events_since(cursor) if e["name"] == "prefill"]
        assert [a["length"] for a in spans] == [0, want]
        assert t2.cached_prompt_len == first + 5 and want >= t2.cached_prompt_len
        diff = t2.logprobs - full_logprobs(
            lm.model, p2, t2, 1.0
        )  # reading the reused prefix is exact
        assert np.abs(diff).max() < tolerance("logprob")["atol"]


# ------------------------------------------------------------------ errors, cancel, compile
def test_bad_requests_raise_clear_errors_and_engine_keeps_serving(engine):
    async def main():
        for bad in ([], list(range(1, 70)), [1, 2, 10_000], [1.5, 2.0], "abc", [[1, 2]]):
            with pytest.raises(EngineError, match="prompt_ids: expected"):
                await engine.generate(bad, SamplingParams())
        with pytest.raises(EngineError, match="generate_n"):
            await engine.generate([1, 2], SamplingParams(n=2))
        return await engine.generate([1, 2, 3], SamplingParams(max_tokens=3))

    assert run(main()).num_tokens == 3


def test_cancelled_request_frees_its_slot(engine):
    async def main():
        with engine.paused():  # forced: the request is mid-generation when it is cancelled
            task = asyncio.create_task(engine.generate([5, 6, 7], SamplingParams(max_tokens=60)))
            await asyncio.sleep(0)
            await asyncio.to_thread(engine.run_iterations, 2)  # its prefill and one decode step
            assert not task.done()
            task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(200):
            if engine._admission.table.num_free == CFG.num_slots:
                break
            await asyncio.sleep(0.01)
        return engine._admission.table.num_free

    assert run(main()) == CFG.num_slots


def test_no_recompiles_after_warmup(engine):
    before = dict(engine.trace_counts)
    ps = prompts(9, seed=41, lo=2, hi=63)
    run(gather(engine, ps, SamplingParams(temperature=0.7, top_k=5, top_p=0.9, max_tokens=3)))
    assert engine.trace_counts == before
    assert WARMUP_TRACES["prefill"] <= len(engine.buckets) * len(engine.batch_sizes) * len(
        engine.prefill_lengths
    )
    assert WARMUP_TRACES["decode"] <= len(engine.widths) * len(engine.lengths)
    tracer = get_tracer()
    cursor = tracer.cursor()
    run(
        engine.generate([1, 2, 3], SamplingParams(max_tokens=4))
    )  # alone: lowest row, narrowest step
    spans = [e for e in tracer.events_since(cursor) if e["name"] in ("prefill", "decode")]
    assert {e["track"] for e in spans} == {"engine"} and {e["name"] for e in spans} == {
        "prefill",
        "decode",
    }
    widths = {e["args"]["width"] for e in spans if e["name"] == "decode"}
    assert widths == {engine.widths[0]} and engine.widths == (8, 12)
    lengths = {
        e["args"]["length"] for e in spans if e["name"] == "decode"
    }  # positions < 32: the short cache
    assert lengths == {engine.lengths[0]} and engine.lengths == (32, 64)
    assert isinstance(engine, Engine)


# ------------------------------------------------------------------ weights
def test_weight_update_mid_generation(engine, lm):
    new = make_tiny("llama", seed=1)
    p = prompts(1, seed=51, lo=6, hi=7)[0]
    sp = SamplingParams(temperature=0.0, max_tokens=50)
    old_version = engine.version

    async def main():
        tokens = 0
        final = None
        async for item in engine.stream(p, sp):
            if isinstance(item, Completion):
                final = item
                break
            tokens += 1
            if tokens == 2:
                engine.update_weights(nnx.state(new.model), old_version + 1)
        after = await engine.generate(p, sp)
        return final, after

    try:
        during, after = run(main())
        v = during.versions
        assert np.all(np.diff(v) >= 0) and v[0] == old_version and v[-1] == old_version + 1
        assert set(after.versions.tolist()) == {old_version + 1}
        diff = after.logprobs - full_logprobs(new.model, p, after, 1.0)  # new weights, new tokens
        assert np.abs(diff).max() < tolerance("logprob")["atol"]
        with pytest.raises(EngineError, match="update_weights"):
            engine.update_weights({"w": np.zeros(3)}, 9)
    finally:
        engine.update_weights(nnx.state(lm.model), old_version + 2)


def test_close_aborts_waiting_and_running_requests(lm):
    eng = JaxEngine.from_loaded(lm, config=CFG, stop_token_ids=())

    async def main():
        sp = SamplingParams(max_tokens=60)
        first = eng.stream([1, 2, 3], sp)
        await first.__anext__()  # the engine is decoding
        with (
            eng.paused()
        ):  # forced: 13 more requests wait while the first one runs, then the engine closes
            tasks = [
                asyncio.create_task(eng.generate(p, sp)) for p in prompts(13, seed=61, lo=4, hi=8)
            ]
            await asyncio.sleep(0)
            await asyncio.to_thread(
                eng.run_iterations, 1
            )  # 11 of them take the free rows, two still wait
            await eng.close()
        await eng.close()  # idempotent
        done = await asyncio.gather(*tasks)
        with pytest.raises(EngineError, match="closed"):
            await eng.generate([1, 2], SamplingParams())
        return done

    done = run(main())
    reasons = [c.finish_reason for c in done]
    assert set(reasons) <= {"abort", "length"} and reasons.count("abort") >= 2


def test_a_failing_step_fails_only_its_requests_and_the_engine_keeps_serving(engine):
    # Fault injection (a device step that raises cannot be provoked on purpose with valid inputs):
    # the next decode call raises once, after deleting the donated cache as a real failure might.
    real = engine._steps.decode
    calls = {"n": 0}

    def flaky(state, cache, *args):
        calls["n"] += 1
        if calls["n"] == 1:
            for leaf in jax.tree.leaves(cache):
                leaf.delete()
            raise RuntimeError("injected device failure")
        return real(state, cache, *args)

    async def main():
        engine._steps.decode = flaky
        try:
            # the error names the call that raised: its program and shape
            with pytest.raises(
                RequestFailed,
                match=r"in decode \(active 1, width \d+, length \d+\): .*injected device failure",
            ):
                await engine.generate([1, 2, 3], SamplingParams(max_tokens=5))
        finally:
            engine._steps.decode = real
        return await engine.generate([1, 2, 3], SamplingParams(temperature=0.0, max_tokens=5))

    after = run(main())
    assert after.num_tokens == 5 and engine._admission.table.num_free == CFG.num_slots


# ------------------------------------------------------------------ compute dtype
def test_close_frees_the_caches_device_memory_and_keeps_the_weights(lm):
    """A closed engine's KV cache is deleted on the device at once (not when the engine is collected);
    the weights, which a learner may share, stay."""
    eng = JaxEngine.from_loaded(lm, config=CFG, stop_token_ids=())
    run(eng.generate([1, 2, 3], SamplingParams(max_tokens=2)))
    cache = jax.tree.leaves(eng._steps.cache)
    assert cache and not any(x.is_deleted() for x in cache)
    run(eng.close())
    assert all(x.is_deleted() for x in cache)
    assert not any(x.is_deleted() for x in jax.tree.leaves(eng._steps.weights.state))


def test_bf16_compute_dtype_keeps_greedy_batching_exact_and_logprobs_close(lm):
    """compute_dtype="bfloat16": the engine's weights and KV cache are bf16 (the caller's model is untouched), a
    request's greedy tokens do not depend on what else is batched, and logprobs stay within bf16
    rounding of the float32 trainer's."""
    cfg = EngineConfig(
        num_slots=8,
        max_len=64,
        min_bucket=64,
        max_prefill_batch=1,
        decode_lengths=1,
        compute_dtype="bfloat16",
    )
    eng = JaxEngine.from_loaded(lm, config=cfg, stop_token_ids=())
    try:
        # bf16 weights (stored as their uint16 bit patterns on CPU, decoded per layer by the forward)
        stored = jnp.uint16 if jax.default_backend() == "cpu" else jnp.bfloat16
        assert {leaf.dtype for leaf in jax.tree.leaves(eng._weights.state)} == {jnp.dtype(stored)}
        assert {leaf.dtype for leaf in jax.tree.leaves(eng._steps.cache)} == {
            jnp.dtype(stored)
        }  # k/v too
        assert lm.model.dtype == jnp.float32
        ps = prompts(8, seed=71)
        sp = SamplingParams(temperature=0.0, max_tokens=12)

        async def together():
            return await gather(eng, ps, sp)

        async def alone():
            return [await eng.generate(p, sp) for p in ps]

        batched, solo = run(together()), run(alone())
        assert [c.token_ids.tolist() for c in batched] == [c.token_ids.tolist() for c in solo]
        diffs = np.concatenate(
            [c.logprobs - full_logprobs(lm.model, p, c, 1.0) for p, c in zip(ps, batched)]
        )
        assert np.abs(diffs).mean() < 0.02 and np.abs(diffs).max() < 0.1  # measured: 0.005 and 0.02
    finally:
        eng.shutdown()
