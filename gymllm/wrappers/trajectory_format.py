"""The trajectory log's format: :class:`TrajectoryLoggerConfig` (where and how a log is written), the
format tag and token fields, and the JSON conversion every record goes through (the layout and the
record types are in :mod:`gymllm.wrappers.trajectory_logger`)."""

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

from gymllm.errors import ConfigError, explain

__all__ = ["FORMAT", "TOKEN_FIELDS", "TrajectoryLoggerConfig", "to_jsonable", "normalise", "dumps_record",
           "plain_json", "wrapper_stack", "package_versions"]

FORMAT = "gymllm.trajectory/1"
TOKEN_FIELDS: dict[str, str] = {"token_ids": "int32", "loss_mask": "int8", "logprobs": "float32", "versions": "int32"}


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
        if not isinstance(self.path, (str, os.PathLike)) or not str(self.path):
            raise ConfigError(explain("TrajectoryLoggerConfig.path", expected="a directory or .jsonl path",
                                      received=self.path, fix="pass path='runs/log'"))
        object.__setattr__(self, "path", os.fspath(self.path))
        if self.fsync not in ("never", "episode", "step"):
            raise ConfigError(explain("TrajectoryLoggerConfig.fsync", expected="'never', 'episode' or 'step'",
                                      received=self.fsync, fix="use fsync='episode'"))
        if not isinstance(self.chunk_size, int) or self.chunk_size < 1:
            raise ConfigError(explain("TrajectoryLoggerConfig.chunk_size", expected="a positive int",
                                      received=self.chunk_size, fix="use chunk_size=65536"))
        if not self.name or "/" in self.name:
            raise ConfigError(explain("TrajectoryLoggerConfig.name", expected="a plain file stem",
                                      received=self.name, fix="use name='episodes'"))

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
