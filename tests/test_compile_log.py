"""Compiles are visible (``gymllm.telemetry.compiles``): every XLA compile recorded with its program, seconds,
kind (program or eager op) and whether the persistent cache supplied it; spans on the trace's "compile"
track; one process-wide listener shared by every active log, across threads; the pipeline figures and the
biggest stall that count compile time; the report's compile line."""

from __future__ import annotations

import json
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gymllm.telemetry import Tracer, use_tracer
from gymllm.telemetry.compiles import (
    COMPILE_TRACK,
    CompileLog,
    CompileRecord,
    read_compiles,
    summarize,
    summary_line,
)
from gymllm.telemetry.metrics import biggest_stall, pipeline_metrics
from gymllm.telemetry.report import write_report
from gymllm.telemetry.sinks import MetricsLogger
from gymllm.utils.compile_cache import persistent_compile_cache


def _fresh_program(scale: float):
    """A jit of a new function (a compile of its own every time), written here: a "program"."""

    def scaled_tanh_sum(x):
        return jnp.tanh(x * scale).sum(axis=0)

    return jax.jit(scaled_tanh_sum)


def test_programs_and_eager_ops_are_told_apart_and_counted(tmp_path):
    x = np.ones((32, 16), np.float32)
    with use_tracer(Tracer()) as tr, CompileLog(tmp_path / "compiles.jsonl") as log:
        _fresh_program(0.5)(x).block_until_ready()
        jax.lax.convert_element_type(
            jnp.asarray(np.arange(7)), np.float16
        ).block_until_ready()  # an eager primitive
        jnp.maximum(
            jnp.asarray(np.arange(5.0)), 2.0
        ).block_until_ready()  # a jax.numpy function run eagerly
    prog = [r for r in log.records if r.kind == "program"]
    assert [r.name for r in prog] == ["jit(scaled_tanh_sum)"] and prog[0].in_bytes == x.nbytes
    ops = {r.name for r in log.records if r.kind == "op"}
    assert {"jit(convert_element_type)", "jit(maximum)"} <= ops
    assert all(r.seconds > 0 and not r.cache_hit and r.thread == "MainThread" for r in log.records)
    assert (
        log.counts() == {"jit(scaled_tanh_sum)": 1} and log.counts(kind=None)["jit(maximum)"] == 1
    )
    s = log.summary()
    assert (
        s["programs"] == 1 and s["programs_all"] == len(log.records) and s["programs_loaded"] == 0
    )
    assert s["compile_s"] == pytest.approx(sum(r.seconds for r in log.records))
    assert s["compile_s_programs"] == pytest.approx(prog[0].seconds)
    # one span per compile on the "compile" track, with the record's tags; and the file holds the same records
    spans = [e for e in tr.events() if e["track"] == COMPILE_TRACK]
    assert [(e["name"], e["args"]["kind"]) for e in spans] == [
        (r.name, r.kind) for r in log.records
    ]
    assert [e["dur"] for e in spans] == pytest.approx(
        [r.seconds * 1e6 for r in log.records], rel=1e-6
    )
    assert read_compiles(tmp_path / "compiles.jsonl") == [r.to_json() for r in log.records]


def test_a_cache_load_is_told_from_a_compile(tmp_path):
    x = np.ones((8, 8), np.float32)
    with persistent_compile_cache(str(tmp_path / "xla")), CompileLog(trace=False) as log:
        _fresh_program(2.0)(x).block_until_ready()
        jax.clear_caches()  # gone from memory: the next call goes through the persistent cache
        _fresh_program(2.0)(x).block_until_ready()
    first, second = [r for r in log.records if r.kind == "program"]
    assert (first.cache_hit, second.cache_hit) == (False, True)
    assert first.key is not None and first.key == second.key  # stored, then loaded, under one key
    s = log.summary()
    assert (s["programs"], s["programs_loaded"]) == (1, 1) and s["load_s"] >= second.seconds
    with CompileLog(trace=False) as off:  # cache off: no key, no hit
        _fresh_program(3.0)(x).block_until_ready()
    assert [(r.cache_hit, r.key) for r in off.records if r.kind == "program"] == [(False, None)]


