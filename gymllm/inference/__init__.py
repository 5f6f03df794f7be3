"""gymllm.inference: the Engine protocol and its backends.

    from gymllm.inference import JaxEngine, EngineConfig, SamplingParams
    engine = JaxEngine.from_loaded(gymllm.models.load("smollm2-135m-instruct"), config=EngineConfig(num_slots=16))
    completion = await engine.generate(prompt_ids, SamplingParams(temperature=1.0))

Backends: :class:`JaxEngine` (embedded, continuous batching; with :class:`AdapterConfig` it serves
several LoRA adapters over one base, chosen per request), :class:`OpenAIClientEngine` (any
OpenAI-compatible server, token ids in and out), :class:`VllmEngine` (optional extra ``vllm``).
:class:`EnginePool` spreads requests over N replicas of any of them (in process or Ray actors built
from a :class:`ReplicaSpec`). :func:`build_app` / :func:`serve` expose an engine as an OpenAI-compatible HTTP server.
Names are imported lazily: the client does not import JAX.
"""

from __future__ import annotations

from gymllm._lazy import lazy_exports, lazy_table

_LAZY = lazy_table(
    __name__,
    {
        ".params": ("SamplingParams",),
        ".completion": ("Completion",),
        ".protocol": ("Engine",),
        ".config": ("EngineConfig",),
        ".jax_engine": ("JaxEngine",),
        ".adapters": ("AdapterConfig",),
        ".client": ("OpenAIClientEngine",),
        ".server": ("build_app", "serve", "ServerThread"),
        ".vllm_engine": ("VllmEngine",),
        ".pool": ("EnginePool", "ReplicaDied"),
        ".pool_routing": ("PoolConfig",),
        ".replica": ("ReplicaSpec", "ReplicaHost", "WeightUpdate"),
    },
)

__all__ = list(_LAZY)


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
