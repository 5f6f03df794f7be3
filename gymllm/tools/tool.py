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

The schema and the argument coercion are pydantic's: the parameters are a ``TypedDict`` (required
for parameters without a default) validated by a :class:`pydantic.TypeAdapter`, and the schema is
that adapter's JSON schema (pydantic's mapping of int, float, bool, str, list[T], dict, Literal[...],
Optional[T], enums, dataclasses, models...) put in the shape chat templates expect: titles dropped,
``$defs`` references inlined, ``Optional[T]`` shown as ``T`` (``None`` stays allowed by validation),
and a ``default`` only where the default is a JSON scalar. The docstring is read by
``docstring_parser`` (Google, NumPy, reST and Epydoc styles): the summary paragraph and per-argument
text. :meth:`Tool.validate` checks arguments against the signature and returns them coerced by
pydantic's lax mode (``"3"`` -> ``3`` for an int, ``"true"`` -> ``True``, ``2`` -> ``"2"`` for a str;
``"3.5"`` is no int), or raises :class:`~gymllm.errors.ToolError` with a message naming the bad argument.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import threading
import typing
from typing import Any, Callable

import functools

import docstring_parser
from typing_extensions import NotRequired, Required, TypedDict

from gymllm.errors import ToolError, explain
from gymllm.validation import require

if typing.TYPE_CHECKING:
    import pydantic

__all__ = [
    "Tool",
    "tool",
    "json_schema_for",
    "parse_docstring",
    "arguments_adapter",
    "parameters_schema",
    "tidy_schema",
]


def _config() -> "pydantic.ConfigDict":
    """pydantic is imported on first use (``import gymllm`` stays light): numbers coerce to str."""
    import pydantic

    return pydantic.ConfigDict(coerce_numbers_to_str=True, arbitrary_types_allowed=True)


def json_schema_for(annotation: Any) -> dict[str, Any]:
    """The JSON schema of a Python type annotation, as a tool parameter shows it (``{}`` when unknown).

    pydantic's ``TypeAdapter(annotation).json_schema()`` with titles dropped, references inlined
    and ``Optional[T]`` shown as ``T``."""
    import pydantic

    if annotation is inspect.Parameter.empty or annotation is Any:
        return {}
    try:
        raw = pydantic.TypeAdapter(annotation, config=_config_for(annotation)).json_schema()
    except (pydantic.PydanticSchemaGenerationError, pydantic.PydanticUserError, TypeError):
        return {}  # a type pydantic has no JSON schema for: accept anything, as before
    return tidy_schema(raw)


def _config_for(annotation: Any) -> pydantic.ConfigDict | None:
    # pydantic refuses a config for types that carry their own (models, dataclasses, TypedDicts)
    import pydantic

    try:
        pydantic.TypeAdapter(annotation, config=_config())
    except pydantic.PydanticUserError:
        return None
    return _config()


