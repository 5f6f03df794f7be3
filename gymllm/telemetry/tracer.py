"""A ring-buffered tracer of spans and counters (placeholder core; extended by the telemetry layer)."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import threading
import time
from typing import Any, Iterator


class Tracer:
    """Records complete spans ("X" events) and counters ("C" events) in a bounded ring buffer."""

    def __init__(self, capacity: int = 1_000_000, enabled: bool = True):
        self.capacity = capacity
        self.enabled = enabled
        self._events: collections.deque[dict[str, Any]] = collections.deque(maxlen=capacity)
        self._t0 = time.perf_counter()
        self._lock = threading.Lock()

    def now_us(self) -> float:
        return (time.perf_counter() - self._t0) * 1e6

    @contextlib.contextmanager
    def span(self, name: str, track: str = "main", **tags: Any) -> Iterator[dict[str, Any]]:
        if not self.enabled:
            yield tags
            return
        start = self.now_us()
        try:
            yield tags
        finally:
            ev = {"name": name, "ph": "X", "ts": start, "dur": self.now_us() - start, "track": track, "args": tags}
            self._events.append(ev)

    def counter(self, name: str, value: float, track: str = "main") -> None:
        if self.enabled:
            self._events.append({"name": name, "ph": "C", "ts": self.now_us(), "track": track, "args": {name: value}})

    def events(self) -> list[dict[str, Any]]:
        return list(self._events)

    def export_chrome_trace(self, path: str | os.PathLike) -> None:
        tracks: dict[str, int] = {}
        out = []
        for ev in self.events():
            tid = tracks.setdefault(ev["track"], len(tracks) + 1)
            e = {k: v for k, v in ev.items() if k != "track"}
            e.update(pid=1, tid=tid)
            out.append(e)
        meta = [{"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": t}} for t, tid in tracks.items()]
        with open(path, "w") as f:
            json.dump({"traceEvents": meta + out, "displayTimeUnit": "ms"}, f, default=str)


_TRACER = Tracer()


def get_tracer() -> Tracer:
    return _TRACER


def set_tracer(tracer: Tracer) -> None:
    global _TRACER
    _TRACER = tracer


def span(name: str, track: str = "main", **tags: Any):
    return _TRACER.span(name, track, **tags)


def counter(name: str, value: float, track: str = "main") -> None:
    _TRACER.counter(name, value, track)
