"""Paired comparison of two players on the same games: the mean difference and its confidence interval.

    d = paired_difference({1: 1.0, 2: 0.5, 3: 0.0}, {1: 0.5, 2: 0.5, 3: 0.0})
    d["diff"], d["lo"], d["hi"]            # mean of a - b over the shared units, and its 95% interval

Two checkpoints evaluated on the same schedule (``gymllm eval game``: the same env seeds, each seed
played from both seats) meet the same deals and openings, so their per-seed results are correlated and
the difference of two independent means overstates the noise. :func:`paired_difference` takes each
player's result per unit (a unit is an env seed: the mean of its seat-swapped games, so a unit holds
every game that shares a deal, and units are independent) and computes, over the units both players
have, ``d_i = a_i - b_i``; the estimate is ``mean(d)``, its standard error ``sd(d) / sqrt(n)`` (``sd``
with ``n - 1``), and the interval ``mean(d) +- t * se`` with ``t`` Student's quantile of ``n - 1``
degrees of freedom at ``(1 + confidence) / 2``. The interval is above 0 exactly when the improvement is
significant at ``1 - confidence`` (two-sided).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

__all__ = ["paired_difference", "student_t_quantile"]


def student_t_quantile(p: float, df: int) -> float:
    """Student's t quantile at probability ``p`` with ``df`` degrees of freedom (scipy's)."""
    from scipy import stats

    if df < 1:
        raise ValueError(
            f"student_t_quantile: expected df >= 1, received {df}; fix: compare at least two units"
        )
    return float(stats.t.ppf(p, df))


def paired_difference(
    a: Mapping[Any, float], b: Mapping[Any, float], *, confidence: float = 0.95
) -> dict[str, Any]:
    """``a`` and ``b``: each player's result per unit (module doc). Returns ``n`` (shared units),
    ``mean_a``, ``mean_b`` (over the shared units), ``diff`` (mean of ``a - b``), ``se``, ``lo``, ``hi``
    (the ``confidence`` interval of ``diff``), ``t`` (the quantile used) and ``confidence``. Fewer than
    two shared units is a ValueError (no interval exists); equal differences give a zero-width interval."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(
            f"paired_difference: expected 0 < confidence < 1, received {confidence}; fix: e.g. 0.95"
        )
    units = [u for u in a if u in b]
    n = len(units)
    if n < 2:
        raise ValueError(
            f"paired_difference: expected at least two units both players have, received {n} "
            f"(a has {len(a)}, b has {len(b)}); fix: evaluate both on the same seeds"
        )
    d = [float(a[u]) - float(b[u]) for u in units]
    mean = sum(d) / n
    var = sum((x - mean) ** 2 for x in d) / (n - 1)
    se = math.sqrt(var / n)
    t = student_t_quantile((1.0 + confidence) / 2.0, n - 1)
    return {
        "n": n,
        "mean_a": sum(float(a[u]) for u in units) / n,
        "mean_b": sum(float(b[u]) for u in units) / n,
        "diff": mean,
        "se": se,
        "lo": mean - t * se,
        "hi": mean + t * se,
        "t": t,
        "confidence": confidence,
    }
