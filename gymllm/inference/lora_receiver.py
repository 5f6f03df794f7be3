"""Adapter-only weight updates: the engine keeps its frozen base weights and receives only LoRA
adapters (+ the policy version); it merges them on its own device and swaps atomically.

    receiver = LoraReceiver.from_model(engine, lm.model, LoRAConfig(rank=8, targets=("wq", "wv")))
    receiver.apply(adapters, version)         # adapters: {"layers.wq.lora_a": [L, in, r], ...}
    # or, once a receiver is attached to the engine:
    apply_lora_update(engine, adapters, version)

Per adapted projection the merge is one jitted ``W + (alpha / r) A @ B`` (computed in float32, cast
to the engine's dtype); the other weights are the base's own arrays (no copy). The merged state goes
through the engine's public ``update_weights(state, version)``, so the swap happens between two
decode steps exactly as for a full push, and every token carries the version of the forward that
produced it. What moves per push is ``2 * r * (in + out) * L`` numbers per target instead of
``in * out * L`` (SmolLM2-135M, rank 8 on wq and wv: 0.46 M numbers, 3.5% of those two matrices, 0.34%
of the model).

HTTP engines (``gymllm.inference.client``) and vLLM: not implemented here (no vLLM on this CPU
machine, so it could not be tested). The way to do it is vLLM's LoRA serving: start the server with
``--enable-lora --max-lora-rank R`` (and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``), save the adapters
in PEFT format (``adapter_config.json`` with r, lora_alpha, target_modules mapped to q_proj / v_proj
..., and ``adapter_model.safetensors`` with ``base_model.model.model.layers.{i}.self_attn.q_proj.
lora_A.weight`` = A[i].T [r, in] and ``lora_B.weight`` = B[i].T [out, r]), then
``POST /v1/load_lora_adapter {"lora_name": "policy-v{version}", "lora_path": dir}`` and sample with
``model="policy-v{version}"`` (unload the previous name afterwards); the version travels in the
adapter name. In process (``VllmEngine``): ``LLM(..., enable_lora=True)`` and pass
``lora_request=LoRARequest(f"policy-v{version}", version + 1, dir)`` with each request. vLLM applies
the adapter at run time (punica kernels) instead of merging; the swap point is per request, not per
decode step, so a request keeps the adapter it started with.
"""

from __future__ import annotations

import functools
import time
import weakref
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from gymllm.models.lora import LoRAConfig, adapter_keys, merged_delta, nbytes
from gymllm.errors import EngineError, explain
from gymllm.validation import require

_RECEIVERS: "weakref.WeakKeyDictionary[Any, LoraReceiver]" = weakref.WeakKeyDictionary()


@functools.partial(jax.jit, static_argnums=0)
def _merge_targets(
    cfg: LoRAConfig, base: dict[str, jax.Array], adapters: dict[str, jax.Array]
) -> dict[str, jax.Array]:
    """``{"layers.wq": W + s A @ B}`` for the targets only: f32 math, the base's dtype out."""
    out = {}
    for t in cfg.targets:
        w = base[f"layers.{t}"]
        a = adapters[f"layers.{t}.lora_a"].astype(jnp.float32)
        b = adapters[f"layers.{t}.lora_b"].astype(jnp.float32)
        out[f"layers.{t}"] = (w.astype(jnp.float32) + merged_delta(cfg, a, b)).astype(w.dtype)
    return out


