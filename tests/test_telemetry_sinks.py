"""MetricsLogger: JSONL records, TensorBoard event files read back, console line and ETA, W&B extra."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from gymllm.errors import MissingExtraError
from gymllm.telemetry import span, use_tracer
from gymllm.telemetry.export import load_chrome_trace
from gymllm.telemetry.sinks import MetricsLogger, flatten, format_eta, progress_line


@pytest.fixture
def tracer():
    with use_tracer() as tr:
        yield tr


def read_tensorboard_scalars(logdir) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series of ``logdir`` through TensorBoard's own reader (its EventAccumulator)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})  # 0: keep every event
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_jsonl_and_tensorboard_hold_the_same_values(tracer, tmp_path):
    logged = []
    with MetricsLogger(tmp_path, console=False, total_steps=3, pipeline=False) as lg:
        for step in range(1, 4):
            m = {
                "reward/mean": 0.25 * step,
                "loss": np.float32(1.0 / step),
                "nested": {"a": step, "b": {"c": 2.0}},
                "bad": float("nan"),
                "note": "text",
            }
            logged.append(lg.log(step, m))
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines == logged
    assert [r["step"] for r in lines] == [1, 2, 3]
    assert lines[1]["nested/b/c"] == 2.0 and lines[1]["bad"] is None and lines[1]["note"] == "text"
    tb = read_tensorboard_scalars(tmp_path / "tensorboard")
    assert tb["reward/mean"] == [(s, pytest.approx(0.25 * s)) for s in (1, 2, 3)]
    assert tb["loss"] == [(s, pytest.approx(1.0 / s)) for s in (1, 2, 3)]
    assert tb["nested/a"] == [(1, 1.0), (2, 2.0), (3, 3.0)]
    assert "bad" not in tb and "note" not in tb  # non-finite and non-numeric are not scalars
    assert (tmp_path / "trace.json").exists()  # exported on close


def test_pipeline_figures_come_from_the_tracer_window(tracer, tmp_path):
    lg = MetricsLogger(tmp_path, console=False, tensorboard=False)
    with span("train_step", track="trainer", step=0, tokens=64, staleness={1: 64}):
        time.sleep(0.02)
    rec = lg.log(0, {"reward/mean": 1.0})
    assert rec["pipeline/tokens_trained"] == pytest.approx(64.0)
    assert rec["pipeline/staleness_hist/1"] == pytest.approx(64.0)
    (step_span,) = tracer.events()
    assert rec["pipeline/trainer_busy_fraction"] == pytest.approx(
        step_span["dur"] / 1e6 / rec["pipeline/window_s"]
    )
    time.sleep(0.02)  # nothing runs in the second window
    rec2 = lg.log(1, {})
    assert rec2["pipeline/trainer_busy_fraction"] == pytest.approx(0.0)
    assert rec2["pipeline/tokens_trained"] == 0.0
    caller = lg.log(2, {"pipeline": {"engine_busy_fraction": 0.5}})  # caller-supplied wins
    assert (
        caller["pipeline/engine_busy_fraction"] == 0.5 and "pipeline/tokens_trained" not in caller
    )
    lg.close()
    lg.close()  # idempotent
    with pytest.raises(RuntimeError, match="after close"):
        lg.log(3, {})
    spans = [e for e in load_chrome_trace(tmp_path / "trace.json") if e["ph"] == "X"]
    assert [e["name"] for e in spans] == ["train_step"]


def test_console_progress_line_and_eta(tracer, tmp_path, capsys):
    flat = flatten(
        {
            "reward": {"mean": 0.5},
            "pipeline": {"tokens_per_s_generated": 1234.4, "engine_busy_fraction": 0.87},
        }
    )
    assert (
        progress_line(12, 100, flat, 190.0)
        == "step 12/100 | reward 0.500 | 1,234 tok/s | engine busy 87% | ETA 0:03:10"
    )
    assert progress_line(3, None, {}, None) == "step 3"
    assert format_eta(None) == "--:--" and format_eta(3725) == "1:02:05"

    lg = MetricsLogger(
        tmp_path,
        console=True,
        tensorboard=False,
        jsonl=False,
        total_steps=10,
        pipeline=False,
        trace=False,
    )
    t0 = time.monotonic()
    lg.log(0, {"reward/mean": 0.1})
    assert lg.eta_s(0) is None
    # 2 steps took (t0+4 - t_first) s -> per step ~2 s, 8 steps left
    assert lg.eta_s(2, now=lg._first[1] + 4.0) == pytest.approx(16.0)
    lg.log(5, {"reward/mean": 0.2})
    lg.close()
    err = capsys.readouterr().err
    assert "step 0/10 | reward 0.100" in err  # first line printed at once on a non-terminal
    assert "step 5/10 | reward 0.200" in err  # last line printed at close
    assert time.monotonic() - t0 < 5


def test_wandb_is_optional_and_explained(tmp_path):
    # wandb is not a test dependency; when absent, the error names the extra that installs it
    try:
        import wandb  # noqa: F401
    except ImportError:
        with pytest.raises(MissingExtraError, match=r"gymllm\[wandb\]"):
            MetricsLogger(tmp_path, console=False, tensorboard=False, wandb=True)
    else:
        pytest.skip("wandb is installed; the missing-extra path cannot be exercised")


def test_live_progress_on_a_terminal(tmp_path):
    import io

    from rich.console import Console

    buf = io.StringIO()
    term = Console(file=buf, force_terminal=True, width=160)
    lg = MetricsLogger(
        tmp_path, console=term, tensorboard=False, total_steps=4, pipeline=False, trace=False
    )
    for s in range(1, 5):
        lg.log(s, {"reward/mean": s / 4, "pipeline": {"engine_busy_fraction": 0.5}})
    lg.close()
    out = buf.getvalue()
    assert lg._console.progress is not None  # the live display, redrawn in place
    assert "step 4/4 | reward 1.000 | engine busy 50% | ETA 0:00:00" in out


def test_pipeline_window_follows_a_replaced_tracer(tracer, tmp_path):
    lg = MetricsLogger(tmp_path, console=False, tensorboard=False, trace=False)
    lg.log(0, {})
    try:
        with use_tracer():  # e.g. a new run in the same process
            with span("decode", track="engine", tokens=8):
                time.sleep(0.005)
            rec = lg.log(1, {})
    finally:
        lg.close()
    assert rec["pipeline/tokens_generated"] == pytest.approx(8.0)
    assert 0.0 < rec["pipeline/engine_busy_fraction"] <= 1.0


def test_progress_line_names_the_every_rollout_and_trained_groups_means():
    flat = {
        "reward_mean": 0.52,
        "rollout_reward_mean": 0.31,
        "tool_calls_per_episode": 0.4,
        "eval/gymllm/X-v0/tool_calls_per_episode": 9.0,
        "eval/gymllm/X-v0/mean_reward": 0.9,
    }
    assert (
        progress_line(4, None, flat, None)
        == "step 4 | reward (all rollouts) 0.310 | trained groups 0.520 | tool calls/episode 0.40"
    )
    assert (
        progress_line(0, None, {"eval/gymllm/X-v0/mean_reward": 0.9}, None) == "step 0"
    )  # held-out: not training's
