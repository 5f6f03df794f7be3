"""Reading a run's metrics for the report: ``metrics.jsonl`` records and the series in them.

:func:`read_metrics` reads the records :class:`gymllm.telemetry.sinks.MetricsLogger` writes;
:func:`series` picks one statistic's (steps, values) under any of its spellings (:data:`ALIASES`);
:func:`staleness_from_records` rebuilds the staleness histogram from the per-step columns. Used by
:mod:`gymllm.telemetry.report` (summary.txt) and :mod:`gymllm.telemetry.report_plots` (the PNGs).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Sequence

__all__ = ["read_metrics", "ALIASES", "series", "staleness_from_records"]


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


# Names the learner may use for a statistic: ours ("reward/mean") first, then flat spellings.
ALIASES = {
    "reward/mean": ("reward/mean", "reward_mean"),
    "reward/min": ("reward/min", "reward_min"),
    "reward/max": ("reward/max", "reward_max"),
    "reward/std": ("reward/std", "reward_std"),
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
    keys = [
        k
        for n in names
        for k in sorted((k for k in present if k == n or k.endswith("/" + n)), key=len)
    ]
    for key in keys:
        pts = {
            int(r["step"]): float(r[key])
            for r in records
            if "step" in r and isinstance(r.get(key), (int, float)) and math.isfinite(r[key])
        }
        if pts:
            steps = sorted(pts)
            return steps, [pts[s] for s in steps]
    return [], []


def staleness_from_records(records) -> dict[int, float]:
    """Sum of the ``.../staleness_hist/<lag>`` columns over all records."""
    hist: dict[int, float] = {}
    for r in records:
        for k, v in r.items():
            head, _, lag = k.rpartition("/")
            if (
                head.endswith("staleness_hist")
                and lag.lstrip("-").isdigit()
                and isinstance(v, (int, float))
            ):
                hist[int(lag)] = hist.get(int(lag), 0.0) + float(v)
    return dict(sorted(hist.items()))
