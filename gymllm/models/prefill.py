"""The chunked prefill over a KV cache: the engine's admission path (a prompt, or a new turn's delta
on top of a reused prefix).

``prefill_forward(cfg, params, tokens [P, T], positions [P, T], rows [P], cache, length, logits_at [P])``
runs T new tokens per row; row p's tokens sit at slots ``positions[p] = start_p + arange(T)`` of cache
row ``rows[p]`` (``[L, B, S_max, K, D]``). It returns the logits at index ``logits_at[p]`` of each row
and each layer's new k/v (``[L, P, T, K, D]``) instead of an updated cache; :func:`write_chunk_kv`
scatters those into the (donated) cache afterwards. Same numbers as ``forward(..., cache=rows)``
(float32: up to summation order), with much less memory traffic, in the manner of
:mod:`gymllm.models.decode`:

* the cache stays read-only inside the layer scan (closed over): each layer reads only the P rows'
  cached prefix ``[P, length]`` (``length`` static, a bucket covering every row's start; 0 reads
  nothing), where the generic cached forward gathers whole rows, carries them through the scan,
  scatters into them and scatters them back (cost growing with ``max_len``);
* a query at position ``pos`` attends, in one softmax, to the cached slots ``s < start`` inside its
  window and to the chunk's own keys (causal by index, inside the window): stale slots at or past
  ``start`` are never read, so no write has to precede the read;
* the attention is :func:`gymllm.models.attention.attention`, the one ``forward`` runs (kv-head-major:
  one [G*T, D] x [D, S] dot per row and kv head);
* the chunk's own k/v round-trip through the cache dtype before they are attended (a uint16 cache
  holds bf16 bit patterns), exactly as the cached forward reads them back after writing.

Padding rows (``rows[p] == B``, the cache's row count) read a clamped row and write nothing; tokens
at index ``>= lengths[p]`` (a row's padded tail) write nothing either (:func:`write_chunk_kv`), so
they cannot clobber real k/v wherever their positions land. Every family of
:class:`~gymllm.models.ModelConfig` goes through the same layer code as ``forward`` (:mod:`gymllm.models.blocks`).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from gymllm.models.blocks import embed_inputs, final_logits, pack_like, scan_layers, unpack
from gymllm.models.cache import KVCache, forward_and_write, scatter_kv
from gymllm.models.config import ModelConfig
from gymllm.models.attention import attention
from gymllm.models.layers import causal_mask


def _cached_prefix(
    cache: KVCache, i: jax.Array, rows: jax.Array, length: int, dtype: Any
) -> tuple[jax.Array, jax.Array]:
    """Layer i's first ``length`` slots of cache rows ``rows`` (clamped), decoded: [P, length, K, D] x2."""
    rows = jnp.minimum(rows, cache.k.shape[1] - 1)
    take = lambda c: unpack(c[i, rows, :length]).astype(dtype)  # noqa: E731  one gather per layer
    return take(cache.k), take(cache.v)


def chunk_attention(
    cfg: ModelConfig,
    q: jax.Array,
    k_own: jax.Array,
    v_own: jax.Array,
    positions: jax.Array,
    rows: jax.Array,
    cache: KVCache,
    i: jax.Array,
    length: int,
    window: jax.Array,
) -> jax.Array:
    """Prompt chunks' attention in layer i: q [P, T, H, D] over cache rows ``rows``' slots before each
    chunk's start (``positions[:, 0]``; ``length`` slots read, 0: none) and the chunk's own k/v [P, T, K, D]
    (as stored), causally, inside ``window``, in one softmax -> [P, T, H*D]."""
    keys, values = unpack(k_own).astype(q.dtype), unpack(v_own).astype(q.dtype)
    mask = causal_mask(positions, None, window)  # [P, T, T]
    if length:
        idx, pos = jnp.arange(length)[None, None], positions[:, :, None]  # [1, 1, S], [P, T, 1]
        ck, cv = _cached_prefix(cache, i, rows, length, q.dtype)  # [P, S, K, D] x2
        keys, values = (
            jnp.concatenate([ck, keys], 1),
            jnp.concatenate([cv, values], 1),
        )  # [P, S + T, K, D]
        mask = jnp.concatenate(
            [(idx < positions[:, :1, None]) & (pos - idx < window), mask], 2
        )  # [P, T, S + T]
    return attention(q, keys, values, mask, scale=cfg.attn_scale, softcap=cfg.attn_logit_softcap)


