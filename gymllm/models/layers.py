"""Pure building blocks of the transformer: RMSNorm, RoPE, one-token decode attention, gated MLP (the
whole-sequence attention is :mod:`gymllm.models.attention`).

All functions are pure JAX (no module state), so they compose under ``jit``/``scan``/``grad``.
Shapes: B batch, T query tokens, S key tokens (T, or the cache length), H query heads,
K kv heads, G = H // K, D head dim, E hidden size, F MLP size.
Normalisation statistics, attention scores and softmax are float32 whatever the weight dtype.

Low-precision (bf16/f16) activations go through :func:`dense`: every matmul accumulates in float32
(``preferred_element_type``) and its backward multiplies in the same low precision. Besides being the
usual mixed-precision recipe, this is what makes bf16 fast on CPUs with AMX: XLA:CPU upcasts a
bf16 x bf16 -> bf16 dot (or a mixed f32 x bf16 one) to float32, but runs bf16 x bf16 -> f32 natively
(measured here: ~3.5x a float32 matmul at >= 64 rows).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

NEG_INF = -1e30  # the score of a masked key (finite: a fully masked row stays NaN-free)


def rms_norm(x: jax.Array, w: jax.Array, eps: float, plus_one: bool) -> jax.Array:
    """RMSNorm over the last axis; Gemma scales by ``1 + w``, the others by ``w`` (HF semantics)."""
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    if plus_one:
        return (xf * (1.0 + w.astype(jnp.float32))).astype(x.dtype)
    return w.astype(x.dtype) * xf.astype(x.dtype)


def _is_low_precision(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.floating) and jnp.dtype(dtype).itemsize < 4


def _acc_dot(a: jax.Array, b: jax.Array, dims) -> jax.Array:
    """dot_general with float32 accumulation and output."""
    return jax.lax.dot_general(a, b, (dims, ((), ())), preferred_element_type=jnp.float32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _mixed_matmul(x: jax.Array, w: jax.Array, w_transposed: bool, f32_out: bool) -> jax.Array:
    """x [..., E] @ w [E, F] (or w [F, E] transposed) with f32 accumulation, both operands low precision.
    Output [..., F]: float32 when ``f32_out``, else x's dtype."""
    out = _acc_dot(x, w, ((x.ndim - 1,), (1 if w_transposed else 0,)))
    return out if f32_out else out.astype(x.dtype)


def _mixed_matmul_fwd(x, w, w_transposed, f32_out):
    return _mixed_matmul(x, w, w_transposed, f32_out), (x, w)


def _mixed_matmul_bwd(w_transposed, f32_out, res, g):
    x, w = res
    g = g.astype(x.dtype)  # the cotangent in low precision too: the backward dots stay native
    dx = _acc_dot(g, w, ((g.ndim - 1,), (0 if w_transposed else 1,))).astype(x.dtype)  # [..., E]
    x2, g2 = x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1])  # [N, E], [N, F]
    dw = _acc_dot(g2, x2, ((0,), (0,))) if w_transposed else _acc_dot(x2, g2, ((0,), (0,)))
    return dx, dw.astype(w.dtype)


_mixed_matmul.defvjp(_mixed_matmul_fwd, _mixed_matmul_bwd)


