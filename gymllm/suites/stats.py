"""The statistics of a suite run, as small pure functions over numbers (no files, no models).

* :func:`pass_at_k`: the unbiased estimator ``1 - C(n - c, k) / C(n, k)`` of one seed with ``n``
  samples of which ``c`` succeeded (Chen et al. 2021, in its numerically stable product form);
  :func:`pass_at_curve` averages it over seeds for every ``j = 1 .. k``.
* :func:`bootstrap` resamples *seeds* (the independent units: the samples of one seed share its
  task) with replacement, within each stratum (an env of the suite) when several are combined with
  weights; :func:`bootstrap_ci` is its percentile interval (95% by default).
* :func:`paired_comparison`: the mean of paired differences ``a - b`` (same env, seed and sample),
  its paired-bootstrap interval, and a two-sided bootstrap p-value for "no difference" (the
  bootstrap distribution shifted to the null: ``(1 + #{|d* - d| >= |d|}) / (B + 1)``).

Every random draw comes from a ``numpy.random.Generator`` the caller seeds, so a summary is
reproducible; no global RNG is touched.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["pass_at_k", "pass_at_curve", "bootstrap", "bootstrap_ci", "paired_comparison"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """P(at least one of ``k`` samples drawn without replacement from ``n`` is among the ``c``
    successes) = ``1 - C(n - c, k) / C(n, k)``; ``k <= n`` is required."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(
            f"pass_at_k: expected 0 <= c <= n and 1 <= k <= n, received n={n}, c={c}, k={k}. "
            "Fix: draw at least k samples per seed"
        )
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def pass_at_curve(successes: Sequence[Sequence[bool]], k: int) -> dict[int, float]:
    """``{j: mean over seeds of pass_at_k(n_seed, c_seed, j)}`` for ``j = 1 .. k``; ``successes`` holds
    one list of sample outcomes per seed. A seed with fewer than ``j`` samples (an unfinished run)
    is left out of ``j``'s mean; a ``j`` no seed reaches is left out of the result."""
    counts = [(len(s), int(np.sum(np.asarray(s, dtype=bool)))) for s in successes]
    out: dict[int, float] = {}
    for j in range(1, k + 1):
        vals = [pass_at_k(n, c, j) for n, c in counts if n >= j]
        if vals:
            out[j] = float(np.mean(vals))
    return out


def bootstrap(
    strata: Sequence[Sequence[float]],
    weights: Sequence[float] | None = None,
    *,
    rng: np.random.Generator,
    num_resamples: int = 2000,
) -> tuple[float, np.ndarray]:
    """The weighted mean of the strata's means (``weights`` normalised; equal by default) and its
    bootstrap distribution ``[num_resamples]``: each resample draws every stratum's units with
    replacement (as many as it has). ``strata``: per stratum, one value per unit (a seed)."""
    arrays = [np.asarray(s, dtype=np.float64) for s in strata]
    if not arrays or any(a.ndim != 1 or a.size == 0 for a in arrays):
        raise ValueError(
            "bootstrap: expected at least one stratum, each a non-empty 1-d sequence of values, "
            f"received sizes {[a.shape for a in arrays]}. Fix: drop the empty strata"
        )
    w = np.ones(len(arrays)) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != (len(arrays),) or np.any(w < 0) or w.sum() <= 0:
        raise ValueError(
            f"bootstrap: expected one weight >= 0 per stratum (some > 0), received {weights}"
        )
    w = w / w.sum()
    point = float(sum(wi * a.mean() for wi, a in zip(w, arrays)))
    dist = np.zeros(num_resamples)
    for wi, a in zip(w, arrays):
        idx = rng.integers(0, a.size, size=(num_resamples, a.size))
        dist += wi * a[idx].mean(axis=1)
    return point, dist


def bootstrap_ci(
    strata: Sequence[Sequence[float]],
    weights: Sequence[float] | None = None,
    *,
    rng: np.random.Generator,
    confidence: float = 0.95,
    num_resamples: int = 2000,
) -> tuple[float, float]:
    """The percentile bootstrap interval ``[lo, hi]`` of :func:`bootstrap`'s weighted mean."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"bootstrap_ci: expected 0 < confidence < 1, received {confidence}")
    _, dist = bootstrap(strata, weights, rng=rng, num_resamples=num_resamples)
    alpha = (1.0 - confidence) / 2
    lo, hi = np.quantile(dist, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def paired_comparison(
    a: Sequence[Sequence[Sequence[float]]],
    b: Sequence[Sequence[Sequence[float]]],
    weights: Sequence[float] | None = None,
    *,
    rng: np.random.Generator,
    confidence: float = 0.95,
    num_resamples: int = 2000,
) -> dict[str, float | list[float]]:
    """Paired comparison of policies ``a`` and ``b``: ``a[s][u][i]`` is the value (reward, or success
    as 0/1) of sample ``i`` of unit (seed) ``u`` of stratum (env) ``s``, and ``b`` the same shape, on the
    same env, seed and sample. Returns ``diff`` (the weighted mean over strata of the mean paired
    difference ``a - b``), ``ci`` ([lo, hi], paired bootstrap over units) and ``p_value`` (two-sided,
    for diff = 0)."""
    strata = []
    for s, (sa, sb) in enumerate(zip(a, b, strict=True)):
        units = []
        for u, (ua, ub) in enumerate(zip(sa, sb, strict=True)):
            xa, xb = np.asarray(ua, dtype=np.float64), np.asarray(ub, dtype=np.float64)
            if xa.shape != xb.shape or xa.size == 0:
                raise ValueError(
                    f"paired_comparison: stratum {s}, unit {u}: expected the same non-zero number of "
                    f"samples for a and b, received {xa.size} and {xb.size}. Fix: pair the same samples"
                )
            units.append(float((xa - xb).mean()))
        strata.append(units)
    point, dist = bootstrap(strata, weights, rng=rng, num_resamples=num_resamples)
    alpha = (1.0 - confidence) / 2
    lo, hi = np.quantile(dist, [alpha, 1.0 - alpha])
    p = (1 + int(np.sum(np.abs(dist - point) >= abs(point) - 1e-12))) / (num_resamples + 1)
    return {"diff": point, "ci": [float(lo), float(hi)], "p_value": float(min(1.0, p))}
