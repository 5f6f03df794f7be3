"""``ToolUse``: give any text env tools. Tool calls in the action run; their results come back as ``tool`` messages.

    env = ToolUse(gymllm.make("gymllm/Arithmetic-v0"), tools=[calculator], parser="hermes")
    obs, info = env.reset(seed=0)        # info["tools"]: JSON schemas for apply_chat_template(tools=...)
    obs, r, term, trunc, info = env.step('<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>')
    # obs == [{"role": "tool", "name": "calculator", "tool_call_id": "call_0", "content": "42"}], r == 0.0
    obs, r, term, trunc, info = env.step("The answer is \\boxed{42}.")   # no call: passed to the inner env

Semantics:

- An action holding one or more calls (in the ``parser`` format) is a *tool turn*: the calls run in
  order (``timeout_s`` each; async tools natively, sync tools in a worker thread), each under
  ``span("tool", track="tool", tool=name)``; the observation is one ``tool`` message per call (and one per
  unreadable call fragment); reward 0, not terminated; the inner env is not stepped.
- Malformed calls, unknown tools, wrong arguments, tool exceptions and timeouts produce an
  ``"Error: ..."`` tool message the model can read, and are recorded in ``info["tool_calls"]``
  (``ok``, ``error`` kind, ``duration_s``) and in the episode counters; nothing is raised.
- An action without a call is passed to the inner env unchanged. Once ``max_tool_calls`` calls were
  made in the episode, every further action is passed through too (so episodes always progress).
- Observations are always message lists (an inner ``str`` observation becomes one ``user``
  message), so ``observation_space`` is :class:`gymllm.spaces.Chat`.
- ``info["tools"]`` (at reset) and :attr:`ToolUse.tools_schema` hold the tools' JSON schemas; every
  step's ``info`` carries ``tool_turn`` (bool) and the episode's ``num_tool_calls`` /
  ``num_tool_errors``.

``areset`` / ``astep`` are native async twins (tools awaited on the caller's loop).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any, Coroutine, Iterable, TypeVar

import gymnasium as gym

from gymllm.core import areset_env, astep_env
from gymllm.errors import ConfigError, InvalidActionError, ResetNeededError, explain
from gymllm.spaces import Chat
from gymllm.telemetry import counter, span
from gymllm.tools.parsers import ParsedCalls, check_format, parse_tool_calls
from gymllm.tools.registry import ToolRegistry, ToolResult
from gymllm.tools.tool import Tool
from gymllm.types import Message
from gymllm.validation import check_range, require_instance

__all__ = ["ToolUse"]

_T = TypeVar("_T")


def _builtin(name: str) -> Tool:
    from gymllm.tools import calculator, python

    table = {"calculator": calculator, "python": python}
    if name not in table:
        raise ConfigError(
            explain(
                "ToolUse tools",
                expected=f"Tool objects, functions, or built-in names {sorted(table)}",
                received=name,
                fix="pass the tool object itself",
            )
        )
    return table[name]


def _registry(tools: Iterable[Any] | ToolRegistry) -> ToolRegistry:
    if isinstance(tools, ToolRegistry):
        return tools
    if isinstance(tools, (str, Tool)) or callable(tools):
        tools = [tools]
    return ToolRegistry(_builtin(t) if isinstance(t, str) else t for t in tools)


def _as_messages(obs: Any) -> list[Message]:
    return [{"role": "user", "content": obs}] if isinstance(obs, str) else list(obs)


def _run_sync(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run a coroutine from sync code, also when this thread already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


class ToolUse(gym.Wrapper):
    """Run tool calls found in actions; pass other actions to the wrapped text env.

    Args:
        env: a text env (``str`` actions).
        tools: :class:`~gymllm.tools.Tool` objects, plain functions (wrapped with ``@tool``), built-in
            names (``"calculator"``, ``"python"``), or a :class:`~gymllm.tools.ToolRegistry`.
        parser: the call format: one of ``gymllm.tools.FORMATS`` (``"hermes"`` for Qwen-style models).
        max_tool_calls: calls allowed per episode; later actions go to the inner env.
        timeout_s: per-call time limit (``None``: no limit).
        max_result_chars: a longer tool result is cut to this many characters (with a note).
    """

    def __init__(
        self,
        env: gym.Env,
        tools: Iterable[Any] | ToolRegistry = (),
        *,
        parser: str = "hermes",
        max_tool_calls: int = 8,
        timeout_s: float | None = 10.0,
        max_result_chars: int = 16_384,
    ):
        super().__init__(env)
        self.registry = _registry(tools)
        self.parser = check_format(parser)
        check_range(
            "ToolUse",
            "max_tool_calls",
            max_tool_calls,
            lo=0,
            integer=True,
            fix="pass max_tool_calls=8",
        )
        check_range(
            "ToolUse",
            "timeout_s",
            timeout_s,
            lo=0,
            lo_open=True,
            optional=True,
            fix="pass timeout_s=10.0",
        )
        check_range(
            "ToolUse",
            "max_result_chars",
            max_result_chars,
            lo=1,
            integer=True,
            fix="pass max_result_chars=16384",
        )
        self.max_tool_calls = max_tool_calls
        self.timeout_s = timeout_s
        self.max_result_chars = max_result_chars
        self.observation_space = Chat()
        self._running = False
        self._num_calls = 0
        self._num_errors = 0
        self._base_info: dict[str, Any] = {}

    @property
    def tools_schema(self) -> list[dict[str, Any]]:
        """The tools' JSON schemas (OpenAI function format), for the chat template's ``tools``."""
        return self.registry.schemas

    @property
    def num_tool_calls(self) -> int:
        return self._num_calls

    # ------------------------------------------------------------------ reset
    def _after_reset(self, obs: Any, info: dict) -> tuple[list[Message], dict]:
        self._running, self._num_calls, self._num_errors = True, 0, 0
        self._base_info = {k: info[k] for k in ("task_id",) if k in info}
        info = dict(info)
        info["tools"] = self.tools_schema
        return _as_messages(obs), info

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        return self._after_reset(obs, info)

    async def areset(self, *, seed: int | None = None, options: dict | None = None):
        obs, info = await areset_env(self.env, seed=seed, options=options)
        return self._after_reset(obs, info)

    # ------------------------------------------------------------------ step
    def _parse(self, action: Any) -> ParsedCalls | None:
        """The calls to run, or None when the action goes to the inner env."""
        require_instance(
            action,
            str,
            "ToolUse.step(action)",
            expected="a str (the model's reply)",
            fix="pass the reply text",
            error=InvalidActionError,
        )
        if not self._running:
            raise ResetNeededError(
                explain(
                    "ToolUse.step()",
                    expected="reset() first",
                    received="a step with no episode running",
                    fix="call env.reset(seed=...)",
                )
            )
        if self._num_calls >= self.max_tool_calls:
            return None
        parsed = parse_tool_calls(action, self.parser)
        return parsed if (parsed or parsed.errors) else None

    async def _run_calls(self, parsed: ParsedCalls) -> list[ToolResult]:
        results = []
        for call in parsed:
            if self._num_calls >= self.max_tool_calls:
                results.append(
                    ToolResult(
                        call.name,
                        call.id,
                        False,
                        f"Error: the tool-call budget of this episode "
                        f"({self.max_tool_calls}) is used up; give your final answer.",
                        "budget",
                    )
                )
                continue
            self._num_calls += 1
            with span("tool", track="tool", tool=call.name) as tags:
                res = await self.registry.acall(call, timeout_s=self.timeout_s)
                tags.update(ok=res.ok, error=res.error)
            results.append(res)
        for err in parsed.errors:
            results.append(
                ToolResult(
                    "error",
                    "",
                    False,
                    f"Error: {err}. Write the call as the tool format ({self.parser}) requires.",
                    "parse",
                )
            )
        self._num_errors += sum(not r.ok for r in results)
        counter("tool_calls", self._num_calls, track="tool")
        return results

    def _tool_turn(self, parsed: ParsedCalls, results: list[ToolResult]):
        obs: list[Message] = []
        for r in results:
            content = r.content
            if len(content) > self.max_result_chars:
                content = (
                    content[: self.max_result_chars]
                    + f"\n... [truncated {len(r.content) - self.max_result_chars} characters]"
                )
            msg: Message = {"role": "tool", "name": r.name, "content": content}
            if r.call_id:
                msg["tool_call_id"] = r.call_id
            obs.append(msg)
        info = {
            **self._base_info,
            **self._counts(),
            "tool_turn": True,
            "tool_calls": [r.to_info() for r in results],
            "parsed_tool_calls": [c.to_message_dict() for c in parsed],
        }
        return obs, 0.0, False, False, info

    def _counts(self) -> dict[str, int]:
        return {"num_tool_calls": self._num_calls, "num_tool_errors": self._num_errors}

    def _passed(self, result: tuple):
        obs, reward, terminated, truncated, info = result
        if terminated or truncated:
            self._running = False
        info = {**dict(info), **self._counts(), "tool_turn": False}
        return _as_messages(obs), reward, terminated, truncated, info

    def step(self, action: str):
        parsed = self._parse(action)
        if parsed is None:
            return self._passed(self.env.step(action))
        return self._tool_turn(parsed, _run_sync(self._run_calls(parsed)))

    async def astep(self, action: str):
        parsed = self._parse(action)
        if parsed is None:
            return self._passed(await astep_env(self.env, action))
        return self._tool_turn(parsed, await self._run_calls(parsed))
