"""The tables of :mod:`gymllm.suites.games`: win/draw/loss per pairing and the Elo ratings of the rows.

:func:`summarize_games` is ``summary.json``'s ``pairings`` (per ordered player and opponent, Wilson
intervals, the most frequent error: :func:`top_error`); :func:`ratings_table` is ``ratings.json``
(Bradley-Terry Elo, bootstrap intervals; :mod:`gymllm.utils.elo`); :func:`row_score` reads one row's score.
"""

from __future__ import annotations

import collections
import itertools
from typing import Any, Sequence

import numpy as np

__all__ = ["row_score", "summarize_games", "ratings_table", "top_error"]


def row_score(row: dict[str, Any]) -> float | None:
    """The first label of ``row["pairing"]``'s score in a scored row (1 win, 0.5 draw, 0 loss), else None."""
    if not row.get("scored"):
        return None
    a = row["pairing"][0]
    return 0.5 if row["winner"] is None else 1.0 if row["winner"] == a else 0.0


def top_error(rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The most frequent ``error`` text of ``rows`` and how many rows carry it (ties: the first met);
    None when no row has one."""
    counts = collections.Counter(r["error"] for r in rows if r.get("error") is not None)
    if not counts:
        return None
    text, n = counts.most_common(1)[0]
    return {"error": text, "rows": n}


def summarize_games(
    rows: Sequence[dict[str, Any]], labels: Sequence[str], *, confidence: float = 0.95
) -> list[dict[str, Any]]:
    """Per ordered (player, opponent) that met: scored ``games``, ``errors`` (rows with an error),
    ``top_error`` (:func:`top_error` of them), ``win`` / ``draw`` / ``loss`` rates (summing to 1; None
    without a scored game), their Wilson intervals (``win_ci``...), ``score`` (wins + draws / 2 over
    games) and ``seats`` (games played in each seat, scored or not)."""
    from gymllm.utils.elo import wilson_interval

    out = []
    for a, b in itertools.permutations(labels, 2):
        mine = [r for r in rows if set(r["pairing"]) == {a, b}]
        if not mine:
            continue
        scored = [r for r in mine if r["scored"]]
        n = len(scored)
        w = sum(r["winner"] == a for r in scored)
        d = sum(r["winner"] is None for r in scored)
        line: dict[str, Any] = {
            "player": a,
            "opponent": b,
            "games": n,
            "errors": sum(r["error"] is not None for r in mine),
            "top_error": top_error(mine),
        }
        for name, k in (("win", w), ("draw", d), ("loss", n - w - d)):
            line[name] = k / n if n else None
            line[f"{name}_ci"] = list(wilson_interval(k, n, confidence)) if n else None
        line["score"] = (w + d / 2) / n if n else None
        seats: dict[str, int] = {}
        for r in mine:
            for seat, label in r["players"].items():
                if label == a:
                    seats[seat] = seats.get(seat, 0) + 1
        line["seats"] = seats
        out.append(line)
    return out


def ratings_table(
    rows: Sequence[dict[str, Any]], labels: Sequence[str], config: Any
) -> dict[str, Any]:
    """``ratings.json``'s content: Bradley-Terry Elo ratings of every player with scored games (anchored
    as :mod:`gymllm.suites.games` says), sorted best first, each with its bootstrap interval, games and
    score. ``config``: the :class:`~gymllm.suites.games.MatchConfig` (typed ``Any``: games.py imports
    this module, not back)."""
    from gymllm.utils.elo import bootstrap_ratings, elo_ratings

    games = [
        (r["pairing"][0], r["pairing"][1], row_score(r)) for r in rows if row_score(r) is not None
    ]
    rated = [label for label in labels if any(label in g[:2] for g in games)]
    anchor = config.anchor if config.anchor in rated else None
    out: dict[str, Any] = {
        "method": "Bradley-Terry maximum likelihood on the Elo scale (P(a beats b) = 1 / (1 + 10^((r_b - r_a) / 400))), "
        f"draws as half a win, {config.prior_draws:g} virtual draw(s) per pairing",
        "anchor": f"{anchor} = {config.anchor_value:g}"
        if anchor
        else f"mean = {config.anchor_value:g}",
        "interval": f"{config.confidence:.0%} percentile bootstrap, {config.num_resamples} resamples of the games "
        "within each pairing",
        "games": len(games),
        "unrated": [label for label in labels if label not in rated],
        "ratings": [],
    }
    if len(rated) < 2:
        out["error"] = "fewer than two players have scored games"
        return out
    try:
        point = elo_ratings(
            games,
            rated,
            anchor=anchor,
            anchor_value=config.anchor_value,
            prior_draws=config.prior_draws,
        )
        ci = bootstrap_ratings(
            games,
            rated,
            rng=np.random.default_rng(config.bootstrap_seed),
            anchor=anchor,
            anchor_value=config.anchor_value,
            prior_draws=config.prior_draws,
            confidence=config.confidence,
            num_resamples=config.num_resamples,
        )
    except ValueError as e:
        out["error"] = str(e)
        return out
    for label in sorted(rated, key=lambda x: -point[x]):
        mine = [g for g in games if label in g[:2]]
        score = sum(s if g0 == label else 1.0 - s for g0, _, s in mine)
        out["ratings"].append(
            {
                "player": label,
                "elo": point[label],
                "ci": list(ci[label]),
                "games": len(mine),
                "score": score / len(mine),
            }
        )
    return out
