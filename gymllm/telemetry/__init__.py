"""Always-on, lightweight telemetry: spans and counters, exported as a Perfetto-viewable trace.

Public API (stable; other layers use only this):

    from gymllm.telemetry import span, counter, get_tracer
    with span("generate", track="engine", request=rid):   # sync or inside async code
        ...
    counter("queue_depth", 3, track="rollout")
    get_tracer().export_chrome_trace("trace.json")
"""

from gymllm.telemetry.tracer import Tracer, counter, get_tracer, set_tracer, span

__all__ = ["Tracer", "counter", "get_tracer", "set_tracer", "span"]
