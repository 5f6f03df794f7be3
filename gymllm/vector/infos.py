"""Batch per-env info dicts the way Gymnasium's vector envs do (arrays plus ``_key`` masks)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["add_info", "batch_infos"]


def _empty(value: Any, n: int) -> np.ndarray:
    if type(value) in (int, float, bool) or isinstance(value, np.number):
        return np.zeros(n, dtype=type(value))
    if isinstance(value, np.ndarray):
        return np.zeros((n, *value.shape), dtype=value.dtype)
    return np.full(n, None, dtype=object)


def add_info(infos: dict[str, Any], info: dict[str, Any], j: int, n: int) -> dict[str, Any]:
    """Put sub-env ``info`` at index ``j`` of batched ``infos`` (length ``n``), Gymnasium-style.

    Each key maps to an array of length ``n`` (numeric dtype for Python/NumPy scalars, object
    otherwise; nested dicts recurse) and ``"_" + key`` to a bool mask of the indices that have it.
    ``final_obs`` always uses an object array. A value whose type does not fit the array created by
    an earlier sub-env turns that array into an object array, so mixed sub-envs never lose data.
    """
    for key, value in info.items():
        if isinstance(value, dict) and key != "final_obs":
            array = add_info(infos.get(key, {}), value, j, n)
        else:
            array = infos.get(key)
            if array is None:
                array = np.full(n, None, dtype=object) if key == "final_obs" else _empty(value, n)
            try:
                if array.dtype != object and not (
                    type(value) in (int, float, bool) or isinstance(value, (np.number, np.ndarray))
                ):
                    raise TypeError
                array[j] = value
            except (TypeError, ValueError):
                obj = np.full(n, None, dtype=object)
                obj[:] = list(array) if array.ndim == 1 else [a for a in array]
                array = obj
                array[j] = value
        mask = infos.get(f"_{key}")
        if mask is None:
            mask = np.zeros(n, dtype=np.bool_)
        mask[j] = True
        infos[key], infos[f"_{key}"] = array, mask
    return infos


_SCALARS = (int, float, bool)


def batch_infos(pairs: list[tuple[int, dict[str, Any]]], n: int) -> dict[str, Any]:
    """Batch many ``(index, info)`` pairs at once; the same result as repeated :func:`add_info`.

    Columns of plain scalars of one type become typed arrays built in one go (the common case, and
    much cheaper than per-element assignment); anything else falls back to :func:`add_info`.
    """
    cols: dict[str, list[tuple[int, Any]]] = {}
    for j, info in pairs:
        for key, value in info.items():
            cols.setdefault(key, []).append((j, value))
    infos: dict[str, Any] = {}
    for key, items in cols.items():
        t = type(items[0][1])
        mask = np.zeros(n, dtype=np.bool_)
        idx = [j for j, _ in items]
        mask[idx] = True
        if key != "final_obs" and t in _SCALARS and all(type(v) is t for _, v in items):
            array = np.zeros(n, dtype=t)
            array[idx] = [v for _, v in items]
        elif key == "final_obs" or not any(isinstance(v, (dict, np.ndarray, np.number)) for _, v in items):
            if t in _SCALARS and key != "final_obs":  # mixed scalar types: let add_info pick
                sub: dict[str, Any] = {}
                for j, v in items:
                    sub = add_info(sub, {key: v}, j, n)
                infos[key], infos[f"_{key}"] = sub[key], mask
                continue
            array = np.full(n, None, dtype=object)
            for j, v in items:
                array[j] = v
        else:
            sub = {}
            for j, v in items:
                sub = add_info(sub, {key: v}, j, n)
            array = sub[key]
        infos[key], infos[f"_{key}"] = array, mask
    return infos
