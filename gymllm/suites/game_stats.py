"""Paired comparisons of players from the rows of ``gymllm eval game`` (``games.jsonl``).

    rows = [json.loads(x) for x in open("out/games.jsonl")]
    seed_results(rows, "selfplay", "random", "win_or_draw")     # {seed: mean over its seat-swapped games}
    paired_comparisons(rows, ["sft", "selfplay"], ["random"])   # selfplay - sft, paired by seed, 95% interval

Two players who each met the same opponent on the same schedule (:func:`gymllm.suites.games.schedule`:
seed ``s`` is played twice, once from each seat, and the random player's draws depend on the seed and
the game, not on who it plays) are compared game for game: a **unit** is an env seed, its result the
player's mean over that seed's scored games against the opponent, and the difference of the two
players is :func:`gymllm.utils.paired.paired_difference` over the seeds both have (Student's t interval).

Metrics (``METRICS``): ``score`` (1 a win, 1/2 a draw, 0 a loss), ``win_or_draw`` (1 unless lost),
``win`` (1 for a win) and ``reward`` (the player's final reward in the game: its chips in Kuhn poker;
games without one, a crashed side's, are left out of that metric).
"""

from __future__ import annotations

import itertools
from typing import Any, Sequence

__all__ = ["METRICS", "game_value", "seed_results", "paired_comparisons"]

METRICS = ("score", "win_or_draw", "win", "reward")


def game_value(row: dict[str, Any], player: str, metric: str) -> float | None:
    """``player``'s value of ``metric`` in one row (module doc); None when the row has none (unscored,
    or no final reward)."""
    if metric not in METRICS:
        raise ValueError(
            f"game_value: expected a metric in {METRICS}, received {metric!r}; fix: pick one of them"
        )
    if metric == "reward":
        r = (row.get("rewards") or {}).get(player)
        return None if r is None else float(r)
    if not row.get("scored"):
        return None
    won, drawn = row["winner"] == player, row["winner"] is None
    return {
        "score": 1.0 if won else 0.5 if drawn else 0.0,
        "win_or_draw": 0.0 if not (won or drawn) else 1.0,
        "win": 1.0 if won else 0.0,
    }[metric]


def seed_results(
    rows: Sequence[dict[str, Any]], player: str, opponent: str, metric: str
) -> dict[int, float]:
    """``{seed: player's mean metric over that seed's games against opponent}`` (seeds with a value)."""
    per: dict[int, list[float]] = {}
    for row in rows:
        if set(row["pairing"]) != {player, opponent}:
            continue
        v = game_value(row, player, metric)
        if v is not None:
            per.setdefault(int(row["seed"]), []).append(v)
    return {s: sum(v) / len(v) for s, v in per.items()}


def paired_comparisons(
    rows: Sequence[dict[str, Any]],
    players: Sequence[str],
    opponents: Sequence[str],
    *,
    metrics: Sequence[str] = METRICS,
    confidence: float = 0.95,
) -> list[dict[str, Any]]:
    """For every two ``players`` ``a`` before ``b`` and every opponent both met: ``{"player": b,
    "baseline": a, "opponent", "metric", "n" (seeds), "mean_a", "mean_b", "diff" (b - a), "se", "lo",
    "hi", "confidence"}`` per metric with at least two shared seeds."""
    from gymllm.utils.paired import paired_difference

    out = []
    for a, b in itertools.combinations(players, 2):
        for c in opponents:
            if c in (a, b):
                continue
            for metric in metrics:
                ra, rb = seed_results(rows, a, c, metric), seed_results(rows, b, c, metric)
                if len(set(ra) & set(rb)) < 2:
                    continue
                d = paired_difference(rb, ra, confidence=confidence)
                out.append(
                    {
                        "player": b,
                        "baseline": a,
                        "opponent": c,
                        "metric": metric,
                        "n": d["n"],
                        "mean_a": d["mean_b"],
                        "mean_b": d["mean_a"],
                        "diff": d["diff"],
                        "se": d["se"],
                        "lo": d["lo"],
                        "hi": d["hi"],
                        "confidence": confidence,
                    }
                )
    return out
