"""The trajectory log's format: :class:`TrajectoryLoggerConfig` (where and how a log is written), the
format tag and token fields, the JSON conversion every record goes through (the layout and the
episode record types are in :mod:`gymllm.wrappers.trajectory_logger`), and the one record of a
trained :class:`~gymllm.types.Trajectory` (:func:`trajectory_record`).

A ``trajectory`` record (one JSON line; a run's ``trajectories.jsonl``, ``gymllm serve --groups-out``)::

    {"type": "trajectory", "format": "gymllm.trajectory/1", "step": 3,      # step: the optimizer step, if any
     "group_id": "g4", "trajectory_id": "g4/m0/a1", "task_id": "...", "reward": 1.0,
     "finish_reason": "terminated", "row_index": 0, "num_tokens": 57, "num_sampled": 12,
     "versions": [2, 3],                          # policy versions of the sampled tokens (sorted, distinct)
     "response": "...",                           # the sampled tokens decoded (with a tokenizer)
     "token_ids": [...], "sampled_spans": [[40, 52]],   # the loss mask as [start, end) runs
     "turn_boundaries": [[40, 52]], "info": {...},
     "logprobs": [...], "token_versions": [...]}   # per token, only with per_token=True

:func:`~gymllm.trajectories.reader.read_trajectory_records` reads it back, and the two
layouts written before it (a run's records without ``type``; ``serve --groups-out`` records with
per-token ``loss_mask`` / ``behaviour_logprobs`` / ``versions``) as the same record.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import platform
import sys
from typing import Any, Literal

import gymnasium as gym
import numpy as np

from gymllm.validation import check_range, require, require_one_of

__all__ = [
    "FORMAT",
    "TOKEN_FIELDS",
    "TrajectoryLoggerConfig",
    "to_jsonable",
    "normalise",
    "dumps_record",
    "plain_json",
    "wrapper_stack",
    "package_versions",
    "TRAJECTORY",
    "trajectory_record",
    "mask_spans",
]

FORMAT = "gymllm.trajectory/1"
TOKEN_FIELDS: dict[str, str] = {
    "token_ids": "int32",
    "loss_mask": "int8",
    "logprobs": "float32",
    "versions": "int32",
}
TRAJECTORY = "trajectory"  # the record type of a trained trajectory (see the module docstring)


# --------------------------------------------------------------------------------------------- config


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrajectoryLoggerConfig:
    """Where and how a :class:`TrajectoryLogger` writes.

    path: a directory (created) or a ``.jsonl`` file path (its tokens go to the sibling ``.zarr``).
    name: the writer's file stem inside a directory; give each concurrent writer its own name.
    env_id / env_kwargs: how replay rebuilds the env; default: the wrapped env's ``spec``.
    fsync: "never", "episode" (default: at each episode end) or "step" (every record).
    assign_seeds: draw a seed for ``reset(seed=None)`` so every episode is replayable.
    chunk_size: zarr chunk length (elements) of the token arrays.
    """

    path: str
    name: str = "episodes"
    env_id: str | None = None
    env_kwargs: dict[str, Any] | None = None
    fsync: Literal["never", "episode", "step"] = "episode"
    assign_seeds: bool = True
    chunk_size: int = 65536

    def __post_init__(self) -> None:
        require(
            isinstance(self.path, (str, os.PathLike)) and str(self.path),
            "TrajectoryLoggerConfig.path",
            expected="a directory or .jsonl path",
            received=self.path,
            fix="pass path='runs/log'",
        )
        object.__setattr__(self, "path", os.fspath(self.path))
        require_one_of(
            self.fsync,
            ("never", "episode", "step"),
            "TrajectoryLoggerConfig.fsync",
            fix="use fsync='episode'",
        )
        check_range(
            "TrajectoryLoggerConfig",
            "chunk_size",
            self.chunk_size,
            lo=1,
            integer=True,
            fix="use chunk_size=65536",
        )
        require(
            self.name and "/" not in self.name,
            "TrajectoryLoggerConfig.name",
            expected="a plain file stem",
            received=self.name,
            fix="use name='episodes'",
        )

    @property
    def jsonl_path(self) -> pathlib.Path:
        p = pathlib.Path(self.path)
        return p if p.suffix == ".jsonl" else p / f"{self.name}.jsonl"

    @property
    def zarr_path(self) -> pathlib.Path:
        return self.jsonl_path.with_suffix(".zarr")


def to_jsonable(x: Any) -> Any:
    """A JSON-safe copy of ``x``: numpy values become Python numbers/lists, tuples lists, keys str."""
    if x is None or isinstance(x, (bool, str)):
        return x
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x)
    if isinstance(x, np.bool_):
        return bool(x)
    if isinstance(x, np.ndarray):
        return to_jsonable(x.tolist())
    if isinstance(x, dict):
        return {str(k): to_jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_jsonable(v) for v in x]
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return to_jsonable(dataclasses.asdict(x))
    if isinstance(x, bytes):
        return x.decode("utf-8", "replace")
    return repr(x)


def normalise(x: Any) -> Any:
    """``x`` as it reads back from the log (JSON round trip), for comparisons against logged values."""
    return json.loads(dumps_record(to_jsonable(x)))


def dumps_record(record: Any) -> str:
    """One log line's JSON text (compact, UTF-8 kept, NaN allowed)."""
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"), allow_nan=True)


