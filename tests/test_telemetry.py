"""Tracer: nesting, exceptions, asyncio cancellation, decorators, threads, bounded memory; trace export."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gymllm.errors import ConfigError
from gymllm.telemetry import Tracer, current_span_id, get_tracer, set_tracer, span, use_tracer
from gymllm.telemetry.export import assign_lanes, load_chrome_trace, to_chrome_trace


@pytest.fixture
def tracer():
    with use_tracer() as tr:
        yield tr


def by_name(tr: Tracer) -> dict[str, dict]:
    return {e["name"]: e for e in tr.events() if e["ph"] == "X"}


def contains(outer: dict, inner: dict) -> bool:
    return (
        outer["ts"] <= inner["ts"]
        and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"] + 1e-3
    )


def test_spans_nest_and_close_in_order(tracer):
    with span("outer", track="trainer", step=1) as tags:
        tags["tokens"] = 5
        with span("inner", track="trainer"):
            time.sleep(0.001)
        assert current_span_id() is not None
    assert current_span_id() is None
    ev = by_name(tracer)
    assert ev["inner"]["parent"] == ev["outer"]["id"] and ev["outer"]["parent"] is None
    assert contains(ev["outer"], ev["inner"])
    assert ev["inner"]["dur"] >= 1000  # µs
    assert ev["outer"]["args"] == {"step": 1, "tokens": 5}
    # closed in order: inner appended first
    assert [e["name"] for e in tracer.events()] == ["inner", "outer"]


def test_span_records_exception_and_reraises(tracer):
    with pytest.raises(KeyError):
        with span("outer"):
            with span("inner"):
                raise KeyError("x")
    ev = by_name(tracer)
    assert ev["inner"]["args"]["error"] == "KeyError" and ev["outer"]["args"]["error"] == "KeyError"
    assert current_span_id() is None


def test_asyncio_cancellation_closes_spans_and_keeps_task_local_nesting(tracer):
    started = []

    async def worker(i: int):
        with span("rollout", track="rollout", trajectory=i):
            with span("generate", track="rollout", trajectory=i):
                started.append(i)
                await asyncio.sleep(10 if i == 0 else 0.01)

    async def main():
        tasks = [asyncio.create_task(worker(i)) for i in range(3)]
        while len(started) < 3:
            await asyncio.sleep(0)
        await asyncio.sleep(0.05)
        tasks[0].cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(results[0], asyncio.CancelledError)
        assert current_span_id() is None

    asyncio.run(main())
    spans = [e for e in tracer.events() if e["ph"] == "X"]
    assert len(spans) == 6  # every span closed exactly once
    for i in range(3):
        (outer,) = [e for e in spans if e["name"] == "rollout" and e["args"]["trajectory"] == i]
        (inner,) = [e for e in spans if e["name"] == "generate" and e["args"]["trajectory"] == i]
        assert inner["parent"] == outer["id"]  # not the span of another, interleaved task
        assert contains(outer, inner)
        assert ("error" in inner["args"]) == (i == 0)
    cancelled = [e for e in spans if e["args"].get("trajectory") == 0]
    assert {e["args"]["error"] for e in cancelled} == {"CancelledError"}


def test_decorators_sync_and_async_fresh_span_per_call(tracer):
    @span("env_step", track="env/0", env=0)
    def step(x):
        with span("reward", track="env/0") as t:
            t["x"] = x
        return x + 1

    @span("tool", track="tool")
    async def call_tool(x):
        await asyncio.sleep(0)
        if x < 0:
            raise ValueError("negative")
        return 2 * x

    assert step(1) == 2 and step(2) == 3
    assert asyncio.run(call_tool(3)) == 6
    with pytest.raises(ValueError):
        asyncio.run(call_tool(-1))
    steps = [e for e in tracer.events() if e["name"] == "env_step"]
    rewards = [e for e in tracer.events() if e["name"] == "reward"]
    assert len(steps) == 2 and len({e["id"] for e in steps}) == 2
    assert [r["parent"] for r in rewards] == [s["id"] for s in steps]
    assert all(e["args"] == {"env": 0} for e in steps)  # decorator tags are not shared/mutated
    tools = [e for e in tracer.events() if e["name"] == "tool"]
    assert [e["args"].get("error") for e in tools] == [None, "ValueError"]


def test_module_span_uses_tracer_set_later():
    @span("late", track="main")
    def f():
        return 1

    before = get_tracer()
    with use_tracer() as tr:
        f()
    assert [e["name"] for e in tr.events()] == ["late"]
    assert get_tracer() is before  # put back


def test_use_tracer_puts_the_previous_one_back_on_an_exception():
    before = get_tracer()
    with pytest.raises(RuntimeError), use_tracer(Tracer(capacity=10)) as tr:
        assert get_tracer() is tr
        raise RuntimeError("boom")
    assert get_tracer() is before


def test_threads_append_safely_with_distinct_ids(tracer):
    n_threads, per = 6, 500
    barrier = threading.Barrier(n_threads)

    def work(k):
        barrier.wait()
        for i in range(per):
            with span("env_step", track=f"env/{k}", i=i):
                pass
            tracer.increment("steps", 1, track="env")
        barrier.wait()  # all alive together, so their thread idents are distinct

    threads = [threading.Thread(target=work, args=(k,)) for k in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    spans = [e for e in tracer.events() if e["ph"] == "X"]
    assert len(spans) == n_threads * per
    assert len({e["id"] for e in spans}) == n_threads * per
    assert len({e["seq"] for e in tracer.events()}) == len(tracer.events())
    assert len({e["thread"] for e in spans}) == n_threads
    assert all(e["parent"] is None for e in spans)  # no cross-thread parent leak
    totals = [e["args"]["steps"] for e in tracer.events() if e["ph"] == "C"]
    assert max(totals) == n_threads * per


def test_ring_buffer_is_bounded_and_spill_keeps_everything(tmp_path):
    tr = Tracer(capacity=100)
    for i in range(1000):
        with tr.span("s", i=i):
            pass
    assert len(tr.events()) <= 100 and tr.dropped == 1000 - len(tr.events())
    assert tr.events()[-1]["args"]["i"] == 999

    tr2 = Tracer(capacity=100, spill_path=tmp_path / "spill.jsonl")
    for i in range(1000):
        with tr2.span("s", i=i):
            pass
        tr2.counter("c", i)
    assert len(tr2.events()) <= 100
    everything = tr2.all_events()
    assert [e["args"]["i"] for e in everything if e["ph"] == "X"] == list(range(1000))
    assert [e["args"]["c"] for e in everything if e["ph"] == "C"] == list(range(1000))


def test_disabled_tracer_records_nothing_and_bad_capacity_is_explained():
    tr = Tracer(enabled=False)
    with tr.span("x") as tags:
        tags["a"] = 1
    tr.counter("c", 1)
    assert tr.events() == []
    with pytest.raises(ConfigError, match="capacity"):
        Tracer(capacity=0)


def test_events_since_cursor(tracer):
    with span("a"):
        pass
    cur = tracer.cursor()
    with span("b"):
        pass
    tracer.counter("c", 1)
    assert [e["name"] for e in tracer.events_since(cur)] == ["b", "c"]
    assert tracer.events_since(tracer.cursor()) == []


# ------------------------------------------------------------------------------------ export


def _laminar(spans: list[dict]) -> bool:
    for a in spans:
        for b in spans:
            if a is b:
                continue
            a0, a1, b0, b1 = a["ts"], a["ts"] + a["dur"], b["ts"], b["ts"] + b["dur"]
            disjoint = a1 <= b0 + 1e-3 or b1 <= a0 + 1e-3
            nested = (a0 <= b0 and b1 <= a1 + 1e-3) or (b0 <= a0 and a1 <= b1 + 1e-3)
            if not (disjoint or nested):
                return False
    return True


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 20)), min_size=1, max_size=25))
def test_assign_lanes_gives_properly_nested_lanes(intervals):
    spans = [{"ts": float(s), "dur": float(d)} for s, d in intervals]
    lanes = assign_lanes(spans)
    assert len(lanes) == len(spans)
    for lane in set(lanes):
        assert _laminar([s for s, ln in zip(spans, lanes) if ln == lane])
    # a laminar set needs exactly one lane
    if _laminar(spans):
        assert set(lanes) == {0}


def _pipeline_run(tr: Tracer) -> None:
    """A small real schedule: async rollouts with env steps in worker threads, an engine thread, a trainer."""

    def env_step(env_id: int) -> None:
        with span("env_step", track=f"env/{env_id}", env=env_id):
            time.sleep(0.002)

    async def rollout(i: int) -> None:
        with span("rollout", track="rollout", trajectory=i):
            for _ in range(2):
                with span("generate", track="rollout", trajectory=i):
                    await asyncio.sleep(0.003)
                await asyncio.to_thread(env_step, i % 2)
            if i == 1:
                with span("tool", track="tool", name="calculator"):
                    await asyncio.sleep(0.002)

    def engine(stop: threading.Event) -> None:
        while not stop.is_set():
            with span("decode", track="engine", tokens=4):
                time.sleep(0.001)

    async def main():
        stop = threading.Event()
        th = threading.Thread(target=engine, args=(stop,))
        th.start()
        await asyncio.gather(*(rollout(i) for i in range(4)))
        tr.counter("queue_depth", 1, track="rollout")
        with span("train_step", track="trainer", step=0, tokens=32, staleness={0: 32}):
            for _ in range(2):
                with span("micro_batch", track="trainer"):
                    time.sleep(0.002)
        with span("weight_sync", track="trainer", version=1):
            time.sleep(0.001)
        stop.set()
        th.join()

    asyncio.run(main())


def test_exported_trace_round_trips_tracks_durations_and_metadata(tracer, tmp_path):
    _pipeline_run(tracer)
    for path in (tmp_path / "trace.json", tmp_path / "trace.json.gz"):
        out = tracer.export_chrome_trace(path)
        loaded = load_chrome_trace(out)
        mine = sorted(
            (e["track"], e["name"], round(e["ts"], 3), round(e["dur"], 3))
            for e in tracer.events()
            if e["ph"] == "X"
        )
        back = sorted(
            (e["track"], e["name"], round(e["ts"], 3), round(e["dur"], 3))
            for e in loaded
            if e["ph"] == "X"
        )
        assert mine == back
        assert [e for e in loaded if e["ph"] == "C"] == [
            {
                "name": "queue_depth",
                "ph": "C",
                "ts": pytest.approx(e["ts"]),
                "track": "rollout",
                "args": {"queue_depth": 1},
            }
            for e in tracer.events()
            if e["ph"] == "C"
        ]
    events = json.load(open(tmp_path / "trace.json"))["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"
    }
    assert set(procs.values()) == {"engine", "trainer", "rollout", "env", "tool"}
    assert {"engine", "trainer", "rollout", "env/0", "env/1", "tool"} <= set(threads.values())
    xs = [e for e in events if e["ph"] == "X"]
    assert all((e["pid"], e["tid"]) in threads for e in xs)  # every span is on a named thread
    assert all(procs[e["pid"]] == e["cat"].split("/")[0] for e in xs)
    assert all(e["ts"] >= 0 and e["dur"] >= 0 for e in xs)
    # concurrent rollouts get extra lanes, and each lane (tid) is properly nested
    assert any(name.startswith("rollout #") for name in threads.values())
    for key in threads:
        assert _laminar([e for e in xs if (e["pid"], e["tid"]) == key])


def test_to_chrome_trace_handles_numpy_and_nan_tags(tmp_path):
    import numpy as np

    tr = Tracer()
    with tr.span("x", track="trainer", loss=np.float32(1.5), bad=float("nan"), arr=np.arange(3)):
        pass
    path = tr.export_chrome_trace(tmp_path / "t.json")
    (ev,) = [e for e in load_chrome_trace(path) if e["ph"] == "X"]
    assert ev["args"] == {"loss": 1.5, "bad": None, "arr": [0, 1, 2]}
    assert to_chrome_trace([])["traceEvents"] == []


def test_global_tracer_api_still_works():
    assert isinstance(get_tracer(), Tracer)


def test_async_with_and_generator_functions_refused(tracer):
    async def main():
        async with span("queue_wait", track="rollout") as tags:
            tags["depth"] = 2
            await asyncio.sleep(0)

    asyncio.run(main())
    assert [(e["name"], e["args"]) for e in tracer.events()] == [("queue_wait", {"depth": 2})]
    with pytest.raises(TypeError, match="generator function"):

        @span("gen")
        def gen():
            yield 1


def test_counters_with_non_numeric_levels_are_left_out_of_the_trace(tmp_path):
    import numpy as np

    tr = Tracer()
    for v in (1, True, np.int64(3), float("nan"), None, "high", 2.5):
        tr.counter("level", v, track="engine")
    loaded = load_chrome_trace(tr.export_chrome_trace(tmp_path / "t.json"))
    assert [e["args"]["level"] for e in loaded] == [1, 1, 3, 2.5]


class Boom(Exception):
    pass


_trees = st.recursive(
    st.just(()), lambda kids: st.lists(kids, max_size=3).map(tuple), max_leaves=10
)


@settings(max_examples=25, deadline=None)
@given(_trees, st.data())
def test_random_span_trees_under_tasks_errors_and_cancellation(tree, data):
    """Any tree of spans run as nested asyncio tasks (sequential or concurrent children, some
    raising, some cancelled while suspended) records every span once, with the right parent, inside
    its parent's interval, and with the right error tag."""
    paths: list[str] = []

    def walk(node, path):
        paths.append(path)
        for i, child in enumerate(node):
            walk(child, f"{path}.{i}")

    walk(tree, "r")
    fate = {
        p: data.draw(st.sampled_from(["ok", "ok", "raise", "hang"]), label=p) for p in paths[1:]
    }
    fate["r"] = "ok"
    concurrent = {p: data.draw(st.booleans(), label=f"{p} concurrent") for p in paths}

    async def run(node, path):
        with span(path, track="rollout"):
            await asyncio.sleep(0)
            calls = [guarded(child, f"{path}.{i}") for i, child in enumerate(node)]
            if concurrent[path]:
                await asyncio.gather(*calls)
            else:
                for c in calls:
                    await c
            if fate[path] == "raise":
                raise Boom(path)
            if fate[path] == "hang":
                reached[path].set()
                await asyncio.sleep(10)

    async def guarded(node, path):
        task = asyncio.ensure_future(run(node, path))  # its own task, like a rollout
        if fate[path] == "hang":
            await reached[path].wait()
            task.cancel()
        try:
            await task
        except (Boom, asyncio.CancelledError):
            pass

    reached = {p: asyncio.Event() for p in paths}

    tr = Tracer()
    previous = set_tracer(tr)
    try:
        asyncio.run(run(tree, "r"))
    finally:
        set_tracer(previous)
    spans = {e["name"]: e for e in tr.events()}
    assert sorted(spans) == sorted(paths) and len(tr.events()) == len(paths)
    for p in paths:
        ev = spans[p]
        parent = p.rpartition(".")[0]
        assert ev["parent"] == (spans[parent]["id"] if parent else None)
        if parent:
            assert contains(spans[parent], ev)
        assert (
            ev["args"].get("error")
            == {"ok": None, "raise": "Boom", "hang": "CancelledError"}[fate[p]]
        )
