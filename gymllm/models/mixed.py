"""One forward over a mixed batch: W decode rows (one new token each) and P prompt chunks (T tokens each).

A continuous-batching engine that prefills new requests in calls of their own reads every weight once
for the prefill and once more for the decode step, and its decode rows wait for the prefill. When the
step is bound by reading the weights (small batches on a CPU, or on an accelerator at low occupancy),
riding the prompts along with the decode step (the "piggybacked" or chunked prefill of Sarathi and
vLLM) costs little more than the decode step alone. ``mixed_forward`` does that in one layer scan:

* all ``N = W + P*T`` tokens go through the projections and the MLP together (``[1, N, E]``);
* decode row w attends over its cached slots ``[0, length)`` before its position plus itself
  (:func:`gymllm.models.layers.decode_attention`, as :func:`gymllm.models.decode.decode_forward`);
* chunk p attends over cache row ``rows[p]``'s slots before the chunk's first position (a reused
  prompt prefix) plus the chunk itself, causally (:func:`gymllm.models.layers.attention` over the
  concatenated keys);
* the cache is only read inside the scan; the new k/v of both parts come back (``[L, W, K, D]`` and
  ``[L, P, T, K, D]``) and :func:`write_mixed_kv` scatters them into the donated cache afterwards.

The decode rows are rows ``[0, W)`` of the cache; chunk rows must not be active decode rows (an idle
row may be both: its decode output is junk and its decode write goes to its scratch position). Padding
chunks use a row index past the cache (their writes are dropped); padding tokens of a chunk continue
its positions, clipped to the last slot (written, never attended: every real query precedes them).
Same numbers as ``forward(..., cache=...)`` up to summation order and the rounding of the chunk's own
k/v to the cache dtype.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from gymllm.models.cache import KVCache
from gymllm.models.config import ModelConfig
from gymllm.models.layers import attention, decode_attention
from gymllm.models.transformer import (_embed, _global_params, _layer_rest, _layer_weights, _layer_xs, _logits,
                                       _pack_like, _qkv, _unpack)


def _chunk_masks(pre_positions: jax.Array, length: int, window: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Chunk queries [P, T]: (visible cached slots [P, T, S], visible chunk keys [P, T, T])."""
    t = pre_positions.shape[1]
    start = pre_positions[:, :1, None]  # [P, 1, 1]
    qpos = pre_positions[:, :, None]  # [P, T, 1]
    idx = jnp.arange(length)[None, None]  # [1, 1, S]
    cached = (idx < start) & (qpos - idx < window)
    causal = jnp.arange(t)[None, :] <= jnp.arange(t)[:, None]  # [T, T]
    near = qpos - pre_positions[:, None, :] < window  # [P, T, T]
    return cached, causal[None] & near


