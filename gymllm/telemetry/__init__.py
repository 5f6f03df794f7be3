"""Always-on, lightweight telemetry: spans and counters, pipeline metrics, sinks, trace, report.

Public API (stable; other layers use only this)::

    from gymllm.telemetry import span, counter, increment, get_tracer
    with span("decode", track="engine", step=3) as tags:   # sync code or inside async code
        tags["tokens"] = n                                  # tags may be added inside the block
    @span("env_step", track="env/0")                        # or as a decorator (sync or async)
    def step(...): ...
    counter("queue_depth", 3, track="rollout")              # a gauge level
    increment("groups_filtered", 1, track="rollout")        # a running total
    get_tracer().export_chrome_trace("trace.json")          # opens in ui.perfetto.dev
    with use_tracer() as tr: ...                             # a fresh process-wide tracer in a block

Modules (imported on demand; only :mod:`tracer` is loaded with the package):
- :mod:`gymllm.telemetry.tracer`: ``Tracer``, ``span``, ``counter``, ``increment``.
- :mod:`gymllm.telemetry.export`: Chrome trace-event JSON writer and reader.
- :mod:`gymllm.telemetry.metrics`: ``pipeline_metrics(events, window=None)``,
  ``learner_step_metrics``, ``aggregate``, ``staleness_histogram``, ``biggest_stall``.
- :mod:`gymllm.telemetry.sinks`: ``MetricsLogger(run_dir, ...)`` (JSONL, TensorBoard, console, W&B).
- :mod:`gymllm.telemetry.report`: ``write_report(run_dir)`` (PNG plots and summary.txt; the plots
  are :mod:`~gymllm.telemetry.report_plots`, the metrics read by :mod:`~gymllm.telemetry.report_series`).
- :mod:`gymllm.telemetry.compiles`: ``CompileLog`` (every XLA compile: program, seconds, cache hit).

Tracks: "engine" (prefill, decode), "trainer" (train_step, micro_batch, weight_sync, checkpoint),
"rollout" (rollout, queue_wait), "env/<id>" (env_step, reward), "tool" (tool), "compile" (one span per XLA compile, named by the program).
"""

from gymllm.telemetry.tracer import (
    Span,
    Tracer,
    counter,
    current_span_id,
    get_tracer,
    increment,
    set_tracer,
    span,
    use_tracer,
)

__all__ = [
    "Span",
    "Tracer",
    "counter",
    "current_span_id",
    "get_tracer",
    "increment",
    "set_tracer",
    "span",
    "use_tracer",
]
