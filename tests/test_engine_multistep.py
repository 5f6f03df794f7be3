"""Multi-token decode (``JaxEngine(decode_chunk=K)``): the same completions as single decode steps.

Two engines over one tiny model, one stepping token by token and one running up to 8 steps per
device call, get the same seeded requests (sampled and greedy, different max_tokens, stop token ids,
stop strings, prompts that run into the context limit); every token, logprob, version and finish
reason must agree. A weight update waits for the end of a chunk, so each token still carries the
version of the forward that produced it.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from gymllm.inference import EngineConfig, JaxEngine, SamplingParams
from gymllm.models import make_tiny

CFG = EngineConfig(num_slots=8, max_len=64, min_bucket=64, max_prefill_batch=4, decode_lengths=2)


@pytest.fixture(scope="module")
def lm():
    return make_tiny(
        "qwen3", seed=3, vocab_size=300, hidden_size=32, intermediate_size=64, num_layers=2
    )


@pytest.fixture(scope="module")
def engines(lm):
    single = JaxEngine.from_loaded(lm, config=CFG)
    chunked = JaxEngine.from_loaded(lm, config=CFG, decode_chunk=8)
    chunked.warmup()
    yield single, chunked
    single.shutdown()
    chunked.shutdown()


def requests(lm, n: int = 12, seed: int = 0):
    rng = np.random.default_rng(seed)
    stop_ids = tuple(lm.tokenizer.stop_token_ids)
    out = []
    for i in range(n):
        prompt = [int(t) for t in rng.integers(3, 290, int(rng.integers(3, 40)))]
        if i % 5 == 4:
            prompt = [int(t) for t in rng.integers(3, 290, 58)]  # hits the 64-token context first
        params = SamplingParams(
            temperature=0.0 if i % 4 == 0 else 1.0,
            max_tokens=int(rng.integers(1, 20)),
            seed=int(rng.integers(0, 2**31)),
            stop_token_ids=(int(rng.integers(3, 290)),) * (i % 3 == 1) + stop_ids,
            stop=["e"] if i % 6 == 2 else [],
        )
        out.append((prompt, params))
    return out


async def run_all(engine, reqs):
    return await asyncio.gather(*(engine.generate(p, sp) for p, sp in reqs))


def test_chunked_decode_equals_single_steps(lm, engines):
    single, chunked = engines
    reqs = requests(lm)
    a = asyncio.run(run_all(single, reqs))
    b = asyncio.run(run_all(chunked, reqs))
    for x, y in zip(a, b):
        assert list(x.token_ids) == list(y.token_ids)
        assert x.finish_reason == y.finish_reason and x.stop_reason == y.stop_reason
        assert list(x.versions) == list(y.versions)
        np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-5)
    reasons = {c.finish_reason for c in b}
    assert reasons == {"length", "stop"}  # both endings exercised
    assert chunked.stats["generated_tokens"] == sum(len(c.token_ids) for c in b)


def test_rows_that_end_inside_a_chunk_keep_exactly_single_steps_tokens(lm, engines):
    """Every request fits in the rows at once, so chunks run 8 steps; each one's stop id or stop string
    is taken from its own greedy reply, so it ends part-way through a chunk (a stop id, a stop string,
    its budget), while the other rows go on."""
    single, chunked = engines
    prompts = [[5 + i, 40 + 3 * i, 7, 90 - i] for i in range(6)]
    free = [(p, SamplingParams(temperature=0.0, max_tokens=30)) for p in prompts]
    greedy = asyncio.run(run_all(single, free))
    tail = lambda c, i: lm.tokenizer.decode([int(c.token_ids[i])])  # noqa: E731
    reqs = []
    for i, (p, c) in enumerate(zip(prompts, greedy)):
        at = 4 + i  # 1 token from the prefill, then a chunk of 8: steps 3..8 fall inside it
        if i % 3 == 0:
            reqs.append(
                (
                    p,
                    SamplingParams(
                        temperature=0.0, max_tokens=30, stop_token_ids=(int(c.token_ids[at]),)
                    ),
                )
            )
        elif i % 3 == 1 and tail(c, at).strip():
            reqs.append(
                (p, SamplingParams(temperature=0.0, max_tokens=30, stop=[tail(c, at).strip()]))
            )
        else:
            reqs.append((p, SamplingParams(temperature=1.0, max_tokens=at + 1, seed=i)))
    calls = []
    real = chunked._steps.decode_k

    def counting(*args):
        calls.append(int(args[11]))
        return real(*args)

    a = asyncio.run(run_all(single, reqs))
    chunked._steps.decode_k = counting
    try:
        b = asyncio.run(run_all(chunked, reqs))
    finally:
        chunked._steps.decode_k = real
    assert max(calls) == 8  # multi-step chunks ran
    for x, y in zip(a, b):
        assert list(x.token_ids) == list(y.token_ids)
        assert (x.finish_reason, x.stop_reason) == (y.finish_reason, y.stop_reason)
        np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-5)
    ended = [len(c.token_ids) for c in b]
    assert len(set(ended)) > 2 and max(ended) < 30  # rows ended at different steps, none ran out
    assert {type(c.stop_reason) for c in b if c.finish_reason == "stop"} == {int, str}
    assert any(c.finish_reason == "length" for c in b)


def test_chunks_run_several_steps_per_call_and_never_recompile(lm, engines):
    _, chunked = engines
    before = dict(chunked.chunk_trace_counts)
    calls = []
    real = chunked._steps.decode_k

    def counting(*args):
        calls.append(int(args[11]))  # n: the steps asked for
        return real(*args)

    chunked._steps.decode_k = counting
    try:
        out = asyncio.run(
            run_all(chunked, [([5, 6, 7], SamplingParams(temperature=1.0, max_tokens=17, seed=1))])
        )
    finally:
        chunked._steps.decode_k = real
    assert len(out[0].token_ids) <= 17
    assert (
        max(calls) == 8 and len(calls) <= 3
    )  # 16 tokens after the prefill's first: two chunks of 8
    assert chunked.chunk_trace_counts == before


def test_weight_update_lands_between_chunks_with_per_token_versions(lm, engines):
    _, chunked = engines
    from flax import nnx

    state = nnx.state(lm.model)
    old = chunked.version

    async def main():
        task = asyncio.ensure_future(
            chunked.generate([9, 8, 7], SamplingParams(temperature=1.0, max_tokens=40, seed=2))
        )
        await asyncio.sleep(0)
        chunked.update_weights(state, old + 1)
        return await task

    v = list(asyncio.run(main()).versions)
    assert v == sorted(v) and set(v) <= {old, old + 1} and len(v) == 40
