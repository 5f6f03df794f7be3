"""Weight push: hand the learner's new weights to the inference engine after each update.

The engine applies a pushed state between two decode steps (no forward pass mixes versions) and
tags every token it samples afterwards with the new version; in-flight rollouts are not drained.
The push itself only wraps the arrays in the engine's NNX state structure (no copy on one device;
sharded arrays are gathered to the engine's device first). Its time is a "weight_sync" span on the
"trainer" track and is returned to the caller.
"""

from __future__ import annotations

import time
from typing import Any

import jax


class WeightPusher:
    """Pushes flat weights ``{"layers.wq": ...}`` to an engine with ``update_weights(state, version)``."""

    def __init__(self, engine: Any, model_config: Any, *, gather: bool = False):
        self.engine = engine
        self.model_config = model_config
        self.gather = gather
        self.pushes = 0
        self.total_s = 0.0
        self.last_s = 0.0

    def state_of(self, flat: dict[str, jax.Array]) -> Any:
        from flax import nnx

        from gymllm.models.transformer import Transformer

        if self.gather:
            device = jax.devices()[0]
            flat = {k: jax.device_put(v, device) for k, v in flat.items()}
        return nnx.state(Transformer(self.model_config, params=flat))

    def push(self, flat: dict[str, jax.Array], version: int) -> float:
        from gymllm.algos.lora_push import push_adapters
        from gymllm.telemetry import span

        t = time.perf_counter()
        with span("weight_sync", track="trainer", version=version):
            if not push_adapters(
                self.engine, self.model_config, flat, version
            ):  # LoRA: adapters only
                self.engine.update_weights(self.state_of(flat), version)
        self.last_s = time.perf_counter() - t
        self.total_s += self.last_s
        self.pushes += 1
        return self.last_s
