"""Host side of the learner: groups -> training rows -> fixed-shape micro-batches (length buckets).

A row is one trajectory, shifted for next-token prediction: inputs ``ids[:-1]``, targets ``ids[1:]``,
and every per-token array aligned on the targets (mask, the sampler's logprobs ``mu``, versions).
Micro-batches have ``micro_batch_size`` rows and a length from a small fixed set of buckets (powers
of two from ``min_bucket`` up to ``max_len``, optionally with evenly spaced lengths in between), so
the learner compiles at most one program per bucket. Padding rows and padding tokens have mask 0
and contribute exactly nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from gymllm.errors import ConfigError, explain
from gymllm.types import Trajectory


@dataclasses.dataclass
class Row:
    """One trajectory ready for the learner (arrays have length ``n = len(token_ids) - 1``)."""

    inputs: np.ndarray  # [n] int32
    targets: np.ndarray  # [n] int32
    mask: np.ndarray  # [n] float32
    mu: np.ndarray  # [n] float32
    versions: np.ndarray  # [n] int32
    advantage: float
    group_tokens: float
    sample_id: str
    group_index: int = -1

    @property
    def length(self) -> int:
        return len(self.inputs)


def row_from_trajectory(t: Trajectory, *, advantage: float, group_tokens: float, sample_id: str,
                        group_index: int = -1, max_len: int | None = None) -> Row:
    """``t`` as a training row; with ``max_len``, a longer one is cut to its first ``max_len`` positions
    (what a truncated episode appends past the engine's context: the last observation, mask 0; see
    :func:`dropped_sampled_tokens` for sampled tokens lost that way)."""
    end = None if max_len is None else max_len + 1
    ids = np.asarray(t.token_ids, np.int32)[:end]
    return Row(inputs=ids[:-1], targets=ids[1:], mask=np.asarray(t.loss_mask[1:end], np.float32),
               mu=np.asarray(t.behaviour_logprobs[1:end], np.float32),
               versions=np.asarray(t.versions[1:end], np.int32), advantage=float(advantage),
               group_tokens=float(group_tokens), sample_id=sample_id, group_index=group_index)


def dropped_sampled_tokens(t: Trajectory, max_len: int) -> int:
    """Sampled (loss-mask 1) tokens of ``t`` past a row of ``max_len`` positions."""
    return int(np.asarray(t.loss_mask[max_len + 1:]).sum())


def buckets(min_bucket: int, max_len: int, per_octave: int = 1) -> tuple[int, ...]:
    """Powers of two from ``min_bucket`` to ``max_len`` (``max_len`` itself is always the last), each
    octave ``[b, 2b)`` cut into ``per_octave`` even steps: ``buckets(64, 128, 4) == (64, 80, 96, 112, 128)``.
    Finer buckets pad less (a 76-token row costs 80, not 128) for a few more compiled shapes."""
    out, b = [], min_bucket
    while b < max_len:
        for i in range(per_octave):
            x = b + (b * i) // per_octave
            if x < max_len and (not out or x > out[-1]):
                out.append(x)
        b *= 2
    return (*out, max_len)


def pick_bucket(length: int, table: Sequence[int]) -> int:
    for b in table:
        if length <= b:
            return b
    raise ConfigError(explain("trajectory length", expected=f"at most {table[-1]} tokens (LearnerConfig.max_len)",
                              received=f"{length + 1} tokens", fix="raise LearnerConfig.max_len or lower max_tokens"))


@dataclasses.dataclass
class MicroBatch:
    """Arrays of one fixed-shape micro-batch ([B, L] each; ``advantages`` / ``group_tokens`` [B])."""

    tokens: np.ndarray
    positions: np.ndarray
    targets: np.ndarray
    mask: np.ndarray
    mu: np.ndarray
    versions: np.ndarray
    advantages: np.ndarray
    group_tokens: np.ndarray
    sample_ids: list[str]

    @property
    def shape(self) -> tuple[int, int]:
        return self.tokens.shape  # type: ignore[return-value]

    def arrays(self) -> dict[str, np.ndarray]:
        return {k: getattr(self, k) for k in ("tokens", "positions", "targets", "mask", "mu", "advantages",
                                                "group_tokens")}


def make_micro_batch(rows: Sequence[Row], batch_size: int, length: int, pad_id: int = 0) -> MicroBatch:
    """Right-pad ``rows`` (at most ``batch_size``) to ``[batch_size, length]``."""
    b, L = batch_size, length
    tok = np.full((b, L), pad_id, np.int32)
    tgt = np.full((b, L), pad_id, np.int32)
    mask, mu = np.zeros((b, L), np.float32), np.zeros((b, L), np.float32)
    ver = np.full((b, L), -1, np.int32)
    adv, gt = np.zeros(b, np.float32), np.ones(b, np.float32)
    for i, r in enumerate(rows):
        n = r.length
        tok[i, :n], tgt[i, :n], mask[i, :n], mu[i, :n], ver[i, :n] = r.inputs, r.targets, r.mask, r.mu, r.versions
        adv[i], gt[i] = r.advantage, r.group_tokens
    pos = np.broadcast_to(np.arange(L, dtype=np.int32), (b, L)).copy()
    return MicroBatch(tok, pos, tgt, mask, mu, ver, adv, gt, [r.sample_id for r in rows])


def pack(rows: Sequence[Row], batch_size: int, table: Sequence[int], pad_id: int = 0) -> list[MicroBatch]:
    """Sort by length, cut into runs of ``batch_size`` rows, each padded to its longest row's bucket."""
    ordered = sorted(rows, key=lambda r: (r.length, r.sample_id))
    out = []
    for i in range(0, len(ordered), batch_size):
        chunk = ordered[i:i + batch_size]
        out.append(make_micro_batch(chunk, batch_size, pick_bucket(max(r.length for r in chunk), table), pad_id))
    return out
