"""A suite run's files: ``results.jsonl`` (one row per sample), ``suite.json``, ``summary.json``.

A row (one per policy, env, seed and sample)::

    {"policy": "tiny-qwen3", "env": "arithmetic", "seed": 1000000, "sample": 0, "reward": 1.0,
     "success": true, "turns": 1, "tokens": 17, "error": null}

``env`` is the suite's name for the env; ``error`` is null, or the message of an episode that failed
(the row stays: reward 0, success false, counted in ``errors``; never dropped). Rows are appended
one ``write`` each on an ``O_APPEND`` descriptor, so a killed run leaves whole rows, plus at most a
torn last line that :meth:`ResultsFile.repair` cuts off before a resume appends.

:func:`summarize` turns rows into ``summary.json`` (see :mod:`gymllm.suites.stats` for the numbers):
one entry per (policy, env) and per policy over the whole suite (``env`` "*", the suite's weights
applied), and the paired comparisons of every pair of policies on every env and on "*".
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import pathlib
from typing import Any, Iterable, Sequence

import numpy as np

from gymllm.errors import ConfigError, explain
from gymllm.suites.spec import Suite, parse_suite
from gymllm.suites.stats import bootstrap, bootstrap_ci, paired_comparison, pass_at_curve

__all__ = ["ROW_KEYS", "ResultsFile", "row_key", "suite_from_dict", "summarize", "write_json"]

ROW_KEYS = ("policy", "env", "seed", "sample", "reward", "success", "turns", "tokens", "error")


def row_key(row: dict[str, Any]) -> tuple[str, str, int, int]:
    """The identity of a row: ``(policy, env, seed, sample)``."""
    return (str(row["policy"]), str(row["env"]), int(row["seed"]), int(row["sample"]))


class ResultsFile:
    """``results.jsonl`` of a run directory: :meth:`repair`, :meth:`read`, :meth:`keys`, :meth:`append`."""

    def __init__(self, path: str | os.PathLike):
        self.path = pathlib.Path(path)
        self._fd: int | None = None

    def repair(self) -> int:
        """Cut a torn last line (no newline, or not JSON) off the file; returns the bytes removed."""
        if not self.path.is_file():
            return 0
        data = self.path.read_bytes()
        end = len(data)
        if data and not data.endswith(b"\n"):
            end = data.rfind(b"\n") + 1
        else:
            last_start = data.rfind(b"\n", 0, max(0, end - 1)) + 1
            if end and not self._parses(data[last_start:end]):
                end = last_start
        if end != len(data):
            with self.path.open("r+b") as f:
                f.truncate(end)
        return len(data) - end

    @staticmethod
    def _parses(line: bytes) -> bool:
        try:
            return isinstance(json.loads(line), dict)
        except ValueError:
            return False

    def read(self) -> list[dict[str, Any]]:
        """Every row, in file order (a torn last line is left out; a bad line elsewhere is an error)."""
        if not self.path.is_file():
            return []
        rows = []
        lines = self.path.read_bytes().split(b"\n")
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                if i == len(lines) - 1:  # torn last line: repair() removes it before appending
                    continue
                raise ConfigError(
                    explain(
                        f"{self.path} line {i + 1}",
                        expected="one JSON object per line",
                        received=line[:80].decode(errors="replace"),
                        fix="remove the line (the rows around it are kept)",
                    )
                ) from None
            missing = [k for k in ROW_KEYS if k not in row]
            if missing:
                raise ConfigError(
                    explain(
                        f"{self.path} line {i + 1}",
                        expected=f"a row with keys {list(ROW_KEYS)}",
                        received=f"missing {missing}",
                        fix="this is not a suite results file",
                    )
                )
            rows.append(row)
        return rows

    def keys(self) -> set[tuple[str, str, int, int]]:
        return {row_key(r) for r in self.read()}

    def append(self, row: dict[str, Any]) -> None:
        """Write one row as one line, in one ``write`` call."""
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        data = (json.dumps({k: row.get(k) for k in ROW_KEYS}) + "\n").encode()
        written = os.write(self._fd, data)
        if written != len(
            data
        ):  # a regular file takes it whole; anything else is an error worth seeing
            raise OSError(f"{self.path}: wrote {written} of {len(data)} bytes of a row")

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def write_json(path: str | os.PathLike, data: Any) -> pathlib.Path:
    """Write ``data`` as indented JSON through a temporary file (a reader never sees half a file)."""
    p = pathlib.Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    tmp.replace(p)
    return p


def suite_from_dict(data: dict[str, Any]) -> Suite:
    """The :class:`Suite` a run directory's ``suite.json`` holds (ids not resolved: nothing is imported)."""
    envs = [{k: v for k, v in e.items() if v is not None and k != "source"} for e in data["envs"]]
    return parse_suite(
        {"name": data["name"], "description": data.get("description", ""), "env": envs},
        source=data.get("source") or "suite.json",
        resolve=False,
    )


# ----------------------------------------------------------------------------------------- summary


def _by_seed(rows: Iterable[dict[str, Any]]) -> dict[int, dict[int, dict[str, Any]]]:
    """seed -> sample -> row (the first row of a key wins)."""
    out: dict[int, dict[int, dict[str, Any]]] = collections.defaultdict(dict)
    for r in rows:
        out[int(r["seed"])].setdefault(int(r["sample"]), r)
    return dict(sorted(out.items()))


def _reward(r: dict[str, Any]) -> float:
    return 0.0 if r.get("error") is not None or r.get("reward") is None else float(r["reward"])


