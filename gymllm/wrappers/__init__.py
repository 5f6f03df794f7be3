"""Gymnasium wrappers for text envs: tool use, trajectory logging, statistics, limits, reward transforms.

Multi-agent envs are in :mod:`gymllm.multiagent`; reading and replaying logs in :mod:`gymllm.trajectories`.

Exports are lazy (one line per public name) so importing one wrapper does not import the others.
"""

from __future__ import annotations

from gymllm._lazy import lazy_exports

_LAZY: dict[str, str] = {
    # "PublicName": "gymllm.wrappers.module",
    "ToolUse": "gymllm.wrappers.tool_use",
    "TrajectoryLogger": "gymllm.wrappers.trajectory_logger",
    "TrajectoryLoggerConfig": "gymllm.trajectories.format",
    "vector_logger": "gymllm.wrappers.trajectory_logger",
    "RecordEpisodeStatistics": "gymllm.wrappers.episode_statistics",
    "RecordVectorEpisodeStatistics": "gymllm.wrappers.episode_statistics",
    "EpisodeStatisticsConfig": "gymllm.wrappers.episode_statistics",
    "Limits": "gymllm.wrappers.limits",
    "LimitsConfig": "gymllm.wrappers.limits",
    "TurnLimit": "gymllm.wrappers.limits",
    "TimeLimit": "gymllm.wrappers.limits",
    "RewardTransform": "gymllm.wrappers.rewards",
    "RewardTransformConfig": "gymllm.wrappers.rewards",
    "TransformReward": "gymllm.wrappers.rewards",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, cache=False)