def plain_json(x: Any) -> bool:
    """Whether ``x`` is made only of JSON-native values (so it rebuilds exactly from the log)."""
    if x is None or isinstance(x, (bool, int, float, str)):
        return True
    if isinstance(x, (list, tuple)):
        return all(plain_json(v) for v in x)
    if isinstance(x, dict):
        return all(isinstance(k, str) and plain_json(v) for k, v in x.items())
    return False


def wrapper_stack(env: gym.Env) -> list[dict[str, Any]]:
    """The wrappers around the registered env, innermost first, as Gymnasium's spec records them.

    ``kwargs`` is None for a wrapper that cannot be rebuilt from the log (it does not record its
    constructor arguments, or they are not plain JSON, e.g. a lambda).
    """
    spec = getattr(env, "spec", None)
    out = []
    for w in getattr(spec, "additional_wrappers", ()) or ():
        kwargs = w.kwargs if w.kwargs is not None and plain_json(w.kwargs) else None
        out.append({"name": w.name, "entry_point": w.entry_point, "kwargs": to_jsonable(kwargs)})
    return out


def package_versions() -> dict[str, str]:
    """Versions that decide whether a replay should match: python, gymllm and the env libraries."""
    out = {"python": platform.python_version()}
    for mod in ("gymllm", "gymnasium", "numpy", "pettingzoo"):
        m = sys.modules.get(mod)
        if m is None and mod in ("gymllm", "gymnasium", "numpy"):
            m = __import__(mod)
        if m is not None:
            out[mod] = str(getattr(m, "__version__", "?"))
    return out


# --------------------------------------------------------------------------------------------- trajectory records


def mask_spans(mask: Any) -> list[list[int]]:
    """``[[start, end), ...]`` of the True runs of a 1-D bool mask (the sampled tokens of a trajectory)."""
    m = np.concatenate([[False], np.asarray(mask, bool).reshape(-1), [False]]).astype(np.int8)
    edges = np.flatnonzero(np.diff(m))
    return [[int(a), int(b)] for a, b in zip(edges[::2], edges[1::2])]


def trajectory_record(
    trajectory: Any, *, step: int | None = None, tokenizer: Any = None, per_token: bool = False
) -> dict[str, Any]:
    """The one JSON record of a trained :class:`~gymllm.types.Trajectory` (fields: module docstring).

    Args:
        trajectory: The trajectory (token ids, loss mask, behaviour log-probs, versions, ids, reward).
        step: The optimizer step that trained it (left out when None).
        tokenizer: Decodes the sampled tokens into ``response`` (left out when None).
        per_token: Also write the per-token ``logprobs`` and ``token_versions`` (what off-policy
            training from the file needs; the loss mask is always there, as ``sampled_spans``).
    """
    ids = np.asarray(trajectory.token_ids).reshape(-1)
    mask = np.asarray(trajectory.loss_mask).reshape(-1).astype(bool)
    versions = np.asarray(trajectory.versions).reshape(-1)
    rec: dict[str, Any] = {"type": TRAJECTORY, "format": FORMAT}
    if step is not None:
        rec["step"] = int(step)
    rec.update(
        {
            "group_id": trajectory.group_id,
            "trajectory_id": trajectory.trajectory_id,
            "task_id": trajectory.task_id,
            "reward": float(trajectory.reward),
            "finish_reason": trajectory.finish_reason,
            "row_index": int(trajectory.row_index),
            "num_tokens": int(ids.size),
            "num_sampled": int(mask.sum()),
            "versions": sorted({int(v) for v in versions[mask]}),
        }
    )
    if tokenizer is not None:
        rec["response"] = tokenizer.decode([int(i) for i in ids[mask]])
    rec.update(
        {
            "token_ids": [int(i) for i in ids],
            "sampled_spans": mask_spans(mask),
            "turn_boundaries": to_jsonable(list(trajectory.turn_boundaries)),
            "info": to_jsonable(dict(trajectory.info)),
        }
    )
    if per_token:
        rec["logprobs"] = [float(x) for x in np.asarray(trajectory.behaviour_logprobs).reshape(-1)]
        rec["token_versions"] = [int(v) for v in versions]
    return rec
