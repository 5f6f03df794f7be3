"""The shared-prefix forward: Gp prompts run once each, S continuations per prompt attend to its keys.

In GRPO the G samples of a group share one prompt. The flat forward runs every row (prompt +
continuation) whole, so a group pays for its prompt G times. Here each prompt runs once:

    h_prefix [Gp, Tp, E], h_suffix [Gp, S, Ts, E] = shared_prefix_hidden(cfg, params, prefix_tokens [Gp, Tp],
                                                                         prefix_lens [Gp], suffix_tokens [Gp, S, Ts])

* prompt ``g`` (right-padded to Tp, ``prefix_lens[g]`` real tokens) sits at positions 0..Tp-1 and attends
  causally to itself, exactly as the first ``prefix_lens[g]`` tokens of a flat row;
* its S continuations (right-padded to Ts) sit at positions ``prefix_lens[g] + 0..Ts-1`` (RoPE positions
  equal the flat row's) and attend to the prompt's real keys (``< prefix_lens[g]``) and causally to their
  own, inside each layer's sliding window (by position), with one joint softmax over both.

So the hidden state of every real token equals the flat forward's on the concatenated row (up to float
summation order), and so do the gradients: the prompt's keys and values are broadcast to the S
continuations and autodiff sums the S cotangents back into the one prompt. Padding tokens (prompt
positions >= ``prefix_lens``, continuation padding) produce values no real token reads.

Every layer goes through :mod:`gymllm.models.blocks` (``qkv`` / ``layer_rest`` on all Gp*Tp + Gp*S*Ts
tokens at once, one matmul per weight) and :func:`gymllm.models.attention.attention` (twice: the
prompts over themselves, the continuations over [prompt keys | own keys]), so every family in
``ModelConfig`` (biases, qk-norm, sliding windows, softcaps, post norms) runs the same layer code as
:func:`gymllm.models.transformer.forward`. The prompt's keys are copied S times per layer for the
continuations' attention (a [Gp*S, Tp, K, D] array: small next to the matmuls it saves).

:func:`shared_prefix_rows_hidden` is the same forward with R continuation rows, each naming its prompt slot
(any number of rows per prompt): the learner's fixed-shape layout
(:func:`gymllm.algos.batching.fixed_prefix_passes`), where a micro-batch's rows fill Gp prompt slots
and R = ``micro_batch_size`` rows whatever its groups look like.

Shapes: Gp prompts, S continuations each, Tp / Ts their padded lengths, E hidden, H / K query / kv heads,
D head dim.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from gymllm.models.attention import attention
from gymllm.models.blocks import embed_tokens, global_params, scan_layers
from gymllm.models.config import ModelConfig
from gymllm.models.layers import causal_mask
from gymllm.models.transformer import lm_logits

__all__ = [
    "shared_prefix_hidden",
    "shared_prefix_logits",
    "shared_prefix_rows_hidden",
    "suffix_mask",
]


def suffix_mask(prefix_lens_rows: jax.Array, tp: int, ts: int, window: jax.Array) -> jax.Array:
    """The continuations' mask [R, Ts, Tp + Ts] (R = Gp*S rows; ``prefix_lens_rows`` [R]): a query at
    continuation index j (position ``len + j``) sees prompt keys ``i < len`` and own keys ``j' <= j``,
    each only within ``window`` positions."""
    lens = prefix_lens_rows[:, None, None]  # [R, 1, 1]
    j = jnp.arange(ts)[None, :, None]  # [1, Ts, 1]
    i = jnp.arange(tp)[None, None, :]  # [1, 1, Tp]
    on_prefix = (i < lens) & (lens + j - i < window)  # [R, Ts, Tp]
    jk = jnp.arange(ts)[None, None, :]
    on_own = (jk <= j) & (j - jk < window)  # [1, Ts, Ts]
    return jnp.concatenate(
        [on_prefix, jnp.broadcast_to(on_own, on_prefix.shape[:2] + (ts,))], axis=-1
    )


@functools.partial(jax.jit, static_argnums=0, static_argnames=("compute_dtype",))
def shared_prefix_hidden(
    cfg: ModelConfig,
    params: dict[str, jax.Array],
    prefix_tokens: jax.Array,
    prefix_lens: jax.Array,
    suffix_tokens: jax.Array,
    *,
    compute_dtype: Any = None,
) -> tuple[jax.Array, jax.Array]:
    """The last layer's output (before the final norm) of the prompts [Gp, Tp, E] and of their
    continuations [Gp, S, Ts, E] (module docstring): at every real token, what
    :func:`gymllm.models.transformer.hidden_states` gives on the row prompt + continuation.
    ``compute_dtype`` as :func:`gymllm.models.transformer.forward`'s."""
    gp, s, ts = suffix_tokens.shape
    owner = jnp.repeat(jnp.arange(gp, dtype=jnp.int32), s)
    hp, hs = shared_prefix_rows_hidden(
        cfg,
        params,
        prefix_tokens,
        prefix_lens,
        suffix_tokens.reshape(gp * s, ts),
        owner,
        compute_dtype=compute_dtype,
    )
    return hp, hs.reshape(gp, s, ts, -1)