def _success(r: dict[str, Any]) -> float:
    return float(r.get("error") is None and bool(r.get("success")))


def _env_entry(
    policy: str,
    env: str,
    k: int,
    seeds: dict[int, dict[int, dict[str, Any]]],
    rng: np.random.Generator,
    num_resamples: int,
) -> dict[str, Any]:
    per_seed_reward = [float(np.mean([_reward(r) for r in s.values()])) for s in seeds.values()]
    curve = pass_at_curve(
        [[bool(_success(r)) for _, r in sorted(s.items())] for s in seeds.values()], k
    )
    lo, hi = bootstrap_ci([per_seed_reward], rng=rng, num_resamples=num_resamples)
    return {
        "policy": policy,
        "env": env,
        "num_seeds": len(seeds),
        "k": k,
        "samples": sum(len(s) for s in seeds.values()),
        "pass_at": {str(j): v for j, v in curve.items()},
        "mean_reward": float(np.mean(per_seed_reward)),
        "mean_reward_ci": [lo, hi],
        "errors": sum(r.get("error") is not None for s in seeds.values() for r in s.values()),
    }


def _suite_entry(
    policy: str,
    entries: list[dict[str, Any]],
    strata: list[list[float]],
    weights: list[float],
    rng: np.random.Generator,
    num_resamples: int,
) -> dict[str, Any]:
    w = np.asarray(weights) / np.sum(weights)
    kmin = min(e["k"] for e in entries)
    pass_at = {}
    for j in range(1, kmin + 1):
        if all(str(j) in e["pass_at"] for e in entries):
            pass_at[str(j)] = float(sum(wi * e["pass_at"][str(j)] for wi, e in zip(w, entries)))
    point, dist = bootstrap(strata, weights, rng=rng, num_resamples=num_resamples)
    lo, hi = np.quantile(dist, [0.025, 0.975])
    return {
        "policy": policy,
        "env": "*",
        "num_seeds": sum(e["num_seeds"] for e in entries),
        "k": kmin,
        "samples": sum(e["samples"] for e in entries),
        "pass_at": pass_at,
        "mean_reward": point,
        "mean_reward_ci": [float(lo), float(hi)],
        "errors": sum(e["errors"] for e in entries),
        "envs": [e["env"] for e in entries],
    }


def _paired(
    a: dict[int, dict[int, dict]], b: dict[int, dict[int, dict]], value
) -> tuple[list, list]:
    ua, ub = [], []
    for seed in sorted(set(a) & set(b)):
        samples = sorted(set(a[seed]) & set(b[seed]))
        if samples:
            ua.append([value(a[seed][i]) for i in samples])
            ub.append([value(b[seed][i]) for i in samples])
    return ua, ub


def summarize(
    rows: Sequence[dict[str, Any]],
    suite: Suite,
    policies: Sequence[str] | None = None,
    *,
    seed: int = 0,
    num_resamples: int = 2000,
) -> dict[str, Any]:
    """``summary.json`` of ``rows`` (see the module doc). ``policies``: their order (default: first
    appearance); envs follow the suite's order; rows of envs not in the suite are ignored. ``seed``
    seeds the bootstrap's Generator (one stream per entry, so entries do not depend on each other)."""
    policies = (
        list(policies) if policies is not None else list(dict.fromkeys(r["policy"] for r in rows))
    )
    grouped: dict[tuple[str, str], list[dict[str, Any]]] = collections.defaultdict(list)
    for r in rows:
        grouped[(r["policy"], r["env"])].append(r)
    data = {key: _by_seed(rs) for key, rs in grouped.items()}
    streams = itertools.count()

    def rng() -> np.random.Generator:
        return np.random.default_rng([seed, next(streams)])

    results, comparisons = [], []
    for p in policies:
        entries, strata, weights = [], [], []
        for e in suite.envs:
            seeds = data.get((p, e.name))
            if not seeds:
                continue
            entry = _env_entry(p, e.name, e.k, seeds, rng(), num_resamples)
            results.append(entry)
            entries.append(entry)
            strata.append(
                [float(np.mean([_reward(r) for r in s.values()])) for s in seeds.values()]
            )
            weights.append(e.weight)
        if entries and sum(weights) > 0:
            results.append(_suite_entry(p, entries, strata, weights, rng(), num_resamples))
    for pa, pb in itertools.combinations(policies, 2):
        for metric, value in (("mean_reward", _reward), ("pass@1", _success)):
            sa, sb, weights = [], [], []
            for e in suite.envs:
                if (pa, e.name) not in data or (pb, e.name) not in data:
                    continue
                ua, ub = _paired(data[(pa, e.name)], data[(pb, e.name)], value)
                if not ua:
                    continue
                sa.append(ua), sb.append(ub), weights.append(e.weight)
                comparisons.append(
                    {
                        "a": pa,
                        "b": pb,
                        "env": e.name,
                        "metric": metric,
                        "pairs": sum(map(len, ua)),
                        **paired_comparison([ua], [ub], rng=rng(), num_resamples=num_resamples),
                    }
                )
            if sa and sum(weights) > 0:
                comparisons.append(
                    {
                        "a": pa,
                        "b": pb,
                        "env": "*",
                        "metric": metric,
                        "pairs": sum(len(u) for s in sa for u in s),
                        **paired_comparison(
                            sa, sb, weights, rng=rng(), num_resamples=num_resamples
                        ),
                    }
                )
    return {
        "suite": suite.name,
        "policies": policies,
        "envs": [e.name for e in suite.envs],
        "weights": suite.weights,
        "results": results,
        "comparisons": comparisons,
    }
