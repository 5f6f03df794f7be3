"""The decoder-only transformer in Flax NNX, one code path for every family in ``ModelConfig``.

Per-layer weights are stacked on a leading layer axis ([L, ...]) and the forward runs the layers
with ``jax.lax.scan``: one compiled layer body whatever the depth (fast compiles, same speed).
Matrices are stored ``[in, out]`` (``x @ w``); loaders transpose Hugging Face's ``[out, in]``.

``model(tokens [B, T], positions [B, T], *, segment_ids=None, cache=None)`` returns
``(logits [B, T, V] float32, new_cache_or_None)``:

* without a cache, token t attends to tokens t' <= t (by index) of the same segment
  (``segment_ids`` [B, T], for packed rows) within the sliding window (by position);
* with a cache (``model.init_cache``) the k/v of each token are written at slot == its position
  (positions >= the cache length are dropped) and a query at position p attends to slots
  ``p - window < s <= p``. Right padding with increasing positions is therefore safe.

The call is jitted internally (static config), so eager calls are fast after the first; calling
it inside your own ``jit`` (e.g. after ``nnx.merge``) simply inlines it.

This module owns the parameters (shapes, init, the NNX module) and the generic forward; the pieces
of a layer it shares with the engine's decode / prefill / mixed forwards are in
:mod:`gymllm.models.blocks` (``pack_bf16`` is re-exported here).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from gymllm.models.cache import KVCache, init_cache
from gymllm.models.config import ModelConfig
from gymllm.models.blocks import (
    embed_tokens,
    final_logits,
    global_params,
    layer_rest,
    layer_weights,
    layer_unroll,
    layer_xs,
    pack_like,
    qkv,
    unpack,
)
from gymllm.models.attention import attention
from gymllm.models.layers import cache_mask, causal_mask

__all__ = [
    "Blocks",
    "Transformer",
    "forward",
    "hidden_states",
    "init_params",
    "lm_logits",
    "param_shapes",
]


def param_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter's shape, keyed by its path (``"layers.wq"``, ``"embed"``...)."""
    e, f, n_layers, v = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers, cfg.vocab_size
    d, h, k = cfg.resolved_head_dim, cfg.num_heads, cfg.num_kv_heads
    shapes: dict[str, tuple[int, ...]] = {"embed": (v, e), "final_norm": (e,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head"] = (e, v)
    layer = {
        "attn_norm": (e,),
        "wq": (e, h * d),
        "wk": (e, k * d),
        "wv": (e, k * d),
        "wo": (h * d, e),
        "mlp_norm": (e,),
        "w_gate": (e, f),
        "w_up": (e, f),
        "w_down": (f, e),
    }
    if cfg.attention_bias:
        layer.update(bq=(h * d,), bk=(k * d,), bv=(k * d,))
    if cfg.qk_norm:
        layer.update(q_norm=(d,), k_norm=(d,))
    if cfg.post_norms:
        layer.update(post_attn_norm=(e,), post_mlp_norm=(e,))
    shapes.update({f"layers.{n}": (n_layers, *s) for n, s in layer.items()})
    return shapes


def _is_norm(name: str) -> bool:
    return name.endswith("norm")


def init_params(
    cfg: ModelConfig,
    seed: int | jax.Array = 0,
    dtype=jnp.float32,
    *,
    std: float = 0.02,
    norm_noise: float = 0.0,
) -> dict[str, jax.Array]:
    """Random parameters: normal(0, std) matrices, norms at identity (+ ``norm_noise``), biases zero
    (or normal(0, std) when ``norm_noise`` > 0). Drawn with a per-call NumPy generator (fast: no
    per-shape compilation); ``seed`` may be an int or a JAX key."""
    if not isinstance(seed, int):
        seed = int(jax.random.bits(seed, dtype=jnp.uint32))
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in sorted(param_shapes(cfg).items()):
        if _is_norm(name):
            value = (0.0 if cfg.norm_plus_one else 1.0) + norm_noise * rng.standard_normal(shape)
        elif name.startswith("layers.b") and not norm_noise:
            value = np.zeros(shape)
        else:
            value = std * rng.standard_normal(shape)
        out[name] = jnp.asarray(value.astype(np.float32), dtype=dtype)
    return out


class Blocks(nnx.Module):
    """All decoder layers' weights, stacked on a leading [L] axis."""

    def __init__(self, params: dict[str, jax.Array]):
        for name, value in params.items():
            setattr(self, name, nnx.Param(value))

    def arrays(self) -> dict[str, jax.Array]:
        return {n: v[...] for n, v in vars(self).items() if isinstance(v, nnx.Param)}


class Transformer(nnx.Module):
    """A decoder-only LM. Build random with ``Transformer(cfg, rngs=nnx.Rngs(0))`` or from weights
    with :meth:`from_params`."""

    def __init__(
        self,
        config: ModelConfig,
        *,
        rngs: nnx.Rngs | None = None,
        dtype=jnp.float32,
        params: dict[str, jax.Array] | None = None,
    ):
        self.config = config
        if params is None:
            key = rngs.params() if rngs is not None else jax.random.key(0)
            params = init_params(config, key, dtype)
        _check_params(config, params)
        self.embed = nnx.Param(params["embed"])
        self.final_norm = nnx.Param(params["final_norm"])
        self.lm_head = nnx.Param(params["lm_head"]) if "lm_head" in params else None
        self.layers = Blocks(
            {n.split(".", 1)[1]: v for n, v in params.items() if n.startswith("layers.")}
        )

    @classmethod
    def from_params(cls, config: ModelConfig, params: dict[str, Any], dtype=None) -> "Transformer":
        """Wrap flat ``{"layers.wq": array, ...}`` weights (cast to ``dtype`` when given)."""
        cast = {n: jnp.asarray(v, dtype=dtype) for n, v in params.items()}
        return cls(config, params=cast)

    # ----- accessors -----
    @property
    def dtype(self):
        return self.embed[...].dtype

    def flat_params(self) -> dict[str, jax.Array]:
        """Flat ``{"layers.wq": array, ...}`` view of the weights (the loaders' and writers' format)."""
        out = {"embed": self.embed[...], "final_norm": self.final_norm[...]}
        if self.lm_head is not None:
            out["lm_head"] = self.lm_head[...]
        out.update({f"layers.{n}": v for n, v in self.layers.arrays().items()})
        return out

    def init_cache(self, batch: int, max_len: int, dtype=None) -> KVCache:
        """A zeroed [L, batch, max_len, K, D] cache. Default dtype: the weights' dtype, except on
        CPU where it is float32 (XLA's CPU scatter/slice of bf16 caches made decode ~1.7x slower;
        ``jnp.uint16`` stores bf16 bit patterns at memory speed, see :mod:`gymllm.models.cache`)."""
        cfg = self.config
        if dtype is None:
            dtype = jnp.float32 if jax.default_backend() == "cpu" else self.dtype
        return init_cache(
            cfg.num_layers, batch, max_len, cfg.num_kv_heads, cfg.resolved_head_dim, dtype
        )

    # ----- forward -----
    def __call__(
        self,
        tokens: jax.Array,
        positions: jax.Array,
        *,
        segment_ids: jax.Array | None = None,
        cache: KVCache | None = None,
        logits_at: jax.Array | None = None,
    ) -> tuple[jax.Array, KVCache | None]:
        """Logits [B, T, V] float32 (or [B, 1, V] at index ``logits_at`` [B] of each row: a
        prefill that needs only the last token's logits skips the other T - 1 vocab projections)."""
        return forward(
            self.config,
            self.flat_params(),
            jnp.asarray(tokens, jnp.int32),
            jnp.asarray(positions, jnp.int32),
            None if segment_ids is None else jnp.asarray(segment_ids, jnp.int32),
            cache,
            None if logits_at is None else jnp.asarray(logits_at, jnp.int32),
        )


def _check_params(cfg: ModelConfig, params: dict[str, Any]) -> None:
    from gymllm.errors import ModelLoadError, explain

    want = param_shapes(cfg)
    missing, unexpected = sorted(set(want) - set(params)), sorted(set(params) - set(want))
    wrong = sorted(n for n in set(want) & set(params) if tuple(params[n].shape) != want[n])
    if missing or unexpected or wrong:
        got = {
            "missing": missing,
            "unexpected": unexpected,
            "wrong_shape": {n: (tuple(params[n].shape), want[n]) for n in wrong},
        }
        raise ModelLoadError(
            explain(
                "Transformer parameters",
                expected="exactly the tensors of param_shapes(config)",
                received=got,
                fix="check the checkpoint matches the config (family, sizes)",
            )
        )


@functools.partial(jax.jit, static_argnums=0, static_argnames=("compute_dtype",))
def forward(
    cfg: ModelConfig,
    params: dict[str, jax.Array],
    tokens: jax.Array,
    positions: jax.Array,
    segment_ids: jax.Array | None = None,
    cache: KVCache | None = None,
    logits_at: jax.Array | None = None,
    *,
    compute_dtype: Any = None,
) -> tuple[jax.Array, KVCache | None]:
    """Pure forward over flat params (see the module docstring for the masking contract).
    ``logits_at`` [B] int32: return only the logits at that index of each row ([B, 1, V]).
    ``compute_dtype`` (e.g. ``"bfloat16"``): cast the weights to it (mixed precision: float32
    master weights, low-precision compute with float32 accumulation; gradients flow back to the
    masters); None computes in the weights' own dtype. Logits are float32 either way.
    ``uint16`` weights are bfloat16 bit patterns (:func:`pack_bf16`), decoded per layer; a uint16
    cache likewise stores bfloat16 k/v.

    Stacked layer weights are cast (or decoded) inside the layer loop, one layer at a time: XLA:CPU
    slices a bf16 [L, ...] stack per layer at ~1 GB/s, which costs more than bf16 matmuls save,
    while slicing float32 or uint16 stacks runs at memory speed.

    One-token decode steps over a cache have a faster path: :func:`gymllm.models.decode.decode_forward`."""
    params = global_params(params, compute_dtype)
    x, cache = _trunk(cfg, params, tokens, positions, segment_ids, cache, compute_dtype)
    if logits_at is not None:
        x = jnp.take_along_axis(x, logits_at[:, None, None], axis=1)  # [B, 1, E]
    return final_logits(cfg, params, x), cache


@functools.partial(jax.jit, static_argnums=0, static_argnames=("compute_dtype",))
def hidden_states(
    cfg: ModelConfig,
    params: dict[str, jax.Array],
    tokens: jax.Array,
    positions: jax.Array,
    segment_ids: jax.Array | None = None,
    *,
    compute_dtype: Any = None,
) -> jax.Array:
    """The last layer's output [B, T, E] (before the final norm), masked as :func:`forward` without a
    cache: ``forward(...)[0] == lm_logits(cfg, params, hidden_states(...))``. With :func:`lm_logits` it
    lets a caller run the vocab projection (and its log-softmax) only on the positions it needs, e.g.
    the learner on the positions that carry a loss (``LearnerConfig.loss_positions_only``)."""
    return _trunk(
        cfg,
        global_params(params, compute_dtype),
        tokens,
        positions,
        segment_ids,
        None,
        compute_dtype,
    )[0]


def lm_logits(
    cfg: ModelConfig, params: dict[str, jax.Array], x: jax.Array, *, compute_dtype: Any = None
) -> jax.Array:
    """Final norm + vocab projection (+ final softcap) of hidden states ``x`` [..., E] from
    :func:`hidden_states`: float32 logits [..., V], as :func:`forward` computes them."""
    head = {n: params[n] for n in ("embed", "final_norm", "lm_head") if n in params}
    return final_logits(cfg, global_params(head, compute_dtype), x)


def _trunk(
    cfg: ModelConfig,
    params: dict[str, jax.Array],
    tokens: jax.Array,
    positions: jax.Array,
    segment_ids: jax.Array | None,
    cache: KVCache | None,
    compute_dtype: Any,
) -> tuple[jax.Array, KVCache | None]:
    """Embedding and every layer (params already through ``global_params``): hidden [B, T, E], cache."""
    b = tokens.shape[0]
    x = embed_tokens(cfg, params, tokens)  # [B, T, E]
    rows = jnp.arange(b)[:, None]  # [B, 1]

    def layer(carry, xs):
        x, kc, vc = carry
        lw, inv_l, win_l, i = xs
        lw = layer_weights(lw, compute_dtype)
        q, kk, vv = qkv(cfg, lw, x, positions, inv_l)
        if kc is None:
            mask = causal_mask(positions, segment_ids, win_l)  # [B, T, T]
            keys, values = kk, vv
        else:
            kc = kc.at[i, rows, positions].set(pack_like(kk, kc), mode="drop")  # [L, B, S, K, D]
            vc = vc.at[i, rows, positions].set(pack_like(vv, vc), mode="drop")
            keys, values = (
                unpack(kc[i]).astype(q.dtype),
                unpack(vc[i]).astype(q.dtype),
            )  # [B, S, K, D]
            mask = cache_mask(positions, kc.shape[2], win_l)  # [B, T, S]
        attn = attention(
            q, keys, values, mask, scale=cfg.attn_scale, softcap=cfg.attn_logit_softcap
        )
        return (layer_rest(cfg, lw, x, attn), kc, vc), None

    kc, vc = (None, None) if cache is None else (cache.k, cache.v)
    (x, kc, vc), _ = jax.lax.scan(
        layer, (x, kc, vc), layer_xs(cfg, params), unroll=layer_unroll(cfg)
    )
    return x, (None if cache is None else KVCache(kc, vc))
