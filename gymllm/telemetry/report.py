"""The run report: PNG plots and a text summary for a run directory (``gymllm report RUN_DIR``).

Reads what :class:`gymllm.telemetry.sinks.MetricsLogger` writes into a run directory:
``metrics.jsonl`` (one record per step) and ``trace.json`` / ``trace.json.gz`` (the Chrome trace).
Either may be missing; each plot is written only when its data exists.

Writes, into the run directory:

- ``reward.png``: reward mean per step, with the min..max band (``*reward/mean``, ``/min``, ``/max``,
  or the learner's flat ``reward_mean`` ... spellings, see :data:`~gymllm.telemetry.report_series.ALIASES`); beside it, named as
  such, ``rollout_reward_mean`` (every completed rollout, filtered groups included) when logged;
- ``eval.png``: the held-out curves ``eval/<env>/pass@1`` and ``eval/<env>/mean_reward`` (``eval.every``);
- ``length.png``: trajectory length mean per step (``*length/mean`` or ``response_len_mean``), with
  its band;
- ``timeline.png``: the pipeline timeline from the trace, one row per track (lane), spans coloured
  by phase (at most ``max_rows`` rows; concurrent lanes of one track are capped at ``max_lanes``);
  a long run shows its last few train steps (the steady state);
- ``idle.png``: engine busy / trainer idle fractions over the whole trace (bars) and per step
  (lines from ``pipeline/...`` in metrics.jsonl);
- ``staleness.png``: trained tokens by staleness (policy versions behind), from the trace's
  ``micro_batch`` / ``train_step`` tags or the ``pipeline/staleness_hist/<lag>`` columns; without
  a histogram, the per-step ``staleness_mean`` / ``staleness_max`` the learner logs;
- ``summary.txt``: steps, last reward, the compile line (seconds compiling, program compiles, how many
  the persistent cache supplied: ``compiles.jsonl``, else the trace's "compile" spans;
  :func:`gymllm.telemetry.compiles.summary_line`), the pipeline figures as a table (throughput, busy /
  idle fractions, compile share, latency shares; rendered by rich, :func:`pipeline_table`) and the
  biggest stall with advice.

The plots are drawn by :mod:`gymllm.telemetry.report_plots`; the records and the series in them are
read by :mod:`gymllm.telemetry.report_series`; this module writes summary.txt and the files.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any, Sequence

from gymllm.errors import GymLLMError, explain
from gymllm.telemetry.export import load_chrome_trace
from gymllm.telemetry.metrics import biggest_stall, pipeline_metrics
from gymllm.telemetry.report_plots import (
    plot_curve,
    plot_eval,
    plot_idle,
    plot_staleness,
    plot_timeline,
)
from gymllm.telemetry.report_series import read_metrics, series, staleness_from_records


class ReportError(GymLLMError, FileNotFoundError):
    """The run directory holds nothing to report on."""


# ------------------------------------------------------------------------------ reading


def _trace_path(run_dir: pathlib.Path) -> pathlib.Path | None:
    for name in ("trace.json", "trace.json.gz"):
        if (run_dir / name).exists():
            return run_dir / name
    return None


# ------------------------------------------------------------------------------ summary


def _fmt(v: Any, pct: bool = False) -> str:
    if v is None:
        return "n/a"
    return f"{100 * v:.1f}%" if pct else f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"


_PIPELINE_ROWS = (  # (label, key, as a percentage)
    ("tokens/s generated", "tokens_per_s_generated", False),
    ("tokens/s trained", "tokens_per_s_trained", False),
    ("engine busy", "engine_busy_fraction", True),
    ("trainer idle", "trainer_idle_fraction", True),
    ("trainer idle while compiling", "trainer_idle_compile_fraction", True),
    ("compile", "compile_fraction", True),
    ("weight sync", "weight_sync_fraction", True),
    ("checkpoint", "checkpoint_fraction", True),
    ("rollout time in tools", "tool_latency_share", True),
    ("rollout time in env steps", "env_latency_share", True),
    ("groups dropped", "groups_dropped", False),
    ("groups filtered", "groups_filtered", False),
)


def pipeline_table(source: dict[str, Any], width: int = 72) -> str:
    """The pipeline figures of ``source`` (:func:`~gymllm.telemetry.metrics.pipeline_metrics` keys) as a
    plain-text table rendered by rich; groups rows only when counted. The title names the window
    (``window_s`` of the whole trace, else the per-step average)."""
    import io

    from rich import box
    from rich.console import Console
    from rich.table import Table

    window = (
        f"whole trace, {_fmt(source['window_s'])} s"
        if source.get("window_s")
        else "per-step average"
    )
    table = Table(
        "figure", "value", title=f"pipeline ({window})", box=box.SIMPLE_HEAD, title_justify="left"
    )
    table.columns[1].justify = "right"
    for label, key, pct in _PIPELINE_ROWS:
        if (key.startswith("groups_") or "compile" in key) and source.get(key) is None:
            continue
        table.add_row(label, _fmt(source.get(key), pct))
    out = io.StringIO()
    Console(
        file=out, width=width, color_system=None, force_terminal=False, legacy_windows=False
    ).print(table)
    return "\n".join(line.rstrip() for line in out.getvalue().rstrip().splitlines())


def env_table(records, width: int = 72) -> str | None:
    """Per-env figures of a suite-mixture run (``env/<name>/...`` keys): groups so far, the last
    recorded reward and success, the current weight; None when the run trained on one env."""
    import io

    from rich import box
    from rich.console import Console
    from rich.table import Table

    names = sorted(
        {k.split("/")[1] for r in records for k in r if k.startswith("env/") and k.count("/") == 2}
    )
    if not names:
        return None
    table = Table(
        "env",
        "groups",
        "reward",
        "success",
        "weight",
        title="per env (last recorded)",
        box=box.SIMPLE_HEAD,
        title_justify="left",
    )
    for col in table.columns[1:]:
        col.justify = "right"
    for name in names:
        last = {
            f: (ys[-1] if (ys := series(records, f"env/{name}/{f}")[1]) else None)
            for f in ("groups", "reward", "success", "weight")
        }
        table.add_row(
            name,
            _fmt(last["groups"]),
            _fmt(last["reward"]),
            _fmt(last["success"], True),
            _fmt(last["weight"], True),
        )
    out = io.StringIO()
    Console(
        file=out, width=width, color_system=None, force_terminal=False, legacy_windows=False
    ).print(table)
    return "\n".join(line.rstrip() for line in out.getvalue().rstrip().splitlines())


def compile_records(
    run_dir: pathlib.Path, events: Sequence[dict[str, Any]] = ()
) -> list[dict[str, Any]]:
    """The run's compiles: ``compiles.jsonl`` when the run wrote it, else the trace's "compile" spans."""
    from gymllm.telemetry.compiles import COMPILE_TRACK, read_compiles

    recs = read_compiles(run_dir / "compiles.jsonl")
    return recs or [
        {
            "name": e["name"],
            "seconds": e["dur"] / 1e6,
            "cache_hit": bool(e["args"].get("cache_hit")),
            "kind": e["args"].get("kind", "program"),
            "lower_s": e["args"].get("lower_s"),
        }
        for e in events
        if e["ph"] == "X" and e["track"] == COMPILE_TRACK
    ]


def summarize(
    run_dir: pathlib.Path,
    records,
    pm: dict[str, Any] | None,
    hist: dict[int, float],
    compiles: Sequence[dict[str, Any]] = (),
) -> str:
    """The text of summary.txt (``compiles``: :func:`compile_records`)."""
    from gymllm.telemetry.compiles import summarize as compile_figures, summary_line

    lines = [f"run: {run_dir}"]
    steps, reward = series(records, "reward/mean")
    if records:
        lines.append(f"steps logged: {len(records)} (last step {records[-1].get('step')})")
    if compiles:
        lines.append(summary_line(compile_figures(compiles), (pm or {}).get("compile_fraction")))
    _, every = series(records, "rollout_reward_mean")
    if every:
        lines.append(
            f"reward over every rollout: first {every[0]:.4g}, last {every[-1]:.4g}, best {max(every):.4g}"
        )
    if reward:
        lines.append(
            f"reward mean{' of trained groups' if every else ''}: first {reward[0]:.4g}, last "
            f"{reward[-1]:.4g}, best {max(reward):.4g}"
        )
    _, calls = series(records, "tool_calls_per_episode")
    _, share = series(records, "tool_call_share")
    if calls:
        lines.append(
            f"tool calls per episode: first {calls[0]:.3g}, last {calls[-1]:.3g}; episodes with a tool call: "
            f"first {_fmt(share[0] if share else None, True)}, last {_fmt(share[-1] if share else None, True)}"
        )
    for key in sorted(
        {k for r in records for k in r if k.startswith("eval/") and k.endswith("/pass@1")}
    ):
        xs, ys = series(records, key)
        if xs:
            lines.append(
                f"held-out {key[len('eval/') : -len('/pass@1')]} pass@1: {ys[0]:.3g} (step {xs[0]}) -> "
                f"{ys[-1]:.3g} (step {xs[-1]})"
            )
    per_env = env_table(records)
    if per_env:
        lines.append(per_env)
    _, length = series(records, "length/mean")
    if length:
        lines.append(f"length mean: last {length[-1]:.4g}")
    source = pm
    if source is None and records:  # no trace: average the per-step pipeline figures
        keys = (
            "engine_busy_fraction",
            "engine_idle_fraction",
            "trainer_idle_fraction",
            "trainer_busy_fraction",
            "compile_fraction",
            "trainer_idle_compile_fraction",
            "weight_sync_fraction",
            "checkpoint_fraction",
            "tool_latency_share",
            "env_latency_share",
            "tokens_per_s_generated",
            "tokens_per_s_trained",
        )
        source = {k: (sum(v) / len(v) if (v := series(records, k)[1]) else None) for k in keys}
    if source:
        lines.append(pipeline_table(source))
    if hist:
        total = sum(hist.values())
        mean = sum(k * v for k, v in hist.items()) / total if total else 0.0
        lines.append(
            f"staleness: mean {mean:.2f} versions, max {max(hist)}, over {total:,.0f} trained tokens"
        )
    if source:
        name, frac, advice = biggest_stall(source)
        lines.append(f"biggest stall: {name} ({100 * frac:.1f}%) -> {advice}")
    else:
        lines.append("biggest stall: unknown (no trace and no pipeline metrics in metrics.jsonl)")
    return "\n".join(lines) + "\n"


def write_report(run_dir: str | os.PathLike) -> list[pathlib.Path]:
    """Render the report of ``run_dir``; returns the files written (PNGs, then summary.txt).

    Raises:
        ReportError: the directory has neither metrics.jsonl nor trace.json(.gz).
    """
    run_dir = pathlib.Path(run_dir)
    metrics_path, trace_path = run_dir / "metrics.jsonl", _trace_path(run_dir)
    if not metrics_path.exists() and trace_path is None:
        raise ReportError(
            explain(
                f"report of {str(run_dir)!r}",
                expected="a run directory with metrics.jsonl and/or trace.json",
                received=sorted(p.name for p in run_dir.iterdir())[:10]
                if run_dir.is_dir()
                else "no such directory",
                fix="pass the run_dir given to `gymllm train` (MetricsLogger writes both files there)",
            )
        )
    records = read_metrics(metrics_path) if metrics_path.exists() else []
    trace_meta: dict[str, Any] = {}
    events = load_chrome_trace(trace_path, meta=trace_meta) if trace_path is not None else []
    pm = pipeline_metrics(events) if any(e["ph"] == "X" for e in events) else None
    hist = {
        int(k): v for k, v in (pm or {}).get("staleness_hist", {}).items()
    } or staleness_from_records(records)
    written = [
        plot_curve(
            records,
            "reward",
            "reward per step",
            run_dir / "reward.png",
            mean_label="trained groups mean" if series(records, "rollout_reward_mean")[0] else None,
            extra=[("rollout_reward_mean", "every rollout mean (filtered groups included)")],
        ),
        plot_eval(records, run_dir / "eval.png"),
        plot_curve(records, "length", "trajectory length per step", run_dir / "length.png"),
        plot_timeline(events, run_dir / "timeline.png"),
        plot_idle(pm, records, run_dir / "idle.png"),
        plot_staleness(hist, run_dir / "staleness.png", records),
    ]
    summary = run_dir / "summary.txt"
    text = summarize(run_dir, records, pm, hist, compile_records(run_dir, events))
    if trace_meta.get("dropped_events"):
        text += (
            f"note: the trace holds the newest events only; {trace_meta['dropped_events']:,} older ones were "
            "dropped by the ring buffer (raise Tracer capacity or set spill_path to keep them)\n"
        )
    summary.write_text(text)
    return [p for p in written if p is not None] + [summary]
