"""Engine-busy accounting from the caller's side: the time with at least one request in flight.

``busy_fraction = (union of [submit, return] intervals of generate calls) / wall time``. It is
engine-agnostic (works for the in-process JAX engine, the HTTP client or vLLM alike).
"""

from __future__ import annotations

import time
from typing import Any, Sequence


class MeteredEngine:
    """Wraps an Engine; forwards everything and measures in-flight time."""

    def __init__(self, engine: Any):
        self.engine = engine
        self.inflight = 0
        self.max_inflight = 0
        self.calls = 0
        self.busy_s = 0.0
        self._busy_since: float | None = None
        self._t0 = time.perf_counter()

    @property
    def version(self) -> int:
        return int(getattr(self.engine, "version", 0))

    def reset_clock(self) -> None:
        self._t0 = time.perf_counter()
        self.busy_s = 0.0
        self._busy_since = time.perf_counter() if self.inflight else None

    async def generate(self, prompt_ids: Sequence[int], params: Any, *, session_id: str | None = None) -> Any:
        if self.inflight == 0:
            self._busy_since = time.perf_counter()
        self.inflight += 1
        self.calls += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            return await self.engine.generate(prompt_ids, params, session_id=session_id)
        finally:
            self.inflight -= 1
            if self.inflight == 0 and self._busy_since is not None:
                self.busy_s += time.perf_counter() - self._busy_since
                self._busy_since = None

    def busy_fraction(self) -> float:
        wall = time.perf_counter() - self._t0
        busy = self.busy_s + (time.perf_counter() - self._busy_since if self._busy_since is not None else 0.0)
        return busy / wall if wall > 0 else 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)
