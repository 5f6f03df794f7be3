"""The two jitted device steps of the JAX engine: batched prefill into chosen cache rows, and one
decode step over every slot. Pure functions of (weights, cache, host arrays); the engine owns state.

Cache layout: a pytree from ``model.init_cache(num_slots, max_len, dtype)`` whose array leaves
carry the slot (batch) row on axis ``CACHE_BATCH_AXIS`` (``gymllm.models.KVCache``: [L, B, S, K, D]). Prefill gathers the rows it writes (``rows`` [P]; an index equal
to ``num_slots`` marks a padding row: its gather is clamped and its scatter dropped), runs the
model on them and scatters them back, so other slots' caches are untouched. Decode runs over the
first W rows (W from a small set of widths), so a lightly loaded engine does not pay for idle rows.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from gymllm.inference.sampling import sample, step_keys


CACHE_BATCH_AXIS = 1


def _rows_get(cache: Any, rows: jax.Array) -> Any:
    return jax.tree.map(lambda c: jnp.take(c, rows, axis=CACHE_BATCH_AXIS, mode="clip"), cache)


def _rows_set(cache: Any, rows: jax.Array, part: Any) -> Any:
    index = (slice(None),) * CACHE_BATCH_AXIS + (rows,)
    return jax.tree.map(lambda c, p: c.at[index].set(p.astype(c.dtype), mode="drop"), cache, part)


@functools.lru_cache(maxsize=16)
def make_steps(graphdef: Any) -> tuple[Callable, Callable, dict[str, int]]:
    """(prefill, decode, trace_counts) for a model graph, shared by engines over equal graphs (so a
    second engine of the same architecture and sizes reuses the compiled steps); ``trace_counts``
    counts traces, i.e. (re)compilations, per step."""
    trace_counts: dict[str, int] = {"prefill": 0, "decode": 0}

    @functools.partial(jax.jit, donate_argnums=(1,))
    def prefill(state, cache, tokens, positions, rows, last, keys, steps, temperature, top_k, top_p):
        # tokens/positions [P, T] int32; rows/last/steps/top_k [P] int32; keys [P, 2] uint32
        trace_counts["prefill"] += 1
        model = nnx.merge(graphdef, state)
        part = _rows_get(cache, rows)
        logits, part = model(tokens, positions, cache=part)  # [P, T, V]
        cache = _rows_set(cache, rows, part)
        last_logits = jnp.take_along_axis(logits, last[:, None, None], axis=1)[:, 0]  # [P, V]
        tok, logp = sample(last_logits, step_keys(keys, steps), temperature, top_k, top_p)
        return cache, tok, logp

    @functools.partial(jax.jit, donate_argnums=(1,))
    def decode(state, cache, tokens, positions, keys, steps, temperature, top_k, top_p):
        # tokens/positions/steps/top_k [W] int32; keys [W, 2] uint32; temperature/top_p [W] f32.
        # W (a static shape) <= the cache's rows: the step runs over rows [0, W) only.
        trace_counts["decode"] += 1
        width = tokens.shape[0]
        model = nnx.merge(graphdef, state)
        part = jax.tree.map(lambda c: jax.lax.slice_in_dim(c, 0, width, axis=CACHE_BATCH_AXIS), cache)
        logits, part = model(tokens[:, None], positions[:, None], cache=part)  # [W, 1, V]
        cache = jax.tree.map(
            lambda c, p: jax.lax.dynamic_update_slice_in_dim(c, p.astype(c.dtype), 0, axis=CACHE_BATCH_AXIS),
            cache, part,
        )
        tok, logp = sample(logits[:, 0], step_keys(keys, steps), temperature, top_k, top_p)
        return cache, tok, logp

    return prefill, decode, trace_counts