def dense(
    x: jax.Array, w: jax.Array, *, transposed: bool = False, f32_out: bool = False
) -> jax.Array:
    """x [..., E] @ w [E, F] (``transposed``: w [F, E]) -> [..., F] in x's dtype (float32 if ``f32_out``).
    Float32 inputs take the plain path; low-precision inputs the f32-accumulating one (module doc)."""
    if _is_low_precision(x.dtype) and x.dtype == w.dtype:
        return _mixed_matmul(x, w, transposed, f32_out)
    if not transposed and not f32_out:
        return x @ w
    out = jnp.einsum(
        "...e,fe->...f" if transposed else "...e,ef->...f", x, w, preferred_element_type=jnp.float32
    )
    return out if f32_out else out.astype(x.dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict) -> np.ndarray:
    """RoPE inverse frequencies [D/2] (float32) with Hugging Face's ``linear`` / ``llama3`` scaling."""
    inv = 1.0 / (
        np.float32(theta) ** (np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim))
    )
    kind = scaling.get("rope_type", "default")
    if kind == "linear":
        inv = inv / np.float32(scaling["factor"])
    elif kind == "llama3":
        factor, lo, hi = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > old / lo, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / hi) & ~(wavelen > old / lo)
        inv = np.where(medium, smoothed, scaled)
    return inv.astype(np.float32)


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: jax.Array) -> jax.Array:
    """Rotate-half RoPE. x [B, T, N, D], positions [B, T], inv_freq [D/2] -> [B, T, N, D]."""
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, D/2]
    emb = jnp.concatenate([freqs, freqs], axis=-1)[:, :, None, :]  # [B, T, 1, D]
    cos, sin = jnp.cos(emb).astype(x.dtype), jnp.sin(emb).astype(x.dtype)
    x1, x2 = jnp.split(x, 2, axis=-1)
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    return x * cos + rotated * sin


#: the forms of the decode attention's products (``EngineConfig.decode_attention``)
DECODE_ATTENTIONS = ("auto", "dots", "elementwise")