@functools.partial(jax.jit, static_argnums=0, static_argnames=("compute_dtype",))
def shared_prefix_rows_hidden(
    cfg: ModelConfig,
    params: dict[str, jax.Array],
    prefix_tokens: jax.Array,
    prefix_lens: jax.Array,
    suffix_tokens: jax.Array,
    suffix_prefix: jax.Array,
    *,
    compute_dtype: Any = None,
) -> tuple[jax.Array, jax.Array]:
    """:func:`shared_prefix_hidden` with R continuation rows ``suffix_tokens`` [R, Ts], row ``r`` continuing
    prompt ``suffix_prefix[r]`` (any number of rows per prompt, none for an unused prompt slot): the
    prompts' [Gp, Tp, E] and the rows' [R, Ts, E] last-layer outputs. A prompt slot may hold any common
    prefix of its rows' inputs (``prefix_lens[g]`` tokens, 0 for none), not only their whole prompt."""
    params = global_params(params, compute_dtype)
    gp, tp = prefix_tokens.shape
    rows, ts = suffix_tokens.shape
    n_pre = gp * tp
    prefix_lens = prefix_lens.astype(jnp.int32)
    owner = suffix_prefix.astype(jnp.int32)
    pos_pre = jnp.broadcast_to(jnp.arange(tp, dtype=jnp.int32), (gp, tp))  # [Gp, Tp]
    lens_rows = prefix_lens[owner]  # [R]
    pos_suf = lens_rows[:, None] + jnp.arange(ts, dtype=jnp.int32)  # [R, Ts]
    positions = jnp.concatenate([pos_pre.reshape(-1), pos_suf.reshape(-1)])[None]  # [1, N]
    tokens = jnp.concatenate([prefix_tokens.reshape(-1), suffix_tokens.reshape(-1)]).astype(
        jnp.int32
    )
    x = embed_tokens(cfg, params, tokens)[None]  # [1, N, E], N = Gp*Tp + R*Ts

    def attend(q, kk, vv, win_l, _):  # [1, N, H, D], [1, N, K, D] x2
        h, d = q.shape[2], q.shape[3]
        qp, kp, vp = (
            a[0, :n_pre].reshape(gp, tp, -1, d) for a in (q, kk, vv)
        )  # prompts [Gp, Tp, ., D]
        qs, ks, vs = (
            a[0, n_pre:].reshape(rows, ts, -1, d) for a in (q, kk, vv)
        )  # continuations [R, Ts, ., D]
        attn_p = attention(
            qp,
            kp,
            vp,
            causal_mask(pos_pre, None, win_l),
            scale=cfg.attn_scale,
            softcap=cfg.attn_logit_softcap,
        )  # [Gp, Tp, H*D]

        def with_prompt(own, pre):  # [R, Tp + Ts, K, D]: each row's prompt k/v, then its own
            return jnp.concatenate([pre[owner], own], axis=1)

        attn_s = attention(
            qs,
            with_prompt(ks, kp),
            with_prompt(vs, vp),
            suffix_mask(lens_rows, tp, ts, win_l),
            scale=cfg.attn_scale,
            softcap=cfg.attn_logit_softcap,
        )  # [R, Ts, H*D]
        attn = jnp.concatenate([attn_p.reshape(-1, h * d), attn_s.reshape(-1, h * d)])[
            None
        ]  # [1, N, H*D]
        return attn, None

    x, _ = scan_layers(cfg, params, x, positions, attend, compute_dtype=compute_dtype)
    x = x[0]
    return x[:n_pre].reshape(gp, tp, -1), x[n_pre:].reshape(rows, ts, -1)


def shared_prefix_logits(
    cfg: ModelConfig, params: dict[str, jax.Array], *inputs: jax.Array, compute_dtype: Any = None
) -> tuple[jax.Array, jax.Array]:
    """float32 logits of the prompts [Gp, Tp, V] and continuations [Gp, S, Ts, V] (final norm and vocab
    projection of :func:`shared_prefix_hidden`, whose ``prefix_tokens, prefix_lens, suffix_tokens``
    are ``inputs``), equal to the flat forward's at every real token."""
    hp, hs = shared_prefix_hidden(cfg, params, *inputs, compute_dtype=compute_dtype)
    return tuple(lm_logits(cfg, params, h, compute_dtype=compute_dtype) for h in (hp, hs))
