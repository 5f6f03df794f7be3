"""Engine-busy accounting from the caller's side, recorded where every other engine figure is: the tracer.

Each ``generate`` call through a :class:`MeteredEngine` is a span "generate" on track
``engine/requests`` (tags: ``session``), so an engine that records nothing itself (the HTTP
client, vLLM) still shows its busy time, and the in-process engine's own "prefill" / "decode"
spans on "engine" fall inside it. "Engine busy" has one definition,
:func:`gymllm.telemetry.metrics.busy_fraction` (the union of the spans on the "engine" tracks over
the wall time), read by the per-step ``pipeline/engine_busy_fraction``, the report, and
:meth:`MeteredEngine.busy_fraction` (the same union since :meth:`~MeteredEngine.reset_clock`, kept
incrementally with :func:`~gymllm.telemetry.metrics.merge_intervals`, so a call reads only the
events recorded since the previous one). With the tracer disabled nothing is recorded and the
fraction reads 0.0.
"""

from __future__ import annotations

from typing import Any, Sequence

from gymllm.telemetry import get_tracer, span
from gymllm.telemetry.export import family_of
from gymllm.telemetry.metrics import merge_intervals, union_length

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
        self._cursor, self.started_us = self._tracer.cursor(), self._tracer.now_us()
        self._horizon = self.started_us  # busy time before it is settled in _settled_us
        self._settled_us = 0.0
        self._busy: list[
            tuple[float, float]
        ] = []  # the union of the engine spans read, after the horizon

    async def generate(
        self, prompt_ids: Sequence[int], params: Any, *, session_id: str | None = None
    ) -> Any:
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
        """The share of the wall time since :meth:`reset_clock` with the engine busy: the union of the
        tracer's spans on "engine*" (the calls still in flight counted up to now) over that time.

        Each call reads only the events recorded since the previous one. Busy time before the
        horizon (the previous call's time, or the start of a call then in flight) is settled; an
        engine span recorded later that began before it (one no call of this engine was waiting
        on) counts from the horizon on."""
        tr = self._tracer
        now = tr.now_us()
        new = [
            (max(e["ts"], self._horizon), e["ts"] + e["dur"])
            for e in tr.events_since(self._cursor)
            if e["ph"] == "X" and family_of(e["track"]) == "engine"
        ]
        self._cursor = tr.cursor()
        merged = merge_intervals(self._busy + new)
        busy = self._settled_us + union_length(
            merged + [(start, now) for start in self._open.values()]
        )
        horizon = min([now, *self._open.values()])
        self._busy = []
        for s, e in merged:  # settle what lies before the new horizon; later spans cannot change it
            self._settled_us += max(0.0, min(e, horizon) - s)
            if e > horizon:
                self._busy.append((max(s, horizon), e))
        self._horizon = horizon
        return busy / (now - self.started_us) if now > self.started_us else 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)
