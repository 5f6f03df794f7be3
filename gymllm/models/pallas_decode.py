"""Decode attention over the KV cache as one Pallas TPU kernel: each row reads only its own slots.

XLA's form of the decode attention (:func:`gymllm.models.layers.decode_attention`) reads every row's
whole static window ``[0, length)`` and, on a TPU v5e, runs its batched matrix-vector products at about
0.3 of the chip's copy bandwidth (docs/tpu.md). :func:`cached_attention` reads the cache in large tiles
instead: a grid over (row blocks, slot blocks) whose slot blocks past a row block's longest row are
neither fetched (the block index is clamped, so the pipeline skips the copy) nor computed, with the
running max and sum of the softmax carried across slot blocks (flash decoding). It returns the
attention over the cached slots alone, normalised, and its log-sum-exp, so that the token's own k/v
and a decode chunk's recent ones join the same softmax outside (:func:`merge_cached`).

The cache stays in the engine's layout ``[L, B, S, K, D]``; the kernel reads it as ``[L, B, K, D, S]``
(slots minor), which is how the TPU runtime lays such a cache out on the chip when ``K x D`` would
pad its tiles (SmolLM2-135M: K = 3, D = 64), so the transpose costs nothing there. The layer is a
scalar argument (the whole cache goes in; no per-layer slice is copied out). On any other backend the
same kernel runs in Pallas's interpreter (slow; for the tests).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

NEG_INF = -1e30
LANES = 128


def slot_block(slots: int, most: int = 512) -> int:
    """The kernel's slot block for a cache of ``slots`` slots a row: the largest of ``most``, 256, 128
    dividing it, else the whole row (a block's minor dimension is a multiple of 128 or the whole)."""
    for b in (most, 256, 128):
        if b <= slots and slots % b == 0:
            return b
    return slots


def row_block(rows: int, most: int = 8) -> int:
    """Rows a kernel program reads: the largest power of two up to ``most`` dividing ``rows``."""
    b = most
    while rows % b:
        b //= 2
    return b


def _precision(dtype) -> jax.lax.Precision:
    """Full precision for float32 products; bf16 ones at the MXU's own (the kernel's compiler refuses
    a float32 contraction of bf16 operands, which a global "highest" default would ask for)."""
    return jax.lax.Precision.HIGHEST if dtype == jnp.float32 else jax.lax.Precision.DEFAULT


def _mxu_block(q, k, v, seen, scale, softcap, m_prev, l_prev, acc):
    """One (row, head) over one slot block by matrix products: q [G, D]; k/v [D, bs]; seen [G, bs];
    m_prev/l_prev [G, 128] (every lane the same); acc [G, D]. Returns (m, l, acc) updated."""
    s = jnp.dot(q, k, preferred_element_type=jnp.float32, precision=_precision(q.dtype)) * scale
    if softcap:
        s = softcap * jnp.tanh(s / softcap)
    s = jnp.where(seen, s, NEG_INF)  # [G, bs]
    m_next = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
    alpha = jnp.exp(m_prev - m_next)
    p = jnp.where(seen, jnp.exp(s - m_next[:, :1]), 0.0)
    l_next = alpha * l_prev + jnp.sum(p, axis=1, keepdims=True)
    pv = jax.lax.dot_general(
        p.astype(v.dtype),
        v,
        (((1,), (1,)), ((), ())),
        preferred_element_type=jnp.float32,
        precision=_precision(v.dtype),
    )  # [G, D]
    return m_next, l_next, acc * alpha[:, :1] + pv


def _kernel(
    layer_ref,
    lens_ref,
    last_ref,
    q_ref,
    k_ref,
    v_ref,
    o_ref,
    m_ref,
    l_ref,
    *,
    scale: float,
    softcap: float,
    rows: int,
    heads: int,
    slots: int,
    form: str,
):
    """A program: ``rows`` rows x one slot block. The outputs' blocks stay put across the slot blocks
    (the running max ``m``, sum ``l`` and unnormalised output ``o``, written back once)."""
    i, j = pl.program_id(0), pl.program_id(1)

    @pl.when(j == 0)
    def _init():
        m_ref[...] = jnp.full(m_ref.shape, NEG_INF, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
        o_ref[...] = jnp.zeros(o_ref.shape, jnp.float32)

    @pl.when(j <= last_ref[i])
    def _compute():
        g = m_ref.shape[2]

        def row(r, carry):
            n = lens_ref[i * rows + r]
            for h in range(heads):
                q = q_ref[r, h]  # the products in q's dtype, as XLA's form
                k = k_ref[r, h].astype(q.dtype)  # [D, bs]
                v = v_ref[r, h].astype(q.dtype)
                if form == "mxu":  # q [G, D], o [G, D]
                    at = j * slots + jax.lax.broadcasted_iota(jnp.int32, (g, slots), 1)
                    m, l_sum, acc = _mxu_block(
                        q, k, v, at < n, scale, softcap, m_ref[r, h], l_ref[r, h], o_ref[r, h]
                    )
                    m_ref[r, h], l_ref[r, h], o_ref[r, h] = m, l_sum, acc
                    continue
                # "vpu": q [D, G], o [D, G]; each query head by multiply-and-reduce in float32
                at = j * slots + jax.lax.broadcasted_iota(jnp.int32, (1, slots), 1)
                seen = at < n
                kf, vf, qf = (x.astype(jnp.float32) for x in (k, v, q))
                for c in range(g):
                    s = jnp.sum(kf * qf[:, c : c + 1], axis=0, keepdims=True) * scale  # [1, bs]
                    if softcap:
                        s = softcap * jnp.tanh(s / softcap)
                    s = jnp.where(seen, s, NEG_INF)
                    m_prev = m_ref[r, h, c : c + 1, :]  # [1, 128]
                    m_next = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
                    alpha = jnp.exp(m_prev - m_next)
                    p = jnp.where(seen, jnp.exp(s - m_next[:, :1]), 0.0)
                    l_ref[r, h, c : c + 1, :] = alpha * l_ref[r, h, c : c + 1, :] + jnp.sum(
                        p, axis=1, keepdims=True
                    )
                    pv = jnp.sum(vf * p, axis=1, keepdims=True)  # [D, 1]
                    o_ref[r, h, :, c : c + 1] = o_ref[r, h, :, c : c + 1] * alpha[:, :1] + pv
                    m_ref[r, h, c : c + 1, :] = m_next
            return carry

        jax.lax.fori_loop(0, rows, row, 0)


FORMS = ("mxu", "vpu")


@functools.partial(
    jax.jit,
    static_argnames=("scale", "softcap", "rows_block", "slots_block", "form", "interpret"),
)
def cached_attention(
    q: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    layer: jax.Array,
    lens: jax.Array,
    *,
    scale: float,
    softcap: float = 0.0,
    rows_block: int | None = None,
    slots_block: int | None = None,
    form: str = "mxu",
    interpret: bool | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Each row's attention over its cached slots ``[0, lens[w])`` of layer ``layer``.

    q [W, K, G, D]; k_cache/v_cache [L, B, S, K, D] (B >= W; rows [0, W) are read); layer int32 [];
    lens [W] int32 (clipped to [0, S]). Returns (out [W, K, G, D] float32, normalised over the cached
    slots; lse [W, K, G] float32, their scores' log-sum-exp, :data:`NEG_INF` for a row with none).
    ``form``: ``"mxu"`` (a (row, head)'s scores and output by matrix products) or ``"vpu"`` (by
    multiply-and-reduce in float32, each query head in turn). ``interpret``: None runs the kernel compiled on a TPU and interpreted elsewhere."""
    w, kh, g, d = q.shape
    _, _, s_max, _, _ = k_cache.shape
    bw = rows_block or row_block(w)
    bs = slots_block or slot_block(s_max)
    if w % bw or s_max % bs:
        raise ValueError(
            f"cached_attention: rows {w} and slots {s_max} must divide by the blocks ({bw}, {bs})"
        )
    if interpret is None:
        interpret = jax.default_backend() != "tpu"
    lens = jnp.clip(lens.astype(jnp.int32), 0, s_max)
    last = (jnp.max(lens.reshape(w // bw, bw), axis=1) - 1) // bs  # -1: the block has no slot
    layer = jnp.asarray(layer, jnp.int32).reshape(1)
    kt = jnp.transpose(k_cache, (0, 1, 3, 4, 2))  # [L, B, K, D, S]
    vt = jnp.transpose(v_cache, (0, 1, 3, 4, 2))

    def kv_map(i, j, layer_ref, lens_ref, last_ref):
        return layer_ref[0], i, 0, 0, jnp.maximum(jnp.minimum(j, last_ref[i]), 0)

    def row_map(i, j, *_):
        return i, 0, 0, 0

    if form not in FORMS:
        raise ValueError(f"cached_attention form: expected one of {FORMS}, received {form!r}")
    kernel = functools.partial(
        _kernel, scale=scale, softcap=softcap, rows=bw, heads=kh, slots=bs, form=form
    )
    qk = q if form == "mxu" else jnp.swapaxes(q, 2, 3)  # "vpu": [W, K, D, G]
    stats = jax.ShapeDtypeStruct((w, kh, g, LANES), jnp.float32)
    acc, m, total = pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=3,
            grid=(w // bw, s_max // bs),
            in_specs=[
                pl.BlockSpec((bw, *qk.shape[1:]), row_map),
                pl.BlockSpec((None, bw, kh, d, bs), kv_map),
                pl.BlockSpec((None, bw, kh, d, bs), kv_map),
            ],
            out_specs=[
                pl.BlockSpec((bw, *qk.shape[1:]), row_map),
                pl.BlockSpec((bw, kh, g, LANES), row_map),
                pl.BlockSpec((bw, kh, g, LANES), row_map),
            ],
        ),
        out_shape=[jax.ShapeDtypeStruct(qk.shape, jnp.float32), stats, stats],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        interpret=interpret,
    )(layer, lens, last, qk, kt, vt)
    if form == "vpu":
        acc = jnp.swapaxes(acc, 2, 3)
    m, total = m[..., 0], total[..., 0]
    empty = total == 0.0
    safe = jnp.where(empty, 1.0, total)
    lse = jnp.where(empty, NEG_INF, m + jnp.log(safe))
    return acc / safe[..., None], lse
