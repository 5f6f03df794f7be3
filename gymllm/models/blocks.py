"""The transformer's shared building blocks over flat params: what :func:`gymllm.models.transformer.forward`,
:func:`gymllm.models.decode.decode_forward`, :func:`gymllm.models.prefill.prefill_forward` and
:func:`gymllm.models.mixed.mixed_forward` all run, so every path computes a layer the same way.

* the layer scan's inputs: :func:`layer_xs` (weight stacks [L, ...], RoPE inverse frequencies [L, D/2],
  attention windows [L], layer index [L]) from :func:`layer_tables`;
* one layer: :func:`qkv` (norm, projections, biases, qk-norm, RoPE) before attention and
  :func:`layer_rest` (output projection, post norms, residuals, gated MLP) after it;
* LoRA adapters served per row (multi-LoRA serving, as vLLM/punica and S-LoRA): the flat params may
  carry stacks ``layers.<t>.lora_a`` [L, N, in, r] and ``layers.<t>.lora_b`` [L, N, r, out] (the
  ``alpha / r`` scale folded into B) for projections ``t``; with a per-row one-hot ``mix`` [..., N]
  (:func:`adapter_mix`) a targeted projection is ``x @ W + (x @ A_k) @ B_k`` for the row's adapter k
  (:func:`project`: the delta of every adapter computed, then masked per row, no gather), so rows of
  different adapters share one step; ``mix`` None is the plain path, unchanged;
* the ends: :func:`embed_tokens` (Gemma's embedding scale) and :func:`final_logits` (final norm, vocab
  projection in float32, final softcap);
* weight and cache storage: :func:`global_params` / :func:`layer_weights` decode and cast the weights
  (non-layer weights once, layer weights per layer inside the scan); :func:`pack_bf16` stores bf16
  weights as uint16 bit patterns (fast to slice on XLA:CPU), :func:`unpack` decodes them and
  :func:`pack_like` encodes new k/v in a cache's storage dtype.

Pure JAX functions of (config, arrays), built from :mod:`gymllm.models.layers`. Shapes: B rows, T tokens,
E hidden, H query heads, K kv heads, D head dim, L layers.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from gymllm.models.config import ModelConfig
from gymllm.models.layers import apply_rope, dense, gated_mlp, rms_norm, rope_inv_freq

GLOBAL_WINDOW = 1 << 30  # the window of a global-attention layer: every earlier position


def layer_tables(cfg: ModelConfig) -> tuple[np.ndarray, np.ndarray]:
    """Per-layer RoPE inverse frequencies [L, D/2] and attention windows [L]."""
    d = cfg.resolved_head_dim
    glob = rope_inv_freq(d, cfg.rope_theta, cfg.rope_scaling_dict)
    local = (
        rope_inv_freq(d, cfg.rope_local_theta or cfg.rope_theta, {})
        if cfg.rope_local_theta
        else glob
    )
    types = cfg.resolved_layer_types
    inv = np.stack([local if t == "sliding_attention" else glob for t in types])
    win = np.array(
        [cfg.sliding_window if t == "sliding_attention" else GLOBAL_WINDOW for t in types], np.int32
    )
    return inv, win


def pack_bf16(params: dict[str, Any]) -> dict[str, jax.Array]:
    """Floating weights as bfloat16 bit patterns in uint16 arrays (what the forwards decode per layer):
    the fast storage for a bf16 inference copy on CPU (see :func:`gymllm.models.transformer.forward`)."""
    return {
        n: jax.lax.bitcast_convert_type(jnp.asarray(v).astype(jnp.bfloat16), jnp.uint16)
        if jnp.issubdtype(jnp.asarray(v).dtype, jnp.floating)
        else v
        for n, v in params.items()
    }


def unpack(v: jax.Array) -> jax.Array:
    """uint16 storage (bfloat16 bit patterns) decoded to bfloat16; any other dtype unchanged."""
    return jax.lax.bitcast_convert_type(v, jnp.bfloat16) if v.dtype == jnp.uint16 else v


def pack_like(x: jax.Array, store: jax.Array) -> jax.Array:
    """``x`` in ``store``'s dtype; uint16 storage holds bfloat16 bit patterns (a packed bf16 KV cache)."""
    if store.dtype == jnp.uint16:
        return jax.lax.bitcast_convert_type(x.astype(jnp.bfloat16), jnp.uint16)
    return x.astype(store.dtype)


