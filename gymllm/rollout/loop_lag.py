"""Measures event-loop lag: how late a periodic ``sleep(interval)`` wakes up.

A large lag means something ran CPU-heavy work on the loop thread and stalled every other
coroutine (env steps, rewards and tools must run in executors or processes instead).
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

from gymllm.telemetry import counter


class LoopLagMonitor:
    """Start with ``await mon.start()``; stop with ``await mon.stop()``; read :meth:`summary`."""

    def __init__(self, interval_s: float = 0.01, max_samples: int = 100_000):
        self.interval_s = interval_s
        self.max_samples = max_samples
        self.samples_s: list[float] = []
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="loop-lag-monitor")

    async def _run(self) -> None:
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(self.interval_s)
            lag = max(0.0, time.perf_counter() - t0 - self.interval_s)
            if len(self.samples_s) < self.max_samples:
                self.samples_s.append(lag)
            counter("loop_lag_ms", lag * 1e3, track="rollout")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    def summary(self) -> dict[str, float]:
        """``{"loop_lag_mean_ms", "loop_lag_p99_ms", "loop_lag_max_ms"}`` (zeros before any sample)."""
        if not self.samples_s:
            return {"loop_lag_mean_ms": 0.0, "loop_lag_p99_ms": 0.0, "loop_lag_max_ms": 0.0}
        a = np.asarray(self.samples_s) * 1e3
        return {
            "loop_lag_mean_ms": float(a.mean()),
            "loop_lag_p99_ms": float(np.percentile(a, 99)),
            "loop_lag_max_ms": float(a.max()),
        }
