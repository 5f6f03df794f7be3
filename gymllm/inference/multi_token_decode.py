"""Multi-token decode: up to K decode steps in one jitted call (a device-side loop), for the JAX engine.

One decode step per engine iteration pays a host round trip per token: dispatch, two device->host
copies, and the Python bookkeeping of every row. When no request waits to join, the engine instead
runs a *chunk* of ``n <= K`` steps on the device: each row feeds its own sampled token back, its
position and token index advance, and the loop ends early once every row is done (it sampled one
of its stop ids or used up its token budget). The host then replays the chunk's tokens row by row
through the ordinary per-token path (stop strings, max_tokens, the context limit, versions,
streaming), so completions are token for token those of single steps:

* token j of a row uses the key ``fold_in(key, steps + j)``, exactly as the j-th single step would;
* the weights are fixed during a chunk (an update waits for its end), so every token still carries
  the version of the forward that produced it;
* tokens a row samples after its finish are discarded; their k/v land beyond the row's cached ids
  (or in the scratch slot), where nothing attends to them.

Compiled shapes: one program per (width, cache length), as for single steps (``n`` is traced).
:func:`chunk_limits` builds a chunk's per-row stop ids and token budgets from the active requests.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from gymllm.inference.sampling import sample, step_keys
from gymllm.inference.jit_steps import decode_logits, served_params
from gymllm.models.cache import RecentKV, write_recent_kv
from gymllm.models.decode import decode_forward

MAX_STOP_IDS = 8  # stop ids per row checked on the device (more are still honoured by the host)


def chunk_limits(
    active: dict[int, Any], width: int, stop_ids: frozenset[int], max_len: int
) -> tuple[np.ndarray, np.ndarray]:
    """The device-side end of each row of a chunk over rows [0, width): (stop_ids [W, MAX_STOP_IDS] int32,
    -1 pads: ``stop_ids`` and the request's own, the first MAX_STOP_IDS in order; budget [W] int32: the
    tokens the row's request may still sample, 0 for idle rows). ``active``: slot -> engine request."""
    stop = np.full((width, MAX_STOP_IDS), -1, np.int32)
    budget = np.zeros(width, np.int32)
    for s, r in active.items():
        ids = sorted(stop_ids | set(r.params.stop_token_ids))[:MAX_STOP_IDS]
        stop[s, : len(ids)] = ids
        budget[s] = r.budget(max_len)
    return stop, budget


@functools.lru_cache(maxsize=16)
def make_decode_chunk(
    graphdef: Any, max_steps: int, kv_write: str = "scatter", attention: str = "auto"
) -> tuple[Callable, dict[str, int]]:
    """``(decode_chunk, trace_counts)`` for a model graph: ``decode_chunk(state, cache, tokens, positions,
    keys, steps, temperature, top_k, top_p, stop_ids, budget, n, length) -> (cache, tokens [K, W],
    logprobs [K, W], steps_run)`` (``K = max_steps``; ``length`` static, as in the single decode step;
    optional ``adapters``/``adapter`` as there: LoRA stacks and each row's index);
    ``trace_counts["decode_chunk"]`` counts its compilations. Shared by engines over equal graphs.
    ``kv_write``: how each step writes its rows' k/v (:func:`gymllm.inference.jit_steps.decode_logits`);
    ``"chunk"``: the cache is only read inside the loop, each step's k/v go to a small
    :class:`~gymllm.models.cache.RecentKV` beside it (one dynamic-update-slice for every row), moved
    into the cache once when the loop ends (:func:`~gymllm.models.cache.write_recent_kv`).
    ``attention``: how each step reads the cached slots (:func:`gymllm.models.decode.decode_forward`)."""
    trace_counts = {"decode_chunk": 0}

    @functools.partial(jax.jit, donate_argnums=(1,), static_argnums=(12,))
    def decode_chunk(
        state,
        cache,
        tokens,
        positions,
        keys,
        steps,
        temperature,
        top_k,
        top_p,
        stop_ids,
        budget,
        n,
        length,
        adapters=None,
        adapter=None,
    ):
        # tokens/positions/steps/top_k/budget [W] int32; keys [W, 2] uint32; temperature/top_p [W] f32;
        # stop_ids [W, MAX_STOP_IDS] int32 (-1 pads); n: int32 scalar <= K steps to run at most.
        trace_counts["decode_chunk"] += 1
        width = tokens.shape[0]
        last_slot = jax.tree.leaves(cache)[0].shape[2] - 1
        model = nnx.merge(graphdef, state)
        live = budget > 0  # idle rows (budget 0) never move off the scratch slot

        def cond(c):
            j, done = c[0], c[4]
            return (j < n) & ~jnp.all(done)

        def step(kv, tok, pos):  # (logits [W, V], kv): kv the cache, or the chunk's RecentKV
            if kv_write != "chunk":
                return decode_logits(
                    model,
                    kv,
                    tok,
                    pos,
                    length,
                    adapters,
                    adapter,
                    kv_write=kv_write,
                    attention=attention,
                )
            params = served_params(model, adapters)
            logits, k_new, v_new = decode_forward(
                model.config,
                params,
                tok,
                pos,
                cache,
                length,
                adapter=adapter,
                recent=kv,
                attention=attention,
            )
            return logits, kv.add(k_new, v_new)

        def body(c):
            j, kv, tok, pos, done, out_t, out_l = c
            logits, kv = step(kv, tok, pos)
            t, lp = sample(logits, step_keys(keys, steps + j), temperature, top_k, top_p)
            done = done | jnp.any(t[:, None] == stop_ids, axis=-1) | (j + 1 >= budget)
            pos = jnp.where(live, jnp.minimum(pos + 1, last_slot), pos)
            return j + 1, kv, t, pos, done, out_t.at[j].set(t), out_l.at[j].set(lp)

        out_t = jnp.zeros((max_steps, width), jnp.int32)
        out_l = jnp.zeros((max_steps, width), jnp.float32)
        kv = RecentKV.empty(cache, positions, max_steps) if kv_write == "chunk" else cache
        c = (jnp.int32(0), kv, tokens, positions, ~live, out_t, out_l)
        j, kv, _, _, _, out_t, out_l = jax.lax.while_loop(cond, body, c)
        cache = write_recent_kv(cache, kv) if kv_write == "chunk" else kv
        return cache, out_t, out_l, j

    return decode_chunk, trace_counts
