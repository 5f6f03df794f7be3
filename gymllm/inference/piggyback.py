"""Piggybacked prefill: new prompts ride along with a decode step in one device call, for the JAX engine.

An engine that admits a request while others decode would otherwise make two device calls, a prefill
of the new prompt and then the decode step, each reading every weight; on hardware where a small step
costs mostly that read (a CPU, or an accelerator at low occupancy) the second call nearly doubles the
time the decode rows wait for their next token. ``mixed`` runs both in one layer scan
(:func:`gymllm.models.mixed.mixed_forward`): the decode rows ``[0, W)`` advance one token and up to P
prompt chunks (bucket T, into their own rows) are prefilled and sample their first token.

Compiled shapes: one program per (width W, chunk bucket T, cache length); P is always the engine's
``max_prefill_batch`` (missing chunks are padding rows that write nothing), and only buckets up to
``EngineConfig.piggyback_tokens`` ride along (longer prompts are prefilled in calls of their own).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from gymllm.inference.jit_steps import sampled_step, served_params
from gymllm.models.mixed import mixed_and_write


@functools.lru_cache(maxsize=16)
def make_mixed_step(graphdef: Any) -> tuple[Callable, dict[str, int]]:
    """``(mixed, trace_counts)`` for a model graph: ``mixed(state, cache, dec, pre, keys, steps, temperature,
    top_k, top_p, length) -> (cache, tokens [W + P], logprobs [W + P])`` with ``dec = (tokens [W],
    positions [W])``, ``pre = (tokens [P, T], positions [P, T], rows [P], last [P])`` and the sampling
    inputs of the decode rows followed by the chunks' ([W + P]; keys [W + P, 2]); ``length`` static;
    optional ``adapters``/``adapter`` [W + P]: LoRA stacks and each row's index (:mod:`gymllm.inference.jit_steps`).
    ``trace_counts["mixed"]`` counts compilations. Shared by engines over equal graphs."""
    trace_counts = {"mixed": 0}
    return sampled_step(graphdef, trace_counts, "mixed", 2, _mixed), trace_counts


def _mixed(model, cache, dec, pre, length, adapters, adapter):
    params = served_params(model, adapters)
    return mixed_and_write(model.config, params, *dec, *pre, cache, length, adapter=adapter)
