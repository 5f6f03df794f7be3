"""Gymnasium wrappers for text envs: tool use, multi-agent, logging and replay, statistics, limits.

Exports are lazy (one line per public name) so importing one wrapper does not import the others.
"""

from __future__ import annotations

from gymllm._lazy import lazy_exports

_LAZY: dict[str, str] = {
    # "PublicName": "gymllm.wrappers.module",
    "ToolUse": "gymllm.wrappers.tool_use",
    "TrajectoryLogger": "gymllm.wrappers.trajectory_logger",
    "TrajectoryLoggerConfig": "gymllm.wrappers.trajectory_format",
    "read_log": "gymllm.wrappers.trajectory_reader",
    "read_tokens": "gymllm.wrappers.trajectory_reader",
    "LoggedEpisode": "gymllm.wrappers.trajectory_reader",
    "vector_logger": "gymllm.wrappers.trajectory_logger",
    "replay": "gymllm.wrappers.replaying",
    "ReplayReport": "gymllm.wrappers.replaying",
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
    "TextAECEnv": "gymllm.wrappers.multi_agent_aec",
    "TextParallelEnv": "gymllm.wrappers.multi_agent_parallel",
    "MultiAgentConfig": "gymllm.wrappers.multi_agent_codec",
    "MoveText": "gymllm.wrappers.multi_agent_codec",
    "SingleAgentView": "gymllm.wrappers.multi_agent_seat",
    "AgentVectorEnv": "gymllm.wrappers.multi_agent_vector",
    "random_legal_policy": "gymllm.wrappers.multi_agent_policies",
    "text_api_test": "gymllm.wrappers.multi_agent_check",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, cache=False)

