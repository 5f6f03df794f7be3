"""A bounded asyncio queue of complete groups that carries producer exceptions and closes cleanly.

* ``put`` waits while the queue is full (backpressure on the producer);
* ``put_exception`` enqueues an error past the bound: the consumer receives every group queued
  before it, then the exception is raised from ``get``;
* ``close`` wakes everyone: ``put`` raises :class:`QueueClosed`, ``get`` drains what is left and then
  raises :class:`QueueClosed`;
* with a ``key``, ``get`` returns the queued item with the smallest key (among those queued before
  the first pending exception) instead of the oldest, e.g. oldest policy version first.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any, Callable

from gymllm.errors import GymLLMError


class QueueClosed(GymLLMError, RuntimeError):
    """The queue was closed (the orchestrator stopped); no more items will arrive."""


class _Raise:
    __slots__ = ("error",)

    def __init__(self, error: BaseException):
        self.error = error


class GroupQueue:
    """FIFO with a capacity, an error channel and a close flag (single event loop)."""

    def __init__(self, maxsize: int, key: Callable[[Any], Any] | None = None):
        if not isinstance(maxsize, int) or maxsize < 1:
            raise ValueError(
                f"GroupQueue.maxsize: expected an int >= 1, received {maxsize!r}. Fix: pass maxsize=1 or more."
            )
        self.maxsize = maxsize
        self.key = key
        self._items: collections.deque[Any] = collections.deque()
        self._changed = asyncio.Condition()
        self.closed = False

    def qsize(self) -> int:
        return sum(1 for x in self._items if not isinstance(x, _Raise))

    def full(self) -> bool:
        return self.qsize() >= self.maxsize

    async def put(self, item: Any) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self.closed or not self.full())
            if self.closed:
                raise QueueClosed("GroupQueue.put after close: the consumer stopped the run")
            self._items.append(item)
            self._changed.notify_all()

    async def put_exception(self, error: BaseException) -> None:
        async with self._changed:
            self._items.append(_Raise(error))
            self._changed.notify_all()

    async def get(self) -> Any:
        async with self._changed:
            await self._changed.wait_for(lambda: self.closed or bool(self._items))
            if not self._items:
                raise QueueClosed("GroupQueue is closed and drained")
            item = self._pop()
            self._changed.notify_all()
        if isinstance(item, _Raise):
            raise item.error
        return item

    def _pop(self) -> Any:
        if self.key is None or isinstance(self._items[0], _Raise):
            return self._items.popleft()
        head = []  # the items before the first pending exception
        for x in self._items:
            if isinstance(x, _Raise):
                break
            head.append(x)
        best = min(range(len(head)), key=lambda i: (self.key(head[i]), i))
        item = head[best]
        del self._items[best]
        return item

    async def close(self) -> None:
        async with self._changed:
            self.closed = True
            self._changed.notify_all()
