"""Metric sinks: JSONL, TensorBoard (its event file format), a live console progress line (rich), W&B.

Usage (the learner, once per step)::

    logger = MetricsLogger(run_dir, total_steps=100)
    logger.log(step, {"reward/mean": 0.4, "loss": 1.2, "pipeline": pipeline_metrics(events)})
    logger.close()          # also writes run_dir/trace.json from the process-wide tracer

What each sink writes:
- ``run_dir/metrics.jsonl``: one JSON object per ``log`` call: ``step``, ``time`` (unix seconds)
  and every metric, nested dicts flattened with "/" (``pipeline/engine_busy_fraction``,
  ``pipeline/staleness_hist/1``); NaN / inf become null.
- ``run_dir/tensorboard/``: TensorBoard event files, one scalar per numeric metric
  (:class:`ScalarEventWriter`: the ``tensorboard`` package's protos and record writer; no torch,
  no TensorFlow import).
- console: a live line ``step 12/100 | reward 0.41 | 1,234 tok/s | engine busy 87% | ETA 0:03:10``
  (rich; redrawn in place on a terminal, printed every ``print_every_s`` seconds otherwise). The
  figures are found by key suffix: reward from ``reward/mean`` (or ``reward_mean`` / ``reward``),
  tok/s from ``tokens_per_s_generated``, busy from ``pipeline/engine_busy_fraction`` (else
  ``engine_busy_fraction``). When the step has
  ``rollout_reward_mean`` (the mean over every completed rollout, filtered groups included) the line
  reads ``reward (all rollouts) 0.31 | trained groups 0.52``; ``tool_calls_per_episode`` adds
  ``tool calls/episode 0.40``. ETA is
  (elapsed since the first log) / (steps since the first log) * steps left.
- W&B (``wandb=True``): ``wandb.log`` per call; wandb is imported only then.

With ``pipeline=True`` (default) each ``log`` also adds ``pipeline/...`` figures from the
process-wide tracer's events since the previous ``log`` (see
:func:`gymllm.telemetry.metrics.pipeline_metrics`), unless the caller passed a "pipeline" entry.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import time
from typing import Any, Mapping

from gymllm.errors import MissingExtraError
from gymllm.telemetry import tracer as _tracer_mod
from gymllm.telemetry.export import jsonable

_REWARD_KEYS = ("reward/mean", "reward_mean", "reward")
_ROLLOUT_REWARD_KEYS = ("rollout_reward_mean",)
_TOOL_KEYS = ("tool_calls_per_episode",)
_TOKS_KEYS = ("tokens_per_s_generated", "tokens_per_s")
_BUSY_KEYS = ("pipeline/engine_busy_fraction", "engine_busy_fraction")  # the step's window first


def flatten(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts -> one level, keys joined with "/"."""
    out: dict[str, Any] = {}
    for k, v in metrics.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "/"))
        else:
            out[key] = v
    return out


def _number(v: Any) -> float | None:
    """A finite float for numeric scalars (incl. NumPy / JAX 0-d arrays), else None."""
    if isinstance(v, bool):
        return float(v)
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _find(flat: Mapping[str, Any], suffixes: tuple[str, ...]) -> float | None:
    for suf in suffixes:
        for k, v in flat.items():
            if (k == suf or k.endswith("/" + suf)) and _number(v) is not None:
                return _number(v)
    return None


