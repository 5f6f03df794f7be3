"""The report's PNG plots (:mod:`gymllm.telemetry.report` lists them): reward, eval, length,
timeline, idle and staleness.

Plots use matplotlib's object API with the Agg canvas (no pyplot, no global backend switch), so
the report is safe to render from any thread or a headless machine. Each ``plot_*`` returns the file
it wrote, or None when its data is missing.
"""

from __future__ import annotations

import pathlib
from typing import Any, Sequence

from gymllm.telemetry.export import assign_lanes, family_of
from gymllm.telemetry.report_series import series

__all__ = [
    "plot_curve",
    "plot_eval",
    "timeline_window",
    "plot_timeline",
    "plot_idle",
    "plot_staleness",
]


_PHASE_COLORS = {
    "prefill": "#1f77b4",
    "decode": "#6baed6",
    "generate": "#9ecae1",
    "train_step": "#2ca02c",
    "micro_batch": "#98df8a",
    "weight_sync": "#d62728",
    "checkpoint": "#9467bd",
    "rollout": "#c7c7c7",
    "queue_wait": "#ff9896",
    "env_step": "#ff7f0e",
    "reward": "#ffbb78",
    "tool": "#8c564b",
}


_EXTRA_COLORS = [
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
    "#aec7e8",
    "#c5b0d5",
    "#c49c94",
    "#f7b6d2",
]


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


def plot_curve(
    records,
    stem: str,
    title: str,
    path: pathlib.Path,
    *,
    mean_label: str | None = None,
    extra: Sequence[tuple[str, str]] = (),
) -> pathlib.Path | None:
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
            ax.fill_between(
                steps,
                [m - s for m, s in zip(mean, sd)],
                [m + s for m, s in zip(mean, sd)],
                color="#1f77b4",
                alpha=0.2,
                label="mean +- std",
            )
    ax.set_xlabel("step")
    ax.set_ylabel(stem)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    return _save(fig, path)


def plot_eval(records, path: pathlib.Path) -> pathlib.Path | None:
    """The held-out curves: ``eval/<env>/pass@1`` (solid) and ``eval/<env>/mean_reward`` (dashed) per
    evaluated step; None when the run did not evaluate."""
    envs = sorted(
        {
            k[len("eval/") : -len("/pass@1")]
            for r in records
            for k in r
            if k.startswith("eval/") and k.endswith("/pass@1")
        }
    )
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


def _rows(
    spans: list[dict[str, Any]], max_rows: int, max_lanes: int, max_env_rows: int = 8
) -> tuple[list[tuple[str, list[dict]]], int]:
    """(row label, spans) per track lane, in track order; and the number of rows left out.

    With more than ``max_env_rows`` env tracks, all env spans share one track "env/*" (its lanes
    show how many envs were busy at once, up to ``max_lanes``).
    """
    by_track: dict[str, list[dict]] = {}
    n_env = len({e["track"] for e in spans if family_of(e["track"]) == "env"})
    for e in spans:
        track = "env/*" if n_env > max_env_rows and family_of(e["track"]) == "env" else e["track"]
        by_track.setdefault(track, []).append(e)
    order = sorted(
        by_track,
        key=lambda t: (
            ("engine", "trainer", "rollout", "tool", "env").index(family_of(t))
            if family_of(t) in ("engine", "trainer", "rollout", "tool", "env")
            else 9,
            len(t),
            t,
        ),
    )
    rows, omitted = [], 0
    for track in order:
        group = by_track[track]
        lanes = assign_lanes(group)
        n = max(lanes) + 1
        for lane in range(n):
            if lane >= max_lanes or len(rows) >= max_rows:
                omitted += 1
                continue
            rows.append(
                (
                    track if lane == 0 else f"{track} #{lane + 1}",
                    [e for e, ln in zip(group, lanes) if ln == lane],
                )
            )
    return rows, omitted


def _depths(lane_spans: list[dict]) -> list[int]:
    """Nesting depth of each span in a properly nested lane."""
    order = sorted(
        range(len(lane_spans)), key=lambda i: (lane_spans[i]["ts"], -lane_spans[i]["dur"])
    )
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


def plot_timeline(
    events, path: pathlib.Path, *, max_rows: int = 32, max_lanes: int = 6, steps: int = 3
) -> pathlib.Path | None:
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
            by_name.setdefault((e["name"], min(d, 3)), []).append(
                ((e["ts"] - t0) / 1e6, e["dur"] / 1e6)
            )
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
    ax.legend(
        list(seen.values()),
        list(seen.keys()),
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
        fontsize=8,
    )
    return _save(fig, path, left=0.13, right=0.86)


def plot_idle(pm: dict[str, Any] | None, records, path: pathlib.Path) -> pathlib.Path | None:
    """Bars of the run-wide busy/idle fractions and per-step lines from metrics.jsonl."""
    bars = {
        k: pm[k]
        for k in (
            "engine_busy_fraction",
            "engine_idle_fraction",
            "trainer_busy_fraction",
            "trainer_idle_fraction",
            "weight_sync_fraction",
            "checkpoint_fraction",
        )
        if pm and pm.get(k) is not None
    }
    lines = {k: series(records, k) for k in ("engine_busy_fraction", "trainer_idle_fraction")}
    lines = {k: v for k, v in lines.items() if v[0]}
    if not bars and not lines:
        return None
    fig = _figure(11, 4)
    axes = (
        [fig.add_subplot(1, 2, i + 1) for i in range(2)]
        if bars and lines
        else [fig.add_subplot(1, 1, 1)]
    )
    if bars:
        ax = axes[0]
        names = list(bars)
        ax.barh(
            names,
            [bars[n] for n in names],
            color=["#1f77b4" if "busy" in n else "#d62728" for n in names],
        )
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
