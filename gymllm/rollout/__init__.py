"""gymllm.rollout: agents, token-in-token-out buffers, the asyncio orchestrator and GRPO groups.

from gymllm.rollout import RolloutOrchestrator, RolloutConfig, ModelAgent, ToolAgent, sync_rollout
"""

from __future__ import annotations

from gymllm._lazy import lazy_exports

_LAZY = {
    "Agent": "gymllm.rollout.agents",
    "ModelAgent": "gymllm.rollout.agents",
    "ToolAgent": "gymllm.rollout.agents",
    "RolloutConfig": "gymllm.rollout.config",
    "Episode": "gymllm.rollout.episode",
    "EpisodeKey": "gymllm.rollout.episode",
    "GroupBuffer": "gymllm.rollout.group_buffer",
    "GroupFailedError": "gymllm.rollout.group_buffer",
    "GroupQueue": "gymllm.rollout.group_queue",
    "QueueClosed": "gymllm.rollout.group_queue",
    "LoopLagMonitor": "gymllm.rollout.loop_lag",
    "MeteredEngine": "gymllm.rollout.engine_meter",
    "RolloutOrchestrator": "gymllm.rollout.orchestrator",
    "GroupTimeoutError": "gymllm.rollout.producer",
    "RolloutStalledError": "gymllm.rollout.producer",
    "run_episode": "gymllm.rollout.producer",
    "StalenessController": "gymllm.rollout.staleness",
    "sync_rollout": "gymllm.rollout.sync_baseline",
    "SyncBatchSource": "gymllm.rollout.sync_baseline",
    "GroupSource": "gymllm.rollout.sources",
    "GroupSourceError": "gymllm.rollout.sources",
    "AgentProgramSource": "gymllm.rollout.agent_programs",
    "EngineWrapper": "gymllm.rollout.engine_wrappers",
    "TokenBuffer": "gymllm.rollout.token_buffer",
    "check_prefix_preserving": "gymllm.rollout.token_buffer",
    "as_env_slots": "gymllm.rollout.env_slots",
}

__all__ = list(_LAZY)


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
