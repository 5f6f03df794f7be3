"""How the streaming learner lays its rows out: a trajectory as a row, the order micro-batches take rows
in, and a micro-batch's fixed-shape host arrays (padded, packed, shared-prefix, or the ``fixed_shapes``
layout; the LM head on the loss positions only).

    layout = RowLayout(config, pad_id=0, devices=1, counts=collections.Counter())
    rows = [layout.row(t, advantage=a, group_tokens=n, sample_id=t.trajectory_id) for t, a in ...]
    chunk = layout.ordered(rows)[:config.micro_batch_size]
    host = layout.arrays(chunk, layout.micro_batch(chunk), tags={})   # what the gradient program reads

Everything here is host-side NumPy (no device, no program): the learner shards what it returns. What a
layout choice did is counted in ``counts`` (the learner's, passed in), e.g. ``shared_prefix_micro_batches``,
``packed_micro_batches``, ``full_head_micro_batches``, ``sampled_tokens_over_budget``.
"""

from __future__ import annotations

import collections
import warnings
from typing import Any, Sequence

import numpy as np

from gymllm.algos.batching import (
    MicroBatch,
    Row,
    buckets,
    cap_sampled,
    fixed_prefix_arrays,
    fixed_prefix_rows,
    fixed_prefix_slots,
    loss_positions,
    make_micro_batch,
    on_loss_positions,
    pack_rows,
    pick_bucket,
    row_from_trajectory,
    shared_prefix_layout,
    shared_prefix_table,
)
from gymllm.algos.learner_config import LearnerConfig
from gymllm.telemetry import increment

__all__ = ["RowLayout", "LOSS_KEYS", "chunks"]

LOSS_KEYS = ("mask", "mu", "advantages", "group_tokens")  # what the loss reads in the padded layout


def chunks(rows: Sequence[Row], n: int) -> list[list[Row]]:
    """``rows`` cut into consecutive lists of at most ``n``."""
    return [list(rows[i : i + n]) for i in range(0, len(rows), n)]