def global_params(params: dict[str, jax.Array], compute_dtype: Any) -> dict[str, jax.Array]:
    """Non-layer weights decoded (uint16 -> bf16) and cast to ``compute_dtype``; layer stacks untouched."""
    params = {n: unpack(v) if not n.startswith("layers.") else v for n, v in params.items()}
    if compute_dtype is not None:
        params = {
            n: v if n.startswith("layers.") else v.astype(compute_dtype) for n, v in params.items()
        }
    return params


def layer_weights(lw: dict[str, jax.Array], compute_dtype: Any) -> dict[str, jax.Array]:
    """One layer's weights (sliced from the stacks inside the scan), decoded and cast."""
    return {
        n: unpack(v) if compute_dtype is None else unpack(v).astype(compute_dtype)
        for n, v in lw.items()
    }


def embed_tokens(cfg: ModelConfig, params: dict[str, jax.Array], tokens: jax.Array) -> jax.Array:
    """Token ids [...] -> embeddings [..., E] (scaled by sqrt(E) where the family does, as Gemma)."""
    x = params["embed"][tokens]  # [..., E]
    if cfg.embed_scale:
        x = x * jnp.asarray(math.sqrt(cfg.hidden_size), x.dtype)
    return x


def adapter_mix(params: dict[str, jax.Array], adapter: jax.Array | None) -> jax.Array | None:
    """Each row's adapter as a float32 one-hot [rows, N] over the params' adapter stacks (N from any
    ``layers.<t>.lora_a`` [L, N, in, r]); None when ``adapter`` is None or the params carry no stack."""
    n = next((v.shape[1] for k, v in params.items() if k.endswith(".lora_a")), None)
    if adapter is None or n is None:
        return None
    return jax.nn.one_hot(adapter, n, dtype=jnp.float32)


def project(lw: dict[str, jax.Array], name: str, x: jax.Array, mix: jax.Array | None) -> jax.Array:
    """``x @ lw[name]``, plus each row's LoRA delta ``(x @ A_k) @ B_k`` when ``mix`` (one-hot [..., N],
    broadcasting against x [..., in]'s leading dims) is given and ``name`` carries adapter stacks
    (``lw[name + ".lora_a"]`` [N, in, r], ``lw[name + ".lora_b"]`` [N, r, out], scale folded in B)."""
    out = dense(x, lw[name])
    if mix is None or f"{name}.lora_a" not in lw:
        return out
    xa = jnp.einsum("...i,nir->...nr", x, lw[f"{name}.lora_a"])  # every adapter's [.., N, r]
    xa = xa * mix.astype(xa.dtype)[..., None]  # only the row's own adapter survives
    return out + jnp.einsum("...nr,nro->...o", xa, lw[f"{name}.lora_b"]).astype(out.dtype)


