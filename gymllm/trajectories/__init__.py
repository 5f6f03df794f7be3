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

from gymllm._lazy import lazy_exports

_LAZY: dict[str, str] = {
    "TrajectoryLoggerConfig": "gymllm.trajectories.format",
    "trajectory_record": "gymllm.trajectories.format",
    "read_log": "gymllm.trajectories.reader",
    "read_tokens": "gymllm.trajectories.reader",
    "scan_jsonl": "gymllm.trajectories.reader",
    "LoggedEpisode": "gymllm.trajectories.reader",
    "read_trajectory_records": "gymllm.trajectories.reader",
    "trajectory_from_record": "gymllm.trajectories.reader",
    "TrajectoryRecordWriter": "gymllm.trajectories.writers",
    "TokenStore": "gymllm.trajectories.tokens",
    "replay": "gymllm.trajectories.replaying",
    "ReplayReport": "gymllm.trajectories.replaying",
}

__all__ = list(_LAZY)


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, cache=False)
