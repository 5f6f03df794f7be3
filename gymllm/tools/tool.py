"""``@tool``: a typed Python callable (sync or async) becomes a tool with an OpenAI-format JSON schema.

    @tool
    def add(a: int, b: int = 0) -> int:
        \"\"\"Add two integers.

        Args:
            a: the first addend.
            b: the second addend.
        \"\"\"
        return a + b

    add.schema     # {"type": "function", "function": {"name": "add", "description": "Add two integers.",
                   #   "parameters": {"type": "object", "properties": {"a": {"type": "integer",
                   #   "description": "the first addend."}, ...}, "required": ["a"]}}}
    add(a=1, b=2)  # still callable as the plain function
    await add.acall({"a": 1, "b": 2})   # validated + coerced arguments, sync fns run in a thread

The schema comes from the signature (annotations -> JSON types: int, float, bool, str, list[T],
dict, Literal[...], Optional[T], enums) and the docstring (the summary paragraph, and per-argument
text from Google ``Args:`` or NumPy ``Parameters`` sections). :meth:`Tool.validate` checks arguments
against the signature and returns them coerced (``"3"`` -> ``3`` for an int where exact), or raises
:class:`~gymllm.errors.ToolError` with a message naming the bad argument.
"""

from __future__ import annotations

import asyncio
import collections.abc
import dataclasses
import enum
import inspect
import re
import threading
import types
import typing
from typing import Any, Callable, Literal, Union

from gymllm.errors import ToolError, explain

__all__ = ["Tool", "tool", "json_schema_for", "parse_docstring"]

_SIMPLE = {int: "integer", float: "number", bool: "boolean", str: "string", dict: "object", list: "array",
           type(None): "null"}


def json_schema_for(annotation: Any) -> dict[str, Any]:
    """The JSON schema of a Python type annotation (``{}``, i.e. anything, when unknown)."""
    if annotation is inspect.Parameter.empty or annotation is Any:
        return {}
    if annotation in _SIMPLE:
        return {"type": _SIMPLE[annotation]}
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return {"type": "string", "enum": [m.value if isinstance(m.value, str) else m.name for m in annotation]}
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        kinds = {_SIMPLE.get(type(a), "string") for a in args}
        out: dict[str, Any] = {"enum": list(args)}
        if len(kinds) == 1:
            out["type"] = kinds.pop()
        return out
    if origin in (Union, types.UnionType):
        non_null = [a for a in args if a is not type(None)]
        if len(non_null) == 1:
            return json_schema_for(non_null[0])
        return {"anyOf": [json_schema_for(a) for a in args]}
    if origin in (list, tuple, set, frozenset, collections.abc.Sequence):
        item = json_schema_for(args[0]) if args else {}
        return {"type": "array", "items": item} if item else {"type": "array"}
    if origin is dict:
        return {"type": "object"}
    return {}


