"""The two jitted device steps of the JAX engine: batched prefill into chosen cache rows, and one
decode step over every slot. Pure functions of (weights, cache, host arrays); the engine owns state.

Cache layout: a pytree from ``model.init_cache(num_slots, max_len, dtype)`` whose array leaves
carry the slot (batch) row on axis ``CACHE_BATCH_AXIS`` (``gymllm.models.KVCache``: [L, B, S, K, D]).
Prefill (:func:`gymllm.models.prefill.prefill_forward`) runs T new tokens into the cache rows ``rows``
[P] (an index equal to ``num_slots`` marks a padding row: its read is clamped and its write dropped),
reading only the first ``length`` slots of those rows (``length`` static, from a small set of cache
lengths covering every row's start; 0: no reused prefix, nothing read) and writing only each row's real
tokens (index <= ``last``) into the donated cache afterwards, so other rows and slots are untouched. Decode
(:func:`gymllm.models.decode.decode_forward`) runs over the first W rows (W from a small set of widths)
and attends over the first S cache slots (S from a small set of cache lengths covering every active
row's position), so a lightly loaded engine or one with short sequences does not pay for idle rows or
empty slots: the cache is only read inside the layer loop, and each row's new k/v are written into
the donated cache afterwards (O(W) writes).
Prefill computes the vocab projection at each row's last prompt token only (``logits_at``).
The packed prefill (:func:`make_packed_prefill`, the engine's fixed shapes) lays up to P prompt pieces
end to end in one budget of N tokens (:mod:`gymllm.models.packed_prefill`): one program for every mix.

An engine serving LoRA adapters (:mod:`gymllm.inference.adapters`) passes every step two more
arguments: ``adapters`` (the flat adapter stacks ``{"layers.<t>.lora_a": [L, N, in, r], ...}``, joined
to the model's flat params) and ``adapter`` (each row's stack index [rows]); without them (None) the
steps trace exactly as before.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
from flax import nnx

from gymllm.inference.sampling import sample, step_keys
from gymllm.models.decode import decode_and_write
from gymllm.models.packed_prefill import packed_prefill_and_write
from gymllm.models.prefill import prefill_and_write


CACHE_BATCH_AXIS = 1


def served_params(model: Any, adapters: dict[str, jax.Array] | None) -> dict[str, jax.Array]:
    """``model``'s flat params, with the adapter stacks joined when the engine serves adapters."""
    params = model.flat_params()
    return params if adapters is None else {**params, **adapters}


def prefill_logits(
    model: Any,
    cache: Any,
    tokens: jax.Array,
    positions: jax.Array,
    rows: jax.Array,
    last: jax.Array,
    length: int | None,
    adapters: dict[str, jax.Array] | None = None,
    adapter: jax.Array | None = None,
) -> tuple[jax.Array, Any]:
    """One prefill chunk of ``model`` into cache rows ``rows`` reading cached slots [0, length):
    (logits [P, V] float32 at index ``last`` of each row, the cache with the real tokens' k/v written).
    ``adapters``/``adapter``: LoRA stacks and each row's index (module docstring)."""
    return prefill_and_write(
        model.config,
        served_params(model, adapters),
        tokens,
        positions,
        rows,
        cache,
        length,
        last,
        adapter=adapter,
    )


def decode_logits(
    model: Any,
    cache: Any,
    tokens: jax.Array,
    positions: jax.Array,
    length: int | None,
    adapters: dict[str, jax.Array] | None = None,
    adapter: jax.Array | None = None,
    *,
    kv_write: str = "scatter",
    attention: str = "auto",
) -> tuple[jax.Array, Any]:
    """One decode step of ``model`` over cache rows [0, W) (W = len(tokens)) attending over slots
    [0, length): (logits [W, V] float32, the cache with each row's new k/v at its position, written
    as ``kv_write`` says: :func:`gymllm.models.decode.write_new_kv`; the cached slots read as
    ``attention`` says: :func:`gymllm.models.decode.decode_forward`). ``adapters``/``adapter``: LoRA
    stacks and each row's index (module docstring)."""
    return decode_and_write(
        model.config,
        served_params(model, adapters),
        tokens,
        positions,
        cache,
        length,
        adapter=adapter,
        kv_write=kv_write,
        attention=attention,
    )


SAMPLING_INPUTS = 5  # keys, steps, temperature, top_k, top_p: every step's sampling rows


