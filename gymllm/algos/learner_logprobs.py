"""The learner's forward: per-token log-probabilities (and entropy) of a micro-batch in any of its
layouts, for :mod:`gymllm.algos.learner`.

A micro-batch reaches the model padded (``tokens``, ``positions``, ``targets`` [B, T]), packed
(:func:`gymllm.algos.batching.pack_rows`) or as shared prompts and their continuations
(:func:`gymllm.algos.batching.shared_prefix_layout`, run by
:func:`gymllm.models.shared_prefix.shared_prefix_hidden`), and optionally with the LM head on the loss
positions only (:func:`gymllm.algos.batching.on_loss_positions`); the results are always aligned with
the padded layout the loss reads.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["build_logprobs", "entropy_from_logits"]


def entropy_from_logits(logits, temperature) -> jnp.ndarray:  # [B, T, V] -> [B, T]
    lp = jax.nn.log_softmax(logits.astype(jnp.float32) / temperature, axis=-1)
    return -jnp.sum(jnp.exp(lp) * lp, axis=-1)


def build_logprobs(model_config: Any, lcfg: Any, temperature: float = 1.0):
    """``f(params, arrays, entropy) -> (logp [B, T] float32, entropy [B, T] or None)``: pure, jit-able
    (``lcfg``: the :class:`gymllm.algos.learner_config.LearnerConfig`, for ``compute_dtype``; ``temperature``: the sampler's).

    ``arrays`` are a micro-batch's (``tokens``, ``positions``, ``targets`` [B, T]), or its packed form
    (``packed_*``, ``segment_ids``, ``gather``: :func:`gymllm.algos.batching.pack_rows`), or its shared-prefix
    form (``sp_*``: :func:`gymllm.algos.batching.shared_prefix_layout`, or the fixed-shape
    :func:`gymllm.algos.batching.fixed_prefix_arrays` with ``sp_suffix_prefix``), optionally with
    ``select_flat`` [B, K] (:func:`gymllm.algos.batching.on_loss_positions`): then the vocab projection,
    log-softmax and entropy run on those K positions of each row only, and the results are [B, K]
    (aligned with that layout's ``mask`` and ``mu``)."""
    from gymllm.models.logprobs import token_logprobs
    from gymllm.models.shared_prefix import shared_prefix_hidden, shared_prefix_rows_hidden
    from gymllm.models.transformer import forward, hidden_states, lm_logits

    def logprobs(params, a, entropy: bool):
        if (
            "sp_prefix_tokens" in a
        ):  # shared prefix (batching.shared_prefix_layout): each prompt runs once
            if (
                "sp_suffix_prefix" in a
            ):  # the fixed layout (batching.fixed_prefix_arrays): rows name their prompt
                hp, hs = shared_prefix_rows_hidden(
                    model_config,
                    params,
                    a["sp_prefix_tokens"],
                    a["sp_prefix_lens"],
                    a["sp_suffix_tokens"],
                    a["sp_suffix_prefix"],
                    compute_dtype=lcfg.compute_dtype,
                )
            else:
                hp, hs = shared_prefix_hidden(
                    model_config,
                    params,
                    a["sp_prefix_tokens"],
                    a["sp_prefix_lens"],
                    a["sp_suffix_tokens"],
                    compute_dtype=lcfg.compute_dtype,
                )
            h = jnp.concatenate([hp.reshape(-1, hp.shape[-1]), hs.reshape(-1, hs.shape[-1])])
            idx = a["select_flat"] if "select_flat" in a else a["sp_gather"]  # [B, K] or [B, T]
            logits = lm_logits(model_config, params, h[idx], compute_dtype=lcfg.compute_dtype)
            logp = token_logprobs(logits, a["sp_targets"], temperature)
            return logp, entropy_from_logits(logits, temperature) if entropy else None
        # packed arrays (batching.pack_rows): the model runs on [P, L], the results are gathered back
        # to the padded [B, L] layout the loss reads; else the padded arrays as they are
        packed = "gather" in a
        tokens, positions, targets = (
            (a["packed_tokens"], a["packed_positions"], a["packed_targets"])
            if packed
            else (a["tokens"], a["positions"], a["targets"])
        )
        segments = a["segment_ids"] if packed else None
        if (
            "select_flat" in a
        ):  # the LM head on the loss positions only: [B, K] of the model rows' flat positions
            h = hidden_states(
                model_config, params, tokens, positions, segments, compute_dtype=lcfg.compute_dtype
            )
            idx = a["select_flat"]
            logits = lm_logits(
                model_config,
                params,
                h.reshape(-1, h.shape[-1])[idx],
                compute_dtype=lcfg.compute_dtype,
            )  # [B, K, V]
            logp = token_logprobs(logits, targets.reshape(-1)[idx], temperature)
            return logp, entropy_from_logits(logits, temperature) if entropy else None
        logits, _ = forward(
            model_config, params, tokens, positions, segments, compute_dtype=lcfg.compute_dtype
        )
        logp = token_logprobs(logits, targets, temperature)  # float32
        ent = entropy_from_logits(logits, temperature) if entropy else None
        if packed:
            logp, ent = (
                logp.reshape(-1)[a["gather"]],
                None if ent is None else ent.reshape(-1)[a["gather"]],
            )
        return logp, ent

    return logprobs