_SECTION = re.compile(r"^\s*(Args|Arguments|Parameters|Params)\s*:?\s*$")
_NUMPY_RULE = re.compile(r"^\s*-{3,}\s*$")
_OTHER_SECTION = re.compile(r"^\s*(Returns?|Yields?|Raises?|Examples?|Notes?|See Also|Attributes)\s*:?\s*$")
_GOOGLE_ARG = re.compile(r"^\s*(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")
_NUMPY_ARG = re.compile(r"^\s*(\w+)\s*(:\s*.*)?$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """``(summary, {arg: description})`` from a Google- or NumPy-style docstring."""
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    summary_lines: list[str] = []
    for line in lines:
        if not line.strip() or _SECTION.match(line) or _OTHER_SECTION.match(line):
            break
        summary_lines.append(line.strip())
    args: dict[str, str] = {}
    i = 0
    while i < len(lines):
        if _SECTION.match(lines[i]):
            numpy = i + 1 < len(lines) and _NUMPY_RULE.match(lines[i + 1])
            i += 2 if numpy else 1
            i = (_parse_numpy_args if numpy else _parse_google_args)(lines, i, args)
        else:
            i += 1
    return " ".join(summary_lines), args


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _parse_google_args(lines: list[str], i: int, out: dict[str, str]) -> int:
    base, current = None, None
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        if _OTHER_SECTION.match(line) or _SECTION.match(line) or (base is not None and _indent(line) < base):
            break
        m = _GOOGLE_ARG.match(line)
        if m and (base is None or _indent(line) == base):
            base = _indent(line) if base is None else base
            current = m.group(1).lstrip("*")
            out[current] = m.group(3).strip()
        elif current is not None:
            out[current] = (out[current] + " " + line.strip()).strip()
        i += 1
    return i


def _parse_numpy_args(lines: list[str], i: int, out: dict[str, str]) -> int:
    base, current = None, None
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        if i + 1 < len(lines) and _NUMPY_RULE.match(lines[i + 1]):
            break  # the next section's title
        if base is None:
            base = _indent(line)
        if _indent(line) == base and _NUMPY_ARG.match(line):
            current = _NUMPY_ARG.match(line).group(1)
            out[current] = ""
        elif current is not None:
            out[current] = (out[current] + " " + line.strip()).strip()
        i += 1
    return i


def _coerce(value: Any, annotation: Any, name: str) -> Any:
    """``value`` checked against ``annotation`` (exact, lossless conversions only)."""
    if annotation is inspect.Parameter.empty or annotation is Any:
        return value
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (Union, types.UnionType):
        errors = []
        for a in args:
            try:
                return _coerce(value, a, name)
            except ToolError as e:
                errors.append(str(e))
        raise ToolError(errors[0] if errors else f"argument {name!r}: no matching type")
    if origin is Literal:
        if value in args:
            return value
        raise _arg_error(name, f"one of {list(args)}", value)
    if annotation is type(None):
        if value is None:
            return None
        raise _arg_error(name, "null", value)
    if annotation is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise _arg_error(name, "a boolean", value)
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str) and re.fullmatch(r"\s*[-+]?\d+\s*", value):
            return int(value)
        raise _arg_error(name, "an integer", value)
    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise _arg_error(name, "a number", value)
    if annotation is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise _arg_error(name, "a string", value)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        for m in annotation:
            if value in (m.value, m.name):
                return m
        raise _arg_error(name, f"one of {[m.value for m in annotation]}", value)
    if origin in (list, tuple, set, frozenset) or annotation in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise _arg_error(name, "a list", value)
        items = [_coerce(v, args[0], f"{name}[{i}]") for i, v in enumerate(value)] if args else list(value)
        return (origin or annotation)(items) if (origin or annotation) is not list else items
    if origin is dict or annotation is dict:
        if not isinstance(value, dict):
            raise _arg_error(name, "an object", value)
        return value
    return value


def _arg_error(name: str, expected: str, value: Any) -> ToolError:
    return ToolError(explain(f"argument {name!r}", expected=expected, received=value,
                             fix=f"pass {name} as {expected}"))


@dataclasses.dataclass(frozen=True)
class Tool:
    """A callable tool: the function, its name, and its OpenAI-format JSON schema."""

    fn: Callable[..., Any]
    name: str
    description: str
    parameters: dict[str, Any]

    @property
    def schema(self) -> dict[str, Any]:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def validate(self, arguments: Any) -> dict[str, Any]:
        """``arguments`` checked against the signature and coerced; :class:`ToolError` when they do not fit."""
        if not isinstance(arguments, dict):
            raise ToolError(explain(f"tool {self.name!r} arguments", expected="a JSON object of named arguments",
                                    received=arguments, fix=f"call {self.name} with {{\"arg\": value, ...}}"))
        sig = inspect.signature(self.fn)
        params = {n: p for n, p in sig.parameters.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
        takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
        unknown = [k for k in arguments if k not in params]
        if unknown and not takes_kwargs:
            raise ToolError(explain(f"tool {self.name!r}", expected=f"arguments among {sorted(params)}",
                                    received=f"unknown argument(s) {unknown}", fix="drop or rename them"))
        missing = [n for n, p in params.items() if p.default is p.empty and n not in arguments]
        if missing:
            raise ToolError(explain(f"tool {self.name!r}", expected=f"required argument(s) {missing}",
                                    received=sorted(arguments), fix="pass every required argument"))
        hints = _type_hints(self.fn)
        return {k: _coerce(v, hints.get(k, inspect.Parameter.empty), k) if k in params else v
                for k, v in arguments.items()}

    async def acall(self, arguments: Any) -> Any:
        """Validate ``arguments`` then call the tool; a sync function runs in its own daemon thread.

        A daemon thread (not the loop's default executor) means a timed-out sync tool never blocks
        the caller: ``asyncio.run`` would otherwise wait for it when the loop shuts down.
        """
        kwargs = self.validate(arguments)
        if self.is_async:
            return await self.fn(**kwargs)
        return await _in_daemon_thread(self.fn, kwargs)

    def call(self, arguments: Any) -> Any:
        """Validate and call synchronously (an async tool is run to completion on a new loop)."""
        kwargs = self.validate(arguments)
        if self.is_async:
            return asyncio.run(self.fn(**kwargs))
        return self.fn(**kwargs)


async def _in_daemon_thread(fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not future.done():
            future.set_result(value) if ok else future.set_exception(value)

    def run() -> None:
        try:
            result: tuple[bool, Any] = (True, fn(**kwargs))
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine
            result = (False, e)
        try:
            loop.call_soon_threadsafe(settle, *result)
        except RuntimeError:
            pass  # the loop is gone (the call timed out and its loop closed): drop the result

    threading.Thread(target=run, name=f"gymllm-tool-{getattr(fn, '__name__', 'fn')}", daemon=True).start()
    return await future


def _type_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - unresolvable forward refs: fall back to raw annotations
        return dict(getattr(fn, "__annotations__", {}))


def _build(fn: Callable[..., Any], name: str | None, description: str | None) -> Tool:
    if not callable(fn):
        raise ToolError(explain("@tool", expected="a function", received=fn, fix="decorate a def or async def"))
    summary, arg_docs = parse_docstring(fn.__doc__)
    hints = _type_hints(fn)
    props: dict[str, Any] = {}
    required: list[str] = []
    for pname, p in inspect.signature(fn).parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        prop = json_schema_for(hints.get(pname, p.annotation))
        if pname in arg_docs and arg_docs[pname]:
            prop["description"] = arg_docs[pname]
        if p.default is p.empty:
            required.append(pname)
        elif p.default is None or isinstance(p.default, (int, float, str, bool)):
            prop["default"] = p.default
        props[pname] = prop
    params = {"type": "object", "properties": props, "required": required}
    return Tool(fn=fn, name=name or fn.__name__, description=description or summary, parameters=params)


def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None, description: str | None = None) -> Any:
    """Decorator: ``@tool`` or ``@tool(name=..., description=...)`` turns a function into a :class:`Tool`."""
    if fn is None:
        return lambda f: _build(f, name, description)
    if isinstance(fn, Tool):
        return fn
    return _build(fn, name, description)
