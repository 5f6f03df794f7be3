"""Loss aggregation: how token losses become one scalar for the optimizer step.

The normalizer is part of the algorithm. Each mode is a pair of pure functions:

* ``row_scale(mask [B, T], rows: RowStats) -> [B]``: a per-sequence factor known as soon as the
  sequence's group is complete (``1/len_i``, ``1/tokens of its group`` ...);
* ``denominator(step: StepStats) -> scalar``: a constant of the whole optimizer step (all micro-batches
  and devices), known only when the update is applied.

``loss = sum_i row_scale_i * sum_t v_{i,t} m_{i,t} / denominator``. Because the denominator is a
constant, a learner can accumulate the *un-normalized* sums of its micro-batches and divide once at
update time: the step's loss and gradient are then exactly invariant to how it is split
(``micro_token_mean`` is the one mode that is not: it is offered to reproduce systems that use it).

| mode                 | loss                                                            |
|----------------------|-----------------------------------------------------------------|
| token_mean           | sum of all token losses / tokens in the step                    |
| micro_token_mean     | per micro-batch token mean (changes under accumulation)         |
| seq_mean_token_mean  | mean over sequences of each sequence's token mean (orig. GRPO)  |
| seq_mean_token_sum   | mean over sequences of each sequence's token sum                |
| constant             | sum of all token losses / (sequences * L_max) (Dr. GRPO)        |
| prompt_mean          | mean over groups of each group's token mean                     |
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple

import jax.numpy as jnp


class RowStats(NamedTuple):
    """Per-row facts the micro-batch carries: ``group_tokens [B]`` = policy tokens of the row's group."""

    group_tokens: jnp.ndarray  # [B] float32


class StepStats(NamedTuple):
    """Counts over the whole optimizer step: policy tokens, sequences, groups; ``max_len`` for Dr. GRPO."""

    num_tokens: float
    num_seqs: float
    num_groups: float
    max_len: float


@dataclasses.dataclass(frozen=True)
class Aggregation:
    row_scale: Callable[[jnp.ndarray, RowStats], jnp.ndarray]
    denominator: Callable[[StepStats], jnp.ndarray | float]
    step_invariant: bool = True


def _ones(mask, rows):
    return jnp.ones(mask.shape[:1], jnp.float32)


def _inv_len(mask, rows):
    return 1.0 / jnp.maximum(jnp.sum(mask.astype(jnp.float32), axis=-1), 1.0)


def _inv_group_tokens(mask, rows):
    return 1.0 / jnp.maximum(rows.group_tokens, 1.0)


def _inv_micro_tokens(mask, rows):
    return jnp.full(mask.shape[:1], 1.0 / jnp.maximum(jnp.sum(mask.astype(jnp.float32)), 1.0))


AGGREGATIONS: dict[str, Aggregation] = {
    "token_mean": Aggregation(_ones, lambda s: jnp.maximum(s.num_tokens, 1.0)),
    "micro_token_mean": Aggregation(_inv_micro_tokens, lambda s: 1.0, step_invariant=False),
    "seq_mean_token_mean": Aggregation(_inv_len, lambda s: jnp.maximum(s.num_seqs, 1.0)),
    "seq_mean_token_sum": Aggregation(_ones, lambda s: jnp.maximum(s.num_seqs, 1.0)),
    "constant": Aggregation(_ones, lambda s: jnp.maximum(s.num_seqs * s.max_len, 1.0)),
    "prompt_mean": Aggregation(_inv_group_tokens, lambda s: jnp.maximum(s.num_groups, 1.0)),
}


def weighted_sum(mode: str, values, mask, rows: RowStats) -> jnp.ndarray:
    """The un-normalized sum ``sum_i row_scale_i sum_t v m`` of one micro-batch (scalar)."""
    m = mask.astype(jnp.float32)
    scale = AGGREGATIONS[mode].row_scale(mask, rows)  # [B]
    return jnp.sum(jnp.sum(values * m, axis=-1) * scale)


def aggregate(mode: str, values, mask, rows: RowStats, step: StepStats) -> jnp.ndarray:
    """The aggregated scalar of ``values [B, T]`` when this micro-batch is the whole step."""
    return weighted_sum(mode, values, mask, rows) / AGGREGATIONS[mode].denominator(step)