def decode_attention(
    q: jax.Array,
    keys: jax.Array,
    values: jax.Array,
    k_self: jax.Array,
    v_self: jax.Array,
    visible: jax.Array,
    *,
    scale: float,
    softcap: float = 0.0,
    recent: tuple[jax.Array, jax.Array, jax.Array] | None = None,
    form: str = "auto",
) -> jax.Array:
    """One query token per row over its cached keys plus itself (one joint softmax).

    q [W, H, D]; keys/values [W, S, K, D] (cached slots; any float dtype); k_self/v_self [W, K, D] (the
    token's own); visible [W, S] (cached slots it may attend) -> [W, H*D] in q's dtype. ``recent``:
    optional (keys [W, R, K, D], values, visible [W, R]), a second block of slots joining the same
    softmax (a decode chunk's own tokens, :class:`gymllm.models.cache.RecentKV`). ``form``
    (:data:`DECODE_ATTENTIONS`): ``"dots"``, ``"elementwise"`` or ``"auto"``, which picks as follows.
    Batched dots in
    q's dtype with float32 accumulation, as :func:`gymllm.models.attention.attention` computes; for float32 q with small heads
    (D < 32) or fewer than 8 rows an elementwise multiply-and-reduce instead. Measured on XLA:CPU over
    30 layers: at D = 64, G = 3 (SmolLM2) the dot is 2-2.4x faster at 8-32 rows (32 rows x 96 slots:
    49 vs 93 ms) and slower at one row (the whole SmolLM2 step: 75-85 vs 59-62 ms); at D = 16, G = 2
    (the tiny test model) the elementwise form is up to 1.2x faster (128 rows). On a TPU v5e
    (SmolLM2's shape, 256 rows, bf16 cache, ``benchmarks/chip_profile.py --parts forms``) the
    elementwise attention alone is 1.4-1.8x faster at windows that are not a multiple of 128 slots
    (96, 160, 200) and 1.9-4.7x slower at those that are (128 to 1024); in the engine's decode at 160
    slots it was slower still (15.2k against 21.6k tokens/s at 64 rows), so ``"auto"`` keeps the dots
    there."""
    w, h, d = q.shape
    kh = keys.shape[2]
    qg = q.reshape(w, kh, h // kh, d)  # [W, K, G, D]
    if form not in DECODE_ATTENTIONS:
        raise ValueError(
            f"decode attention: expected one of {DECODE_ATTENTIONS}, received {form!r}"
        )
    if form == "auto":
        dots = _is_low_precision(q.dtype) or (d >= 32 and w >= 8)  # batched dots, else elementwise
    else:
        dots = form == "dots"

    def capped(x):
        x = x * scale
        return softcap * jnp.tanh(x / softcap) if softcap else x

    def block_scores(kk, vis):  # kk [W, S, K, D], vis [W, S] -> [W, K, G, S]
        if dots:
            sc = jnp.einsum(
                "wkgd,wskd->wkgs", qg, kk.astype(q.dtype), preferred_element_type=jnp.float32
            )
        else:
            qf = qg.astype(jnp.float32)
            sc = (qf[:, :, :, None] * jnp.swapaxes(kk, 1, 2).astype(jnp.float32)[:, :, None]).sum(
                -1
            )
        return jnp.where(vis[:, None, None, :], capped(sc), NEG_INF)

    def block_out(p, vv):  # p [W, K, G, S], vv [W, S, K, D] -> [W, K, G, D] float32
        if dots:
            return jnp.einsum(
                "wkgs,wskd->wkgd",
                p.astype(q.dtype),
                vv.astype(q.dtype),
                preferred_element_type=jnp.float32,
            )
        return (p[..., None] * jnp.swapaxes(vv, 1, 2).astype(jnp.float32)[:, :, None]).sum(-2)

    if dots:
        own = jnp.einsum(
            "wkgd,wkd->wkg", qg, k_self.astype(q.dtype), preferred_element_type=jnp.float32
        )
    else:
        own = (qg.astype(jnp.float32) * k_self.astype(jnp.float32)[:, :, None]).sum(-1)  # [W,K,G]
    own = capped(own)
    blocks = [(block_scores(keys, visible), values)]
    if recent is not None:
        blocks.append((block_scores(recent[0], recent[2]), recent[1]))
    top = own
    for sc, _ in blocks:
        top = jnp.maximum(sc.max(-1), top)  # [W, K, G]
    probs = [jnp.exp(sc - top[..., None]) for sc, _ in blocks]
    p_own = jnp.exp(own - top)
    total = probs[0].sum(-1) + p_own
    for p in probs[1:]:
        total = total + p.sum(-1)
    out = p_own[..., None] / total[..., None] * v_self.astype(jnp.float32)[:, :, None]
    for p, (_, vv) in zip(probs, blocks):
        out = block_out(p / total[..., None], vv) + out
    return out.astype(q.dtype).reshape(w, h * d)


def causal_mask(
    positions: jax.Array, segment_ids: jax.Array | None, window: jax.Array
) -> jax.Array:
    """Full-forward mask [B, T, T]: key index <= query index, same segment, inside the window."""
    t = positions.shape[1]
    idx = jnp.arange(t)
    mask = (idx[None, :] <= idx[:, None])[None]  # [1, T, T]
    if segment_ids is not None:
        mask = mask & (segment_ids[:, :, None] == segment_ids[:, None, :])
    dist = positions[:, :, None] - positions[:, None, :]  # [B, T, T]
    return mask & (dist < window)


def cache_mask(positions: jax.Array, cache_len: int, window: jax.Array) -> jax.Array:
    """Cached-forward mask [B, T, S]: cache index <= query position and > position - window."""
    idx = jnp.arange(cache_len)[None, None, :]
    pos = positions[:, :, None]
    return (idx <= pos) & (pos - idx < window)


def gated_mlp(
    x: jax.Array, w_gate: jax.Array, w_up: jax.Array, w_down: jax.Array, activation: str
) -> jax.Array:
    """act(x @ w_gate) * (x @ w_up) @ w_down. x [B, T, E], w_gate/w_up [E, F], w_down [F, E]."""
    gate = dense(x, w_gate)  # [B, T, F]
    act = jax.nn.silu(gate) if activation == "silu" else jax.nn.gelu(gate, approximate=True)
    return dense(act * dense(x, w_up), w_down)
