"""Argument checks of the vector env's public calls (env ids, actions, seeds, ``min_ready``).

Each returns the normalized value or raises a :mod:`gymllm.errors` error that says what was
expected, what was received and the fix; nothing has started when one raises.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gymllm.errors import InvalidActionError, explain
from gymllm.vector.errors import EnvIdError

__all__ = ["check_env_id", "env_id_list", "action_list", "seed_list", "check_min_ready"]


def check_env_id(env_id: Any, n: int) -> int:
    """``env_id`` as an int in ``[0, n)`` (bools refused)."""
    if (
        isinstance(env_id, (bool, np.bool_))
        or not isinstance(env_id, (int, np.integer))
        or not 0 <= env_id < n
    ):
        raise EnvIdError(
            explain(
                "env id",
                expected=f"an int in [0, {n})",
                received=env_id,
                fix="use the env_ids that recv() returned",
            )
        )
    return int(env_id)


def env_id_list(env_ids: Any, n: int) -> list[int]:
    """Distinct checked env ids (all ``n`` when ``env_ids`` is None)."""
    if env_ids is None:
        return list(range(n))
    ids = [check_env_id(i, n) for i in np.asarray(env_ids, dtype=object).reshape(-1)]
    if len(set(ids)) != len(ids):
        raise EnvIdError(
            explain(
                "env_ids",
                expected="distinct env ids",
                received=ids,
                fix="send at most one action per env id per call",
            )
        )
    return ids


def action_list(actions: Any, n: int) -> list[Any]:
    """``actions`` as a list of exactly ``n`` actions (one per env id)."""
    if isinstance(actions, (str, bytes)) or not hasattr(actions, "__len__"):
        raise InvalidActionError(
            explain(
                "actions",
                expected=f"a sequence of {n} actions",
                received=actions,
                fix="pass a list with one str per env id",
            )
        )
    _check_count(actions, n, "actions", "actions (one per env id)", "pass one action per env id")
    return list(actions)


def seed_list(seed: Any, n: int) -> list[int | None]:
    """Per-env seeds: None -> all None, an int ``s`` -> ``s + i``, else a sequence of ``n`` seeds."""
    if seed is None:
        return [None] * n
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        return [int(seed) + i for i in range(n)]
    seeds = list(seed)
    _check_count(seeds, n, "reset(seed=[...])", "seeds", "pass an int or one seed per env")
    return seeds


def _check_count(items: Any, n: int, what: str, noun: str, fix: str) -> None:
    """``items`` holds exactly ``n`` entries, else an :class:`InvalidActionError`: expected
    ``f"{n} {noun}"``, received the count and ``noun``'s first word (e.g. ``"seeds"``)."""
    if len(items) != n:
        raise InvalidActionError(
            explain(
                what, expected=f"{n} {noun}", received=f"{len(items)} {noun.split()[0]}", fix=fix
            )
        )


def check_min_ready(min_ready: Any) -> int:
    """``recv``'s ``min_ready`` as an int >= 1."""
    if isinstance(min_ready, bool) or not isinstance(min_ready, (int, np.integer)) or min_ready < 1:
        raise InvalidActionError(
            explain(
                "recv(min_ready)",
                expected="an int >= 1",
                received=min_ready,
                fix="pass min_ready=1",
            )
        )
    return int(min_ready)
