"""Engine scheduling on a real tiny model: piggybacked prefill (``EngineConfig.piggyback_tokens``: prompts
that arrive while other rows decode ride along the decode step), checked against the same engine
without it; and row compaction (the tail of a batch decodes in the narrowest width), checked against
each request run alone."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest

from gymllm.errors import ConfigError
from gymllm.inference import EngineConfig, JaxEngine, SamplingParams
from gymllm.models import make_tiny
from gymllm.telemetry import get_tracer

# tests/test_engine.py's engine shapes (compiled programs are shared within a test run) plus piggybacking
CFG = EngineConfig(
    num_slots=12,
    max_len=64,
    min_bucket=64,
    max_prefill_batch=2,
    decode_lengths=2,
    piggyback_tokens=64,
)


@pytest.fixture(scope="module")
def lm():
    return make_tiny("llama")


@pytest.fixture(scope="module")
def engines(lm):
    on = JaxEngine.from_loaded(lm, config=CFG, stop_token_ids=())
    off = JaxEngine.from_loaded(
        lm, config=dataclasses.replace(CFG, piggyback_tokens=0), stop_token_ids=()
    )
    on.warmup()
    off.warmup()
    yield on, off
    on.shutdown()
    off.shutdown()


def prompts(n: int, seed: int, lo: int = 3, hi: int = 40) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [list(map(int, rng.integers(3, 500, size=int(rng.integers(lo, hi))))) for _ in range(n)]


async def staggered(engine, ps, params, gap_s: float = 0.01):
    """Requests arriving one after another while earlier ones decode."""

    async def one(i, p, sp):
        await asyncio.sleep(i * gap_s)
        return await engine.generate(p, sp)

    return await asyncio.gather(*(one(i, p, sp) for i, (p, sp) in enumerate(zip(ps, params))))


async def held(engine, ps, params):
    """Every request queued while the engine is paused, then released together: the first 12 fill the
    rows and prefill; each later one is admitted when rows free up while others still decode, so it
    rides along a decode step (forced, not left to the thread's timing)."""
    with engine.paused():
        tasks = [asyncio.ensure_future(engine.generate(p, sp)) for p, sp in zip(ps, params)]
        await asyncio.sleep(0)  # each task runs up to its await: every request is queued
        assert all(not t.done() for t in tasks)
    return await asyncio.gather(*tasks)


def _mixed_spans(cursor):
    return [
        e
        for e in get_tracer().events_since(cursor)
        if e["name"] == "decode" and "prefill" in e.get("args", {})
    ]


def test_riding_requests_get_their_solo_tokens_and_logprobs(engines):
    """Greedy: 16 requests on 12 slots, queued while the engine is paused (the last four ride along as rows free) get
    exactly the tokens they get alone, and logprobs equal to the engine without piggybacking."""
    on, off = engines
    lengths = (
        40,
        17,
        5,
        24,
        2,
        11,
        8,
        6,
        19,
        4,
        9,
        2,
        14,
        7,
        21,
        3,
    )  # the first decodes while others arrive
    ps = prompts(len(lengths), seed=3, hi=60)
    params = [SamplingParams(temperature=0.0, max_tokens=m) for m in lengths]
    cursor = get_tracer().cursor()
    mixed = asyncio.run(held(on, ps, params))
    assert _mixed_spans(cursor)  # the check can fail: nothing rode along
    plain = asyncio.run(held(off, ps, params))
    for m, p, sp in zip(mixed, plain, params):
        assert (
            m.token_ids.tolist() == p.token_ids.tolist()
            and m.finish_reason == p.finish_reason == "length"
        )
        np.testing.assert_allclose(m.logprobs, p.logprobs, atol=1e-4)


def test_seeded_sampling_matches_the_engine_without_piggybacking(engines):
    """Temperature 1 with seeds: a riding request's first token uses the same key as a prefilled one's."""
    on, off = engines
    ps = prompts(10, seed=8)
    params = [
        SamplingParams(temperature=1.0, max_tokens=40 if i == 0 else 12, seed=100 + i)
        for i in range(len(ps))
    ]
    a, b = asyncio.run(staggered(on, ps, params)), asyncio.run(staggered(off, ps, params))
    same = sum(x.token_ids.tolist() == y.token_ids.tolist() for x, y in zip(a, b))
    assert same >= len(ps) - 1  # float rounding may flip one draw at a CDF boundary, not more


def test_a_reused_prefix_rides_along(engines, lm):
    """A session's next turn (prefix cached in its row) rides along while another row decodes: it prefills
    only its new tokens and samples what a fresh engine samples for the whole prompt."""
    on, off = engines
    first = prompts(1, seed=21, lo=10, hi=11)[0]
    other = prompts(1, seed=22, lo=3, hi=4)[0]

    async def turns(engine):
        c1 = await engine.generate(
            first, SamplingParams(temperature=0.0, max_tokens=4), session_id="s"
        )
        nxt = first + c1.token_ids.tolist() + [7, 8, 9]
        long_run = engine.stream(other, SamplingParams(temperature=0.0, max_tokens=55))
        with engine.paused():  # forced: the next turn arrives while the long run's row decodes
            head = asyncio.ensure_future(long_run.__anext__())
            await asyncio.sleep(0)
            await asyncio.to_thread(
                engine.run_iterations, 1
            )  # its prefill: the row decodes from now on
            await head
            second = asyncio.ensure_future(
                engine.generate(nxt, SamplingParams(temperature=0.0, max_tokens=6), session_id="s")
            )
            await asyncio.sleep(0)
        c2 = await second
        async for _ in long_run:
            pass
        engine.end_session("s")
        return nxt, c2

    cursor = get_tracer().cursor()
    nxt, c2 = asyncio.run(turns(on))
    assert (
        c2.cached_prompt_len == len(first) + 3
    )  # prompt + 4 sampled, the last one not yet fed back
    assert _mixed_spans(cursor)
    fresh = asyncio.run(off.generate(nxt, SamplingParams(temperature=0.0, max_tokens=6)))
    assert c2.token_ids.tolist() == fresh.token_ids.tolist()


def test_no_recompiles_after_warmup_and_config_checked(engines):
    on, _ = engines
    before = dict(on.mixed_trace_counts), dict(on.trace_counts)
    asyncio.run(
        staggered(
            on,
            prompts(9, seed=41, lo=2, hi=63),
            [SamplingParams(temperature=0.7, max_tokens=5)] * 9,
        )
    )
    assert (dict(on.mixed_trace_counts), dict(on.trace_counts)) == before
    assert before[0]["mixed"] <= len(on.widths) * len(on.lengths) * 1  # one bucket (64) rides along
    with pytest.raises(ConfigError, match="piggyback_tokens"):
        EngineConfig(piggyback_tokens=-1)


def test_compaction_narrows_the_tail_and_keeps_every_request_s_tokens(engines):
    """12 requests fill every row; the long ones sit in the high rows. Once the short ones finish, the
    long ones are moved down and decode 8 rows wide, with exactly the tokens they get alone."""
    _, off = engines
    ps = prompts(12, seed=31, lo=3, hi=8)
    params = [SamplingParams(temperature=0.0, max_tokens=30 if i >= 9 else 3) for i in range(12)]
    cursor = get_tracer().cursor()
    together = asyncio.run(staggered(off, ps, params, gap_s=0.0))
    events = get_tracer().events_since(cursor)
    moved = [e for e in events if e["name"] == "compact"]
    assert moved and sum(e["args"]["rows"] for e in moved) >= 1
    after = [
        e["args"]["width"] for e in events if e["name"] == "decode" and e["ts"] > moved[0]["ts"]
    ]
    assert after and set(after) == {off.widths[0]}  # the check can fail: the tail stays 12 wide
    alone = [asyncio.run(off.generate(p, sp)) for p, sp in zip(ps, params)]
    for a, b in zip(together, alone):
        assert a.token_ids.tolist() == b.token_ids.tolist()
    assert off._admission.table.num_free == 12 and not off._rows.active


def test_a_busy_high_row_trades_places_with_a_pinned_row_and_every_session_keeps_its_prefix(
    engines, lm
):
    """12 sessions pin every row; then only the session in the highest row decodes (the others wait, as
    trajectories waiting on tools do). Compaction swaps it into a low row (the waiting session's prefix
    moves up), so it decodes 8 rows wide; afterwards every session's next turn still reuses its whole
    prefix and samples what an engine without compaction samples."""
    _, off = engines
    static = JaxEngine.from_loaded(
        lm, config=dataclasses.replace(off.config, compact_rows=False), stop_token_ids=()
    )
    static.warmup()
    ps = prompts(12, seed=51, lo=3, hi=9)

    async def episode(engine):
        sp = SamplingParams(temperature=0.0, max_tokens=2)
        first = await asyncio.gather(
            *(engine.generate(p, sp, session_id=f"s{i}") for i, p in enumerate(ps))
        )
        assert engine._admission.table.sessions == {
            f"s{i}": i for i in range(12)
        }  # one pinned row per session
        nxt = [p + c.token_ids.tolist() + [5, 6] for p, c in zip(ps, first)]
        cursor = get_tracer().cursor()
        long = await engine.generate(
            nxt[11], SamplingParams(temperature=0.0, max_tokens=24), session_id="s11"
        )
        events = get_tracer().events_since(cursor)
        second = await asyncio.gather(
            *(engine.generate(n, sp, session_id=f"s{i}") for i, n in enumerate(nxt[:11]))
        )
        return events, [long, *second], nxt

    try:
        events, comps, nxt = asyncio.run(episode(off))
        _, plain, _ = asyncio.run(episode(static))
    finally:
        static.shutdown()
    assert [e["args"]["rows"] for e in events if e["name"] == "compact"] == [1]
    widths = [e["args"]["width"] for e in events if e["name"] == "decode"]
    assert (
        widths[-1] == 8 and widths.count(12) <= 1
    )  # the check can fail: without the swap it stays 12 wide
    assert off._admission.table.sessions["s11"] < 8
    for c, p, n in zip(comps, plain, [nxt[11], *nxt[:11]]):
        assert (
            c.cached_prompt_len == len(n) - 3
        )  # all but the last sampled id and the 2 new ones, wherever the row is
        assert c.token_ids.tolist() == p.token_ids.tolist()