def tidy_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """pydantic's JSON schema in the shape chat templates expect: ``$defs`` inlined, no ``title``
    keys, and ``anyOf [T, null]`` shown as ``T`` (defaults and descriptions kept)."""
    defs = schema.get("$defs", {})

    def walk(node: Any, depth: int = 0) -> Any:
        if isinstance(node, list):
            return [walk(v, depth) for v in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node and depth < 32:
            target = defs.get(node["$ref"].rsplit("/", 1)[-1], {})
            return walk({**target, **{k: v for k, v in node.items() if k != "$ref"}}, depth + 1)
        out = {k: walk(v, depth) for k, v in node.items() if k not in ("title", "$defs")}
        any_of = out.get("anyOf")
        if isinstance(any_of, list):
            non_null = [a for a in any_of if a != {"type": "null"}]
            if len(non_null) == 1 and len(any_of) == 2:
                rest = {k: v for k, v in out.items() if k != "anyOf"}
                out = {**non_null[0], **rest}
        return out

    return walk(schema)


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """``(summary, {arg: description})`` from a docstring (Google, NumPy, reST or Epydoc style, read by
    ``docstring_parser``); the summary is the first paragraph, line breaks become spaces."""
    if not doc:
        return "", {}
    parsed = docstring_parser.parse(inspect.cleandoc(doc))
    summary = parsed.short_description or ""
    if parsed.long_description and not parsed.blank_after_short_description:
        summary += " " + parsed.long_description.split("\n\n", 1)[0]
    args = {p.arg_name.lstrip("*"): " ".join((p.description or "").split()) for p in parsed.params}
    return " ".join(summary.split()), args


def _arg_error(name: str, expected: str, value: Any) -> ToolError:
    return ToolError(
        explain(
            f"argument {name!r}",
            expected=expected,
            received=value,
            fix=f"pass {name} as {expected}",
        )
    )


_EXPECTED = {
    "int": "an integer",
    "float": "a number",
    "bool": "a boolean",
    "string": "a string",
    "list": "a list",
    "tuple": "a list",
    "set": "a list",
    "frozen_set": "a list",
    "dict": "an object",
    "none": "null",
}


def _expected_text(error: dict[str, Any]) -> str:
    """pydantic's error type in words (``int_parsing`` -> ``an integer``)."""
    kind = error.get("type", "")
    if kind in ("literal_error", "enum"):
        return f"one of {error.get('ctx', {}).get('expected', '')}".strip()
    for prefix, text in _EXPECTED.items():
        if kind.startswith(prefix + "_") or kind == prefix:
            return text
    return str(error.get("msg", "a valid value"))


def _location(loc: tuple[Any, ...]) -> str:
    name = str(loc[0]) if loc else "arguments"
    for part in loc[1:]:
        name += (
            f"[{part}]"
            if isinstance(part, int)
            else ("" if str(part).startswith(("function-", "is-")) else f".{part}")
        )
    return name


def arguments_adapter(fn: Callable[..., Any]) -> pydantic.TypeAdapter:
    """A :class:`pydantic.TypeAdapter` for ``fn``'s named arguments: a ``TypedDict`` whose keys are
    the parameters (``Required`` for those without a default; ``*args``/``**kwargs`` left out)."""
    import pydantic

    hints = _type_hints(fn)
    fields: dict[str, Any] = {}
    for pname, p in inspect.signature(fn).parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        hint = hints.get(pname, p.annotation)
        hint = Any if hint is inspect.Parameter.empty else hint
        fields[pname] = Required[hint] if p.default is p.empty else NotRequired[hint]
    name = "".join(c if c.isalnum() else "_" for c in getattr(fn, "__name__", "tool")) or "tool"
    arguments = TypedDict(f"{name}_arguments", fields)  # type: ignore[misc]
    arguments.__pydantic_config__ = _config()  # type: ignore[attr-defined]
    return pydantic.TypeAdapter(arguments)


@dataclasses.dataclass(frozen=True)
class Tool:
    """A callable tool: the function, its name and description; its OpenAI-format JSON schema
    (:attr:`parameters`) and its argument validator (:attr:`arguments`) are built by pydantic on first
    use, so decorating a function imports no pydantic. A parameter type pydantic cannot validate is a
    :class:`~gymllm.errors.ToolError` then, naming the tool and the type."""

    fn: Callable[..., Any]
    name: str
    description: str

    @functools.cached_property
    def arguments(self) -> "pydantic.TypeAdapter":
        """The pydantic adapter that validates and coerces the named arguments (:func:`arguments_adapter`)."""
        import pydantic

        try:
            return arguments_adapter(self.fn)
        except (pydantic.PydanticSchemaGenerationError, pydantic.PydanticUserError, TypeError) as e:
            raise ToolError(
                explain(
                    f"tool {self.name!r}",
                    expected="parameters pydantic can validate (int, float, "
                    "bool, str, list[T], dict, Literal, Optional, enums, models...)",
                    received=str(e).splitlines()[0],
                    fix="annotate each parameter with such a type",
                )
            ) from e

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without the built adapter (rebuilt on first use where it lands, e.g. a Ray worker)."""
        return {k: v for k, v in self.__dict__.items() if k != "arguments"}

    @functools.cached_property
    def parameters(self) -> dict[str, Any]:
        """The JSON schema of the arguments (``{"type": "object", "properties": ..., "required": [...]}``)."""
        return parameters_schema(self.fn, self.arguments)

    @property
    def schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def validate(self, arguments: Any) -> dict[str, Any]:
        """``arguments`` checked against the signature and coerced; :class:`ToolError` when they do not fit."""
        require(
            isinstance(arguments, dict),
            f"tool {self.name!r} arguments",
            expected="a JSON object of named arguments",
            received=arguments,
            fix=f'call {self.name} with {{"arg": value, ...}}',
            error=ToolError,
        )
        sig = inspect.signature(self.fn)
        params = {
            n: p
            for n, p in sig.parameters.items()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        }
        takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
        unknown = [k for k in arguments if k not in params]
        require(
            not unknown or takes_kwargs,
            f"tool {self.name!r}",
            expected=f"arguments among {sorted(params)}",
            received=f"unknown argument(s) {unknown}",
            fix="drop or rename them",
            error=ToolError,
        )
        missing = [n for n, p in params.items() if p.default is p.empty and n not in arguments]
        require(
            not missing,
            f"tool {self.name!r}",
            expected=f"required argument(s) {missing}",
            received=sorted(arguments),
            fix="pass every required argument",
            error=ToolError,
        )
        import pydantic

        adapter = self.arguments
        named = {k: v for k, v in arguments.items() if k in params}
        try:
            coerced = adapter.validate_python(named)
        except pydantic.ValidationError as e:
            first = e.errors()[0]
            raise _arg_error(
                _location(tuple(first.get("loc", ()))), _expected_text(first), first.get("input")
            ) from None
        return {k: coerced[k] if k in params else v for k, v in arguments.items()}

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

    threading.Thread(
        target=run, name=f"gymllm-tool-{getattr(fn, '__name__', 'fn')}", daemon=True
    ).start()
    return await future


def _type_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - unresolvable forward refs: fall back to raw annotations
        return dict(getattr(fn, "__annotations__", {}))


def parameters_schema(fn: Callable[..., Any], adapter: "pydantic.TypeAdapter") -> dict[str, Any]:
    """The tool schema's ``parameters``: the adapter's JSON schema tidied (:func:`tidy_schema`), each
    property with its docstring text, and a ``default`` only where the default is a JSON scalar."""
    _, arg_docs = parse_docstring(fn.__doc__)
    schema = tidy_schema(adapter.json_schema())
    props: dict[str, Any] = {}
    for pname, p in inspect.signature(fn).parameters.items():
        if pname not in schema.get("properties", {}):
            continue
        prop = dict(schema["properties"][pname])
        prop.pop("default", None)
        if arg_docs.get(pname):
            prop["description"] = arg_docs[pname]
        if p.default is not p.empty and (
            p.default is None or isinstance(p.default, (int, float, str, bool))
        ):
            prop["default"] = p.default
        props[pname] = prop
    required = [n for n in schema.get("required", []) if n in props]
    return {"type": "object", "properties": props, "required": required}


def _build(fn: Callable[..., Any], name: str | None, description: str | None) -> Tool:
    require(
        callable(fn),
        "@tool",
        expected="a function",
        received=fn,
        fix="decorate a def or async def",
        error=ToolError,
    )
    summary, _ = parse_docstring(fn.__doc__)
    return Tool(fn=fn, name=name or fn.__name__, description=description or summary)


def tool(
    fn: Callable[..., Any] | None = None, *, name: str | None = None, description: str | None = None
) -> Any:
    """Decorator: ``@tool`` or ``@tool(name=..., description=...)`` turns a function into a :class:`Tool`."""
    if fn is None:
        return lambda f: _build(f, name, description)
    if isinstance(fn, Tool):
        return fn
    return _build(fn, name, description)
