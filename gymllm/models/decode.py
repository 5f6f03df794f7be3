"""The one-token decode step over a KV cache: the engine's hot path.

``decode_forward(cfg, params, tokens [W], positions [W], cache, length)`` computes the logits of one
new token per row for the first W rows of ``cache`` (``[L, B, S_max, K, D]``, B >= W), each attending
over its cached slots ``[0, length)`` before its position (inside the layer's window) and over itself.
It returns the logits and each layer's new k/v (``[L, W, K, D]``) instead of an updated cache, and
:func:`write_new_kv` scatters those into the (donated) cache afterwards. Same numbers as
``forward(..., cache=...)`` with ``T == 1`` (float32: up to summation order), much less memory traffic:

* the cache stays read-only inside the layer scan (closed over, one layer's ``[W, length]`` window read
  per layer, fused into the attention): the generic cached forward carries the whole cache through the
  scan, scatters into it and copies a layer slice per layer (measured 2.5-12x the weight matmuls
  at 32 rows);
* the new token's own score joins the softmax over the cached scores (no write before the read);
* attention is an elementwise multiply-and-reduce in float32 (a batched dot with M = G query heads per
  kv head is ~4x slower on XLA:CPU), or for low-precision compute a bf16 x bf16 -> f32 dot, the same
  rounding as the cached forward's;
* a uint16 cache holds bfloat16 bit patterns (half the bytes to read; XLA:CPU slices bf16 arrays
  slowly, uint16 ones at memory speed), decoded in the attention fusion.

Every family of :class:`~gymllm.models.ModelConfig` goes through the same layer code as ``forward``
(:mod:`gymllm.models.blocks`: biases, qk-norm, post norms, sliding windows, softcaps, Gemma's embedding
scale and plus-one norms, ``compute_dtype``, uint16-packed weights).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from gymllm.models.blocks import embed_inputs, final_logits, pack_like, scan_layers, unpack
from gymllm.models.cache import (
    KV_WRITES,
    KVCache,
    RecentKV,
    forward_and_write,
    scatter_kv,
    select_kv,
)
from gymllm.models.config import ModelConfig
from gymllm.models.layers import decode_attention


def decode_forward(
    cfg: ModelConfig,
    params: dict[str, jax.Array],
    tokens: jax.Array,
    positions: jax.Array,
    cache: KVCache,
    length: int | None = None,
    *,
    compute_dtype: Any = None,
    adapter: jax.Array | None = None,
    recent: RecentKV | None = None,
    attention: str = "auto",
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One decode step: logits [W, V] float32 and the new k/v [L, W, K, D] (cache dtype) of every layer.

    tokens/positions [W] int32 (W <= the cache's rows: rows [0, W) are used); ``length`` (static, default
    the cache's): cache slots attended, every row's position must be <= ``length`` (a row past it,
    e.g. an idle row at the scratch slot, gets junk logits). Slot ``positions[w]`` itself is not read
    (the new token stands in for it). ``adapter`` [W] int32: each row's LoRA adapter among the params'
    stacks (:func:`gymllm.models.blocks.project`; None: the base weights). ``recent``: the chunk's
    own earlier tokens (:class:`~gymllm.models.cache.RecentKV`): the cache is then read only below each
    row's ``recent.start`` and the slots from there come from ``recent``. ``attention``: the form of
    the attention's products (:func:`gymllm.models.layers.decode_attention`'s ``form``, which
    checks it). Call it inside ``jit`` (``cfg``, ``length`` and ``attention`` static)."""
    w = tokens.shape[0]
    length = length or cache.k.shape[2]
    h, d = cfg.num_heads, cfg.resolved_head_dim
    params, x, mix = embed_inputs(cfg, params, tokens, adapter, compute_dtype)
    mix = None if mix is None else mix[:, None]  # [W, 1, N]
    pos = positions[:, None]  # [W, 1]
    idx = jnp.arange(length)[None]  # [1, S]

    def attend(q, kk, vv, win_l, i):  # q [W, 1, H, D], kk/vv [W, 1, K, D]
        keys, values = cached_rows(cache, i, w, length)  # [W, S, K, D] x2
        below = pos if recent is None else recent.start[:, None]
        visible = (idx < below) & (pos - idx < win_l)  # [W, S]
        extra = None
        if recent is not None:
            at = recent.start[:, None] + jnp.arange(recent.k.shape[2])[None]  # [W, R]
            seen = (at - recent.start[:, None] < recent.count) & (at < pos) & (pos - at < win_l)
            extra = tuple(
                unpack(jax.lax.dynamic_index_in_dim(b, i, 0, keepdims=False))
                for b in (recent.k, recent.v)
            ) + (seen,)
        attn = decode_attention(
            q[:, 0],
            keys,
            values,
            kk[:, 0],
            vv[:, 0],
            visible,
            scale=cfg.attn_scale,
            softcap=cfg.attn_logit_softcap,
            recent=extra,
            form=attention,
        )  # [W, H*D]
        return attn.reshape(w, 1, h * d), (
            pack_like(kk[:, 0], cache.k),
            pack_like(vv[:, 0], cache.v),
        )

    x, (k_new, v_new) = scan_layers(
        cfg, params, x[:, None], pos, attend, mix=mix, compute_dtype=compute_dtype
    )
    return final_logits(cfg, params, x[:, 0]), k_new, v_new