def qkv(
    cfg: ModelConfig,
    lw: dict[str, jax.Array],
    x: jax.Array,
    positions: jax.Array,
    inv_l: jax.Array,
    mix: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """x [B, T, E] -> roped q [B, T, H, D], roped k [B, T, K, D], v [B, T, K, D] (biases, qk-norm);
    ``mix``: each row's adapter one-hot (:func:`project`), None for the base weights alone."""
    b, t = x.shape[:2]
    h, k, d = cfg.num_heads, cfg.num_kv_heads, cfg.resolved_head_dim
    hdn = rms_norm(x, lw["attn_norm"], cfg.rms_norm_eps, cfg.norm_plus_one)
    q, kk, vv = (project(lw, n, hdn, mix) for n in ("wq", "wk", "wv"))  # [B, T, H*D], [B, T, K*D]
    if cfg.attention_bias:
        q, kk, vv = q + lw["bq"], kk + lw["bk"], vv + lw["bv"]
    q, kk, vv = q.reshape(b, t, h, d), kk.reshape(b, t, k, d), vv.reshape(b, t, k, d)
    if cfg.qk_norm:
        q = rms_norm(q, lw["q_norm"], cfg.rms_norm_eps, cfg.norm_plus_one)
        kk = rms_norm(kk, lw["k_norm"], cfg.rms_norm_eps, cfg.norm_plus_one)
    return apply_rope(q, positions, inv_l), apply_rope(kk, positions, inv_l), vv


def layer_rest(
    cfg: ModelConfig,
    lw: dict[str, jax.Array],
    x: jax.Array,
    attn: jax.Array,
    mix: jax.Array | None = None,
) -> jax.Array:
    """The layer after attention: output projection, post norms, residuals, MLP. attn [B, T, H*D];
    ``mix``: each row's adapter one-hot (:func:`project`), None for the base weights alone."""
    eps, plus_one = cfg.rms_norm_eps, cfg.norm_plus_one
    out = project(lw, "wo", attn, mix)
    if cfg.post_norms:
        out = rms_norm(out, lw["post_attn_norm"], eps, plus_one)
    x = x + out
    hdn = rms_norm(x, lw["mlp_norm"], eps, plus_one)
    if mix is None:
        out = gated_mlp(hdn, lw["w_gate"], lw["w_up"], lw["w_down"], cfg.activation)
    else:  # gated_mlp's math with each projection adapted
        gate = project(lw, "w_gate", hdn, mix)
        act = jax.nn.silu(gate) if cfg.activation == "silu" else jax.nn.gelu(gate, approximate=True)
        out = project(lw, "w_down", act * project(lw, "w_up", hdn, mix), mix)
    if cfg.post_norms:
        out = rms_norm(out, lw["post_mlp_norm"], eps, plus_one)
    return x + out


def final_logits(cfg: ModelConfig, params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    """Final norm and vocab projection (float32, final softcap). x [..., E] -> [..., V]."""
    x = rms_norm(x, params["final_norm"], cfg.rms_norm_eps, cfg.norm_plus_one)
    if "lm_head" in params:
        logits = dense(x, params["lm_head"], f32_out=True)
    else:
        logits = dense(x, params["embed"], transposed=True, f32_out=True)
    if cfg.final_logit_softcap:
        logits = cfg.final_logit_softcap * jnp.tanh(logits / cfg.final_logit_softcap)
    return logits


UNROLL_MAX_LAYERS = 4  # models this shallow run their layer loop unrolled


def layer_unroll(cfg: ModelConfig) -> int:
    """The layer scan's ``unroll``: every layer for a model of at most :data:`UNROLL_MAX_LAYERS` layers,
    else 1 (one compiled body, fast compiles). XLA:CPU runs a scan's backward with a copy of the carried
    and stacked arrays per iteration; for a 2-layer model that costs as much as the layers' math
    (measured: fwd+bwd of a 2-layer d64 model over 16 x 80 tokens, 65 -> 33 ms unrolled); for deep
    models it is a small share of the step and unrolling would multiply the compile time by the depth."""
    return cfg.num_layers if cfg.num_layers <= UNROLL_MAX_LAYERS else 1


def embed_inputs(
    cfg: ModelConfig,
    params: dict[str, jax.Array],
    tokens: jax.Array,
    adapter: jax.Array | None,
    compute_dtype: Any,
) -> tuple[dict[str, jax.Array], jax.Array, jax.Array | None]:
    """What every cached forward starts from: (the params with their non-layer weights decoded and
    cast (:func:`global_params`), the embeddings of ``tokens`` [..., E] (:func:`embed_tokens`), each
    row's adapter one-hot (:func:`adapter_mix`, None without adapters))."""
    mix = adapter_mix(params, adapter)
    params = global_params(params, compute_dtype)
    return params, embed_tokens(cfg, params, tokens), mix


def scan_layers(
    cfg: ModelConfig,
    params: dict[str, jax.Array],
    x: jax.Array,
    positions: jax.Array,
    attend: Any,
    *,
    mix: jax.Array | None = None,
    compute_dtype: Any = None,
) -> tuple[jax.Array, Any]:
    """Every layer over ``x`` [B, T, E] in one ``jax.lax.scan`` (:func:`layer_unroll`): the layer's
    weights decoded and cast (:func:`layer_weights`), :func:`qkv` at ``positions``, the caller's
    attention ``attend(q, k, v, window, layer_index) -> (attn [B, T, H*D], out)`` and
    :func:`layer_rest`. Returns the last layer's output and every layer's ``out`` stacked ([L, ...]:
    e.g. the new k/v). ``params`` as :func:`global_params` returns them."""

    def layer(x, xs):
        lw, inv_l, win_l, i = xs
        lw = layer_weights(lw, compute_dtype)
        attn, out = attend(*qkv(cfg, lw, x, positions, inv_l, mix), win_l, i)
        return layer_rest(cfg, lw, x, attn, mix), out

    return jax.lax.scan(layer, x, layer_xs(cfg, params), unroll=layer_unroll(cfg))


def layer_xs(cfg: ModelConfig, params: dict[str, jax.Array]) -> tuple:
    """The scan's per-layer inputs: (layer weight stacks, inv_freq [L, D/2], windows [L], index [L])."""
    inv_freq, windows = layer_tables(cfg)
    layer_params = {n.split(".", 1)[1]: v for n, v in params.items() if n.startswith("layers.")}
    return layer_params, jnp.asarray(inv_freq), jnp.asarray(windows), jnp.arange(cfg.num_layers)
