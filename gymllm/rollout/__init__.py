"""gymllm.rollout: agents, token-in-token-out buffers, the asyncio orchestrator and GRPO groups.

from gymllm.rollout import RolloutOrchestrator, RolloutConfig, ModelAgent, ToolAgent, sync_rollout
"""

from __future__ import annotations

from gymllm._lazy import lazy_exports, lazy_table

_LAZY = lazy_table(
    __name__,
    {
        ".agents": ("Agent", "ModelAgent", "ToolAgent"),
        ".config": ("RolloutConfig",),
        ".episode": ("Episode", "EpisodeKey"),
        ".group_buffer": ("GroupBuffer", "GroupFailedError"),
        ".group_queue": ("GroupQueue", "QueueClosed"),
        ".loop_lag": ("LoopLagMonitor",),
        ".engine_meter": ("MeteredEngine",),
        ".orchestrator": ("RolloutOrchestrator",),
        ".producer": ("GroupTimeoutError", "RolloutStalledError", "run_episode"),
        ".staleness": ("StalenessController",),
        ".sync_baseline": ("sync_rollout", "SyncBatchSource"),
        ".sources": ("GroupSource", "GroupSourceError"),
        ".agent_programs": ("AgentProgramSource",),
        ".engine_wrappers": ("EngineWrapper",),
        ".token_buffer": ("TokenBuffer", "check_prefix_preserving"),
        ".env_slots": ("as_env_slots",),
    },
)

__all__ = list(_LAZY)


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
