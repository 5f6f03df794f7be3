"""The KV cache: a plain pytree of two arrays, so engines can slice, stack and donate it.

``k`` and ``v`` are ``[L, B, S, K, D]`` (layers, batch rows, cache slots, kv heads, head dim).
The batch row is axis 1 of both leaves, so ``jax.tree.map(lambda x: x[:, i], cache)`` takes row i
and ``jax.tree.map(lambda c, r: c.at[:, i].set(r), cache, row)`` writes it back.
A token's k/v are written at slot == its position; see :mod:`gymllm.models.transformer`.
A ``uint16`` cache stores bfloat16 bit patterns (the JAX engine's choice when it computes in bf16 on
CPU: half the bytes of float32, and XLA:CPU slices uint16 arrays at memory speed, bf16 ones slowly);
``forward`` and :func:`gymllm.models.decode.decode_forward` encode and decode it.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class KVCache(NamedTuple):
    k: jax.Array  # [L, B, S, K, D]
    v: jax.Array  # [L, B, S, K, D]

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    @property
    def batch(self) -> int:
        return self.k.shape[1]


def init_cache(
    num_layers: int, batch: int, max_len: int, num_kv_heads: int, head_dim: int, dtype=jnp.float32
) -> KVCache:
    """A zeroed cache of ``max_len`` slots per row."""
    shape = (num_layers, batch, max_len, num_kv_heads, head_dim)
    return KVCache(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype))


def scatter_kv(
    cache: KVCache, k_new: jax.Array, v_new: jax.Array, rows: jax.Array, positions: jax.Array
) -> KVCache:
    """Every layer's new k/v written at slots ``positions`` of cache rows ``rows`` (broadcast against
    each other, the new k/v shaped ``[L, *broadcast shape, K, D]``), in place under donation; a row or
    position past the cache writes nothing."""
    return KVCache(
        cache.k.at[:, rows, positions].set(k_new, mode="drop"),
        cache.v.at[:, rows, positions].set(v_new, mode="drop"),
    )


#: how a decode step writes its rows' new k/v (``EngineConfig.kv_write``)
KV_WRITES = ("scatter", "select")


def select_kv(cache: KVCache, k_new: jax.Array, v_new: jax.Array, positions: jax.Array) -> KVCache:
    """Row w's new k/v (``[L, W, K, D]``) at slot ``positions[w]`` of cache row w, every row at once: a
    select over each row's slots, reading and writing cache rows [0, W) whole, where
    :func:`scatter_kv` writes only the W slots. Same cache afterwards (a position past the cache
    writes nothing). For an accelerator where XLA lowers the scatter to one dynamic-update-slice per
    row inside a loop, so that a decode step's write grows with the rows (docs/tpu.md)."""
    w = positions.shape[0]
    hit = (jnp.arange(cache.k.shape[2])[None, :] == positions[:, None])[None, :, :, None, None]

    def put(c: jax.Array, new: jax.Array) -> jax.Array:
        rows = jnp.where(hit, new[:, :, None].astype(c.dtype), c[:, :w])  # [L, W, S, K, D]
        return rows if w == c.shape[1] else c.at[:, :w].set(rows)

    return KVCache(put(cache.k, k_new), put(cache.v, v_new))