class RowLayout:
    """Rows and micro-batch host arrays for one learner config (see the module docstring).

    ``config``: the learner's (resolved) config; ``pad_id``: the padding token; ``devices``: the mesh's
    data-parallel devices (packed rows and shared prompts split evenly over them); ``counts``: the counter
    the layout choices are tallied in."""

    def __init__(
        self, config: LearnerConfig, *, pad_id: int, devices: int, counts: collections.Counter
    ):
        self.config = config
        self.pad_id = pad_id
        self.devices = devices
        self.counts = counts
        self.buckets = (
            (config.max_len,)
            if config.fixed_shapes
            else buckets(config.min_bucket, config.max_len, config.buckets_per_octave)
        )
        self.prefix_table = shared_prefix_table(config.max_len)
        self.prefix_len = (
            config.prefix_len or config.max_len // 2
        )  # the fixed layout's (fixed_shapes)
        self.prefix_slots = -(-config.prefix_slots // devices) * devices
        q = -(-config.micro_batch_size // config.pack_row_steps)
        self.pack_quantum = (
            -(-q // devices) * devices
        )  # packed rows come in multiples of this (and of the mesh)

    def row(self, t: Any, **kw: Any) -> Row:
        """``t`` as a training row cut to ``max_len``; with ``fixed_shapes`` and the LM head on the loss
        positions, at most ``max_response_len`` sampled targets in its loss (the rest counted)."""
        r = row_from_trajectory(t, max_len=self.buckets[-1], **kw)
        budget = self.config.max_response_len
        if (
            self.config.fixed_shapes
            and self.config.loss_positions_only
            and 0 < budget < self.buckets[-1]
        ):
            dropped = cap_sampled(r, budget)
            if dropped:
                self.counts["sampled_tokens_over_budget"] += dropped
                increment("sampled_tokens_over_budget", dropped, track="trainer")
        return r

    def micro_batch(self, rows: list[Row]) -> MicroBatch:
        """``rows`` padded to ``micro_batch_size`` rows and the smallest bucket that holds the longest."""
        return make_micro_batch(
            rows,
            self.config.micro_batch_size,
            pick_bucket(max(r.length for r in rows), self.buckets),
            self.pad_id,
        )

    def ordered(self, rows: list[Row]) -> list[Row]:
        """Rows in the order micro-batches take them: shortest first (less padding); with shared prefix
        whole groups (by their longest row) so that a group's rows share a micro-batch."""
        if not self.config.shared_prefix:
            return sorted(rows, key=lambda r: r.length)
        longest: dict[int, int] = {}
        for r in rows:
            longest[r.group_index] = max(longest.get(r.group_index, 0), r.length)
        return sorted(rows, key=lambda r: (longest[r.group_index], r.group_index))

    def on_loss_positions(
        self, host: dict[str, np.ndarray], mask: np.ndarray, gather: np.ndarray | None = None
    ) -> dict[str, np.ndarray]:
        """``host`` arrays for the LM head on the loss positions only (``loss_positions_only``), or as
        they are (every position) when that saves nothing or a row outgrew the budget (counted)."""
        budget = self.config.max_response_len
        if not self.config.loss_positions_only or not budget or budget >= mask.shape[1]:
            return host
        sel = loss_positions(mask, budget, gather)
        if sel is None:
            self.counts["full_head_micro_batches"] += 1  # a row sampled more tokens than the budget
            return host
        return on_loss_positions(host, sel)

    def ref_arrays(self, mb: MicroBatch, rows: Sequence[Row] = ()) -> dict[str, np.ndarray]:
        """The reward-placement reference forward's host arrays (and the ``mu`` / ``mask`` its penalty reads)."""
        host = {k: getattr(mb, k) for k in ("tokens", "positions", "targets", "mask", "mu")}
        sp = self.shared_prefix(list(rows), mb.shape)
        if sp is not None:
            host = {"mask": host["mask"], "mu": host["mu"], **sp}
            self.counts["shared_prefix_reference_batches"] += 1
        return self.on_loss_positions(host, mb.mask, None if sp is None else sp["sp_gather"])

    def shared_prefix(
        self, rows: list[Row], shape: tuple[int, int], fewer_than: int | None = None
    ) -> dict[str, np.ndarray] | None:
        """The shared-prefix layout of ``rows`` when on and it runs fewer positions (than ``fewer_than``), and
        its prompts split evenly over the mesh's devices (as the micro-batch's rows do)."""
        sp = (
            shared_prefix_layout(rows, *shape, self.prefix_table, self.pad_id, fewer_than)
            if self.config.shared_prefix and rows
            else None
        )
        return None if sp is None or sp["sp_prefix_tokens"].shape[0] % self.devices else sp

    def arrays(self, rows: list[Row], mb: MicroBatch, tags: dict) -> dict[str, np.ndarray]:
        """The host arrays of one micro-batch as the (not fixed) gradient program reads them: padded,
        packed or shared-prefix (whichever runs fewest positions), the LM head on the loss positions."""
        host = mb.arrays()
        packed = (
            pack_rows(rows, mb.shape[0], mb.shape[1], self.pack_quantum, self.pad_id)
            if self.config.packing
            else None
        )
        sp = self.shared_prefix(
            rows, mb.shape, None if packed is None else packed["packed_tokens"].size
        )
        gather = None
        if sp is not None:  # each shared prompt runs once; the loss reads the padded layout
            host = {**{k: host[k] for k in LOSS_KEYS}, **sp}
            tags["shared_prefixes"] = sp["sp_prefix_tokens"].shape[0]
            self.counts["shared_prefix_micro_batches"] += 1
            gather = sp["sp_gather"]
        elif (
            packed is not None
        ):  # the model runs on the packed rows; the loss reads the padded layout
            host = {**{k: host[k] for k in LOSS_KEYS}, **packed}
            tags["packed_rows"] = packed["packed_tokens"].shape[0]
            self.counts["packed_micro_batches"] += 1
            gather = packed["gather"]
        return self.on_loss_positions(host, mb.mask, gather)

    def fixed_hosts(self, rows: list[Row]) -> list[tuple[list[int], dict[str, np.ndarray]]]:
        """``rows`` (at most ``micro_batch_size``) in the fixed program's layout (``fixed_shapes``): one
        ``(indices into rows, host arrays)`` per pass, the arrays' shapes the same whatever the rows (no
        rows: one all-padding pass). Padded rows at ``max_len``, or the fixed shared-prefix layout."""
        b, length = self.config.micro_batch_size, self.buckets[-1]
        if not self.config.shared_prefix:
            mb = make_micro_batch(rows, b, length, self.pad_id)
            return [(list(range(len(rows))), self.on_loss_positions(mb.arrays(), mb.mask))]
        out = []
        for slot_rows in fixed_prefix_slots(rows, b, length, self.prefix_len, self.prefix_slots):
            mb = make_micro_batch(fixed_prefix_rows(rows, slot_rows), b, length, self.pad_id)
            sp = fixed_prefix_arrays(
                rows, slot_rows, b, length, self.prefix_len, self.prefix_slots, self.pad_id
            )
            host = {**{k: getattr(mb, k) for k in LOSS_KEYS}, **sp}
            out.append(
                (
                    [i for _, members in slot_rows for i in members],
                    self.on_loss_positions(host, mb.mask, sp["sp_gather"]),
                )
            )
        return out

    def check_passes(self, rows: list[Row], passes: int) -> None:
        """Count (and say once) the passes beyond one per ``prefix_slots`` groups: a group whose rows did not
        fit one slot, as its common prefix is shorter than ``prefix_len``."""
        extra = passes - -(-len({r.group_index for r in rows}) // self.prefix_slots)
        if extra > 0:
            self.counts["shared_prefix_extra_passes"] += extra
            if self.counts["shared_prefix_extra_passes"] == extra:
                warnings.warn(
                    f"LearnerConfig.prefix_len: expected at most the shortest prompt, received "
                    f"{self.prefix_len} while a group shares fewer tokens, so its rows take {extra} more "
                    f"pass(es) of the gradient program. Fix: set --learner.prefix-len to at most the "
                    f"shortest prompt's length (counted: shared_prefix_extra_passes)",
                    stacklevel=2,
                )