def sampled_step(
    graphdef: Any,
    trace_counts: dict[str, int],
    name: str,
    inputs: int,
    forward: Callable,
    *,
    program: str | None = None,
) -> Callable:
    """The jitted step every engine call runs: ``step(state, cache, *inputs, keys, steps, temperature,
    top_k, top_p, length, adapters=None, adapter=None) -> (cache, tokens, logprobs)`` (the cache
    donated, ``length`` static). It merges the model, runs ``forward(model, cache, *inputs, length,
    adapters, adapter) -> (logits [R, V], cache)`` (as :func:`prefill_logits`) and samples each row
    (:func:`gymllm.inference.sampling.sample`); ``trace_counts[name]`` counts its
    traces, i.e. compilations; ``program`` (default ``name``) names the jitted function, as compile
    events and :meth:`~gymllm.inference.device_cache.DeviceSteps.program_shapes` show it."""

    def step(state, cache, *args, adapters=None, adapter=None):
        keys, steps, temperature, top_k, top_p = args[inputs : inputs + SAMPLING_INPUTS]
        length = args[inputs + SAMPLING_INPUTS] if len(args) > inputs + SAMPLING_INPUTS else None
        trace_counts[name] += 1
        model = nnx.merge(graphdef, state)
        logits, cache = forward(model, cache, *args[:inputs], length, adapters, adapter)
        tok, logp = sample(logits, step_keys(keys, steps), temperature, top_k, top_p)
        return cache, tok, logp

    step.__name__ = step.__qualname__ = program or name
    return jax.jit(step, donate_argnums=(1,), static_argnums=(2 + inputs + SAMPLING_INPUTS,))


def packed_logits(
    model: Any, cache: Any, tokens, positions, seg, rows, starts, last, length, adapters, adapter
) -> tuple[jax.Array, Any]:
    """One packed prefill of ``model`` (:func:`make_packed_prefill`): (logits [P, V] float32 at token
    index ``last[p]`` of each segment, the cache with the real tokens' k/v written)."""
    return packed_prefill_and_write(
        model.config,
        served_params(model, adapters),
        tokens,
        positions,
        seg,
        rows,
        starts,
        cache,
        length,
        last,
        adapter=adapter,
    )


@functools.lru_cache(maxsize=16)
def make_steps(
    graphdef: Any, kv_write: str = "scatter", attention: str = "auto"
) -> tuple[Callable, Callable, dict[str, int]]:
    """(prefill, decode, trace_counts) for a model graph, shared by engines over equal graphs (so a
    second engine of the same architecture and sizes reuses the compiled steps); ``trace_counts``
    counts traces, i.e. (re)compilations, per step. ``kv_write``: how decode writes its rows' k/v,
    ``attention``: how it reads the cached slots (:func:`decode_logits`).

    ``prefill(state, cache, tokens, positions, rows, last, keys, steps, temperature, top_k, top_p,
    length=None, adapters=None, adapter=None)``: tokens/positions [P, T] int32; rows/last/steps/top_k
    [P] int32; keys [P, 2] uint32. ``length`` (static, default the whole context): cached slots read,
    >= every row's start (positions[:, 0]); tokens past ``last`` write nothing.

    ``decode(state, cache, tokens, positions, keys, steps, temperature, top_k, top_p, length=None,
    adapters=None, adapter=None)``: tokens/positions/steps/top_k [W] int32; keys [W, 2] uint32;
    temperature/top_p [W] f32. W (a static shape) <= the cache's rows: the step runs over rows [0, W)
    only. ``length`` (static, default the whole context): attend over cache slots [0, length) only;
    every active row's position must be < length (a row at a position >= length writes nothing and
    its output is junk)."""
    trace_counts: dict[str, int] = {"prefill": 0, "decode": 0}
    prefill_jit = sampled_step(
        graphdef, trace_counts, "prefill", 4, prefill_logits, program="prefill_jit"
    )

    def prefill(state, cache, *args, adapters=None, adapter=None):
        if len(args) == 4 + SAMPLING_INPUTS:  # ``length`` left out: the whole context
            args = (*args, jax.tree.leaves(cache)[0].shape[2])
        return prefill_jit(state, cache, *args, adapters=adapters, adapter=adapter)

    decode = functools.partial(decode_logits, kv_write=kv_write, attention=attention)
    return prefill, sampled_step(graphdef, trace_counts, "decode", 2, decode), trace_counts


@functools.lru_cache(maxsize=16)
def make_packed_prefill(graphdef: Any) -> tuple[Callable, dict[str, int]]:
    """``(prefill_packed, trace_counts)`` for a model graph: ``prefill_packed(state, cache, tokens [N],
    positions [N], seg [N], rows [P], starts [P], last [P], keys, steps, temperature, top_k, top_p, length,
    adapters=None, adapter=None) -> (cache, tokens [P], logprobs [P])``: segment p's pieces continue cache
    row ``rows[p]`` from slot ``starts[p]`` and sample at token index ``last[p]``
    (:func:`gymllm.models.packed_prefill.packed_prefill_and_write`); ``length`` static (cached slots read
    per row); ``adapter`` [P]: each segment's LoRA adapter. ``trace_counts["prefill_packed"]`` counts its
    compilations. Shared by engines over equal graphs."""
    trace_counts = {"prefill_packed": 0}
    return sampled_step(graphdef, trace_counts, "prefill_packed", 6, packed_logits), trace_counts
