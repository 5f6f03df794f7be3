"""The run report renders from a real short run directory (real env, spans from asyncio + threads)."""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest

import gymllm
from gymllm.telemetry import Tracer, set_tracer, span
from gymllm.telemetry.export import load_chrome_trace
from gymllm.telemetry.metrics import (
    biggest_stall,
    learner_step_metrics,
    pipeline_metrics,
    staleness_histogram,
)
from gymllm.telemetry.report import ReportError, write_report
from gymllm.telemetry.report_plots import timeline_window
from gymllm.telemetry.report_series import read_metrics
from gymllm.telemetry.sinks import MetricsLogger

STEPS, GROUP = 4, 3


async def _trajectory(env, seed: int, version: int, rng: np.random.Generator, env_id: int) -> dict:
    """One episode of gymllm/Arithmetic-v0; the 'policy' answers right with probability 0.5.

    The policy stands in for the engine (a real model is not needed to exercise telemetry): its
    generation is a decode span on the engine track lasting a few milliseconds.
    """
    with span("rollout", track="rollout", trajectory=f"{seed}"):
        with span("env_step", track=f"env/{env_id}", kind="reset"):
            obs, info = await env.areset(seed=seed)
        n_tokens = int(rng.integers(5, 30))
        with span("generate", track="rollout", trajectory=f"{seed}"):
            with span("decode", track="engine", tokens=n_tokens):
                await asyncio.sleep(0.002 + 0.0002 * n_tokens)
        answer = info["answer"] if rng.random() < 0.5 else "0"
        with span("env_step", track=f"env/{env_id}"):
            _, reward, terminated, truncated, _ = await env.astep(f"\\boxed{{{answer}}}")
        if env_id == 0:
            with span("tool", track="tool", name="calculator"):
                await asyncio.sleep(0.001)
    return {"reward": reward, "length": n_tokens, "version": version}


def _train(batch: list[dict], version: int, rng: np.random.Generator) -> dict:
    """A real (tiny) numerical step in a worker thread, traced like the learner does."""
    lengths = [b["length"] for b in batch]
    versions = np.concatenate([np.full(b["length"], b["version"]) for b in batch])
    hist = staleness_histogram(versions, np.ones_like(versions), version)
    w = rng.standard_normal((64, 64))
    with span(
        "train_step", track="trainer", step=version, tokens=int(sum(lengths)), staleness=hist
    ):
        for _ in range(2):
            with span("micro_batch", track="trainer"):
                for _ in range(20):
                    w = np.tanh(w @ w.T / 64)
                time.sleep(0.002)
    with span("weight_sync", track="trainer", version=version + 1):
        time.sleep(0.001)
    mu = -rng.random(sum(lengths))
    return learner_step_metrics(
        rewards=[b["reward"] for b in batch],
        lengths=lengths,
        sampler_logprobs=mu,
        trainer_logprobs=mu + 1e-3,
        clip_fraction=0.0,
        entropy=float(np.abs(w).mean()),
    )


async def _run(run_dir) -> None:
    envs = [gymllm.make("gymllm/Arithmetic-v0") for _ in range(GROUP)]
    rng = np.random.default_rng(0)
    logger = MetricsLogger(run_dir, console=False, total_steps=STEPS)
    version, pending = 0, None
    for step in range(STEPS + 1):
        batch = None
        if step < STEPS:  # rollouts of this step overlap with training on the previous one
            rollouts = asyncio.gather(
                *(_trajectory(envs[i], 100 * step + i, version, rng, i) for i in range(GROUP))
            )
            with span("queue_wait", track="rollout"):
                batch = await rollouts
        if pending is not None:
            metrics = await pending
            version += 1
            logger.log(version, metrics)
        pending = (
            asyncio.ensure_future(asyncio.to_thread(_train, batch, version, rng)) if batch else None
        )
        get = gymllm.telemetry.get_tracer()
        get.counter("queue_depth", 0 if batch is None else 1, track="rollout")
    gymllm.telemetry.get_tracer().increment("groups_filtered", 1, track="rollout")
    logger.close()
    for e in envs:
        e.close()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("run")
    previous = set_tracer(Tracer())
    try:
        asyncio.run(_run(d))
    finally:
        set_tracer(previous)
    return d


