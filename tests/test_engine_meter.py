"""Engine busy is measured once: MeteredEngine records each call as a span, and its busy_fraction, the
step's pipeline figure and the report all read those spans through telemetry.metrics.busy_fraction.

The engine is a stand-in (an asyncio engine whose calls finish when the test says), so the interleaving
is forced: no assertion rests on timing beyond "the spans the tracer recorded"."""

from __future__ import annotations

import asyncio

import pytest

from gymllm.rollout.engine_meter import TRACK, MeteredEngine
from gymllm.telemetry import span, use_tracer
from gymllm.telemetry.metrics import busy_fraction, pipeline_metrics, union_length


class GatedEngine:
    """A stand-in engine: each generate waits for its own gate (the test opens them in a chosen order)."""

    version = 3

    def __init__(self):
        self.gates: dict[str, asyncio.Event] = {}

    async def generate(self, prompt_ids, params, *, session_id=None):
        gate = self.gates.setdefault(session_id, asyncio.Event())
        await gate.wait()
        return f"done {session_id}"


class FakeClock:
    """The tracer's clock, moved by the test (so every fraction below is exact, not a timing)."""

    def __init__(self):
        self.ns = 1_000_000_000

    def perf_counter_ns(self) -> int:
        return self.ns

    def time(self) -> float:
        return self.ns / 1e9

    def advance_us(self, us: float) -> None:
        self.ns += int(us * 1000)


def test_calls_become_engine_spans_and_the_fraction_is_their_union(monkeypatch):
    import gymllm.telemetry.tracer as tracer_module

    clock = FakeClock()
    monkeypatch.setattr(tracer_module, "time", clock)

    async def main(tr):
        eng = MeteredEngine(GatedEngine())
        a = asyncio.create_task(eng.generate([1], None, session_id="a"))
        b = asyncio.create_task(eng.generate([1], None, session_id="b"))
        await asyncio.sleep(0)
        assert eng.inflight == 2 and eng.max_inflight == 2
        clock.advance_us(1000)
        open_fraction = (
            eng.busy_fraction()
        )  # both in flight since the clock start: counted up to now
        clock.advance_us(1000)
        eng.engine.gates["a"].set()
        assert await a == "done a"
        clock.advance_us(1000)  # b still in flight
        eng.engine.gates["b"].set()
        await b
        clock.advance_us(1000)  # idle
        return eng, open_fraction

    with use_tracer() as tr:
        eng, open_fraction = asyncio.run(main(tr))
        got = eng.busy_fraction()
        events = tr.events()
    calls = [e for e in events if e["track"] == TRACK]
    assert (
        [e["args"]["session"] for e in calls] == ["a", "b"] and eng.calls == 2 and eng.inflight == 0
    )
    assert open_fraction == pytest.approx(1.0)
    assert [e["dur"] for e in calls] == pytest.approx([2000, 3000])
    lo, hi = (
        eng.started_us,
        calls[-1]["ts"] + calls[-1]["dur"],
    )  # the union is the span of b (a lies inside it)
    expected = union_length((e["ts"], e["ts"] + e["dur"]) for e in calls)
    assert (
        busy_fraction(events, "engine", window=(lo, hi))
        == pytest.approx(expected / (hi - lo))
        == pytest.approx(1.0)
    )
    assert got == pytest.approx(0.75)  # 3 ms busy, then 1 ms idle after b
    assert eng.version == 3


def test_device_spans_inside_a_call_count_once_in_every_reader():
    async def main():
        eng = MeteredEngine(GatedEngine())
        t = asyncio.create_task(eng.generate([1], None, session_id="s"))
        await asyncio.sleep(0)
        with span("decode", track="engine", tokens=4):  # the engine's own span, inside the call
            await asyncio.sleep(0.002)
        eng.engine.gates["s"].set()
        await t
        return eng

    with use_tracer() as tr:
        _engine = asyncio.run(main())  # held until the events are read
        events = tr.events()
    call = next(e for e in events if e["track"] == TRACK)
    window = (call["ts"], call["ts"] + call["dur"])
    assert busy_fraction(events, "engine", window=window) == pytest.approx(
        1.0
    )  # not 1 + decode's share
    assert pipeline_metrics(events, window=window)["engine_busy_fraction"] == pytest.approx(1.0)
    assert busy_fraction(events, "trainer") is None  # never traced: unknown, not idle


def test_a_disabled_tracer_reads_zero_not_an_error():
    from gymllm.telemetry import Tracer

    async def main():
        eng = MeteredEngine(GatedEngine())
        eng.engine.gates["x"] = asyncio.Event()
        eng.engine.gates["x"].set()
        await eng.generate([1], None, session_id="x")
        return eng

    with use_tracer(Tracer(enabled=False)):
        eng = asyncio.run(main())
        assert eng.busy_fraction() == 0.0 and eng.calls == 1


def test_incremental_reads_give_the_union_of_every_engine_span():
    """busy_fraction settles busy time as it goes (reading only new events per call); after many calls
    read in between, the busy time it reports is still the union of every engine span, as
    telemetry.metrics computes it from the whole trace."""

    async def main(tr):
        eng = MeteredEngine(GatedEngine())
        for round_ in range(6):
            tasks = [
                asyncio.create_task(eng.generate([1], None, session_id=f"{round_}/{k}"))
                for k in range(3)
            ]
            await asyncio.sleep(0)
            eng.busy_fraction()  # read while calls are in flight
            with span("decode", track="engine", tokens=3):
                await asyncio.sleep(0.001)
            for k in (2, 0, 1):  # out of order
                eng.engine.gates[f"{round_}/{k}"].set()
                await asyncio.sleep(0)
            await asyncio.gather(*tasks)
            with span("prefill", track="engine"):  # a device span outside any call
                pass
            eng.busy_fraction()
            await asyncio.sleep(0.001)  # idle between rounds
        return eng

    with use_tracer() as tr:
        eng = asyncio.run(main(tr))
        before = tr.now_us()
        got = eng.busy_fraction()
        after = tr.now_us()
        events = tr.events()
    spans = [
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e["ph"] == "X" and e["track"].startswith("engine")
    ]
    reference = union_length(spans)
    assert got * (before - eng.started_us) <= reference * (1 + 1e-9) + 1e-6
    assert reference <= got * (after - eng.started_us) * (1 + 1e-9) + 1e-6
    assert len([e for e in events if e["track"] == TRACK]) == 18
