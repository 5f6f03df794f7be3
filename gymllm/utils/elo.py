"""Ratings from games, as small pure functions over numbers (no files, no models, no global RNG).

* :func:`fit_bradley_terry`: the maximum-likelihood Bradley-Terry ratings on the Elo scale:
  ``P(i beats j) = 1 / (1 + 10 ** ((r_j - r_i) / 400))``, a draw counting as half a win for each
  side. ``scores[i, j]`` is what ``i`` scored against ``j`` (wins + draws / 2), ``counts[i, j]`` the
  games they played. Fitted by Newton's method with a backtracking line search on the (concave)
  log-likelihood; the ratings are returned with mean 0 (the likelihood fixes only differences).
  ``prior_draws`` adds that many virtual draws to every pair that met (as BayesElo's prior does), so
  a player who won or lost every game still gets a finite rating; with ``prior_draws=0`` the maximum
  exists only when the "scored against" graph is strongly connected (Zermelo, Ford), which is
  checked, and the fit is the textbook MLE: two players with win rate ``p`` are
  :func:`rating_gap` ``(p) = 400 log10(p / (1 - p))`` apart.
* :func:`elo_ratings` turns game results ``(a, b, score_of_a)`` into anchored ratings: ``anchor`` (a
  player, e.g. ``random``) gets ``anchor_value`` (1000), or with no anchor the mean is 1000.
* :func:`bootstrap_ratings`: a percentile interval per rating from resampling the games with
  replacement within each pairing (every pairing keeps its number of games, so the design stays
  connected), each resample refitted and anchored the same way (the anchor's own interval is a point).
* :func:`wilson_interval`: the Wilson score interval of a proportion ``k / n``.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Hashable, Sequence

import numpy as np

__all__ = [
    "ELO_SCALE",
    "expected_score",
    "rating_gap",
    "pairwise_matrices",
    "fit_bradley_terry",
    "elo_ratings",
    "bootstrap_ratings",
    "wilson_interval",
]

#: Elo points per natural-log unit of odds: ``r = ELO_SCALE * theta`` with ``P = sigmoid(theta_i - theta_j)``
ELO_SCALE = 400.0 / math.log(10.0)


def expected_score(r_a: float, r_b: float) -> float:
    """``a``'s expected score against ``b``: ``1 / (1 + 10 ** ((r_b - r_a) / 400))``."""
    return 1.0 / (1.0 + 10.0 ** ((r_b - r_a) / 400.0))


def rating_gap(p: float) -> float:
    """The Elo gap at which the stronger side scores ``p`` (0 < p < 1): ``400 log10(p / (1 - p))``."""
    if not 0.0 < p < 1.0:
        raise ValueError(
            f"rating_gap: expected a score rate strictly between 0 and 1, received {p}. "
            "Fix: a rate of 0 or 1 is an infinite gap"
        )
    return 400.0 * math.log10(p / (1.0 - p))


def pairwise_matrices(
    games: Sequence[tuple[Hashable, Hashable, float]], players: Sequence[Hashable]
) -> tuple[np.ndarray, np.ndarray]:
    """``(scores, counts)``, each ``[n, n]``: ``scores[i, j]`` what ``players[i]`` scored against
    ``players[j]`` over ``games`` (each ``(a, b, score_of_a)``, score in [0, 1]), ``counts[i, j]`` the
    games between them (symmetric)."""
    index = {p: i for i, p in enumerate(players)}
    n = len(players)
    scores, counts = np.zeros((n, n)), np.zeros((n, n))
    for a, b, s in games:
        if a not in index or b not in index or a == b:
            raise ValueError(
                f"pairwise_matrices: expected games between two distinct players of {list(players)}, "
                f"received ({a!r}, {b!r}). Fix: list every player"
            )
        s = float(s)
        if not 0.0 <= s <= 1.0:
            raise ValueError(
                f"pairwise_matrices: expected a score in [0, 1] (1 win, 0.5 draw, 0 loss), received {s}"
            )
        i, j = index[a], index[b]
        scores[i, j] += s
        scores[j, i] += 1.0 - s
        counts[i, j] += 1.0
        counts[j, i] += 1.0
    return scores, counts


