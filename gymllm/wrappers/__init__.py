"""Gymnasium wrappers for text envs: tool use, multi-agent, logging and replay, statistics, limits.

Exports are lazy (one line per public name) so importing one wrapper does not import the others.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY: dict[str, str] = {
    # "PublicName": "gymllm.wrappers.module",
    "TrajectoryLogger": "gymllm.wrappers.trajectory_logger",
    "TrajectoryLoggerConfig": "gymllm.wrappers.trajectory_logger",
    "read_log": "gymllm.wrappers.trajectory_logger",
    "read_tokens": "gymllm.wrappers.trajectory_logger",
    "replay": "gymllm.wrappers.replay",
    "ReplayReport": "gymllm.wrappers.replay",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'gymllm.wrappers' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(_LAZY)