def _png_ok(path) -> bool:
    from matplotlib.image import imread

    img = imread(path)
    return (
        img.ndim == 3
        and img.shape[0] > 100
        and img.shape[1] > 100
        and float(img[..., :3].std()) > 0.01
    )


def test_report_renders_from_a_short_run(run_dir, capsys):
    """Through the CLI command `gymllm report RUN_DIR`, which calls write_report and prints its files."""
    from gymllm.cli.commands import report as report_command

    assert report_command(str(run_dir)) == 0
    printed = capsys.readouterr().out
    names = ["reward.png", "length.png", "timeline.png", "idle.png", "staleness.png", "summary.txt"]
    written = [run_dir / n for n in names]
    assert all(str(p) in printed for p in written) and "biggest stall:" in printed
    assert all(_png_ok(p) for p in written if p.suffix == ".png")
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert all("reward/mean" in r and "pipeline/engine_busy_fraction" in r for r in records)

    events = load_chrome_trace(run_dir / "trace.json")
    tracks = {e["track"] for e in events if e["ph"] == "X"}
    assert {"engine", "trainer", "rollout", "tool", "env/0", "env/1", "env/2"} <= tracks
    pm = pipeline_metrics(events)
    name, frac, _ = biggest_stall(pm)
    summary = (run_dir / "summary.txt").read_text()
    assert f"biggest stall: {name} ({100 * frac:.1f}%)" in summary
    assert f"steps logged: {STEPS}" in summary
    # every trained token is accounted for in the staleness histogram (trained at lag 0 or 1)
    assert sum(pm["staleness_hist"].values()) == pytest.approx(pm["tokens_trained"])
    assert pm["tokens_trained"] == pytest.approx(sum(r["length/mean"] * GROUP for r in records))
    assert set(pm["staleness_hist"]) <= {0, 1}
    spans = [e for e in events if e["ph"] == "X"]
    lo, hi, n = timeline_window(spans, 3)  # the timeline shows the last 3 of 4 steps
    first_end = min(e["ts"] + e["dur"] for e in spans if e["name"] == "train_step")
    assert (
        n == STEPS
        and lo == pytest.approx(first_end)
        and hi == max(e["ts"] + e["dur"] for e in spans)
    )
    assert timeline_window(spans, 0)[0] == min(e["ts"] for e in spans)
    assert pm["groups_filtered"] == 1.0


def test_report_from_metrics_only_and_torn_line(tmp_path):
    with open(tmp_path / "metrics.jsonl", "w") as f:
        for s in range(5):
            f.write(
                json.dumps(
                    {
                        "step": s,
                        "reward/mean": s / 5,
                        "reward/min": 0.0,
                        "reward/max": 1.0,
                        "length/mean": 10 + s,
                        "length/std": 1.0,
                        "pipeline/engine_busy_fraction": 0.9,
                        "pipeline/trainer_idle_fraction": 0.6,
                        "pipeline/staleness_hist/0": 10,
                        "pipeline/staleness_hist/2": 5,
                    }
                )
                + "\n"
            )
        f.write('{"step": 5, "reward/me')  # the run was killed mid-write
    written = write_report(tmp_path)
    assert [p.name for p in written] == [
        "reward.png",
        "length.png",
        "idle.png",
        "staleness.png",
        "summary.txt",
    ]
    summary = (tmp_path / "summary.txt").read_text()
    assert "biggest stall: trainer idle" in summary and "60.0%" in summary
    assert "staleness: mean 0.67 versions, max 2" in summary


def test_summary_table_and_idle_lines_read_the_steps_own_window_first(tmp_path):
    """The run also logs a top-level ``engine_busy_fraction`` (since the rollout started); the report's
    per-step figures are the tracer's window of each step (``pipeline/...``), the same as the console's."""
    from gymllm.telemetry.report import pipeline_table
    from gymllm.telemetry.report_series import series
    from gymllm.telemetry.sinks import progress_line

    records = [
        {
            "step": s,
            "engine_busy_fraction": 0.5,
            "pipeline/engine_busy_fraction": 0.25 * s,
            "trainer_idle_fraction": 0.9,
            "pipeline/trainer_idle_fraction": 0.1,
        }
        for s in (1, 2, 3)
    ]
    assert series(records, "engine_busy_fraction") == ([1, 2, 3], [0.25, 0.5, 0.75])
    assert series(records, "trainer_idle_fraction")[1] == [0.1] * 3
    assert series([{"step": 1, "engine_busy_fraction": 0.5}], "engine_busy_fraction") == (
        [1],
        [0.5],
    )  # fallback
    assert progress_line(3, None, records[-1], None).endswith("engine busy 75%")
    table = pipeline_table(
        {
            "window_s": 12.5,
            "tokens_per_s_generated": 1234.5,
            "engine_busy_fraction": 0.873,
            "groups_dropped": 2.0,
        }
    )
    assert table.splitlines()[0] == "pipeline (whole trace, 12.5 s)"
    assert all(line == line.rstrip() for line in table.splitlines())
    flat = {" ".join(line.split()) for line in table.splitlines()}
    assert {
        "tokens/s generated 1,234",
        "engine busy 87.3%",
        "trainer idle n/a",
        "groups dropped 2",
    } <= flat
    assert not any(line.startswith("groups filtered") for line in flat)


