"""The run report: PNG plots and a text summary for a run directory (``gymllm report RUN_DIR``).

Reads what :class:`gymllm.telemetry.sinks.MetricsLogger` writes into a run directory:
``metrics.jsonl`` (one record per step) and ``trace.json`` / ``trace.json.gz`` (the Chrome trace).
Either may be missing; each plot is written only when its data exists.

Writes, into the run directory:

- ``reward.png``: reward mean per step, with the min..max band (``*reward/mean``, ``/min``, ``/max``,
  or the learner's flat ``reward_mean`` ... spellings, see :data:`ALIASES`); beside it, named as
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

Plots use matplotlib's object API with the Agg canvas (no pyplot, no global backend switch), so
the report is safe to render from any thread or a headless machine.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
from typing import Any, Sequence

from gymllm.errors import GymLLMError, explain
from gymllm.telemetry.export import assign_lanes, family_of, load_chrome_trace
from gymllm.telemetry.metrics import biggest_stall, pipeline_metrics

_PHASE_COLORS = {
    "prefill": "#1f77b4", "decode": "#6baed6", "generate": "#9ecae1",
    "train_step": "#2ca02c", "micro_batch": "#98df8a", "weight_sync": "#d62728", "checkpoint": "#9467bd",
    "rollout": "#c7c7c7", "queue_wait": "#ff9896",
    "env_step": "#ff7f0e", "reward": "#ffbb78", "tool": "#8c564b",
}
_EXTRA_COLORS = ["#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#aec7e8", "#c5b0d5", "#c49c94", "#f7b6d2"]


class ReportError(GymLLMError, FileNotFoundError):
    """The run directory holds nothing to report on."""


# ------------------------------------------------------------------------------ reading


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Records of a metrics.jsonl, in file order; a torn last line (run killed mid-write) is skipped."""
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def _trace_path(run_dir: pathlib.Path) -> pathlib.Path | None:
    for name in ("trace.json", "trace.json.gz"):
        if (run_dir / name).exists():
            return run_dir / name
    return None


# Names the learner may use for a statistic: ours ("reward/mean") first, then flat spellings.
ALIASES = {
    "reward/mean": ("reward/mean", "reward_mean"), "reward/min": ("reward/min", "reward_min"),
    "reward/max": ("reward/max", "reward_max"), "reward/std": ("reward/std", "reward_std"),
    "length/mean": ("length/mean", "length_mean", "response_len_mean"),
    "length/min": ("length/min", "length_min", "response_len_min"),
    "length/max": ("length/max", "length_max", "response_len_max"),
    "length/std": ("length/std", "length_std", "response_len_std"),
    # the step's own window of the tracer's spans first (telemetry.metrics.busy_fraction); a run's
    # top-level figure (since the rollout started, or the learner's wait) only when that is absent
    "engine_busy_fraction": ("pipeline/engine_busy_fraction", "engine_busy_fraction"),
    "trainer_idle_fraction": ("pipeline/trainer_idle_fraction", "trainer_idle_fraction"),
}


