"""Engine-busy accounting from the caller's side, recorded where every other engine figure is: the tracer.

Each ``generate`` call through a :class:`MeteredEngine` is a span "generate" on track
``engine/requests`` (tags: ``session``), so an engine that records nothing itself (the HTTP
client, vLLM) still shows its busy time, and the in-process engine's own "prefill" / "decode"
spans on "engine" fall inside it. "Engine busy" has one definition,
:func:`gymllm.telemetry.metrics.busy_fraction` (the union of the spans on the "engine" tracks over
the wall time), read by the per-step ``pipeline/engine_busy_fraction``, the report, and
:meth:`MeteredEngine.busy_fraction` (the same figure since :meth:`~MeteredEngine.reset_clock`).
With the tracer disabled nothing is recorded and the fraction reads 0.0.
"""

from __future__ import annotations

from typing import Any, Sequence

from gymllm.telemetry import get_tracer, span
from gymllm.telemetry.metrics import busy_fraction

TRACK = "engine/requests"


class MeteredEngine:
    """Wraps an Engine; forwards everything, records each call as a span, counts calls in flight."""

    def __init__(self, engine: Any):
        self.engine = engine
        self.inflight = 0
        self.max_inflight = 0
        self.calls = 0
        self._open: dict[int, float] = {}  # calls in flight: id -> start (tracer microseconds)
        self.reset_clock()

    @property
    def version(self) -> int:
        return int(getattr(self.engine, "version", 0))

    def reset_clock(self) -> None:
        """Start :meth:`busy_fraction`'s window now (``started_us``, on the tracer's clock; the orchestrator
        calls it when it starts)."""
        self._tracer = get_tracer()
        self._cursor, self.started_us, self._dropped = self._tracer.cursor(), self._tracer.now_us(), self._tracer.dropped

    async def generate(self, prompt_ids: Sequence[int], params: Any, *, session_id: str | None = None) -> Any:
        self.inflight += 1
        self.calls += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        key = self.calls
        self._open[key] = self._tracer.now_us()
        try:
            with span("generate", track=TRACK, session=session_id):
                return await self.engine.generate(prompt_ids, params, session_id=session_id)
        finally:
            self.inflight -= 1
            self._open.pop(key, None)

    def busy_fraction(self) -> float:
        """The share of the wall time since :meth:`reset_clock` with the engine busy
        (:func:`~gymllm.telemetry.metrics.busy_fraction` over the tracer's spans, the calls still in
        flight counted up to now). When the tracer's ring buffer dropped events since then, the
        window starts at the oldest event it still holds."""
        tr = self._tracer
        now = tr.now_us()
        events = tr.events_since(self._cursor)
        lo = self.started_us if tr.dropped == self._dropped or not events else max(self.started_us, events[0]["ts"])
        events += [{"ph": "X", "name": "generate", "track": TRACK, "ts": start, "dur": now - start, "args": {}}
                   for start in self._open.values()]
        return (busy_fraction(events, "engine", window=(lo, now)) or 0.0) if now > lo else 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)
