"""Packed (ragged) prefill: prompt pieces of any lengths and counts in one fixed token budget.

The bucketed prefill (:mod:`gymllm.models.prefill`) pads P prompt chunks to a length bucket T, so every
(P, T, cached length) is a compiled program and a short prompt pays for its whole bucket. Here the
chunks of up to P requests are laid end to end in one row of N tokens (N the engine's token budget,
as the ragged prefill of vLLM's and JetStream's TPU paths): one program serves every mix of prompt
lengths and counts, and a call costs N tokens whatever the mix.

``packed_prefill_forward(cfg, params, tokens [N], positions [N], seg [N], rows [P], starts [P], cache,
length, logits_at [P])``: token n belongs to segment ``seg[n]`` (P: padding), which continues cache row
``rows[seg[n]]`` from slot ``starts[seg[n]]`` (the reused prefix, or the part of a long prompt an
earlier call prefilled). Each token attends, in one softmax,

* to its segment's cached slots ``s < start`` of that row (the P rows' first ``length`` slots are read,
  ``length`` static, one gather per layer; a token never sees another segment's row), and
* to the earlier tokens of its own segment in this call (causal by index, same segment), inside the
  layer's window.

Segments are contiguous and their positions increase by one, so these are the numbers of
:func:`gymllm.models.prefill.prefill_forward` over the same chunks (float32: up to summation order).
The new k/v come back ``[L, N, K, D]`` and :func:`write_packed_kv` scatters each real token's into its
row at its position (padding tokens write nothing). LoRA adapters: ``adapter`` [P], one per segment,
each token computing with its segment's (:func:`gymllm.models.blocks.project`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from gymllm.models.attention import attention
from gymllm.models.blocks import embed_inputs, final_logits, pack_like, scan_layers, unpack
from gymllm.models.cache import KVCache, forward_and_write, scatter_kv
from gymllm.models.config import ModelConfig
from gymllm.models.layers import causal_mask


def packed_mask(
    positions: jax.Array, seg: jax.Array, starts: jax.Array, length: int, window: jax.Array
) -> jax.Array:
    """[N, P*length + N]: token n may attend slot s of segment p's cached row (p == seg[n], s < starts[p])
    and the earlier tokens of its own segment (index order), all inside ``window`` of its position."""
    own = causal_mask(positions[None], seg[None], window)[0]  # [N, N]
    if not length:
        return own
    p = starts.shape[0]
    idx = jnp.arange(length)[None, None]  # [1, 1, S]
    hit = (seg[:, None, None] == jnp.arange(p)[None, :, None]) & (
        idx < starts[None, :, None]
    )  # [N, P, S]
    hit = hit & (positions[:, None, None] - idx < window)
    return jnp.concatenate([hit.reshape(positions.shape[0], p * length), own], 1)


def packed_prefill_forward(
    cfg: ModelConfig,
    params: dict[str, jax.Array],
    tokens: jax.Array,
    positions: jax.Array,
    seg: jax.Array,
    rows: jax.Array,
    starts: jax.Array,
    cache: KVCache,
    length: int,
    logits_at: jax.Array,
    *,
    compute_dtype: Any = None,
    adapter: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Logits [P, V] float32 at token index ``logits_at[p]`` and the new k/v [L, N, K, D] (cache dtype).

    tokens/positions/seg [N] int32; rows/starts/logits_at [P] int32 (a padding segment: row = the cache's
    row count, start 0); ``length`` (static): cached slots read per row, >= every segment's start (0:
    none); ``adapter`` [P] int32: each segment's LoRA adapter, its tokens' (None: the base weights).
    Call it inside ``jit``."""
    per_token = None if adapter is None else adapter[segment_index(seg, rows)]
    params, x, mix = embed_inputs(cfg, params, tokens, per_token, compute_dtype)  # x [N, E]
    mix = None if mix is None else mix[None]  # [1, N, A]
    clamped = jnp.minimum(rows, cache.k.shape[1] - 1)
    p = rows.shape[0]

    def attend(q, kk, vv, win_l, i):  # q [1, N, H, D], kk/vv [1, N, K, D]
        k_st, v_st = pack_like(kk, cache.k), pack_like(vv, cache.v)  # as stored
        keys, values = unpack(k_st).astype(q.dtype), unpack(v_st).astype(q.dtype)
        if length:

            def take(c):
                return (
                    unpack(c[i, clamped, :length])
                    .astype(q.dtype)
                    .reshape(1, p * length, *c.shape[3:])
                )

            keys, values = (
                jnp.concatenate([take(cache.k), keys], 1),
                jnp.concatenate([take(cache.v), values], 1),
            )
        mask = packed_mask(positions, seg, starts, length, win_l)[None]  # [1, N, P*S + N]
        attn = attention(
            q, keys, values, mask, scale=cfg.attn_scale, softcap=cfg.attn_logit_softcap
        )  # [1, N, H*D]
        return attn, (k_st[0], v_st[0])

    x, (k_new, v_new) = scan_layers(
        cfg, params, x[None], positions[None], attend, mix=mix, compute_dtype=compute_dtype
    )
    return final_logits(cfg, params, x[0, logits_at]), k_new, v_new


#: ``write_packed_kv(cache, k_new, v_new, token_rows, positions)``: token n's new k/v ([L, N, K, D]) at
#: slot ``positions[n]`` of cache row ``token_rows[n]``, in place under donation; a row index past the
#: cache (a padding token) writes nothing.
write_packed_kv = scatter_kv


def segment_index(seg: jax.Array, rows: jax.Array) -> jax.Array:
    """Each token's segment [N], a padding token's clamped to the last (a valid index into [P])."""
    return jnp.minimum(seg, rows.shape[0] - 1)


def write_packed_prefill(args: dict[str, Any], k_new: jax.Array, v_new: jax.Array) -> KVCache:
    """:func:`write_packed_kv` of the real tokens' new k/v, ``args`` a
    :func:`packed_prefill_forward` call's arguments by name (padding tokens write nothing)."""
    seg, rows, cache = args["seg"], args["rows"], args["cache"]
    token_rows = jnp.where(seg < rows.shape[0], rows[segment_index(seg, rows)], cache.k.shape[1])
    return write_packed_kv(cache, k_new, v_new, token_rows, args["positions"])


packed_prefill_and_write = forward_and_write(
    packed_prefill_forward,
    write_packed_prefill,
    "packed_prefill_and_write",
    """:func:`packed_prefill_forward` (its parameters) then :func:`write_packed_kv`: (logits [P, V], the
    updated cache). Call it inside ``jit``.""",
)
