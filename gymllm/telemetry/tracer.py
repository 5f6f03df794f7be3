"""An always-on tracer: spans and counters in a bounded ring buffer, safe from threads and asyncio.

Spec
----
- ``with tracer.span(name, track=..., **tags) as tags:`` records one complete span (a Chrome "X"
  event) when the block exits. The block may add tags (``tags["tokens"] = n``). ``async with``
  works too. The span object is also a decorator for sync and ``async def`` functions (a fresh
  span per call); generator functions are refused (the span would close at the first yield).
- Spans nest through a :mod:`contextvars` variable, so the parent of a span is the innermost span
  open *in the same thread or asyncio task* (a task inherits the span open where it was created).
  A span closes exactly once, also when its block raises or its task is cancelled; then its tags
  gain ``error`` (the exception's class name, ``"CancelledError"`` for cancellation) and the
  exception propagates unchanged.
- ``tracer.counter(name, value, track=...)`` records a gauge level (a Chrome "C" event);
  ``tracer.increment(name, delta, track=...)`` keeps a running total per (track, name) and records
  the total, for things that only ever add up (dropped groups, trained tokens).
- Memory is bounded: at most ``capacity`` events are held. When full, the oldest half is either
  streamed to ``spill_path`` by a background writer thread (JSON lines, read back by
  :meth:`Tracer.all_events` and the export) or dropped (counted in :attr:`Tracer.dropped`).
- Appends are lock-free (``deque.append`` and ``itertools.count`` are atomic in CPython); only the
  rare overflow takes a lock. Every event records the OS thread that closed it.
- Timestamps are microseconds since the tracer was created (``time.perf_counter_ns`` based);
  :attr:`Tracer.t0_unix` anchors them to wall-clock time.

Track conventions used by the other layers: "engine" (spans "prefill", "decode"), "trainer"
("train_step", "micro_batch", "weight_sync", "checkpoint"), "rollout" ("rollout", "queue_wait"),
"env/<id>" ("env_step", "reward"), "tool" ("tool"). Tags: step, group, trajectory, env, tokens,
staleness (see :mod:`gymllm.telemetry.metrics` for the tags that metrics read).
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import functools
import inspect
import itertools
import json
import os
import pathlib
import queue
import threading
import time
from typing import Any, Callable, Iterator

from gymllm.telemetry.export import jsonable

# One event, as stored (a tuple keeps the hot path cheap):
# (seq, ph, name, track, ts_ns, dur_ns, args, span_id, parent_id, thread_ident)
_Raw = tuple

_CURRENT_SPAN: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "gymllm_span", default=None
)


def current_span_id() -> int | None:
    """The id of the innermost span open in this thread / asyncio task, or None."""
    return _CURRENT_SPAN.get()


class Span:
    """One span: a context manager (single use) and a decorator (a fresh span per call)."""

    __slots__ = ("_tracer", "name", "track", "tags", "_start", "_id", "_parent", "_token")

    def __init__(self, tracer: Tracer | None, name: str, track: str, tags: dict[str, Any]):
        self._tracer = tracer  # None: the global tracer at enter time (so set_tracer applies)
        self.name = name
        self.track = track
        self.tags = tags
        self._token = None

    def __enter__(self) -> dict[str, Any]:
        tr = self._tracer or _TRACER
        if not tr.enabled:
            self._id = None
            return self.tags
        self._tracer = tr
        self._id = next(tr._ids)
        self._parent = _CURRENT_SPAN.get()
        self._token = _CURRENT_SPAN.set(self._id)
        self._start = time.perf_counter_ns()
        return self.tags

    def __exit__(self, et, ev, tb) -> bool:
        if self._id is None:
            return False
        end = time.perf_counter_ns()
        try:
            _CURRENT_SPAN.reset(self._token)
        except (
            ValueError
        ):  # closed in another context (e.g. an async generator finalized elsewhere)
            _CURRENT_SPAN.set(self._parent)
        if et is not None:
            self.tags["error"] = et.__name__
        tr = self._tracer  # Tracer._append, inlined: this is the hot path
        events = tr._events
        events.append(
            (
                next(tr._seq),
                "X",
                self.name,
                self.track,
                self._start,
                end - self._start,
                self.tags,
                self._id,
                self._parent,
                threading.get_ident(),
            )
        )
        if len(events) > tr.capacity:
            tr._overflow()
        return False

    async def __aenter__(self) -> dict[str, Any]:
        return self.__enter__()

    async def __aexit__(self, et, ev, tb) -> bool:
        return self.__exit__(et, ev, tb)

    def __call__(self, fn: Callable) -> Callable:
        name, track, tags, tracer = self.name, self.track, self.tags, self._tracer
        if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
            from gymllm.errors import explain

            raise TypeError(
                explain(
                    f"@span({name!r}) on {fn.__qualname__}",
                    expected="a function or coroutine function",
                    received="a generator function",
                    fix="open `with span(...)` inside the generator around the work to measure",
                )
            )
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapper(*args, **kwargs):
                with Span(tracer, name, track, dict(tags)):
                    return await fn(*args, **kwargs)

            return async_wrapper

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with Span(tracer, name, track, dict(tags)):
                return fn(*args, **kwargs)

        return wrapper


class Tracer:
    """Records spans ("X" events) and counters ("C" events) in a bounded buffer.

    Args:
        capacity: The most events held in memory (>= 2). A buffered span costs about 0.5 KB
            (``benchmarks/telemetry.py`` measures it), so the default bounds the tracer near 125 MB.
        enabled: When False, spans and counters cost one attribute check and record nothing.
        spill_path: If set, overflowing events are appended here as JSON lines instead of dropped.
    """

    def __init__(
        self,
        capacity: int = 250_000,
        enabled: bool = True,
        spill_path: str | os.PathLike | None = None,
    ):
        if not isinstance(capacity, int) or capacity < 2:
            from gymllm.errors import ConfigError, explain

            raise ConfigError(
                explain(
                    "Tracer.capacity",
                    expected="an int >= 2",
                    received=capacity,
                    fix="pass e.g. capacity=1_000_000",
                )
            )
        self.capacity = capacity
        self.enabled = enabled
        self.spill_path = pathlib.Path(spill_path) if spill_path is not None else None
        if self.spill_path is not None:
            self.spill_path.parent.mkdir(parents=True, exist_ok=True)
            self.spill_path.write_text("")
        self.dropped = 0
        self.spilled = 0
        self._spill_queue: queue.Queue[list[_Raw]] = queue.Queue()
        self._writer: threading.Thread | None = None
        self._events: collections.deque[_Raw] = collections.deque()
        self._ids = itertools.count(1)
        self._seq = itertools.count()
        self._t0_ns = time.perf_counter_ns()
        self.t0_unix = time.time()
        self._lock = threading.Lock()
        self._totals: dict[tuple[str, str], float] = {}

    # ------------------------------------------------------------------ recording

    def now_us(self) -> float:
        """Microseconds since this tracer was created (the time base of every event)."""
        return (time.perf_counter_ns() - self._t0_ns) / 1e3

    def span(self, name: str, /, track: str = "main", **tags: Any) -> Span:
        """A span on ``track``; use as ``with`` block (yields the tags dict) or as a decorator.

        ``name`` is positional-only, so ``name=...`` may be used as a tag (e.g. a tool's name)."""
        return Span(self, name, track, tags)

    def add_span(self, name: str, /, seconds: float, track: str = "main", **tags: Any) -> None:
        """Record a span that ended just now and lasted ``seconds`` (work reported after the fact by a
        callback, e.g. an XLA compile from ``jax.monitoring``). Top level: it has no parent span."""
        if self.enabled:
            end = time.perf_counter_ns()
            dur = max(0, int(seconds * 1e9))
            self._append(("X", name, track, end - dur, dur, tags, next(self._ids), None))

    def counter(self, name: str, value: float, track: str = "main") -> None:
        """Record the level of a gauge (queue depth, KV pages in use, ...)."""
        if self.enabled:
            self._append(("C", name, track, time.perf_counter_ns(), 0, {name: value}, None, None))

    def increment(self, name: str, delta: float = 1, track: str = "main") -> float:
        """Add ``delta`` to the running total of (track, name), record the total and return it."""
        key = (track, name)
        with self._lock:
            total = self._totals.get(key, 0) + delta
            self._totals[key] = total
        self.counter(name, total, track)
        return total

    def _append(self, ev: tuple) -> None:
        self._events.append((next(self._seq), *ev, threading.get_ident()))
        if len(self._events) > self.capacity:
            self._overflow()

    def _overflow(self) -> None:
        with self._lock:
            n = len(self._events) - self.capacity // 2
            if n <= 0:
                return
            old = [self._events.popleft() for _ in range(n)]
            if self.spill_path is None:
                self.dropped += n
                return
            self.spilled += n
            if self._writer is None:
                self._writer = threading.Thread(
                    target=self._write_spills, name="gymllm-trace-spill", daemon=True
                )
                self._writer.start()
            self._spill_queue.put(
                old
            )  # written by a background thread: the hot path never blocks on disk

    def _write_spills(self) -> None:
        while True:
            batch = self._spill_queue.get()
            try:
                with open(self.spill_path, "a") as f:
                    f.write(
                        "".join(
                            json.dumps(jsonable(self._to_dict(raw)), allow_nan=False) + "\n"
                            for raw in batch
                        )
                    )
            finally:
                self._spill_queue.task_done()

    def flush(self) -> None:
        """Wait until every spilled event is on disk."""
        self._spill_queue.join()

    # ------------------------------------------------------------------ reading

    def _to_dict(self, raw: _Raw) -> dict[str, Any]:
        seq, ph, name, track, ts, dur, args, sid, parent, thread = raw
        ev = {
            "name": name,
            "ph": ph,
            "ts": (ts - self._t0_ns) / 1e3,
            "track": track,
            "args": args,
            "seq": seq,
            "thread": thread,
        }
        if ph == "X":
            ev.update(dur=dur / 1e3, id=sid, parent=parent)
        return ev

    def events(self) -> list[dict[str, Any]]:
        """The events held in memory, oldest first, as dicts: name, ph ("X" | "C"), ts and dur
        (microseconds), track, args (the tags; a counter's is ``{name: value}``), seq, thread and,
        for spans, id and parent (span ids; parent None at top level)."""
        return [self._to_dict(r) for r in list(self._events)]

    def all_events(self) -> list[dict[str, Any]]:
        """Spilled events (if streaming to disk) followed by those in memory."""
        out = []
        self.flush()
        if self.spill_path is not None and self.spill_path.exists():
            with open(self.spill_path) as f:
                out = [json.loads(line) for line in f if line.strip()]
        return out + self.events()

    def cursor(self) -> int:
        """A position to pass to :meth:`events_since` later (the seq of the next event)."""
        last = self._events[-1][0] if self._events else -1
        return last + 1

    def events_since(self, cursor: int) -> list[dict[str, Any]]:
        """Events recorded at or after ``cursor`` (from :meth:`cursor`) that are still in memory."""
        out = []
        for raw in reversed(self._events.copy()):  # copy: C-speed, safe against concurrent appends
            if raw[0] < cursor:
                break
            out.append(raw)
        return [self._to_dict(r) for r in reversed(out)]

    def clear(self) -> None:
        """Forget every event in memory (the spill file is kept)."""
        self._events.clear()

    def iter_spans(
        self, name: str | None = None, track: str | None = None
    ) -> Iterator[dict[str, Any]]:
        """Spans held in memory, filtered by name and/or track."""
        for ev in self.events():
            if (
                ev["ph"] == "X"
                and (name is None or ev["name"] == name)
                and (track is None or ev["track"] == track)
            ):
                yield ev

    # ------------------------------------------------------------------ export

    def export_chrome_trace(self, path: str | os.PathLike) -> pathlib.Path:
        """Write every event as Chrome trace-event JSON (``.json`` or ``.json.gz``) that
        ui.perfetto.dev and chrome://tracing open; see :mod:`gymllm.telemetry.export`."""
        from gymllm.telemetry.export import write_chrome_trace

        return write_chrome_trace(
            path, self.all_events(), t0_unix=self.t0_unix, dropped=self.dropped
        )


_TRACER = Tracer()


def get_tracer() -> Tracer:
    """The process-wide tracer that :func:`span` and :func:`counter` record into."""
    return _TRACER


def set_tracer(tracer: Tracer) -> Tracer:
    """Replace the process-wide tracer; returns the previous one (so tests can restore it)."""
    global _TRACER
    previous, _TRACER = _TRACER, tracer
    return previous


@contextlib.contextmanager
def use_tracer(tracer: Tracer | None = None) -> Iterator[Tracer]:
    """``with use_tracer() as tr:``: ``tracer`` (a fresh :class:`Tracer` when None) is the process-wide
    tracer inside the block; the previous one is put back on exit, also on an exception."""
    tr = Tracer() if tracer is None else tracer
    previous = set_tracer(tr)
    try:
        yield tr
    finally:
        set_tracer(previous)


def span(name: str, /, track: str = "main", **tags: Any) -> Span:
    """A span on the process-wide tracer (resolved when the span is entered); see :class:`Span`."""
    return Span(None, name, track, tags)


def counter(name: str, value: float, track: str = "main") -> None:
    """Record a gauge level on the process-wide tracer."""
    _TRACER.counter(name, value, track)


def increment(name: str, delta: float = 1, track: str = "main") -> float:
    """Add to a running total on the process-wide tracer and record it."""
    return _TRACER.increment(name, delta, track)