def test_one_listener_serves_every_active_log_and_every_thread():
    a, b = CompileLog(trace=False).start(), CompileLog(trace=False).start()
    a.start()  # idempotent
    try:
        worker = threading.Thread(
            target=lambda: _fresh_program(4.0)(np.ones(3, np.float32)), name="compiler-thread"
        )
        worker.start()
        worker.join()
        b.stop()
        _fresh_program(5.0)(np.ones(3, np.float32))
    finally:
        a.stop()
    assert [(r.name, r.thread) for r in a.records if r.kind == "program"] == [
        ("jit(scaled_tanh_sum)", "compiler-thread"),
        ("jit(scaled_tanh_sum)", "MainThread"),
    ]
    assert [r.thread for r in b.records if r.kind == "program"] == [
        "compiler-thread"
    ]  # stopped: no more
    assert (
        not a.active and not b.active
    )  # (one record per compile above: the listener is registered once)


def test_two_active_logs_put_one_span_per_compile_in_one_tracer():
    # a run's log beside another active log (e.g. one a caller left running) must not double the trace
    tr, other = Tracer(), Tracer()
    a, b, c = (
        CompileLog(tracer=tr).start(),
        CompileLog(tracer=tr).start(),
        CompileLog(tracer=other).start(),
    )
    try:
        _fresh_program(6.0)(np.ones(3, np.float32))
    finally:
        a.stop(), b.stop(), c.stop()
    names = [r.name for r in a.records]
    assert names and names == [r.name for r in b.records] == [r.name for r in c.records]
    spans = lambda t: sorted(e["name"] for e in t.events() if e["track"] == COMPILE_TRACK)  # noqa: E731
    assert spans(tr) == sorted(names) and spans(other) == sorted(names)  # once each, in each tracer


def _rec(name: str, seconds: float, hit: bool = False, kind: str = "program") -> CompileRecord:
    return CompileRecord(name=name, seconds=seconds, cache_hit=hit, kind=kind, end=0.0)


def test_summary_figures_and_line():
    recs = [
        _rec("jit(prefill)", 3.0),
        _rec("jit(prefill)", 1.0),
        _rec("jit(grad)", 0.5, hit=True),
        _rec("jit(maximum)", 0.25, kind="op"),
    ]
    s = summarize(recs)
    assert (
        s["programs"],
        s["programs_loaded"],
        s["programs_distinct"],
        s["programs_all"],
        s["loaded_all"],
    ) == (2, 1, 2, 3, 1)
    assert (s["compile_s"], s["compile_s_programs"], s["load_s"]) == (4.75, 4.5, 0.5)
    assert s["slowest"] == ("jit(prefill)", 3.0) and s["by_name"]["jit(prefill)"] == {
        "n": 2,
        "s": 4.0,
        "hits": 0,
        "kind": "program",
    }
    assert (
        summarize([r.to_json() for r in recs]) == s
    )  # the JSON records read back give the same figures
    line = summary_line(s, share=0.25)
    assert line.startswith(
        "compile: 4.8 s (25% of the run's wall had a compile under way); 2 program compile(s) "
        "(2 distinct), 1 loaded from the persistent cache; 4 compiles in all"
    )


def _span(name: str, track: str, ts: float, dur: float) -> dict:
    return {"name": name, "ph": "X", "ts": ts, "dur": dur, "track": track, "args": {}}


