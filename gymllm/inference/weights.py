"""Versioned weight swaps for the JAX engine: the weights every device step reads, and the update waiting.

:class:`WeightStore` holds the engine's copy of the model state (``nnx.split(model)[1]``, in the
engine's storage dtype) and its policy version. :meth:`WeightStore.submit` (any thread) checks and
converts an update and parks it as pending; the engine thread calls :meth:`WeightStore.apply`
between two device steps, so no forward pass mixes versions, and the newest pending update wins.
Updates keep the compiled dtypes, so a weight swap never recompiles a step.

Storage dtypes (``EngineConfig.compute_dtype``): :func:`cast_floats` casts every floating leaf once;
bfloat16 on CPU is stored as uint16 bit patterns (:func:`gymllm.models.blocks.pack_bf16`'s
format: the forwards decode them per layer, since XLA:CPU slices bf16 layer stacks slowly).
:func:`kv_cache_dtype` picks the KV cache's storage dtype to match.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from gymllm.errors import EngineError, explain
from gymllm.validation import require
from gymllm.inference.config import EngineConfig
from gymllm.telemetry import counter


def as_engine_dtype(x: Any, dtype: Any) -> jax.Array:
    """``x`` in the engine's storage dtype; uint16 storage holds bfloat16 bit patterns."""
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != jnp.uint16:
        return x
    if jnp.dtype(dtype) == jnp.uint16 and x.dtype != jnp.uint16:
        return jax.lax.bitcast_convert_type(x.astype(jnp.bfloat16), jnp.uint16)
    return x.astype(dtype)


@functools.partial(jax.jit, static_argnums=(1,))
def convert_leaves(leaves: list[jax.Array], dtypes: tuple[str, ...]) -> list[jax.Array]:
    """``leaves[i]`` in storage dtype ``dtypes[i]`` (:func:`as_engine_dtype`), in one compiled program: a
    weight install or update is one program for the whole model (the same one at every update), not
    one conversion program per leaf shape."""
    return [as_engine_dtype(x, d) for x, d in zip(leaves, dtypes)]


def convert_tree(tree: Any, dtypes: list[Any]) -> Any:
    """``tree``'s leaves in ``dtypes`` (flattened order); leaves already of their dtype are kept as they are
    (no copy), the others converted together (:func:`convert_leaves`)."""
    leaves, treedef = jax.tree.flatten(tree)
    leaves = [
        jnp.asarray(x) for x in leaves
    ]  # host arrays moved to the device (a jax array stays as it is)
    todo = [
        i
        for i, (x, d) in enumerate(zip(leaves, dtypes))
        if jnp.dtype(np.result_type(x)) != jnp.dtype(d)
    ]
    if todo:
        done = convert_leaves(
            [leaves[i] for i in todo], tuple(jnp.dtype(dtypes[i]).name for i in todo)
        )
        for i, x in zip(todo, done):
            leaves[i] = x
    return jax.tree.unflatten(treedef, leaves)


def cast_floats(state: Any, dtype: Any) -> Any:
    """The weights with every floating-point leaf cast to ``dtype`` (integer leaves unchanged). On CPU,
    bfloat16 weights are stored as their uint16 bit patterns (``models.blocks.pack_bf16``: the
    forward decodes them per layer; XLA:CPU slices bf16 layer stacks slowly)."""
    packed = jnp.dtype(dtype) == jnp.bfloat16 and jax.default_backend() == "cpu"
    store = jnp.uint16 if packed else dtype

    def floating(x):
        return jnp.issubdtype(np.result_type(x), jnp.floating) or np.result_type(x) == np.uint16

    return convert_tree(
        state, [store if floating(x) else np.result_type(x) for x in jax.tree.leaves(state)]
    )