def test_report_without_inputs_is_explained(tmp_path):
    with pytest.raises(ReportError, match="metrics.jsonl") as exc:
        write_report(tmp_path)
    assert isinstance(exc.value, FileNotFoundError)


def test_series_of_a_resumed_run_keeps_the_last_record_per_step():
    from gymllm.telemetry.report_series import series

    records = [
        {"step": 1, "train/reward/mean": 0.1},
        {"step": 2, "train/reward/mean": 0.2},
        {"step": 3, "train/reward/mean": 0.3},  # killed here; resumed from the step-2 checkpoint
        {"step": 3, "train/reward/mean": 0.35},
        {"step": 4, "train/reward/mean": float("nan")},
        {"step": 5, "train/reward/mean": 0.5},
        {"step": 6},
    ]
    assert series(records, "reward/mean") == ([1, 2, 3, 5], [0.1, 0.2, 0.35, 0.5])


def test_report_reads_the_learners_flat_metric_names(tmp_path):
    """The streaming learner logs reward_mean / response_len_mean / staleness_mean (no histogram)."""
    with MetricsLogger(
        tmp_path, console=False, tensorboard=False, pipeline=False, trace=False
    ) as lg:
        for s in range(1, 4):
            lg.log(
                s,
                {
                    "reward_mean": 0.1 * s,
                    "reward_std": 0.05,
                    "reward_max": 0.5,
                    "response_len_mean": 20 + s,
                    "response_len_max": 40,
                    "staleness_mean": 0.5,
                    "staleness_max": 1.0,
                },
            )
    names = [p.name for p in write_report(tmp_path)]
    assert names == ["reward.png", "length.png", "staleness.png", "summary.txt"]
    summary = (tmp_path / "summary.txt").read_text()
    assert "reward mean: first 0.1, last 0.3" in summary and "length mean: last 23" in summary


def test_timeline_rows_collapse_many_env_tracks_and_cap_lanes():
    from gymllm.telemetry.report_plots import _rows

    # env spans [0,1], [0.5,1.5], [1,2] (4 tracks each): two lanes once collapsed into "env/*"
    spans = [
        {"name": "env_step", "track": f"env/{i}", "ts": 0.5 * (i % 3), "dur": 1.0, "args": {}}
        for i in range(12)
    ]
    # 9 staggered overlapping rollouts: 9 lanes needed, 4 shown
    spans += [
        {"name": "rollout", "track": "rollout", "ts": 0.5 * i, "dur": 5.0, "args": {}}
        for i in range(9)
    ]
    rows, omitted = _rows(spans, max_rows=32, max_lanes=4)
    assert [label for label, _ in rows] == [
        "rollout",
        "rollout #2",
        "rollout #3",
        "rollout #4",
        "env/*",
        "env/* #2",
    ]
    assert omitted == 5
    assert [len(r) for _, r in rows] == [1, 1, 1, 1, 8, 4]
    few, _ = _rows(spans[:6], max_rows=32, max_lanes=4)  # 6 env tracks: one row each
    assert [label for label, _ in few] == [f"env/{i}" for i in range(6)]


def test_summary_says_when_the_trace_dropped_events(tmp_path):
    tr = Tracer(capacity=10)
    for i in range(30):
        with tr.span("decode", track="engine", tokens=1):
            pass
    tr.export_chrome_trace(tmp_path / "trace.json")
    write_report(tmp_path)
    assert f"{tr.dropped:,} older ones were dropped" in (tmp_path / "summary.txt").read_text()
    assert tr.dropped > 0