def mixed_forward(cfg: ModelConfig, params: dict[str, jax.Array], dec_tokens: jax.Array, dec_positions: jax.Array,
                  pre_tokens: jax.Array, pre_positions: jax.Array, pre_rows: jax.Array, pre_last: jax.Array,
                  cache: KVCache, length: int | None = None, *, compute_dtype: Any = None
                  ) -> tuple[jax.Array, tuple[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]:
    """Logits [W + P, V] float32 (decode rows, then each chunk at its ``pre_last`` index), the decode rows'
    new (k, v) [L, W, K, D] and the chunks' new (k, v) [L, P, T, K, D] (cache dtype).

    dec_tokens/dec_positions [W] int32 (cache rows [0, W)); pre_tokens/pre_positions [P, T] int32,
    pre_rows/pre_last [P] int32. ``length`` (static): cache slots read; it must cover every decode
    row's position and every chunk's start. Call it inside ``jit`` (``cfg`` and ``length`` static)."""
    w, (p, t) = dec_tokens.shape[0], pre_tokens.shape
    length = length or cache.k.shape[2]
    h, d = cfg.num_heads, cfg.resolved_head_dim
    params = _global_params(params, compute_dtype)
    positions = jnp.concatenate([dec_positions, pre_positions.reshape(-1)])[None]  # [1, N]
    x = _embed(cfg, params, jnp.concatenate([dec_tokens, pre_tokens.reshape(-1)]))[None]  # [1, N, E]
    dpos = dec_positions[:, None]  # [W, 1]
    idx = jnp.arange(length)[None]  # [1, S]

    def layer(x, xs):
        lw, inv_l, win_l, i = xs
        lw = _layer_weights(lw, compute_dtype)
        q, kk, vv = (a[0] for a in _qkv(cfg, lw, x, positions, inv_l))  # [N, H, D], [N, K, D] x2
        ck = jax.lax.dynamic_index_in_dim(cache.k, i, 0, keepdims=False)  # [B, S_max, K, D]
        cv = jax.lax.dynamic_index_in_dim(cache.v, i, 0, keepdims=False)
        visible = (idx < dpos) & (dpos - idx < win_l)  # [W, S]
        attn_d = decode_attention(q[:w], _unpack(ck[:w, :length]), _unpack(cv[:w, :length]), kk[:w], vv[:w],
                                  visible, scale=cfg.attn_scale, softcap=cfg.attn_logit_softcap)  # [W, H*D]
        qp, kp, vp = (a[w:].reshape(p, t, *a.shape[1:]) for a in (q, kk, vv))  # [P, T, H|K, D]
        keys = jnp.concatenate([_unpack(jnp.take(ck, pre_rows, axis=0, mode="clip")[:, :length]).astype(qp.dtype),
                                kp], axis=1)  # [P, S + T, K, D]
        values = jnp.concatenate([_unpack(jnp.take(cv, pre_rows, axis=0, mode="clip")[:, :length]).astype(qp.dtype),
                                  vp], axis=1)
        cached, own = _chunk_masks(pre_positions, length, win_l)
        attn_p = attention(qp, keys, values, jnp.concatenate([cached, own], axis=-1), scale=cfg.attn_scale,
                           softcap=cfg.attn_logit_softcap)  # [P, T, H*D]
        attn = jnp.concatenate([attn_d.astype(attn_p.dtype), attn_p.reshape(p * t, h * d)])[None]  # [1, N, H*D]
        x = _layer_rest(cfg, lw, x, attn)
        new = tuple(_pack_like(a, cache.k) for a in (kk[:w], vv[:w], kp, vp))
        return x, new

    x, (kd, vd, kp, vp) = jax.lax.scan(layer, x, _layer_xs(cfg, params))
    x_last = jnp.take_along_axis(x[0, w:].reshape(p, t, -1), pre_last[:, None, None], axis=1)[:, 0]  # [P, E]
    return _logits(cfg, params, jnp.concatenate([x[0, :w], x_last])), (kd, vd), (kp, vp)


def write_mixed_kv(cache: KVCache, dec_kv: tuple[jax.Array, jax.Array], dec_positions: jax.Array,
                   pre_kv: tuple[jax.Array, jax.Array], pre_positions: jax.Array, pre_rows: jax.Array) -> KVCache:
    """Scatter both parts' new k/v into the (donated) cache: decode row w at slot ``dec_positions[w]`` of
    row w, chunk p's token j at slot ``pre_positions[p, j]`` of row ``pre_rows[p]`` (rows or slots past
    the cache are dropped). The chunks are written last."""
    rows = jnp.arange(dec_positions.shape[0])
    chunk_rows = jnp.broadcast_to(pre_rows[:, None], pre_positions.shape)  # [P, T]
    k = cache.k.at[:, rows, dec_positions].set(dec_kv[0], mode="drop")
    v = cache.v.at[:, rows, dec_positions].set(dec_kv[1], mode="drop")
    k = k.at[:, chunk_rows, pre_positions].set(pre_kv[0], mode="drop")
    v = v.at[:, chunk_rows, pre_positions].set(pre_kv[1], mode="drop")
    return KVCache(k, v)


def mixed_and_write(cfg: ModelConfig, params: dict[str, jax.Array], dec_tokens: jax.Array, dec_positions: jax.Array,
                    pre_tokens: jax.Array, pre_positions: jax.Array, pre_rows: jax.Array, pre_last: jax.Array,
                    cache: KVCache, length: int | None = None, *, compute_dtype: Any = None
                    ) -> tuple[jax.Array, KVCache]:
    """:func:`mixed_forward` then :func:`write_mixed_kv`: (logits [W + P, V], the updated cache)."""
    logits, dec_kv, pre_kv = mixed_forward(cfg, params, dec_tokens, dec_positions, pre_tokens, pre_positions,
                                           pre_rows, pre_last, cache, length, compute_dtype=compute_dtype)
    return logits, write_mixed_kv(cache, dec_kv, dec_positions, pre_kv, pre_positions, pre_rows)


mixed_step = functools.partial(jax.jit, static_argnums=(0, 9), static_argnames=("compute_dtype",),
                               donate_argnums=(8,))(mixed_and_write)
mixed_step.__doc__ = """:func:`mixed_and_write`, jitted, the cache donated."""