def kv_cache_dtype(cfg: EngineConfig, requested: Any) -> Any:
    """The KV cache's storage dtype: ``requested`` when given; else, computing in bfloat16, bf16 (on
    CPU as uint16 bit patterns, which XLA:CPU slices at memory speed): half the bytes a decode step
    reads, and the bf16 compute rounds the keys and values the same way anyway; else None (the model's
    choice)."""
    if requested is not None:
        return requested
    if cfg.compute_dtype == "bfloat16":
        return jnp.uint16 if jax.default_backend() == "cpu" else jnp.bfloat16
    return None


class WeightStore:
    """The engine's weights and policy version, and at most one pending update.

    ``state`` / ``version`` are what the device steps use now (read and swapped by the engine thread);
    ``cv`` is the engine's condition (it guards ``pending`` and wakes the loop when an update lands).
    """

    def __init__(
        self, state: Any, version: int, *, compute_dtype: str | None, cv: threading.Condition
    ):
        self.state = cast_floats(state, compute_dtype) if compute_dtype is not None else state
        self.version = version
        self.pending: tuple[Any, int] | None = None  # (state, version), guarded by ``cv``
        self.cv = cv
        self.adapters: Any = (
            None  # an AdapterStore (gymllm.inference.adapters) when the engine serves LoRA adapters
        )

    def has_pending(self) -> bool:
        """(Holding ``cv``.) A weight or adapter update waits for the loop."""
        return self.pending is not None or bool(self.adapters is not None and self.adapters.pending)

    def version_of(self, adapter: int) -> int:
        """The version a token sampled now by a row of stack index ``adapter`` records (0: the base's)."""
        return (
            self.version
            if self.adapters is None
            else self.adapters.version_of(adapter, self.version)
        )

    def kv_tag(self, adapter: int) -> Any:
        """What a row of stack index ``adapter`` computes its k/v under now: the version, or with adapters
        (adapter, its version, the base version); a cached prefix is reused only under an equal tag."""
        return (
            self.version if self.adapters is None else self.adapters.kv_tag(adapter, self.version)
        )

    @property
    def latest_version(self) -> int:
        """The version that tokens sampled from now on carry (a pending update counts)."""
        with self.cv:
            return self.pending[1] if self.pending is not None else self.version

    def submit(self, state: Any, version: int) -> None:
        """Check ``state`` (an ``nnx.State``, an ``nnx.Module`` or a matching pytree) against the current
        weights, convert it to their dtypes and park it for the loop; raises :class:`EngineError` on a
        structure or shape mismatch. Arrays already of the engine's dtype are used without a copy."""
        if isinstance(state, nnx.Module):
            state = nnx.state(state)
        new_leaves, new_def = jax.tree.flatten(state)
        old_leaves, old_def = jax.tree.flatten(self.state)
        if new_def != old_def:
            raise EngineError(
                explain(
                    "update_weights(state)",
                    expected="the same pytree structure as the "
                    "engine's model state (nnx.split(model)[1])",
                    received=str(new_def)[:200],
                    fix="pass nnx.state(model) of the same architecture",
                )
            )
        for n, o in zip(new_leaves, old_leaves):
            require(
                tuple(np.shape(n)) == tuple(o.shape),
                "update_weights(state)",
                expected=f"a leaf of shape {o.shape}",
                received=np.shape(n),
                fix="pass weights of the same model config",
                error=EngineError,
            )
        # same dtypes as compiled: a weight update never triggers a recompile
        converted = convert_tree(
            jax.tree.unflatten(old_def, new_leaves), [o.dtype for o in old_leaves]
        )
        with self.cv:
            self.pending = (converted, int(version))
            self.cv.notify_all()

    def apply(self) -> bool:
        """(Engine thread, between device steps.) Swap in the pending update (and adapter updates), if
        any; True if one landed."""
        landed = self.adapters is not None and self.adapters.apply()
        with self.cv:
            pending, self.pending = self.pending, None
        if pending is None:
            return landed
        self.state, self.version = pending
        counter("policy_version", self.version, track="engine")
        return True