def series(records: Sequence[dict[str, Any]], suffix: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the first key equal to or ending in "/" + ``suffix`` (or one of its
    :data:`ALIASES`) that has numbers.

    Sorted by step; when a step was logged twice (a resumed run appends to metrics.jsonl), the
    later record wins.
    """
    names = ALIASES.get(suffix, (suffix,))
    present = {k for r in records for k in r}
    keys = [k for n in names for k in sorted((k for k in present if k == n or k.endswith("/" + n)), key=len)]
    for key in keys:
        pts = {int(r["step"]): float(r[key]) for r in records
               if "step" in r and isinstance(r.get(key), (int, float)) and math.isfinite(r[key])}
        if pts:
            steps = sorted(pts)
            return steps, [pts[s] for s in steps]
    return [], []


# ------------------------------------------------------------------------------ figures


def _figure(w: float = 8.0, h: float = 4.0):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: pathlib.Path, *, left: float = 0.1, right: float = 0.97) -> pathlib.Path:
    h = fig.get_figheight()  # margins in inches (tight_layout would fit them, slowly)
    fig.subplots_adjust(left=left, right=right, bottom=0.55 / h, top=1 - 0.4 / h, wspace=0.35)
    fig.savefig(path, format="png")
    return path


def plot_curve(records, stem: str, title: str, path: pathlib.Path, *, mean_label: str | None = None,
               extra: Sequence[tuple[str, str]] = ()) -> pathlib.Path | None:
    """Mean per step with the min..max band (or mean +- std) of ``stem``; None without data.
    ``extra``: ``(key, label)`` series drawn beside it (e.g. the reward over every rollout)."""
    steps, mean = series(records, f"{stem}/mean")
    more = [(label, *series(records, key)) for key, label in extra]
    more = [m for m in more if m[1]]
    if not steps and not more:
        return None
    fig = _figure()
    ax = fig.add_subplot(1, 1, 1)
    for (label, xs, ys), color in zip(more, ("#d62728", "#2ca02c", "#9467bd")):
        ax.plot(xs, ys, color=color, lw=2.0, label=label)
    if not steps:
        ax.set_xlabel("step")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(loc="best")
        return _save(fig, path)
    ax.plot(steps, mean, color="#1f77b4", lw=1.5, label=mean_label or f"{stem} mean")
    lo_s, lo = series(records, f"{stem}/min")
    hi_s, hi = series(records, f"{stem}/max")
    if lo_s == steps and hi_s == steps:
        ax.fill_between(steps, lo, hi, color="#1f77b4", alpha=0.2, label="min..max")
    else:
        sd_s, sd = series(records, f"{stem}/std")
        if sd_s == steps:
            ax.fill_between(steps, [m - s for m, s in zip(mean, sd)], [m + s for m, s in zip(mean, sd)],
                            color="#1f77b4", alpha=0.2, label="mean +- std")
    ax.set_xlabel("step")
    ax.set_ylabel(stem)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    return _save(fig, path)


def plot_eval(records, path: pathlib.Path) -> pathlib.Path | None:
    """The held-out curves: ``eval/<env>/pass@1`` (solid) and ``eval/<env>/mean_reward`` (dashed) per
    evaluated step; None when the run did not evaluate."""
    envs = sorted({k[len("eval/"):-len("/pass@1")] for r in records for k in r
                   if k.startswith("eval/") and k.endswith("/pass@1")})
    if not envs:
        return None
    fig = _figure()
    ax = fig.add_subplot(1, 1, 1)
    colors = iter(list(_PHASE_COLORS.values()) * 10)
    for env in envs:
        color = next(colors)
        for name, style in (("pass@1", "-"), ("mean_reward", "--")):
            xs, ys = series(records, f"eval/{env}/{name}")
            if xs:
                ax.plot(xs, ys, style, color=color, marker="o", lw=1.5, label=f"{env} {name}")
    ax.set_xlabel("step (policy version evaluated)")
    ax.set_ylabel("held-out")
    ax.set_title("held-out evaluation")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    return _save(fig, path)


def _rows(spans: list[dict[str, Any]], max_rows: int, max_lanes: int,
          max_env_rows: int = 8) -> tuple[list[tuple[str, list[dict]]], int]:
    """(row label, spans) per track lane, in track order; and the number of rows left out.

    With more than ``max_env_rows`` env tracks, all env spans share one track "env/*" (its lanes
    show how many envs were busy at once, up to ``max_lanes``).
    """
    by_track: dict[str, list[dict]] = {}
    n_env = len({e["track"] for e in spans if family_of(e["track"]) == "env"})
    for e in spans:
        track = "env/*" if n_env > max_env_rows and family_of(e["track"]) == "env" else e["track"]
        by_track.setdefault(track, []).append(e)
    order = sorted(by_track, key=lambda t: (("engine", "trainer", "rollout", "tool", "env").index(family_of(t))
                                            if family_of(t) in ("engine", "trainer", "rollout", "tool", "env") else 9,
                                            len(t), t))
    rows, omitted = [], 0
    for track in order:
        group = by_track[track]
        lanes = assign_lanes(group)
        n = max(lanes) + 1
        for lane in range(n):
            if lane >= max_lanes or len(rows) >= max_rows:
                omitted += 1
                continue
            rows.append((track if lane == 0 else f"{track} #{lane + 1}", [e for e, ln in zip(group, lanes) if ln == lane]))
    return rows, omitted


def _depths(lane_spans: list[dict]) -> list[int]:
    """Nesting depth of each span in a properly nested lane."""
    order = sorted(range(len(lane_spans)), key=lambda i: (lane_spans[i]["ts"], -lane_spans[i]["dur"]))
    depth = [0] * len(lane_spans)
    stack: list[float] = []
    for i in order:
        s, e = lane_spans[i]["ts"], lane_spans[i]["ts"] + lane_spans[i]["dur"]
        while stack and stack[-1] <= s + 1e-3:
            stack.pop()
        depth[i] = len(stack)
        stack.append(e)
    return depth


def timeline_window(spans: Sequence[dict[str, Any]], steps: int) -> tuple[float, float, int]:
    """(start_us, end_us, train steps in the trace): the last ``steps`` train steps, or everything."""
    lo = min(e["ts"] for e in spans)
    hi = max(e["ts"] + e["dur"] for e in spans)
    ends = sorted(e["ts"] + e["dur"] for e in spans if e["name"] == "train_step")
    if steps > 0 and len(ends) > steps:
        lo = ends[-steps - 1]
    return lo, hi, len(ends)


def plot_timeline(events, path: pathlib.Path, *, max_rows: int = 32, max_lanes: int = 6,
                  steps: int = 3) -> pathlib.Path | None:
    """One row per track lane, spans as bars coloured by phase; nested spans drawn thinner.

    A trace with more than ``steps`` train steps is shown from the end of the step before the last
    ``steps`` (the steady state, readable); ``steps=0`` shows the whole trace.
    """
    spans = [e for e in events if e["ph"] == "X"]
    if not spans:
        return None
    t0 = min(e["ts"] for e in spans)
    lo, hi, n_steps = timeline_window(spans, steps)
    spans = [e for e in spans if e["ts"] + e["dur"] >= lo]
    rows, omitted = _rows(spans, max_rows, max_lanes)
    fig = _figure(11, max(3.0, 0.35 * len(rows) + 1.5))
    ax = fig.add_subplot(1, 1, 1)
    colors, extra = dict(_PHASE_COLORS), iter(_EXTRA_COLORS * 100)
    seen: dict[str, Any] = {}
    for y, (_, lane) in enumerate(rows):
        by_name: dict[tuple[str, int], list[tuple[float, float]]] = {}
        for e, d in zip(lane, _depths(lane)):
            by_name.setdefault((e["name"], min(d, 3)), []).append(((e["ts"] - t0) / 1e6, e["dur"] / 1e6))
        for (name, d), bars in sorted(by_name.items(), key=lambda kv: kv[0][1]):
            color = colors.setdefault(name, next(extra))
            h = 0.8 - 0.18 * d
            coll = ax.broken_barh(bars, (y - h / 2, h), facecolors=color, edgecolor="none")
            seen.setdefault(name, coll)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([label for label, _ in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since trace start")
    ax.set_xlim((lo - t0) / 1e6, (hi - t0) / 1e6)
    title = "pipeline timeline" + (f" (last {steps} of {n_steps} train steps)" if lo > t0 else "")
    if omitted:
        title += f" ({omitted} more lanes not shown)"
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(list(seen.values()), list(seen.keys()), loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return _save(fig, path, left=0.13, right=0.86)


def plot_idle(pm: dict[str, Any] | None, records, path: pathlib.Path) -> pathlib.Path | None:
    """Bars of the run-wide busy/idle fractions and per-step lines from metrics.jsonl."""
    bars = {k: pm[k] for k in ("engine_busy_fraction", "engine_idle_fraction", "trainer_busy_fraction",
                               "trainer_idle_fraction", "weight_sync_fraction", "checkpoint_fraction")
            if pm and pm.get(k) is not None}
    lines = {k: series(records, k) for k in ("engine_busy_fraction", "trainer_idle_fraction")}
    lines = {k: v for k, v in lines.items() if v[0]}
    if not bars and not lines:
        return None
    fig = _figure(11, 4)
    axes = [fig.add_subplot(1, 2, i + 1) for i in range(2)] if bars and lines else [fig.add_subplot(1, 1, 1)]
    if bars:
        ax = axes[0]
        names = list(bars)
        ax.barh(names, [bars[n] for n in names], color=["#1f77b4" if "busy" in n else "#d62728" for n in names])
        ax.set_xlim(0, 1)
        ax.set_xlabel("fraction of wall time (whole trace)")
        ax.invert_yaxis()
        ax.set_title("busy and idle")
        ax.tick_params(axis="y", labelsize=8)
        for i, n in enumerate(names):
            ax.text(min(bars[n] + 0.01, 0.9), i, f"{100 * bars[n]:.0f}%", va="center", fontsize=8)
    if lines:
        ax = axes[-1]
        for k, (s, v) in lines.items():
            ax.plot(s, v, label=k)
        ax.set_ylim(0, 1.05)
        ax.set_xlabel("step")
        ax.set_title("per step")
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)
    return _save(fig, path, left=0.2 if bars else 0.1)


def staleness_from_records(records) -> dict[int, float]:
    """Sum of the ``.../staleness_hist/<lag>`` columns over all records."""
    hist: dict[int, float] = {}
    for r in records:
        for k, v in r.items():
            head, _, lag = k.rpartition("/")
            if head.endswith("staleness_hist") and lag.lstrip("-").isdigit() and isinstance(v, (int, float)):
                hist[int(lag)] = hist.get(int(lag), 0.0) + float(v)
    return dict(sorted(hist.items()))


def plot_staleness(hist: dict[int, float], path: pathlib.Path, records=()) -> pathlib.Path | None:
    """Trained tokens by staleness; without a histogram, the per-step ``staleness_mean`` / ``_max``."""
    if not hist or sum(hist.values()) <= 0:
        return _plot_staleness_steps(records, path)
    fig = _figure(6, 4)
    ax = fig.add_subplot(1, 1, 1)
    total = sum(hist.values())
    ax.bar(list(hist), [100 * v / total for v in hist.values()], color="#2ca02c")
    ax.set_xticks(list(hist))
    ax.set_xlabel("staleness (policy versions behind the trainer)")
    ax.set_ylabel("% of trained tokens")
    ax.set_title(f"staleness of {total:,.0f} trained tokens")
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def _plot_staleness_steps(records, path: pathlib.Path) -> pathlib.Path | None:
    lines = {k: series(records, k) for k in ("staleness_mean", "staleness_max")}
    lines = {k: v for k, v in lines.items() if v[0]}
    if not lines:
        return None
    fig = _figure(6, 4)
    ax = fig.add_subplot(1, 1, 1)
    for k, (st, v) in lines.items():
        ax.plot(st, v, label=k, drawstyle="steps-post" if k.endswith("max") else "default")
    ax.set_xlabel("step")
    ax.set_ylabel("policy versions behind the trainer")
    ax.set_title("staleness of trained tokens per step")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    return _save(fig, path, left=0.14)


# ------------------------------------------------------------------------------ summary


def _fmt(v: Any, pct: bool = False) -> str:
    if v is None:
        return "n/a"
    return f"{100 * v:.1f}%" if pct else f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"


_PIPELINE_ROWS = (  # (label, key, as a percentage)
    ("tokens/s generated", "tokens_per_s_generated", False), ("tokens/s trained", "tokens_per_s_trained", False),
    ("engine busy", "engine_busy_fraction", True), ("trainer idle", "trainer_idle_fraction", True),
    ("trainer idle while compiling", "trainer_idle_compile_fraction", True), ("compile", "compile_fraction", True),
    ("weight sync", "weight_sync_fraction", True), ("checkpoint", "checkpoint_fraction", True),
    ("rollout time in tools", "tool_latency_share", True), ("rollout time in env steps", "env_latency_share", True),
    ("groups dropped", "groups_dropped", False), ("groups filtered", "groups_filtered", False),
)


def pipeline_table(source: dict[str, Any], width: int = 72) -> str:
    """The pipeline figures of ``source`` (:func:`~gymllm.telemetry.metrics.pipeline_metrics` keys) as a
    plain-text table rendered by rich; groups rows only when counted. The title names the window
    (``window_s`` of the whole trace, else the per-step average)."""
    import io

    from rich import box
    from rich.console import Console
    from rich.table import Table

    window = f"whole trace, {_fmt(source['window_s'])} s" if source.get("window_s") else "per-step average"
    table = Table("figure", "value", title=f"pipeline ({window})", box=box.SIMPLE_HEAD, title_justify="left")
    table.columns[1].justify = "right"
    for label, key, pct in _PIPELINE_ROWS:
        if (key.startswith("groups_") or "compile" in key) and source.get(key) is None:
            continue
        table.add_row(label, _fmt(source.get(key), pct))
    out = io.StringIO()
    Console(file=out, width=width, color_system=None, force_terminal=False, legacy_windows=False).print(table)
    return "\n".join(line.rstrip() for line in out.getvalue().rstrip().splitlines())


def env_table(records, width: int = 72) -> str | None:
    """Per-env figures of a suite-mixture run (``env/<name>/...`` keys): groups so far, the last
    recorded reward and success, the current weight; None when the run trained on one env."""
    import io

    from rich import box
    from rich.console import Console
    from rich.table import Table

    names = sorted({k.split("/")[1] for r in records for k in r if k.startswith("env/") and k.count("/") == 2})
    if not names:
        return None
    table = Table("env", "groups", "reward", "success", "weight", title="per env (last recorded)",
                  box=box.SIMPLE_HEAD, title_justify="left")
    for col in table.columns[1:]:
        col.justify = "right"
    for name in names:
        last = {f: (ys[-1] if (ys := series(records, f"env/{name}/{f}")[1]) else None)
                for f in ("groups", "reward", "success", "weight")}
        table.add_row(name, _fmt(last["groups"]), _fmt(last["reward"]), _fmt(last["success"], True),
                      _fmt(last["weight"], True))
    out = io.StringIO()
    Console(file=out, width=width, color_system=None, force_terminal=False, legacy_windows=False).print(table)
    return "\n".join(line.rstrip() for line in out.getvalue().rstrip().splitlines())


def compile_records(run_dir: pathlib.Path, events: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """The run's compiles: ``compiles.jsonl`` when the run wrote it, else the trace's "compile" spans."""
    from gymllm.telemetry.compiles import COMPILE_TRACK, read_compiles

    recs = read_compiles(run_dir / "compiles.jsonl")
    return recs or [{"name": e["name"], "seconds": e["dur"] / 1e6, "cache_hit": bool(e["args"].get("cache_hit")),
                     "kind": e["args"].get("kind", "program"), "lower_s": e["args"].get("lower_s")}
                    for e in events if e["ph"] == "X" and e["track"] == COMPILE_TRACK]


def summarize(run_dir: pathlib.Path, records, pm: dict[str, Any] | None, hist: dict[int, float],
              compiles: Sequence[dict[str, Any]] = ()) -> str:
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
        lines.append(f"reward over every rollout: first {every[0]:.4g}, last {every[-1]:.4g}, best {max(every):.4g}")
    if reward:
        lines.append(f"reward mean{' of trained groups' if every else ''}: first {reward[0]:.4g}, last "
                     f"{reward[-1]:.4g}, best {max(reward):.4g}")
    _, calls = series(records, "tool_calls_per_episode")
    _, share = series(records, "tool_call_share")
    if calls:
        lines.append(f"tool calls per episode: first {calls[0]:.3g}, last {calls[-1]:.3g}; episodes with a tool call: "
                     f"first {_fmt(share[0] if share else None, True)}, last {_fmt(share[-1] if share else None, True)}")
    for key in sorted({k for r in records for k in r if k.startswith("eval/") and k.endswith("/pass@1")}):
        xs, ys = series(records, key)
        if xs:
            lines.append(f"held-out {key[len('eval/'):-len('/pass@1')]} pass@1: {ys[0]:.3g} (step {xs[0]}) -> "
                         f"{ys[-1]:.3g} (step {xs[-1]})")
    per_env = env_table(records)
    if per_env:
        lines.append(per_env)
    _, length = series(records, "length/mean")
    if length:
        lines.append(f"length mean: last {length[-1]:.4g}")
    source = pm
    if source is None and records:  # no trace: average the per-step pipeline figures
        keys = ("engine_busy_fraction", "engine_idle_fraction", "trainer_idle_fraction", "trainer_busy_fraction",
                "compile_fraction", "trainer_idle_compile_fraction",
                "weight_sync_fraction", "checkpoint_fraction", "tool_latency_share", "env_latency_share",
                "tokens_per_s_generated", "tokens_per_s_trained")
        source = {k: (sum(v) / len(v) if (v := series(records, k)[1]) else None) for k in keys}
    if source:
        lines.append(pipeline_table(source))
    if hist:
        total = sum(hist.values())
        mean = sum(k * v for k, v in hist.items()) / total if total else 0.0
        lines.append(f"staleness: mean {mean:.2f} versions, max {max(hist)}, over {total:,.0f} trained tokens")
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
        raise ReportError(explain(f"report of {str(run_dir)!r}", expected="a run directory with metrics.jsonl and/or trace.json",
                                  received=sorted(p.name for p in run_dir.iterdir())[:10] if run_dir.is_dir() else "no such directory",
                                  fix="pass the run_dir given to `gymllm train` (MetricsLogger writes both files there)"))
    records = read_metrics(metrics_path) if metrics_path.exists() else []
    trace_meta: dict[str, Any] = {}
    events = load_chrome_trace(trace_path, meta=trace_meta) if trace_path is not None else []
    pm = pipeline_metrics(events) if any(e["ph"] == "X" for e in events) else None
    hist = {int(k): v for k, v in (pm or {}).get("staleness_hist", {}).items()} or staleness_from_records(records)
    written = [
        plot_curve(records, "reward", "reward per step", run_dir / "reward.png",
                   mean_label="trained groups mean" if series(records, "rollout_reward_mean")[0] else None,
                   extra=[("rollout_reward_mean", "every rollout mean (filtered groups included)")]),
        plot_eval(records, run_dir / "eval.png"),
        plot_curve(records, "length", "trajectory length per step", run_dir / "length.png"),
        plot_timeline(events, run_dir / "timeline.png"),
        plot_idle(pm, records, run_dir / "idle.png"),
        plot_staleness(hist, run_dir / "staleness.png", records),
    ]
    summary = run_dir / "summary.txt"
    text = summarize(run_dir, records, pm, hist, compile_records(run_dir, events))
    if trace_meta.get("dropped_events"):
        text += (f"note: the trace holds the newest events only; {trace_meta['dropped_events']:,} older ones were "
                 "dropped by the ring buffer (raise Tracer capacity or set spill_path to keep them)\n")
    summary.write_text(text)
    return [p for p in written if p is not None] + [summary]
