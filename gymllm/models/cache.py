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

import inspect
from typing import Any, Callable, Mapping, NamedTuple

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
    cache: KVCache,
    k_new: jax.Array,
    v_new: jax.Array,
    rows: jax.Array,
    positions: jax.Array,
    *,
    unique: bool = False,
) -> KVCache:
    """Every layer's new k/v written at slots ``positions`` of cache rows ``rows`` (broadcast against
    each other, the new k/v shaped ``[L, *broadcast shape, K, D]``), in place under donation; a row or
    position past the cache writes nothing. ``unique``: the caller promises no (row, position) pair
    repeats (XLA may then write them in parallel)."""
    return KVCache(
        cache.k.at[:, rows, positions].set(k_new, mode="drop", unique_indices=unique),
        cache.v.at[:, rows, positions].set(v_new, mode="drop", unique_indices=unique),
    )


def forward_and_write(
    forward: Callable[..., tuple],
    write: Callable[..., KVCache],
    name: str,
    doc: str,
    **options: Any,
) -> Callable[..., tuple[jax.Array, KVCache]]:
    """``forward`` then ``write``, as one function named ``name`` (docstring ``doc``): it takes
    ``forward``'s parameters plus the keyword-only ``options`` (their defaults given here), runs
    ``forward(...) -> (logits, *new)`` and returns ``(logits, write(args, *new))``, ``args`` the call's
    arguments by name (defaults applied, ``options`` among them). Its signature is ``forward``'s plus
    ``options``, so ``jax.jit``'s ``static_argnums``, ``static_argnames`` and ``donate_argnums`` read it
    as they would ``forward``'s; one signature serves both (the forward's, documented there)."""
    own = inspect.signature(forward)
    extra = [
        inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, default=value)
        for key, value in options.items()
    ]
    signature = own.replace(
        parameters=[*own.parameters.values(), *extra],
        return_annotation="tuple[jax.Array, KVCache]",
    )

    def run(*args: Any, **kwargs: Any) -> tuple[jax.Array, KVCache]:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        named: Mapping[str, Any] = bound.arguments
        logits, *new = forward(**{key: named[key] for key in own.parameters})
        return logits, write(named, *new)

    run.__signature__ = signature  # type: ignore[attr-defined]
    run.__name__ = run.__qualname__ = name
    run.__doc__ = doc
    run.__module__ = forward.__module__
    return run


#: how a decode step writes its rows' new k/v (``EngineConfig.kv_write``)
KV_WRITES = ("scatter", "select", "chunk")


class RecentKV(NamedTuple):
    """A decode chunk's own k/v, kept beside the cache until the chunk ends (``kv_write="chunk"``).

    ``k``/``v`` ``[L, W, R, K, D]``: entry i of row w is the k/v of the token at position
    ``start[w] + i`` (``start`` [W] int32: each row's position when the chunk began); ``count`` (int32
    scalar): the entries written so far. Inside the chunk the cache is only read (its slots below
    ``start``) and each step writes one entry here (one dynamic-update-slice for every row);
    :func:`write_recent_kv` moves the entries into the cache once, when the chunk ends."""

    k: jax.Array
    v: jax.Array
    start: jax.Array
    count: jax.Array

    @classmethod
    def empty(cls, cache: KVCache, start: jax.Array, entries: int) -> "RecentKV":
        """No entries yet, room for ``entries`` steps of the rows ``start`` names (``[W]``)."""
        layers, _, _, k, d = cache.k.shape
        shape = (layers, start.shape[0], entries, k, d)
        zeros = jnp.zeros(shape, cache.k.dtype)
        return cls(zeros, zeros, start, jnp.int32(0))

    def add(self, k_new: jax.Array, v_new: jax.Array) -> "RecentKV":
        """Entry ``count`` of every row set to ``k_new``/``v_new`` (``[L, W, K, D]``)."""

        def put(buf: jax.Array, new: jax.Array) -> jax.Array:
            return jax.lax.dynamic_update_index_in_dim(
                buf, new.astype(buf.dtype), self.count, axis=2
            )

        return self._replace(k=put(self.k, k_new), v=put(self.v, v_new), count=self.count + 1)


def write_recent_kv(cache: KVCache, recent: RecentKV) -> KVCache:
    """The cache with each row's ``recent.count`` chunk entries at slots ``start + i``: one window of
    R slots per row (a scatter of W windows, not W x R slots; a chunk longer than the cache writes
    entry by entry). A window that would pass the cache's
    end is moved back to end there, keeping the slots before ``start`` it then covers; entries past the
    cache are dropped, as :func:`scatter_kv` drops them. Slots from ``start + count`` on within the
    window receive the unwritten entries' junk: they lie past the row's position, where nothing
    attends before a later step writes them."""
    s = cache.k.shape[2]
    w, r = recent.k.shape[1], recent.k.shape[2]
    if r > s:  # a chunk longer than the cache has slots: entry by entry (unwritten ones dropped)
        i = jnp.arange(r)[None]
        slot = jnp.where(i < recent.count, recent.start[:, None] + i, s)  # [W, R]
        return scatter_kv(cache, recent.k, recent.v, jnp.arange(w)[:, None], slot, unique=True)
    window = jnp.clip(recent.start, 0, s - r)  # [W] in bounds
    src = jnp.arange(r)[None] - (recent.start - window)[:, None]  # [W, R] entry for window slot
    take = (src >= 0) & (src < recent.count)
    src = jnp.clip(src, 0, r - 1)[None, :, :, None, None]
    slots = window[:, None] + jnp.arange(r)[None]  # [W, R]
    rows = jnp.arange(w)[:, None]
    dnums = jax.lax.ScatterDimensionNumbers(
        update_window_dims=(0, 2, 3, 4),
        inserted_window_dims=(1,),
        scatter_dims_to_operand_dims=(1, 2),
    )
    index = jnp.stack([jnp.arange(w), window], axis=1)  # [W, 2]: (row, window start)

    def put(c: jax.Array, buf: jax.Array) -> jax.Array:
        old = c[:, rows, slots]  # [L, W, R, K, D]
        new = jnp.take_along_axis(buf, src, axis=2)
        upd = jnp.where(take[None, :, :, None, None], new, old)
        return jax.lax.scatter(
            c,
            index,
            upd,
            dnums,
            indices_are_sorted=True,
            unique_indices=True,
            mode=jax.lax.GatherScatterMode.PROMISE_IN_BOUNDS,
        )

    return KVCache(put(cache.k, recent.k), put(cache.v, recent.v))


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
