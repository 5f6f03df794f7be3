""":class:`TokenStore`: a trajectory log's token-level arrays (token ids, loss mask, logprobs, policy
versions), appendable and chunked, in a tensorstore zarr directory next to the JSONL file."""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np

from gymllm.trajectories.format import TOKEN_FIELDS

__all__ = ["TokenStore"]


class TokenStore:
    """Appendable, chunked 1-D arrays (one per field) in a tensorstore zarr directory."""

    def __init__(self, root: pathlib.Path, chunk_size: int, cursor: int):
        try:
            import tensorstore as ts
        except ImportError as e:  # pragma: no cover - tensorstore is a core dependency
            from gymllm.errors import MissingExtraError

            raise MissingExtraError("tensorstore", "test") from e
        self._ts = ts
        self.root = root
        self.cursor = cursor
        self.arrays: dict[str, Any] = {}
        for field, dtype in TOKEN_FIELDS.items():
            spec = {"driver": "zarr", "kvstore": {"driver": "file", "path": str(root / field)}}
            if (root / field).exists():
                arr = ts.open(spec).result()
            else:
                arr = ts.open(
                    spec,
                    create=True,
                    dtype=getattr(ts, dtype),
                    shape=[0],
                    chunk_layout=ts.ChunkLayout(write_chunk_shape=[chunk_size]),
                ).result()
            self.arrays[field] = arr

    def append(self, arrays: dict[str, np.ndarray]) -> tuple[int, int]:
        """Write aligned arrays at the cursor; return ``(offset, length)``."""
        n = len(next(iter(arrays.values())))
        lo, hi = self.cursor, self.cursor + n
        for field, values in arrays.items():
            arr = self.arrays[field]
            if arr.domain.exclusive_max[0] < hi:
                arr = arr.resize(exclusive_max=[hi], expand_only=True).result()
                self.arrays[field] = arr
            arr[lo:hi].write(np.asarray(values, dtype=TOKEN_FIELDS[field])).result()
        self.cursor = hi
        return lo, n
