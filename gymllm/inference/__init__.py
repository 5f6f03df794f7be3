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

from gymllm._lazy import lazy_exports

_LAZY = {
    "SamplingParams": "gymllm.inference.params",
    "Completion": "gymllm.inference.completion",
    "Engine": "gymllm.inference.protocol",
    "EngineConfig": "gymllm.inference.config",
    "JaxEngine": "gymllm.inference.jax_engine",
    "AdapterConfig": "gymllm.inference.adapters",
    "OpenAIClientEngine": "gymllm.inference.client",
    "build_app": "gymllm.inference.server",
    "serve": "gymllm.inference.server",
    "ServerThread": "gymllm.inference.server",
    "VllmEngine": "gymllm.inference.vllm_engine",
    "EnginePool": "gymllm.inference.pool",
    "PoolConfig": "gymllm.inference.pool_routing",
    "ReplicaDied": "gymllm.inference.pool",
    "ReplicaSpec": "gymllm.inference.replica",
    "ReplicaHost": "gymllm.inference.replica",
    "WeightUpdate": "gymllm.inference.replica",
}

__all__ = list(_LAZY)


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
