"""Execution resources of the vector env: a daemon worker-thread pool and an event-loop thread.

Both use daemon threads so that a sub-env stuck forever can never block interpreter exit, and
neither ever raises into the caller: work items catch their own exceptions.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any, Callable, Coroutine

__all__ = ["WorkerPool", "LoopThread"]


class WorkerPool:
    """``size`` daemon threads running submitted zero-argument callables in FIFO order."""

    def __init__(self, size: int, name: str = "gymllm-vec"):
        self._queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._name = name
        self._size = size
        self._idle = threading.Semaphore(0)  # one permit per worker waiting for work
        self._threads: list[threading.Thread] = []

    def add_worker(self, replacement: bool = False) -> None:
        """Start one more worker; ``replacement=True`` (for a worker stuck in a timed-out sub-env
        call) also raises the pool's size so its capacity stays the same."""
        if replacement:
            self._size += 1
        t = threading.Thread(
            target=self._run, name=f"{self._name}-{len(self._threads)}", daemon=True
        )
        t.start()
        self._threads.append(t)

    def submit(self, fn: Callable[[], None]) -> None:
        """Queue ``fn``; start a new worker (up to ``size``) only when none is idle, so cheap work
        runs on a few threads (fewer context switches) and slow work grows the pool to ``size``."""
        self._queue.put(fn)
        if not self._idle.acquire(blocking=False) and len(self._threads) < self._size:
            self.add_worker()

    def _run(self) -> None:
        while True:
            fn = self._queue.get()
            if fn is None:
                return
            try:
                fn()
            except BaseException:  # noqa: BLE001 - work items report their own errors; never lose a worker
                pass
            self._idle.release()

    def shutdown(self) -> None:
        """Ask every worker to exit after its current item; never waits."""
        for _ in list(self._threads):
            self._queue.put(None)


class LoopThread:
    """An asyncio event loop running forever on a daemon thread."""

    def __init__(self, name: str = "gymllm-vec-loop"):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, Any]):
        """Schedule ``coro`` on the loop; returns a ``concurrent.futures.Future``."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self, timeout: float = 1.0) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
