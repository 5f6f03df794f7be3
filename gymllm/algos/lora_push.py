"""Learner side of an adapter-only weight push (LoRA): send the adapters, not the merged weights.

With LoRA the learner trains only the adapters; the engine already holds the frozen base. So a push
moves the adapter arrays (+ the version) and the engine merges them on its own device
(:class:`gymllm.inference.lora_receiver.LoraReceiver`), swapping between two decode steps.

Two ways in:

* :class:`AdapterPusher`: the :class:`~gymllm.algos.weight_sync.WeightPusher` interface
  (``push(weights, version) -> seconds``, ``pushes``, ``total_s``, ``last_s``) plus ``last_bytes``.
* :func:`push_adapters`, the hook ``WeightPusher.push`` calls first: weights from
  :func:`gymllm.models.lora.merge` (the learner's ``policy_params()`` under LoRA) remember their
  adapters, so the trainer's pushes send only those to an in-process :class:`JaxEngine` (or to one
  adapter slot of an engine serving several, :class:`~gymllm.inference.adapters.AdapterView`). Other
  engines (HTTP, vLLM) get the merged weights as before (see :mod:`gymllm.inference.lora_receiver`).
"""

from __future__ import annotations

import time
from typing import Any

from gymllm.models.lora import LoRAConfig, MergedWeights, nbytes


class AdapterPusher:
    """Pushes LoRA adapters ``{"layers.wq.lora_a": ..., ...}`` (or :class:`MergedWeights`, whose
    adapters are sent) to ``engine``; ``base``: the frozen weights the engine was built from."""

    def __init__(self, engine: Any, model_config: Any, base: dict[str, Any], lora: LoRAConfig):
        from gymllm.inference.lora_receiver import LoraReceiver

        self.receiver = LoraReceiver(engine, model_config, base, lora)
        self.pushes, self.total_s, self.last_s, self.last_bytes = 0, 0.0, 0.0, 0

    def push(self, weights: dict[str, Any], version: int) -> float:
        from gymllm.telemetry import span

        adapters = weights.adapters if isinstance(weights, MergedWeights) else weights
        t = time.perf_counter()
        with span("weight_sync", track="trainer", version=version, lora_bytes=nbytes(adapters)):
            self.receiver.apply(adapters, version)
        self.last_s = time.perf_counter() - t
        self.last_bytes = self.receiver.last_bytes
        self.total_s += self.last_s
        self.pushes += 1
        return self.last_s


def push_adapters(engine: Any, model_config: Any, weights: Any, version: int) -> bool:
    """Send only the adapters of LoRA-merged ``weights`` to an in-process JaxEngine (its receiver is
    attached on the first push, with the weights' base); False (nothing sent) for plain weights or
    another kind of engine, which then take the full weights."""
    from gymllm.inference.adapters import AdapterView
    from gymllm.inference.jax_engine import JaxEngine
    from gymllm.inference.lora_receiver import LoraReceiver, LoraUpdate, receiver_of

    if isinstance(weights, MergedWeights) and getattr(
        engine, "takes_weight_updates", False
    ):  # an EnginePool
        engine.update_weights(
            LoraUpdate(weights.lora, model_config, weights.adapters, weights.base), version
        )
        return True
    if isinstance(weights, MergedWeights) and isinstance(
        engine, AdapterView
    ):  # one adapter of a shared engine
        engine.update_weights(weights.adapters, version)
        return True
    if not isinstance(weights, MergedWeights) or not isinstance(engine, JaxEngine):
        return False
    rec = receiver_of(engine)
    if rec is None or rec.lora != weights.lora:
        rec = LoraReceiver(engine, model_config, weights.base, weights.lora)
    rec.apply(weights.adapters, version)
    return True