def cached_rows(cache: KVCache, i: jax.Array, w: int, length: int) -> tuple[jax.Array, jax.Array]:
    """Layer ``i``'s keys and values at slots ``[0, length)`` of cache rows ``[0, w)``, decoded
    (:func:`~gymllm.models.blocks.unpack`): [W, length, K, D] x2, what decode rows attend over."""

    def take(c: jax.Array) -> jax.Array:
        return unpack(jax.lax.dynamic_index_in_dim(c, i, 0, keepdims=False)[:w, :length])

    return take(cache.k), take(cache.v)


def write_new_kv(
    cache: KVCache,
    k_new: jax.Array,
    v_new: jax.Array,
    positions: jax.Array,
    kv_write: str = "scatter",
) -> KVCache:
    """Write row w's new k/v ([L, W, K, D]) at slot ``positions[w]`` of cache row w, in place under
    donation (positions past the cache are dropped). ``kv_write``: ``"scatter"`` (the W slots,
    :func:`~gymllm.models.cache.scatter_kv`) or ``"select"`` (rows [0, W) rewritten by a select,
    :func:`~gymllm.models.cache.select_kv`); the same cache either way. ``"chunk"`` keeps a decode
    chunk's k/v beside the cache (:class:`~gymllm.models.cache.RecentKV`); a single step, a chunk of
    one, scatters."""
    if kv_write == "select":
        return select_kv(cache, k_new, v_new, positions)
    if kv_write not in ("scatter", "chunk"):
        raise ValueError(f"kv_write: expected one of {KV_WRITES}, received {kv_write!r}")
    rows = jnp.arange(positions.shape[0])  # one slot a row: every (row, position) pair distinct
    return scatter_kv(cache, k_new, v_new, rows, positions, unique=True)


decode_and_write = forward_and_write(
    decode_forward,
    lambda args, k_new, v_new: write_new_kv(
        args["cache"], k_new, v_new, args["positions"], args["kv_write"]
    ),
    "decode_and_write",
    """:func:`decode_forward` (its parameters) then :func:`write_new_kv` (``kv_write`` there, keyword
    only, default ``"scatter"``): (logits [W, V], the updated cache). Call it inside ``jit`` (the
    engine's steps do); :func:`decode_step` is the standalone jitted form.""",
    kv_write="scatter",
)


decode_step = functools.partial(
    jax.jit,
    static_argnums=(0, 5),
    static_argnames=("compute_dtype", "kv_write", "attention"),
    donate_argnums=(4,),
)(decode_and_write)
decode_step.__doc__ = """:func:`decode_and_write`, jitted, the cache donated."""