def _reaches_all(adjacency: np.ndarray) -> bool:
    seen, todo = {0}, [0]
    while todo:
        i = todo.pop()
        for j in np.flatnonzero(adjacency[i]):
            if int(j) not in seen:
                seen.add(int(j))
                todo.append(int(j))
    return len(seen) == adjacency.shape[0]


def _log_likelihood(theta: np.ndarray, scores: np.ndarray) -> float:
    d = theta[:, None] - theta[None, :]
    return float(
        -(scores * np.logaddexp(0.0, -d)).sum()
    )  # sum_ij S_ij log sigmoid(theta_i - theta_j)


def fit_bradley_terry(
    scores: np.ndarray,
    counts: np.ndarray,
    *,
    prior_draws: float = 0.0,
    max_iter: int = 100,
    tol: float = 1e-9,
) -> np.ndarray:
    """Maximum-likelihood ratings (Elo scale, mean 0) from ``scores`` / ``counts`` (module doc).

    Raises ValueError when the players are not all connected by games, or (``prior_draws=0``) when
    some group of players scored nothing against the rest (their ratings would be infinite)."""
    s, c = np.asarray(scores, dtype=np.float64), np.asarray(counts, dtype=np.float64)
    n = s.shape[0]
    if (
        s.shape != (n, n)
        or c.shape != (n, n)
        or not np.allclose(c, c.T)
        or not np.allclose(s + s.T, c)
    ):
        raise ValueError(
            "fit_bradley_terry: expected square scores and symmetric counts with scores[i, j] + "
            f"scores[j, i] == counts[i, j], received shapes {s.shape} and {c.shape}. "
            "Fix: build them with pairwise_matrices"
        )
    if prior_draws < 0:
        raise ValueError(f"fit_bradley_terry: expected prior_draws >= 0, received {prior_draws}")
    if n == 1:
        return np.zeros(1)
    if not _reaches_all(c > 0):
        raise ValueError(
            "fit_bradley_terry: the players are not all connected by games, so their ratings are not "
            "comparable. Fix: add games between the groups (a round robin connects everyone)"
        )
    met = (c > 0).astype(np.float64)
    s = s + 0.5 * prior_draws * met
    c = c + prior_draws * met
    if prior_draws == 0 and not (_reaches_all(s > 0) and _reaches_all((s > 0).T)):
        raise ValueError(
            "fit_bradley_terry: some players won (or lost) every game against the others, so the "
            "maximum-likelihood ratings are infinite. Fix: pass prior_draws > 0 (virtual draws per pairing)"
        )
    theta = np.zeros(n)
    ll = _log_likelihood(theta, s)
    for _ in range(max_iter):
        p = 1.0 / (1.0 + np.exp(-(theta[:, None] - theta[None, :])))
        grad = s.sum(axis=1) - (c * p).sum(axis=1)
        if np.max(np.abs(grad)) < tol * max(1.0, c.sum()):
            break
        w = c * p * (1.0 - p)
        lap = (
            np.diag(w.sum(axis=1)) - w
        )  # minus the Hessian: a weighted graph Laplacian (null space: constants)
        step = np.linalg.solve(lap + np.ones((n, n)), grad)  # the Newton step with mean 0
        t = 1.0
        while t > 1e-12:
            cand = theta + t * step
            new = _log_likelihood(cand, s)
            if new >= ll - 1e-12:
                theta, ll = cand, new
                break
            t *= 0.5
        else:
            break
    theta = theta - theta.mean()
    return ELO_SCALE * theta


def _anchored(
    ratings: np.ndarray, players: Sequence[Hashable], anchor: Hashable | None, value: float
) -> np.ndarray:
    if anchor is None:
        return ratings - ratings.mean() + value
    return ratings - ratings[list(players).index(anchor)] + value


