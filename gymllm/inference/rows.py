"""SamplingRows: the per-row sampling inputs of one device step, kept on the host.

Every device step (decode, prefill, piggybacked) samples each of its R rows with that row's own key,
step index, temperature, top-k and top-p. The engine keeps one ``SamplingRows`` over all its cache
rows (what each row samples at its next decode step) and builds one per prefill batch; a step over
the first W rows passes :meth:`head` ``(W)``. Inert rows (padding, rows nobody decodes) are greedy and
unfiltered.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass
class SamplingRows:
    keys: np.ndarray  # [R, 2] uint32: the request's base key (token j uses fold_in(key, j))
    steps: np.ndarray  # [R] int32: tokens the request has sampled so far
    temperature: np.ndarray  # [R] float32 (0: greedy)
    top_k: np.ndarray  # [R] int32 (0: off)
    top_p: np.ndarray  # [R] float32 (1: off)

    @classmethod
    def inert(cls, rows: int) -> "SamplingRows":
        return cls(np.zeros((rows, 2), np.uint32), np.zeros(rows, np.int32), np.zeros(rows, np.float32),
                   np.zeros(rows, np.int32), np.ones(rows, np.float32))

    def set(self, row: int, key: np.ndarray, step: int, params) -> None:
        """Row ``row`` samples its ``step``-th token for a request with ``key`` and SamplingParams ``params``."""
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

    def copy_row(self, src: int, dst: int) -> None:
        for a in self.arrays():
            a[dst] = a[src]

    def head(self, rows: int) -> "SamplingRows":
        """The first ``rows`` rows (views, no copy)."""
        return SamplingRows(*(a[:rows] for a in self.arrays()))

    def concat(self, other: "SamplingRows") -> "SamplingRows":
        """These rows, then ``other``'s."""
        return SamplingRows(*(np.concatenate([a, b]) for a, b in zip(self.arrays(), other.arrays())))

    def arrays(self) -> tuple[np.ndarray, ...]:
        """(keys, steps, temperature, top_k, top_p): the order the compiled steps take them in."""
        return self.keys, self.steps, self.temperature, self.top_k, self.top_p