def test_compile_time_is_its_own_stall_and_not_blamed_on_generation():
    # 10 s: the engine compiles during 0-6 s while the trainer waits; then it trains 6-7 s, then waits 7-10 s
    s = 1e6
    events = [
        _span("jit(prefill)", COMPILE_TRACK, 0, 6 * s),
        _span("prefill", "engine", 0, 6.5 * s),
        _span("decode", "engine", 6.5 * s, 3.5 * s),
        _span("train_step", "trainer", 6 * s, 1 * s),
        _span("jit(grad)", COMPILE_TRACK, 6 * s, 0.5 * s),
    ]
    m = pipeline_metrics(events)
    assert m["compile_fraction"] == pytest.approx(0.65)
    assert m["trainer_idle_fraction"] == pytest.approx(0.9)
    assert m["trainer_idle_compile_fraction"] == pytest.approx(
        0.6
    )  # idle 0-6 s under a compile; 7-10 s not
    name, frac, advice = biggest_stall(m)
    assert (name, frac) == ("compile", pytest.approx(0.65)) and "persistent compile cache" in advice
    steady = pipeline_metrics(
        events, window=(7 * s, 10 * s)
    )  # no compile here: the trainer starves on rollouts
    assert steady["compile_fraction"] == 0.0 and steady["trainer_idle_compile_fraction"] == 0.0
    name, frac, advice = biggest_stall(steady)
    assert (
        name == "trainer idle (waiting for rollouts)"
        and frac == pytest.approx(1.0)
        and "compiles excluded" in advice
    )
    untraced = pipeline_metrics([_span("decode", "engine", 0, s)])
    assert (
        untraced["compile_fraction"] is None and untraced["trainer_idle_compile_fraction"] is None
    )


def test_report_counts_compiles_from_the_run_or_its_trace(tmp_path):
    with use_tracer(Tracer()) as tr, CompileLog(tmp_path / "a" / "compiles.jsonl") as log:
        logger = MetricsLogger(tmp_path / "a", console=False, tensorboard=False)
        _fresh_program(6.0)(np.ones(4, np.float32))
        tr.add_span("train_step", 0.001, track="trainer")
        logger.log(1, {"reward_mean": 0.5})
        logger.close()
    write_report(tmp_path / "a")
    text = (tmp_path / "a" / "summary.txt").read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("compile: "))
    assert (
        "1 program compile(s) (1 distinct), 0 loaded" in line
        and "slowest jit(scaled_tanh_sum)" in line
    )
    assert "compile" in [
        ln.split()[0] for ln in text.splitlines() if ln.strip()
    ]  # the pipeline table's row
    (tmp_path / "a" / "compiles.jsonl").unlink()  # the trace's "compile" spans give the same line
    write_report(tmp_path / "a")
    assert line in (tmp_path / "a" / "summary.txt").read_text().splitlines()
    assert log.counts() == {"jit(scaled_tanh_sum)": 1}


def test_the_viewer_shows_the_runs_compile_figures(tmp_path):
    from gymllm.viewer.runs import ViewedRun

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("{}")
    assert (
        ViewedRun(run, "run").overview()["compiles"] is None
    )  # no compiles.jsonl: nothing claimed
    recs = [
        _rec("jit(prefill)", 3.0),
        _rec("jit(grad)", 0.5, hit=True),
        _rec("jit(maximum)", 0.25, kind="op"),
    ]
    (run / "compiles.jsonl").write_text(
        "".join(json.dumps(r.to_json()) + "\n" for r in recs) + '{"name": "torn'
    )
    shown = ViewedRun(run, "run").overview()["compiles"]
    assert shown == {k: v for k, v in summarize(recs).items() if k != "by_name"}
    assert (shown["programs"], shown["programs_loaded"], shown["programs_all"]) == (1, 1, 2)


def test_a_run_whose_setup_fails_leaves_no_log_recording(tmp_path):
    # setup starts the run's compile log before building the parts; no close() follows a failed setup, so a
    # log left active would record (and write) every later compile of the process
    import dataclasses

    from gymllm.train.run import Run
    from gymllm.train.train_config import preset
    from gymllm.telemetry.compiles import active_logs

    cfg = preset("tiny")
    cfg = dataclasses.replace(
        cfg,
        env=dataclasses.replace(cfg.env, id="gymllm/NoSuchEnv-v0", kwargs={}),
        run=dataclasses.replace(cfg.run, run_dir=str(tmp_path / "run")),
    )
    before = active_logs()
    run = Run(cfg, None)
    try:
        with pytest.raises(Exception, match="NoSuchEnv"):
            run.setup()
    finally:
        run.components.close()  # as train() does after a failed setup
    assert not run.compiles.active and active_logs() == before