def prefill_forward(
    cfg: ModelConfig,
    params: dict[str, jax.Array],
    tokens: jax.Array,
    positions: jax.Array,
    rows: jax.Array,
    cache: KVCache,
    length: int | None,
    logits_at: jax.Array,
    *,
    compute_dtype: Any = None,
    adapter: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """A prefill chunk: logits [P, V] float32 at ``logits_at`` and the new k/v [L, P, T, K, D] (cache dtype).

    tokens/positions [P, T] int32 (row p's positions continue from ``start_p = positions[p, 0]``);
    rows [P] int32 cache rows (``B``: a padding row); ``length`` (static; None: the whole cache): cached
    slots read, must be >= every row's start (0: no cached prefix, nothing read); logits_at [P] int32;
    ``adapter`` [P] int32: each row's LoRA adapter among the params' stacks
    (:func:`gymllm.models.blocks.project`; None: the base weights). Call it inside ``jit`` (``cfg``
    and ``length`` static)."""
    length = cache.k.shape[2] if length is None else length
    params, x, mix = embed_inputs(cfg, params, tokens, adapter, compute_dtype)  # x [P, T, E]
    mix = None if mix is None else mix[:, None]  # [P, 1, N]

    def attend(q, kk, vv, win_l, i):  # q [P, T, H, D], kk/vv [P, T, K, D]
        k_st, v_st = pack_like(kk, cache.k), pack_like(vv, cache.v)  # as stored
        attn = chunk_attention(
            cfg, q, k_st, v_st, positions, rows, cache, i, length, win_l
        )  # [P, T, H*D]
        return attn, (k_st, v_st)

    x, (k_new, v_new) = scan_layers(
        cfg, params, x, positions, attend, mix=mix, compute_dtype=compute_dtype
    )
    x = jnp.take_along_axis(x, logits_at[:, None, None], axis=1)[:, 0]  # [P, E]
    return final_logits(cfg, params, x), k_new, v_new


def write_chunk_kv(
    cache: KVCache,
    k_new: jax.Array,
    v_new: jax.Array,
    rows: jax.Array,
    positions: jax.Array,
    lengths: jax.Array | None = None,
) -> KVCache:
    """Write row p's new k/v ([L, P, T, K, D]) at slots ``positions[p]`` of cache row ``rows[p]``, in place
    under donation. Dropped: padding rows (``rows[p]`` >= the cache's rows), positions past the cache,
    and tokens at index >= ``lengths[p]`` (a row's padded tail; default: every token is written)."""
    b, s = cache.k.shape[1], cache.k.shape[2]
    pos = positions
    if lengths is not None:
        pos = jnp.where(
            jnp.arange(positions.shape[1])[None] < lengths[:, None], positions, s
        )  # [P, T]
    r = jnp.where(rows < b, rows, b)[:, None]  # [P, 1]
    return scatter_kv(cache, k_new, v_new, r, pos)


prefill_and_write = forward_and_write(
    prefill_forward,
    lambda args, k_new, v_new: write_chunk_kv(
        args["cache"], k_new, v_new, args["rows"], args["positions"], args["logits_at"] + 1
    ),
    "prefill_and_write",
    """:func:`prefill_forward` (its parameters) then :func:`write_chunk_kv` (tokens past
    ``logits_at`` are padding and write nothing): (logits [P, V], the updated cache). Call it inside
    ``jit``; :func:`prefill_step` is the standalone jitted form.""",
)


prefill_step = functools.partial(
    jax.jit, static_argnums=(0, 6), static_argnames=("compute_dtype",), donate_argnums=(5,)
)(prefill_and_write)
prefill_step.__doc__ = """:func:`prefill_and_write`, jitted, the cache donated."""
