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
  prompt prefix) plus the chunk itself, causally (:func:`gymllm.models.prefill.chunk_attention`, as
  :func:`gymllm.models.prefill.prefill_forward`);
* the cache is only read inside the scan; the new k/v of both parts come back (``[L, W, K, D]`` and
  ``[L, P, T, K, D]``) and :func:`write_mixed_kv` scatters them into the donated cache afterwards.

The decode rows are rows ``[0, W)`` of the cache; chunk rows must not be active decode rows (an idle
row may be both: its decode output is junk, its decode write goes to its scratch position and the
chunk is written after it). Padding chunks use a row index past the cache and padding tokens sit past
``pre_last``: neither writes anything. Same numbers as ``forward(..., cache=...)`` up to summation order.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from gymllm.models.blocks import embed_inputs, final_logits, pack_like, scan_layers
from gymllm.models.cache import KVCache, forward_and_write
from gymllm.models.config import ModelConfig
from gymllm.models.decode import cached_rows, write_new_kv
from gymllm.models.layers import decode_attention
from gymllm.models.prefill import chunk_attention, write_chunk_kv


def mixed_forward(
    cfg: ModelConfig,
    params: dict[str, jax.Array],
    dec_tokens: jax.Array,
    dec_positions: jax.Array,
    pre_tokens: jax.Array,
    pre_positions: jax.Array,
    pre_rows: jax.Array,
    pre_last: jax.Array,
    cache: KVCache,
    length: int | None = None,
    *,
    compute_dtype: Any = None,
    adapter: jax.Array | None = None,
) -> tuple[jax.Array, tuple[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]:
    """Logits [W + P, V] float32 (decode rows, then each chunk at its ``pre_last`` index), the decode rows'
    new (k, v) [L, W, K, D] and the chunks' new (k, v) [L, P, T, K, D] (cache dtype).

    dec_tokens/dec_positions [W] int32 (cache rows [0, W)); pre_tokens/pre_positions [P, T] int32,
    pre_rows/pre_last [P] int32. ``length`` (static): cache slots read; it must cover every decode
    row's position and every chunk's start. ``adapter`` [W + P] int32: each decode row's, then each
    chunk's LoRA adapter among the params' stacks (:func:`gymllm.models.blocks.project`; None: the
    base weights). Call it inside ``jit`` (``cfg`` and ``length`` static)."""
    w, (p, t) = dec_tokens.shape[0], pre_tokens.shape
    length = length or cache.k.shape[2]
    h, d = cfg.num_heads, cfg.resolved_head_dim
    tokens = jnp.concatenate([dec_tokens, pre_tokens.reshape(-1)])
    params, x, mix = embed_inputs(cfg, params, tokens, adapter, compute_dtype)  # x [N, E]
    if mix is not None:  # per token: the decode rows', then every chunk token its chunk's
        mix = jnp.concatenate([mix[:w], jnp.repeat(mix[w:], t, axis=0)])[None]  # [1, N, adapters]
    positions = jnp.concatenate([dec_positions, pre_positions.reshape(-1)])[None]  # [1, N]
    dpos = dec_positions[:, None]  # [W, 1]
    idx = jnp.arange(length)[None]  # [1, S]

    def attend(q, kk, vv, win_l, i):
        q, kk, vv = q[0], kk[0], vv[0]  # [N, H, D], [N, K, D] x2
        visible = (idx < dpos) & (dpos - idx < win_l)  # [W, S]
        keys, values = cached_rows(cache, i, w, length)  # [W, S, K, D] x2
        attn_d = decode_attention(
            q[:w],
            keys,
            values,
            kk[:w],
            vv[:w],
            visible,
            scale=cfg.attn_scale,
            softcap=cfg.attn_logit_softcap,
        )  # [W, H*D]
        qp, kp, vp = (a[w:].reshape(p, t, *a.shape[1:]) for a in (q, kk, vv))  # [P, T, H|K, D]
        kp, vp = (
            pack_like(kp, cache.k),
            pack_like(vp, cache.v),
        )  # as stored (and read back by later steps)
        attn_p = chunk_attention(
            cfg, qp, kp, vp, pre_positions, pre_rows, cache, i, length, win_l
        )  # [P, T, H*D]
        attn = jnp.concatenate([attn_d.astype(attn_p.dtype), attn_p.reshape(p * t, h * d)])[
            None
        ]  # [1, N, H*D]
        return attn, (pack_like(kk[:w], cache.k), pack_like(vv[:w], cache.v), kp, vp)

    x, (kd, vd, kp, vp) = scan_layers(
        cfg, params, x[None], positions, attend, mix=mix, compute_dtype=compute_dtype
    )
    x_last = jnp.take_along_axis(x[0, w:].reshape(p, t, -1), pre_last[:, None, None], axis=1)[
        :, 0
    ]  # [P, E]
    return final_logits(cfg, params, jnp.concatenate([x[0, :w], x_last])), (kd, vd), (kp, vp)


def write_mixed_kv(
    cache: KVCache,
    dec_kv: tuple[jax.Array, jax.Array],
    dec_positions: jax.Array,
    pre_kv: tuple[jax.Array, jax.Array],
    pre_positions: jax.Array,
    pre_rows: jax.Array,
    pre_last: jax.Array,
) -> KVCache:
    """Scatter both parts' new k/v into the (donated) cache: decode row w at slot ``dec_positions[w]`` of
    row w (:func:`~gymllm.models.decode.write_new_kv`), then chunk p's real tokens (index <=
    ``pre_last[p]``) at their positions in row ``pre_rows[p]`` (:func:`~gymllm.models.prefill.write_chunk_kv`;
    padding rows and tokens write nothing)."""
    cache = write_new_kv(cache, *dec_kv, dec_positions)
    return write_chunk_kv(cache, *pre_kv, pre_rows, pre_positions, pre_last + 1)


mixed_and_write = forward_and_write(
    mixed_forward,
    lambda args, dec_kv, pre_kv: write_mixed_kv(
        args["cache"],
        dec_kv,
        args["dec_positions"],
        pre_kv,
        args["pre_positions"],
        args["pre_rows"],
        args["pre_last"],
    ),
    "mixed_and_write",
    """:func:`mixed_forward` (its parameters) then :func:`write_mixed_kv`: (logits [W + P, V], the
    updated cache).""",
)


mixed_step = functools.partial(
    jax.jit, static_argnums=(0, 9), static_argnames=("compute_dtype",), donate_argnums=(8,)
)(mixed_and_write)
mixed_step.__doc__ = """:func:`mixed_and_write`, jitted, the cache donated."""
