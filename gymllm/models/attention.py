"""Grouped-query attention over a whole sequence (training forward, prefill), kv-head-major, with a
hand-written backward.

Each kv head's G query heads and T tokens form one [G*T, D] x [D, S] dot per (row, kv head), and the
backward is the softmax gradient written out (``dS = P * (dP - rowsum(P * dP))``) over the stashed
probabilities, every dot in the same batched [row, kv head] layout. Autodiff of the plain
``[B, T, K, G]``-ordered formula, as XLA:CPU compiles it, fuses the softmax and the masking into
transposed copies of the [B, K, G, T, S] scores; measured on the 2-core AMD EPYC (float32, median of
7): at the peers' medium config (64 rows x 128 tokens, 8 heads of 16 over 4 kv heads) one layer's
forward 99 -> 65 ms and forward+backward 169 -> 131 ms; at SmolLM2's heads (8 x 128, 9 heads of 64
over 3) 14.7 -> 6.1 ms and 20.5 -> 13.2 ms. The numbers are those of the plain formula up to float32
summation order (``tests/test_attention.py`` checks values and gradients against it).

Shapes: P rows, T query tokens, S keys, H query heads, K kv heads, G = H // K, D head dim, M = G * T.
Scores, softmax and the backward's softmax gradient are float32 whatever the input dtype; the dots
take low-precision operands with float32 accumulation.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from gymllm.models.layers import NEG_INF


def _to_kv_major(x: jax.Array, kh: int) -> jax.Array:
    """[P, T, H, D] -> [P, K, G*T, D]: each kv head's query heads, then tokens."""
    p, t, h, d = x.shape
    return x.reshape(p, t, kh, h // kh, d).transpose(0, 2, 3, 1, 4).reshape(p, kh, -1, d)


def _from_kv_major(x: jax.Array, t: int) -> jax.Array:
    """[P, K, G*T, D] -> [P, T, K*G, D] (the query layout)."""
    p, kh, m, d = x.shape
    return x.reshape(p, kh, m // t, t, d).transpose(0, 3, 1, 2, 4).reshape(p, t, kh * (m // t), d)


def _dot(spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
    """``jnp.einsum(spec, a, b)`` accumulated and returned in float32."""
    return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


def _forward(q, keys, values, mask, scale, softcap):
    p, t, h, d = q.shape
    kh = keys.shape[2]
    qm = _to_kv_major(q, kh)  # [P, K, M, D]
    km, vm = jnp.swapaxes(keys, 1, 2), jnp.swapaxes(values, 1, 2)  # [P, K, S, D]
    scores = _dot("pkmd,pksd->pkms", qm, km) * scale  # [P, K, M, S]
    capped = None
    if softcap:
        capped = jnp.tanh(scores / softcap)
        scores = softcap * capped
    shape5 = (p, kh, h // kh, t, scores.shape[-1])
    scores = jnp.where(mask[:, None, None], scores.reshape(shape5), NEG_INF)  # [P, K, G, T, S]
    probs = (
        jax.nn.softmax(scores, axis=-1).astype(values.dtype).reshape(p, kh, h // kh * t, -1)
    )  # [P, K, M, S]
    out = _dot("pkms,pksd->pkmd", probs, vm)  # [P, K, M, D]
    out = _from_kv_major(out.astype(values.dtype), t).reshape(p, t, h * d)  # [P, T, H*D]
    return out, (qm, km, vm, probs, capped, mask)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _attention(q, keys, values, mask, scale, softcap):
    return _forward(q, keys, values, mask, scale, softcap)[0]


def _attention_fwd(q, keys, values, mask, scale, softcap):
    return _forward(q, keys, values, mask, scale, softcap)


def _attention_bwd(scale, softcap, res, d_out):
    qm, km, vm, probs, capped, mask = res
    p, t = d_out.shape[:2]
    kh, s, d = km.shape[1:]
    dom = _to_kv_major(d_out.reshape(p, t, -1, d), kh).astype(vm.dtype)  # [P, K, M, D]
    d_v = _dot("pkms,pkmd->pksd", probs, dom)  # [P, K, S, D]
    d_probs = _dot("pkmd,pksd->pkms", dom, vm)  # [P, K, M, S]
    pf = probs.astype(jnp.float32)
    d_scores = pf * (
        d_probs - jnp.sum(pf * d_probs, axis=-1, keepdims=True)
    )  # the softmax gradient
    if softcap:
        d_scores = d_scores * (1.0 - capped * capped)
    m = d_scores.shape[2]
    d_scores = jnp.where(
        mask[:, None, None], d_scores.reshape(p, kh, m // t, t, s), 0.0
    )  # masked: no gradient
    d_scores = (d_scores.reshape(p, kh, m, s) * scale).astype(qm.dtype)
    d_q = _dot("pkms,pksd->pkmd", d_scores, km)  # [P, K, M, D]
    d_k = _dot("pkms,pkmd->pksd", d_scores, qm)  # [P, K, S, D]
    return (
        _from_kv_major(d_q, t).astype(qm.dtype),
        jnp.swapaxes(d_k, 1, 2).astype(km.dtype),
        jnp.swapaxes(d_v, 1, 2).astype(vm.dtype),
        None,
    )


_attention.defvjp(_attention_fwd, _attention_bwd)


def attention(
    q: jax.Array,
    keys: jax.Array,
    values: jax.Array,
    mask: jax.Array,
    *,
    scale: float,
    softcap: float = 0.0,
) -> jax.Array:
    """Grouped-query attention: q [P, T, H, D], keys/values [P, S, K, D], mask [P, T, S] (True: the query
    may attend the key) -> [P, T, H*D] in values' dtype. ``softcap`` > 0 soft-caps the scores
    (``softcap * tanh(scores / softcap)``, Gemma 2). Differentiable in q, keys and values (module doc)."""
    return _attention(q, keys, values, mask, float(scale), float(softcap))
