"""``ToolRegistry``: tools by name, their schemas for a chat template, and a safe call path.

    reg = ToolRegistry([calculator, python])
    reg.schemas                       # [schema, ...] for apply_chat_template(tools=...)
    result = await reg.acall(ToolCall("calculator", {"expression": "2+2"}), timeout_s=5)
    result.ok, result.content         # True, "4"

:meth:`ToolRegistry.acall` never raises for a bad call: unknown tools, wrong arguments, exceptions
inside the tool and timeouts come back as a :class:`ToolResult` with ``ok=False`` and an ``error``
text the model can read.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import Any, Callable, Iterable

from gymllm.errors import ToolError, explain
from gymllm.tools.tool import Tool, tool
from gymllm.types import ToolCall

__all__ = ["ToolRegistry", "ToolResult", "format_result"]


@dataclasses.dataclass
class ToolResult:
    """The outcome of one call: content for the model, or an error kind and message."""

    name: str
    call_id: str
    ok: bool
    content: str
    error: str | None = None  # "unknown_tool" | "bad_arguments" | "exception" | "timeout" | "parse"
    duration_s: float = 0.0

    def to_info(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def format_result(value: Any) -> str:
    """A tool's return value as text: str as is, other values as JSON (repr when not serializable)."""
    if isinstance(value, str):
        return value
    if hasattr(value, "as_text"):
        return value.as_text()
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return repr(value)


class ToolRegistry:
    """A name -> :class:`Tool` map. Plain functions are wrapped with :func:`tool` on the way in."""

    def __init__(self, tools: Iterable[Tool | Callable[..., Any]] = ()):
        self._tools: dict[str, Tool] = {}
        for t in tools:
            self.add(t)

    def add(self, t: Tool | Callable[..., Any]) -> Tool:
        t = t if isinstance(t, Tool) else tool(t)
        if t.name in self._tools and self._tools[t.name] is not t:
            raise ToolError(
                explain(
                    "ToolRegistry.add",
                    expected="unique tool names",
                    received=t.name,
                    fix="give one of the tools another name: @tool(name=...)",
                )
            )
        self._tools[t.name] = t
        return t

    def __contains__(self, name: str) -> bool:
        return name in self._tools

    def __getitem__(self, name: str) -> Tool:
        return self._tools[name]

    def __iter__(self):
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    @property
    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema for t in self._tools.values()]

    async def acall(self, call: ToolCall, *, timeout_s: float | None = None) -> ToolResult:
        """Run one call; every failure becomes a ``ToolResult(ok=False)``."""
        start = time.perf_counter()

        def fail(kind: str, msg: str) -> ToolResult:
            return ToolResult(
                call.name, call.id, False, f"Error: {msg}", kind, time.perf_counter() - start
            )

        t = self._tools.get(call.name)
        if t is None:
            return fail(
                "unknown_tool",
                explain(
                    "tool name",
                    expected=f"one of {self.names}",
                    received=call.name,
                    fix="call one of the listed tools",
                ),
            )
        try:
            t.validate(call.arguments)
        except ToolError as e:
            return fail("bad_arguments", str(e))
        try:
            value = await asyncio.wait_for(t.acall(call.arguments), timeout_s)
        except asyncio.TimeoutError:
            return fail("timeout", f"tool {call.name!r} did not finish within {timeout_s} s")
        except Exception as e:  # noqa: BLE001 - a tool's exception is an observation, never a crash
            return fail("exception", f"{type(e).__name__}: {e}")
        return ToolResult(
            call.name, call.id, True, format_result(value), None, time.perf_counter() - start
        )

    def call(self, call: ToolCall, *, timeout_s: float | None = None) -> ToolResult:
        """Synchronous :meth:`acall` (runs its own event loop; do not use inside a running loop)."""
        return asyncio.run(self.acall(call, timeout_s=timeout_s))