def elo_ratings(
    games: Sequence[tuple[Hashable, Hashable, float]],
    players: Sequence[Hashable] | None = None,
    *,
    anchor: Hashable | None = None,
    anchor_value: float = 1000.0,
    prior_draws: float = 1.0,
) -> dict[Hashable, float]:
    """``{player: rating}`` fitted from ``games`` (``(a, b, score_of_a)``): ``anchor`` rated
    ``anchor_value``, or (no anchor) the mean rating ``anchor_value``. ``players``: the order (default:
    as they first appear)."""
    players = (
        list(players)
        if players is not None
        else list(dict.fromkeys(p for g in games for p in g[:2]))
    )
    if anchor is not None and anchor not in players:
        raise ValueError(
            f"elo_ratings: expected the anchor among the players {players}, received {anchor!r}. "
            "Fix: anchor a player who played, or None (mean)"
        )
    scores, counts = pairwise_matrices(games, players)
    r = _anchored(
        fit_bradley_terry(scores, counts, prior_draws=prior_draws), players, anchor, anchor_value
    )
    return {p: float(x) for p, x in zip(players, r)}


def bootstrap_ratings(
    games: Sequence[tuple[Hashable, Hashable, float]],
    players: Sequence[Hashable] | None = None,
    *,
    rng: np.random.Generator,
    anchor: Hashable | None = None,
    anchor_value: float = 1000.0,
    prior_draws: float = 1.0,
    confidence: float = 0.95,
    num_resamples: int = 1000,
) -> dict[Hashable, tuple[float, float]]:
    """``{player: (lo, hi)}``: the percentile interval of each rating over ``num_resamples`` resamples
    of the games (with replacement within each pairing), refitted and anchored as :func:`elo_ratings`.
    A resample whose fit has no finite maximum (only possible with ``prior_draws=0``) is left out."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"bootstrap_ratings: expected 0 < confidence < 1, received {confidence}")
    players = (
        list(players)
        if players is not None
        else list(dict.fromkeys(p for g in games for p in g[:2]))
    )
    index = {p: i for i, p in enumerate(players)}
    strata: dict[tuple[int, int], list[float]] = {}
    for a, b, s in games:
        i, j = index[a], index[b]
        strata.setdefault((i, j), []).append(float(s))
    n = len(players)
    base = np.zeros((n, n))
    resampled: list[tuple[int, int, int, np.ndarray]] = []
    for (i, j), xs in strata.items():
        x = np.asarray(xs)
        sums = x[rng.integers(0, x.size, size=(num_resamples, x.size))].sum(axis=1)
        resampled.append((i, j, x.size, sums))
        base[i, j] += x.size
        base[j, i] += x.size
    fits = []
    for k in range(num_resamples):
        scores = np.zeros((n, n))
        for i, j, size, sums in resampled:
            scores[i, j] += sums[k]
            scores[j, i] += size - sums[k]
        try:
            r = fit_bradley_terry(scores, base, prior_draws=prior_draws)
        except ValueError:
            continue
        fits.append(_anchored(r, players, anchor, anchor_value))
    if not fits:
        raise ValueError(
            "bootstrap_ratings: no resample had finite ratings. Fix: pass prior_draws > 0"
        )
    dist = np.stack(fits)
    alpha = (1.0 - confidence) / 2
    lo, hi = np.quantile(dist, [alpha, 1.0 - alpha], axis=0)
    return {p: (float(a), float(b)) for p, a, b in zip(players, lo, hi)}


def wilson_interval(k: float, n: float, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of the proportion ``k / n`` (``(0, 1)`` when ``n == 0``)."""
    if n < 0 or not 0 <= k <= n:
        raise ValueError(f"wilson_interval: expected 0 <= k <= n, received k={k}, n={n}")
    if n == 0:
        return 0.0, 1.0
    z = NormalDist().inv_cdf(1.0 - (1.0 - confidence) / 2)
    p = k / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (0.0 if k == 0 else max(0.0, centre - half)), (
        1.0 if k == n else min(1.0, centre + half)
    )