def format_eta(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "--:--"
    s = int(round(max(0.0, seconds)))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def progress_line(
    step: int, total: int | None, flat: Mapping[str, Any], eta_s: float | None
) -> str:
    """The console line for one step (pure; the console sink renders it)."""
    parts = [f"step {step}/{total}" if total else f"step {step}"]
    flat = {
        k: v for k, v in flat.items() if not k.startswith("eval/")
    }  # held-out figures: not the training's
    r = _find(flat, _REWARD_KEYS)
    every = _find(flat, _ROLLOUT_REWARD_KEYS)
    if (
        every is not None
    ):  # the honest figure first: every completed rollout, filtered groups included
        parts.append(f"reward (all rollouts) {every:.3f}")
        if r is not None:
            parts.append(f"trained groups {r:.3f}")
    elif r is not None:
        parts.append(f"reward {r:.3f}")
    calls = _find(flat, _TOOL_KEYS)
    if calls is not None:
        parts.append(f"tool calls/episode {calls:.2f}")
    t = _find(flat, _TOKS_KEYS)
    if t is not None:
        parts.append(f"{t:,.0f} tok/s")
    b = _find(flat, _BUSY_KEYS)
    if b is not None:
        parts.append(f"engine busy {100 * b:.0f}%")
    if total:
        parts.append(f"ETA {format_eta(eta_s)}")
    return " | ".join(parts)


def parse_step_window(text: str, field: str = "run.profile_steps") -> tuple[int, int] | None:
    """``"A:B"`` -> ``(A, B)`` (optimizer steps, 1 <= A <= B); ``""`` -> None; anything else a
    :class:`~gymllm.errors.ConfigError` naming ``field``."""
    from gymllm.errors import ConfigError, explain

    text = (text or "").strip()
    if not text:
        return None
    a, sep, b = text.partition(":")
    try:
        lo, hi = int(a), int(b)
    except ValueError:
        lo = hi = -1
    if not sep or lo < 1 or hi < lo:
        raise ConfigError(
            explain(
                field,
                expected="'A:B' with optimizer steps 1 <= A <= B (both ints)",
                received=text,
                fix="e.g. --run.profile-steps 3:4 captures steps 3 and 4; '' turns it off",
            )
        )
    return lo, hi


class ProfileWindow:
    """An op-level ``jax.profiler`` trace of optimizer steps ``A..B`` into ``logdir`` (TensorBoard's
        profile plugin and xprof read it: ``plugins/profile/<time>/<host>.xplane.pb`` and
        ``<host>.trace.json.gz``, which ui.perfetto.dev opens too).

        The run calls :meth:`after_step` with the version live on the engine before any rollout
        (0, or the resumed step) and after every optimizer step: the trace starts once step ``A - 1`` is
        done (so it holds step A's rollouts, the engine's device calls, and its training) and stops once
        step ``B`` is done; :meth:`close` stops a capture the run left open (it ended before B). A run
    resumed past step ``A - 1`` captures nothing; ``captured`` is ``(first, last)`` step of the trace
    written, else None."""

    def __init__(self, logdir: str | os.PathLike, window: tuple[int, int] | None):
        self.logdir, self.window = pathlib.Path(logdir), window
        self.active = False
        self.captured: tuple[int, int] | None = None  # the steps the written trace covers

    def after_step(self, step: int) -> None:
        if self.window is None:
            return
        a, b = self.window
        if not self.active and self.captured is None and step == a - 1:
            import jax

            self.logdir.mkdir(parents=True, exist_ok=True)
            try:
                jax.profiler.start_trace(str(self.logdir))
            except (
                RuntimeError
            ) as e:  # e.g. a trace the caller started is running: the run goes on without ours
                import logging

                logging.getLogger("gymllm.telemetry").warning(
                    "run.profile_steps: no op-level trace (%s)", e
                )
                self.window = None
                return
            self.active, self._first = True, step + 1
        elif self.active and step >= b:
            self._stop(step)

    def _stop(self, last: int) -> None:
        import jax

        jax.profiler.stop_trace()
        self.active = False
        self.captured = (self._first, last)

    def close(self, last_step: int) -> None:
        if self.active:
            self._stop(last_step)


class ScalarEventWriter:
    """TensorBoard scalar events in ``logdir/events.out.tfevents.<time>.<host>.<pid>``, written with the
    ``tensorboard`` package's own ``Event`` / ``Summary`` protos and its TFRecord ``RecordWriter``
    (length, masked CRC-32C, payload, CRC), flushed at every :meth:`add_scalars`.

    Not tensorboardX: importing any part of it imports torch when torch is installed (seconds and
    hundreds of MB, only to accept torch tensors). Not ``EventFileWriter`` either: it opens the file
    through ``tensorboard.compat.tf``, which imports TensorFlow when TensorFlow is installed. The
    record writer and the protos import neither.
    """

    def __init__(self, logdir: str | os.PathLike):
        import socket

        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.record_writer import RecordWriter

        self._event, self._summary = event_pb2.Event, summary_pb2.Summary
        self.logdir = pathlib.Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        now = time.time()
        self.path = (
            self.logdir / f"events.out.tfevents.{int(now)}.{socket.gethostname()}.{os.getpid()}"
        )
        self._writer = RecordWriter(open(self.path, "ab"))
        self._write(event_pb2.Event(wall_time=now, file_version="brain.Event:2"))

    def _write(self, event: Any) -> None:
        self._writer.write(event.SerializeToString())
        self._writer.flush()

    def add_scalars(self, scalars: dict[str, float], step: int) -> None:
        """One event holding every scalar of a step (TensorBoard reads each tag's series from it)."""
        if scalars and self._writer is not None:
            values = [
                self._summary.Value(tag=str(tag), simple_value=float(value))
                for tag, value in scalars.items()
            ]
            self._write(
                self._event(
                    wall_time=time.time(), step=int(step), summary=self._summary(value=values)
                )
            )

    def add_scalar(self, tag: str, value: float, global_step: int = 0) -> None:
        self.add_scalars({tag: value}, global_step)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _import_wandb():
    try:
        import wandb
    except ImportError as e:
        raise MissingExtraError("wandb", "wandb") from e
    return wandb


class _Console:
    """A rich live progress line (redrawn in place on a terminal, printed periodically otherwise)."""

    def __init__(self, total: int | None, print_every_s: float, console: Any = None):
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn

        self.console = console if console is not None else Console(stderr=True)
        self.print_every_s = print_every_s
        self._last_print = -math.inf
        self.progress = None
        if self.console.is_terminal:
            self.progress = Progress(
                BarColumn(),
                TextColumn("{task.description}", markup=False),
                console=self.console,
                transient=False,
            )
            self.task = self.progress.add_task("starting", total=total)
            self.progress.start()

    def update(self, step: int, line: str) -> None:
        if self.progress is not None:
            self.progress.update(self.task, completed=step, description=line)
        elif time.monotonic() - self._last_print >= self.print_every_s:
            self._last_print = time.monotonic()
            self.console.print(line, markup=False, highlight=False)

    def close(self, line: str | None) -> None:
        if self.progress is not None:
            self.progress.stop()
        elif line:
            self.console.print(line, markup=False, highlight=False)


class MetricsLogger:
    """Writes each step's metrics to JSONL, TensorBoard, the console and (optionally) W&B.

    Args:
        run_dir: Directory for metrics.jsonl, tensorboard/ and trace.json (created if missing).
        console: Show the live progress line on stderr (True), or on this ``rich.console.Console``.
        tensorboard: Write TensorBoard event files under run_dir/tensorboard.
        jsonl: Append to run_dir/metrics.jsonl.
        total_steps: The planned number of steps (for "step i/N" and the ETA).
        wandb: Also log to Weights & Biases (needs ``pip install 'gymllm[wandb]'``).
        pipeline: Add ``pipeline/...`` figures from the process-wide tracer at each log.
        trace: On close, export the process-wide tracer to run_dir/trace.json.
        print_every_s: On a non-terminal console, print the line at most this often.
        wandb_kwargs: Extra arguments for ``wandb.init`` (project, name, config, ...).
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        *,
        console: Any = True,
        tensorboard: bool = True,
        jsonl: bool = True,
        total_steps: int | None = None,
        wandb: bool = False,
        pipeline: bool = True,
        trace: bool = True,
        print_every_s: float = 10.0,
        wandb_kwargs: Mapping[str, Any] | None = None,
    ):
        wandb_mod = _import_wandb() if wandb else None  # fail before any file is opened
        self.run_dir = pathlib.Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.total_steps = total_steps
        self.pipeline = pipeline
        self.trace = trace
        self._jsonl = open(self.run_dir / "metrics.jsonl", "a") if jsonl else None
        self._tb = None
        if tensorboard:
            self._tb = ScalarEventWriter(self.run_dir / "tensorboard")
        self._wandb = (
            wandb_mod.init(dir=str(self.run_dir), **dict(wandb_kwargs or {})) if wandb else None
        )
        self._console = (
            _Console(total_steps, print_every_s, None if console is True else console)
            if console is not False and console is not None
            else None
        )
        self._first: tuple[int, float] | None = None
        self._last_line: str | None = None
        self._watch(_tracer_mod.get_tracer())
        self.closed = False

    def _watch(self, tr: _tracer_mod.Tracer, from_start: bool = False) -> None:
        self._tracer = tr
        first = 0 if from_start else tr.cursor()
        self._cursors = [first, first]  # events from two windows back: long spans close late
        self._window_start = 0.0 if from_start else tr.now_us()

    def eta_s(self, step: int, now: float | None = None) -> float | None:
        """Seconds left at ``step``: mean time per step since the first log times steps left."""
        now = time.monotonic() if now is None else now
        if self.total_steps is None or self._first is None or step <= self._first[0]:
            return None
        per_step = (now - self._first[1]) / (step - self._first[0])
        return per_step * max(0, self.total_steps - step)

    def _pipeline_figures(self) -> dict[str, Any]:
        from gymllm.telemetry.metrics import pipeline_metrics

        tr = _tracer_mod.get_tracer()
        if tr is not self._tracer:  # replaced (set_tracer): read it from its start, on its clock
            self._watch(tr, from_start=True)
        now = tr.now_us()
        events = tr.events_since(self._cursors[0])
        self._cursors = [self._cursors[1], tr.cursor()]
        lo, self._window_start = self._window_start, now
        return pipeline_metrics(events, window=(lo, now)) if now > lo else {}

    def log(self, step: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """Record ``metrics`` for ``step`` in every sink; returns the flat record written."""
        if self.closed:
            raise RuntimeError(
                "MetricsLogger.log after close(): create a new MetricsLogger for a new run"
            )
        step = int(step)
        metrics = dict(metrics)
        if self.pipeline and "pipeline" not in metrics:
            metrics["pipeline"] = self._pipeline_figures()
        flat = flatten(metrics)
        now = time.monotonic()
        if self._first is None:
            self._first = (step, now)
        record = {"step": step, "time": time.time()}
        record.update((k, v) for k, v in jsonable(flat).items() if k not in record)  # ours win
        if self._jsonl is not None:
            self._jsonl.write(json.dumps(record, allow_nan=False) + "\n")
            self._jsonl.flush()
        numeric = {k: x for k, v in flat.items() if (x := _number(v)) is not None}
        if self._tb is not None:
            self._tb.add_scalars(numeric, step)
        if self._wandb is not None:
            self._wandb.log(numeric, step=step)
        self._last_line = progress_line(step, self.total_steps, flat, self.eta_s(step, now))
        if self._console is not None:
            self._console.update(step, self._last_line)
        return record

    def close(self) -> None:
        """Flush and close every sink; export run_dir/trace.json (if ``trace``). Idempotent."""
        if self.closed:
            return
        self.closed = True
        if self._console is not None:
            self._console.close(self._last_line)
        if self._jsonl is not None:
            self._jsonl.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
        if self.trace:
            _tracer_mod.get_tracer().export_chrome_trace(self.run_dir / "trace.json")

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