class LoraReceiver:
    """Engine side of an adapter-only push (see the module docstring).

    ``base``: the flat frozen weights ``{"layers.wq": [L, in, out], ...}``, moved once to the
    engine's device; ``model_config``: the engine model's config (to rebuild its state)."""

    def __init__(
        self,
        engine: Any,
        model_config: Any,
        base: dict[str, jax.Array],
        lora: LoRAConfig,
        *,
        device: Any = None,
    ):
        require(
            bool(lora.enabled),
            "LoraReceiver(lora)",
            expected="a LoRAConfig with rank > 0",
            received=lora,
            fix="pass the learner's LoRAConfig",
            error=EngineError,
        )
        self._engine = weakref.ref(engine)
        self.model_config = model_config
        self.lora = lora
        self.device = device if device is not None else jax.local_devices()[0]
        self.base = {k: jax.device_put(v, self.device) for k, v in base.items()}
        self.expected = {k: self._shape(k) for k in adapter_keys(lora)}
        self.pushes, self.total_s, self.last_s, self.last_bytes = 0, 0.0, 0.0, 0
        self.history: list[dict[str, Any]] = []  # per push: version, keys, bytes, seconds
        _RECEIVERS[engine] = self

    @classmethod
    def from_model(cls, engine: Any, model: Any, lora: LoRAConfig) -> "LoraReceiver":
        """Use ``model``'s weights (the ones the engine was built from) as the frozen base."""
        return cls(engine, model.config, model.flat_params(), lora)

    @property
    def engine(self) -> Any:
        eng = self._engine()
        if eng is None:
            raise EngineError(
                "LoraReceiver: expected a live engine, received a collected one. Fix: keep the engine."
            )
        return eng

    def _shape(self, key: str) -> tuple[int, ...]:
        w = self.base[key.rsplit(".", 1)[0]]  # "layers.wq.lora_a" -> "layers.wq" [L, in, out]
        n_layers, d_in, d_out = w.shape
        return (
            (n_layers, d_in, self.lora.rank)
            if key.endswith("lora_a")
            else (n_layers, self.lora.rank, d_out)
        )

    def check(self, adapters: dict[str, Any]) -> None:
        got = {k: tuple(np.shape(v)) for k, v in adapters.items()}
        require(
            got == self.expected,
            "LoraReceiver.apply(adapters)",
            expected=f"exactly {self.expected}",
            received=got,
            fix="push the learner's adapters of the same LoRAConfig",
            error=EngineError,
        )

    def merged(self, adapters: dict[str, Any]) -> dict[str, jax.Array]:
        """The full flat weights: base arrays, with the targets merged on the engine's device."""
        self.check(adapters)
        local = {
            k: jax.device_put(v, self.device) for k, v in adapters.items()
        }  # a gather when sharded
        return {**self.base, **_merge_targets(self.lora, self.base, local)}

    def apply(self, adapters: dict[str, Any], version: int) -> float:
        """Merge and hand the new weights to the engine at ``version``; returns the seconds it took
        (merge included: the engine swaps them in between two decode steps)."""
        from flax import nnx

        from gymllm.models.transformer import Transformer

        t = time.perf_counter()
        flat = self.merged(adapters)
        jax.block_until_ready(flat)
        self.engine.update_weights(nnx.state(Transformer(self.model_config, params=flat)), version)
        self.last_s = time.perf_counter() - t
        self.last_bytes = nbytes(adapters)
        self.total_s += self.last_s
        self.pushes += 1
        self.history.append(
            {
                "version": int(version),
                "keys": sorted(adapters),
                "bytes": self.last_bytes,
                "seconds": self.last_s,
            }
        )
        return self.last_s


class LoraUpdate:
    """An adapter-only push as one object (an ``gymllm.inference.replica.WeightUpdate``): an
    ``EnginePool`` hands it to every replica, each merging on its own device through its receiver.

    ``base``: the frozen weights, used in this process only (an in-process engine's receiver is
    built from them on its first push); a pickled update (to a Ray replica) leaves them behind and the
    replica builds its receiver from the model its engine was built from."""

    def __init__(
        self,
        lora: LoRAConfig,
        model_config: Any,
        adapters: dict[str, Any],
        base: dict[str, Any] | None = None,
    ):
        self.lora, self.model_config, self.adapters, self.base = (
            lora,
            model_config,
            dict(adapters),
            base,
        )

    def __getstate__(self) -> dict[str, Any]:
        return {
            "lora": self.lora,
            "model_config": self.model_config,
            "base": None,
            "adapters": {k: np.asarray(v) for k, v in self.adapters.items()},
        }

    def apply_to(self, engine: Any, version: int, model: Any = None) -> None:
        rec = receiver_of(engine)
        if rec is None or rec.lora != self.lora:
            if self.base is not None:
                rec = LoraReceiver(engine, self.model_config, self.base, self.lora)
            elif model is not None:
                rec = LoraReceiver.from_model(engine, model, self.lora)
            else:
                raise EngineError(
                    explain(
                        "LoraUpdate.apply_to",
                        expected="the frozen base: in the update "
                        "(in process) or the replica's model",
                        received=None,
                        fix="build replicas from a ReplicaSpec, or push LoraUpdate(..., base=...)",
                    )
                )
        rec.apply(self.adapters, version)


def receiver_of(engine: Any) -> LoraReceiver | None:
    """The receiver attached to ``engine`` (the last one built for it), if any."""
    return _RECEIVERS.get(engine)


def apply_lora_update(engine: Any, adapters: dict[str, Any], version: int) -> float:
    """Push ``adapters`` at ``version`` through the receiver attached to ``engine``."""
    rec = receiver_of(engine)
    require(
        rec is not None,
        "apply_lora_update(engine)",
        expected="an engine with a LoraReceiver",
        received=type(engine).__name__,
        fix="build LoraReceiver.from_model(engine, model, lora) first",
        error=EngineError,
    )
    return rec.apply(adapters, version)
