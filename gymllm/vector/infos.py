"""Batch per-env info dicts the way Gymnasium's vector envs do (arrays plus ``_key`` masks)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["add_info", "batch_infos", "batch_results"]


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
                if array.dtype != object:
                    if not (
                        type(value) in (int, float, bool)
                        or isinstance(value, (np.number, np.ndarray))
                    ):
                        raise TypeError
                    wider = np.result_type(array.dtype, np.asarray(value).dtype)
                    if wider != array.dtype:  # e.g. a float after ints: widen instead of truncating
                        array = array.astype(wider)
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
_OBJECT_OK = {str, type(None), list, tuple, bytes}


def batch_infos(pairs: list[tuple[int, dict[str, Any]]], n: int) -> dict[str, Any]:
    """Batch many ``(index, info)`` pairs at once; the same result as repeated :func:`add_info`.

    Columns of plain scalars of one type become typed arrays and columns of strings / None /
    lists object arrays, each built in one go (the common cases, much cheaper than per-element
    assignment); anything else (nested dicts, NumPy values, mixed scalar types) goes through
    :func:`add_info`.
    """
    cols: dict[str, list[tuple[int, Any]]] = {}
    for j, info in pairs:
        for item in info.items():
            col = cols.get(item[0])
            if col is None:
                cols[item[0]] = [(j, item[1])]
            else:
                col.append((j, item[1]))
    infos: dict[str, Any] = {}
    for key, items in cols.items():
        idx = [j for j, _ in items]
        values = [v for _, v in items]
        types = set(map(type, values))
        t = next(iter(types))
        if len(types) == 1 and t in _SCALARS and key != "final_obs":
            array = np.zeros(n, dtype=t)
            array[idx] = values
        elif key == "final_obs" or types <= _OBJECT_OK:
            array = np.full(n, None, dtype=object)
            for j, v in zip(
                idx, values
            ):  # element-wise: a list of str would first become a '<U' array
                array[j] = v
        else:
            sub: dict[str, Any] = {}
            for j, v in zip(idx, values):
                sub = add_info(sub, {key: v}, j, n)
            infos[key] = sub[key]
            infos[f"_{key}"] = sub[f"_{key}"]
            continue
        mask = np.zeros(n, dtype=np.bool_)
        mask[idx] = True
        infos[key], infos[f"_{key}"] = array, mask
    return infos


def batch_results(results: list, n: int, by_env_id: bool) -> tuple:
    """``(obs, rewards, terms, truncs, infos)`` arrays of length ``n`` from result records
    (``env_id``, ``obs``, ``reward``, ``terminated``, ``truncated``, ``info``); result k goes to index
    ``env_id`` (``by_env_id``) or ``k``."""
    obs = np.empty(n, dtype=object)
    rewards = np.zeros(n, dtype=np.float64)
    terms = np.zeros(n, dtype=np.bool_)
    truncs = np.zeros(n, dtype=np.bool_)
    pairs = []
    for k, r in enumerate(results):
        j = r.env_id if by_env_id else k
        obs[j] = r.obs
        rewards[j] = r.reward
        terms[j] = r.terminated
        truncs[j] = r.truncated
        if r.info:
            pairs.append((j, r.info))
    return obs, rewards, terms, truncs, batch_infos(pairs, n)
