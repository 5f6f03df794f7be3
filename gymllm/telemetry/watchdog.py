"""A stall watchdog: stages of a run report progress; a stage that should progress and does not is named.

    wd = Watchdog(WatchdogConfig(stall_s=300.0))
    wd.start()                                   # a daemon thread runs check() every check_every_s
    with wd.stage("learner", "step 3: 2 groups"):  # watched from here ...
        ...; wd.beat("learner", "micro-batch 2/4")  # progress (optional inside a long stage)
    # ... to here, however the block ends (an exception is a failure, not a stall)
    wd.stop()

Spec
----
- A stage is *watched* from :meth:`begin` (or the first :meth:`beat`) until :meth:`end`;
  ``with wd.stage(name, doing):`` is the one way the run times a stage: :meth:`begin` on entry,
  :meth:`end` on exit, also when the block raises or is cancelled. A watched
  stage whose last beat is ``stall_s`` or more seconds old is *stalled*: :meth:`check` reports it
  once, then again after every further ``stall_s`` of silence (stall 1, 2, ...) until it beats.
- Each report is a :class:`Stall` and is
  1. a WARNING on the ``gymllm.watchdog`` logger: ``stalled: no progress in <stage> for N s
     (bound B s); last beat N s ago: <what the last beat said>; doing: <what begin said>``;
  2. in the trace (the process-wide tracer at report time, :func:`gymllm.telemetry.get_tracer`):
     a zero-length span ``stall`` on track ``watchdog`` tagged stage / idle_s / doing / count (the
     tracer records spans and counters; a zero-length span is the instant marker Perfetto shows)
     and the running counter ``stalls`` on the same track;
  3. given to ``on_stall(stall)`` if set;
  4. after ``stop_after`` reports for one stage in a row (None: never), ``on_stop(error)`` gets a
     :class:`StageStalledError` naming the stage once (e.g. to stop the run with that error).
- ``stall_s == 0`` turns the watchdog off: no thread, every call is a no-op.
- Time comes from ``clock`` (seconds, monotonic; default :func:`time.monotonic`), so tests pass a
  fake clock and call :meth:`check` themselves; the thread only calls :meth:`check` periodically
  (it waits on an Event, so :meth:`stop` returns at once). Every method is thread-safe.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import threading
import time
from typing import Any, Callable, Iterator

from gymllm.errors import ConfigError, GymLLMError, explain
from gymllm.validation import check_range

__all__ = ["WatchdogConfig", "Watchdog", "Stall", "StageStalledError"]

log = logging.getLogger("gymllm.watchdog")


@dataclasses.dataclass(frozen=True, kw_only=True)
class WatchdogConfig:
    """stall_s: seconds without progress before a watched stage is reported (0 = off);
    check_every_s: the thread's period (None = stall_s / 4, at most 5 s);
    stop_after: consecutive reports of one stage before ``on_stop`` is called (None = never)."""

    stall_s: float = 300.0
    check_every_s: float | None = None
    stop_after: int | None = None

    def __post_init__(self) -> None:
        s = self.stall_s
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or s < 0:
            raise ConfigError(
                explain(
                    "WatchdogConfig.stall_s",
                    expected="seconds >= 0 (0 = off)",
                    received=s,
                    fix="pass stall_s=300.0",
                )
            )
        c = self.check_every_s
        if c is not None and (
            isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c) or c <= 0
        ):
            raise ConfigError(
                explain(
                    "WatchdogConfig.check_every_s",
                    expected="None or seconds > 0",
                    received=c,
                    fix="pass check_every_s=1.0",
                )
            )
        m = self.stop_after
        check_range(
            "WatchdogConfig",
            "stop_after",
            m,
            lo=1,
            integer=True,
            optional=True,
            fix="pass stop_after=3",
        )

    @property
    def enabled(self) -> bool:
        return self.stall_s > 0

    @property
    def period_s(self) -> float:
        return self.check_every_s if self.check_every_s is not None else min(5.0, self.stall_s / 4)


@dataclasses.dataclass(frozen=True)
class Stall:
    """One report: ``stage`` had no beat for ``idle_s`` seconds (the ``count``-th report in a row);
    ``doing``: what :meth:`Watchdog.begin` said; ``last_beat``: what the last beat said."""

    stage: str
    idle_s: float
    bound_s: float
    count: int
    doing: str
    last_beat: str

    def message(self) -> str:
        return (
            f"stalled: no progress in {self.stage} for {self.idle_s:.1f} s (bound {self.bound_s:g} s); "
            f"last beat {self.idle_s:.1f} s ago: {self.last_beat or '(none)'}; doing: {self.doing or '(unknown)'}"
        )


class StageStalledError(GymLLMError, TimeoutError):
    """A stage reported stalled ``stop_after`` times in a row (``stall`` is the last report)."""

    def __init__(self, stall: Stall):
        super().__init__(
            explain(
                f"run stage {stall.stage!r} (doing: {stall.doing or 'unknown'}; last beat: "
                f"{stall.last_beat or 'none'})",
                expected=f"progress within {stall.bound_s:g} s",
                received=f"none for {stall.idle_s:.1f} s",
                fix="see the stage's own error or log "
                "above; raise run.stall_timeout_s if the stage is merely slow",
            )
        )
        self.stall = stall


@dataclasses.dataclass
class _Stage:
    doing: str
    last_beat_at: float
    last_beat: str
    reported: int = 0


class Watchdog:
    """Names stages of a run that stop making progress (see the module docstring)."""

    def __init__(
        self,
        config: WatchdogConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_stall: Callable[[Stall], Any] | None = None,
        on_stop: Callable[[StageStalledError], Any] | None = None,
    ):
        self.config = config or WatchdogConfig()
        self.clock, self.on_stall, self.on_stop = clock, on_stall, on_stop
        self.stalls: list[Stall] = []  # every report, oldest first
        self._stages: dict[str, _Stage] = {}
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ stages report
    def begin(self, stage: str, doing: str = "") -> None:
        """``stage`` starts work that should progress (``doing`` says what, for the report)."""
        if self.config.enabled:
            now = self.clock()
            with self._lock:
                self._stages[stage] = _Stage(
                    doing=doing, last_beat_at=now, last_beat=f"began: {doing}"
                )

    def beat(self, stage: str, what: str = "") -> None:
        """``stage`` made progress (``what``: what it did). A stage not yet watched starts being watched."""
        if not self.config.enabled:
            return
        now = self.clock()
        with self._lock:
            st = self._stages.get(stage)
            if st is None:
                self._stages[stage] = _Stage(doing=what, last_beat_at=now, last_beat=what)
            else:
                st.last_beat_at, st.last_beat, st.reported = now, what or st.last_beat, 0

    def end(self, stage: str) -> None:
        """``stage`` finished its work: no longer watched until the next :meth:`begin` / :meth:`beat`."""
        if self.config.enabled:
            with self._lock:
                self._stages.pop(stage, None)

    @contextlib.contextmanager
    def stage(self, stage: str, doing: str = "") -> Iterator["Watchdog"]:
        """``with wd.stage("learner", "step 3"):`` watches ``stage`` for the block: :meth:`begin` on
        entry, :meth:`end` on exit however the block ends (a block that raised failed; it did not stall)."""
        self.begin(stage, doing)
        try:
            yield self
        finally:
            self.end(stage)

    def watched(self) -> list[str]:
        """The stages currently expected to progress."""
        with self._lock:
            return sorted(self._stages)

    # ------------------------------------------------------------------ checking
    def check(self) -> list[Stall]:
        """One pass at ``clock()``: report every watched stage that is due (see the module docstring)."""
        if not self.config.enabled:
            return []
        bound, now, due = float(self.config.stall_s), self.clock(), []
        with self._lock:
            for name, st in self._stages.items():
                idle = now - st.last_beat_at
                if idle >= bound * (st.reported + 1):
                    st.reported += 1
                    due.append(
                        Stall(
                            stage=name,
                            idle_s=idle,
                            bound_s=bound,
                            count=st.reported,
                            doing=st.doing,
                            last_beat=st.last_beat,
                        )
                    )
            self.stalls += due
        for stall in due:
            self._report(stall)
        return due

    def _report(self, stall: Stall) -> None:
        from gymllm.telemetry.tracer import get_tracer

        log.warning("%s", stall.message())
        tracer = get_tracer()
        with tracer.span(
            "stall",
            track="watchdog",
            stage=stall.stage,
            idle_s=round(stall.idle_s, 3),
            bound_s=stall.bound_s,
            count=stall.count,
            doing=stall.doing,
            last_beat=stall.last_beat,
        ):
            pass
        tracer.increment("stalls", 1, track="watchdog")
        if self.on_stall is not None:
            self.on_stall(stall)
        limit = self.config.stop_after
        if limit is not None and stall.count == limit and self.on_stop is not None:
            self.on_stop(StageStalledError(stall))

    # ------------------------------------------------------------------ the thread
    def start(self) -> "Watchdog":
        """Start the daemon thread (no thread when the watchdog is off); idempotent."""
        if self.config.enabled and self._thread is None:
            self._halt.clear()
            self._thread = threading.Thread(target=self._loop, name="gymllm-watchdog", daemon=True)
            self._thread.start()
        return self

    @property
    def running(self) -> bool:
        """Whether the daemon thread is running."""
        return self._thread is not None

    def stop(self) -> None:
        """Stop the thread (returns within one check); the watchdog can be started again."""
        self._halt.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _loop(self) -> None:
        while not self._halt.wait(self.config.period_s):
            try:
                self.check()
            except Exception:  # a failing callback must not kill the watchdog
                log.exception("watchdog check failed")

    def __enter__(self) -> "Watchdog":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
