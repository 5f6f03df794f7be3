"""Trajectory logs: the one record format, writer names, token arrays, the reader, and replay.

* :mod:`~gymllm.trajectories.format`: the record types and their JSON form (:class:`TrajectoryLoggerConfig`,
  :func:`trajectory_record`, the one record of a trained trajectory).
* :mod:`~gymllm.trajectories.writers`: writer names in a shared log directory and
  :class:`TrajectoryRecordWriter` (a run's ``trajectories.jsonl``).
* :mod:`~gymllm.trajectories.tokens`: :class:`TokenStore`, the token-level arrays in zarr beside the JSONL.
* :mod:`~gymllm.trajectories.reader`: :func:`read_log`, :func:`read_tokens`, :func:`read_trajectory_records`.
* :mod:`~gymllm.trajectories.replaying`: :func:`replay`, deterministic re-execution of logged episodes.

The writing wrapper is :class:`gymllm.wrappers.TrajectoryLogger`. Exports are lazy.
"""

from __future__ import annotations

from gymllm._lazy import lazy_exports, lazy_table

_LAZY = lazy_table(
    __name__,
    {
        ".format": ("TrajectoryLoggerConfig", "trajectory_record"),
        ".reader": (
            "read_log",
            "read_tokens",
            "scan_jsonl",
            "LoggedEpisode",
            "read_trajectory_records",
            "trajectory_from_record",
        ),
        ".writers": ("TrajectoryRecordWriter",),
        ".tokens": ("TokenStore",),
        ".replaying": ("replay", "ReplayReport"),
    },
)

__all__ = list(_LAZY)


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, cache=False)
