"""A second identical run compiles nothing: two runs of the tiny preset in one fresh persistent-cache
directory, the second after JAX's in-memory caches are cleared (as a new process starts), every program
of the second loaded from the cache, counted by :class:`gymllm.telemetry.compiles.CompileLog`; and what
the run itself records about its compiles (``compiles.jsonl``, ``compile_s`` per step, the trace's
"compile" track, the summary's compile line).

The runs use ``run.warmup`` and an engine narrowed to one shape of each step (one prefill bucket and
batch size, one decode width and cache length, no row copies): without a warm-up the engine compiles
the shapes its requests happen to need, which depends on their timing (measured: an unwarmed second
tiny run compiled a prefill and a row-copy shape the first never used), and a full warm-up of the
tiny preset compiles 40 programs (over 2 minutes here; ``benchmarks/compile.py --preset tiny``)."""

from __future__ import annotations

import collections
import dataclasses
import json

import jax
import pytest

from gymllm.telemetry.compiles import COMPILE_TRACK, CompileLog, read_compiles, summarize
from gymllm.telemetry.export import load_chrome_trace


def _tiny(run_dir, cache, report: bool):
    from gymllm.train.train_config import RunSection, preset

    cfg = preset("tiny")
    r = dataclasses.replace
    return r(
        cfg,
        env=r(cfg.env, num_envs=8),
        rollout=r(cfg.rollout, max_concurrency=8),
        engine=r(
            cfg.engine,
            num_slots=8,
            max_prefill_batch=1,
            decode_lengths=1,
            compact_rows=False,
            share_prompt_prefill=False,
        ),
        learner=r(cfg.learner, num_steps=1, groups_per_step=2, micro_batch_size=16, min_bucket=64),
        run=RunSection(
            run_dir=str(run_dir),
            console=False,
            report=report,
            checkpoint_every=0,
            compile_cache=str(cache),
            warmup=True,
        ),
    )


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    from gymllm.train.trainer import train

    tmp = tmp_path_factory.mktemp("rerun")
    cache, logs = tmp / "xla", []
    for i in range(2):
        jax.clear_caches()  # nothing compiled stays in memory: the second run starts as a new process would
        with CompileLog(trace=False) as log:
            result = train(_tiny(tmp / f"run{i}", cache, report=i == 1))
        assert result.steps == 1
        # what `gymllm train` prints counts the run's own compiles (its log started in setup, as ours did before)
        assert (
            result.compiles["programs"] == log.summary()["programs"]
            and "\ncompile: " in result.summary()
        )
        logs.append(log)
    return tmp, logs


def test_the_second_run_loads_every_program_from_the_cache(two_runs):
    _, (cold, warm) = two_runs
    cold_s, warm_s = cold.summary(), warm.summary()
    assert cold_s["programs"] >= 4 and cold_s["programs_loaded"] == 0, (
        cold_s
    )  # prefill, decode, grad, update
    assert warm_s["programs"] == 0, warm.counts(cache_hit=False)  # no model program compiled again
    assert warm.counts(cache_hit=True) == cold.counts(cache_hit=False)  # each one loaded instead
    assert warm_s["compile_s"] < cold_s["compile_s"]
    # every compile of the first run was stored (JAX's 1 s / entry-size thresholds lowered), eager ops too,
    # and every program was loaded under the key it was stored under
    assert all(c.key is not None for c in cold.records), [
        c.name for c in cold.records if c.key is None
    ]
    keys = lambda log: sorted(c.key for c in log.records if c.kind == "program")  # noqa: E731
    assert keys(warm) == keys(cold)


def test_the_run_puts_the_process_settings_back(two_runs):
    import jax

    from gymllm.utils.compile_cache import JAX_DEFAULTS

    tmp, _ = two_runs
    assert jax.config.jax_compilation_cache_dir != str(tmp / "xla")
    assert {k: getattr(jax.config, k) for k in JAX_DEFAULTS} == JAX_DEFAULTS


def test_the_run_records_its_compiles(two_runs):
    tmp, (cold, _) = two_runs
    recs = read_compiles(tmp / "run0" / "compiles.jsonl")
    assert [(r["name"], r["cache_hit"], r["kind"]) for r in recs] == [
        (c.name, c.cache_hit, c.kind) for c in cold.records
    ]
    assert summarize(recs)["programs"] == cold.summary()["programs"]
    step = json.loads((tmp / "run0" / "metrics.jsonl").read_text().splitlines()[-1])
    assert step["compiles"] == len(recs) and step["compile_s"] == pytest.approx(
        sum(r["seconds"] for r in recs)
    )
    trace = [
        e for e in load_chrome_trace(tmp / "run0" / "trace.json") if e.get("track") == COMPILE_TRACK
    ]
    # every compile of the run has its span on the compile track (the track may hold more: compiles of the
    # process recorded into the same tracer outside the run's log, seen when other test modules ran first)
    spans, logged = (
        collections.Counter(e["name"] for e in trace),
        collections.Counter(r["name"] for r in recs),
    )
    assert not logged - spans, logged - spans
    assert {e["args"]["kind"] for e in trace} == {"program", "op"}


def test_the_summary_counts_compiles(two_runs):
    tmp, (_, warm) = two_runs
    text = (tmp / "run1" / "summary.txt").read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("compile: "))
    n = warm.summary()["programs_loaded"]
    assert "; 0 program compile(s)" in line and f"{n} loaded from the persistent cache" in line, (
        line
    )
