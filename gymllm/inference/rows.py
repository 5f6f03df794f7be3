"""The decode rows on the host: who decodes in each cache row, and each row's inputs to the next step.

:class:`DecodeRows` maps each active cache row to its request and keeps, for every row, the token,
position and sampling inputs of its next decode step; rows nobody decodes are idle (they write only to
the scratch slot ``max_len - 1``, greedy, unfiltered). Written by the engine thread only.

:class:`SamplingRows`: the per-row sampling inputs of one device step. Every device step (decode,
prefill, piggybacked) samples each of its R rows with that row's own key, step index, temperature,
top-k and top-p, and runs it with its own LoRA adapter (``adapter``: a stack index, 0 the base model;
:mod:`gymllm.inference.adapters`). The engine keeps one ``SamplingRows`` over all its cache
rows (what each row samples at its next decode step) and builds one per prefill batch; a step over
the first W rows passes :meth:`head` ``(W)``. Inert rows (padding, rows nobody decodes) are greedy and
unfiltered.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

from gymllm.inference.slot_table import Placement

if TYPE_CHECKING:
    from gymllm.inference.request import EngineRequest


@dataclasses.dataclass
class SamplingRows:
    keys: np.ndarray  # [R, 2] uint32: the request's base key (token j uses fold_in(key, j))
    steps: np.ndarray  # [R] int32: tokens the request has sampled so far
    temperature: np.ndarray  # [R] float32 (0: greedy)
    top_k: np.ndarray  # [R] int32 (0: off)
    top_p: np.ndarray  # [R] float32 (1: off)
    adapter: np.ndarray  # [R] int32: the row's LoRA adapter (stack index; 0: the base model)

    @classmethod
    def inert(cls, rows: int) -> "SamplingRows":
        return cls(
            np.zeros((rows, 2), np.uint32),
            np.zeros(rows, np.int32),
            np.zeros(rows, np.float32),
            np.zeros(rows, np.int32),
            np.ones(rows, np.float32),
            np.zeros(rows, np.int32),
        )

    def set(self, row: int, key: np.ndarray, step: int, params, adapter: int = 0) -> None:
        """Row ``row`` samples its ``step``-th token for a request with ``key`` and SamplingParams ``params``
        under LoRA adapter ``adapter`` (a stack index)."""
        self.adapter[row] = adapter
        self.keys[row] = key
        self.steps[row] = step
        self.temperature[row] = params.temperature
        self.top_k[row] = params.top_k
        self.top_p[row] = params.top_p

    def clear(self, row: int) -> None:
        """Row ``row`` becomes inert (greedy, unfiltered)."""
        self.temperature[row] = 0.0
        self.top_k[row] = 0
        self.top_p[row] = 1.0
        self.adapter[row] = 0

    def copy_row(self, src: int, dst: int) -> None:
        for a in (*self.arrays(), self.adapter):
            a[dst] = a[src]

    def head(self, rows: int) -> "SamplingRows":
        """The first ``rows`` rows (views, no copy)."""
        return SamplingRows(*(a[:rows] for a in (*self.arrays(), self.adapter)))

    def concat(self, other: "SamplingRows") -> "SamplingRows":
        """These rows, then ``other``'s."""
        return SamplingRows(
            *(
                np.concatenate([a, b])
                for a, b in zip((*self.arrays(), self.adapter), (*other.arrays(), other.adapter))
            )
        )

    def arrays(self) -> tuple[np.ndarray, ...]:
        """(keys, steps, temperature, top_k, top_p): the order the compiled steps take them in."""
        return self.keys, self.steps, self.temperature, self.top_k, self.top_p


class DecodeRows:
    """The engine's decode rows: ``active`` (slot -> request) and each row's next decode inputs
    ``tokens`` [num_slots], ``positions`` [num_slots] and ``sampling``."""

    def __init__(self, num_slots: int, max_len: int):
        self.max_len = max_len
        self.active: dict[
            int, EngineRequest
        ] = {}  # slot -> request (the same dict for the engine's life)
        self.tokens = np.zeros(num_slots, np.int32)
        self.positions = np.full(
            num_slots, max_len - 1, np.int32
        )  # idle rows write only to the scratch index
        self.sampling = SamplingRows.inert(
            num_slots
        )  # each row's sampling inputs at its next decode step

    def top_row(self) -> int:
        """The highest active row (0 when none is active)."""
        return max(self.active, default=0)

    def max_position(self, ahead: int = 0) -> int:
        """The furthest position an active row reaches ``ahead`` steps from now (capped at the scratch
        slot ``max_len - 1``; 0 when none is active)."""
        return max(
            (min(int(self.positions[s]) + ahead, self.max_len - 1) for s in self.active), default=0
        )

    def inputs(self, width: int) -> tuple[np.ndarray, np.ndarray, SamplingRows]:
        """Rows [0, width)'s (tokens [W], positions [W], sampling inputs): views, no copy."""
        return self.tokens[:width], self.positions[:width], self.sampling.head(width)

    def join(self, req: EngineRequest) -> None:
        """``req`` (placed, prefilled) decodes in its row from the next step on."""
        self.active[req.slot] = req

    def schedule(self, req: EngineRequest) -> None:
        """Feed ``req``'s last sampled token back: its row's inputs at the next decode step."""
        s = req.slot
        self.tokens[s] = req.tokens[-1]
        self.positions[s] = len(req.prompt) + len(req.tokens) - 1
        self.sampling.set(s, req.key, len(req.tokens), req.params, req.adapter)

    def leave(self, req: EngineRequest) -> None:
        """``req`` stops decoding: its row (if it is still the row's request) becomes idle."""
        if self.active.get(req.slot) is req:
            del self.active[req.slot]
            self.idle(req.slot)

    def idle(self, slot: int) -> None:
        """Host inputs of a row nobody decodes: it writes only to the scratch slot, greedy, unfiltered."""
        self.positions[slot] = self.max_len - 1
        self.sampling.clear(slot)

    def move(self, a: int, b: int) -> None:
        """The request decoding in row ``a`` moves to idle row ``b`` (the caller copied its k/v)."""
        req = self.active.pop(a)
        req.placement = Placement(b, req.placement.reuse_len)
        self.active[b] = req
        self.tokens[b], self.positions[b] = self.tokens[a], self.positions[a]
        self.sampling.copy_row(a, b)
        self.idle(a)
