"""Tool-call parsers per model family, and the matching renderers (used for round-trip tests and demos).

Formats:

- ``"hermes"`` (Qwen 2/2.5/3, Hermes, SmolLM): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
  (one or more; an unclosed last tag, as when generation stops at the end tag, is accepted);
- ``"llama3"``: a bare JSON object ``{"name": ..., "parameters": {...}}`` (``"arguments"`` also
  accepted; an optional ``<|python_tag|>`` prefix);
- ``"gemma"``: a fenced ``tool_code`` block holding Python call syntax, ``fn(a=1, b="x")`` (also
  ``print(fn(...))`` and ``api.fn(...)``), keyword arguments with literal values;
- ``"python"``: every fenced ```` ```python ```` block is a call of the python tool:
  ``ToolCall("python", {"code": block})`` (opt-in: plain code answers are common);
- ``"auto"``: the first of hermes, gemma, llama3 whose markers appear in the text.

:func:`parse_tool_calls` never raises on any input text: it returns a :class:`ParsedCalls` (a
``list[ToolCall]``) whose ``errors`` holds a :class:`ParseError` for every call-looking fragment it
could not read (bad JSON, no name, positional arguments, ...), so a wrapper can tell the model.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from typing import Any, Callable

from gymllm.errors import ConfigError, explain
from gymllm.types import ToolCall

__all__ = [
    "FORMATS",
    "ParseError",
    "ParsedCalls",
    "parse_tool_calls",
    "format_tool_calls",
    "has_tool_call",
    "check_format",
]


@dataclasses.dataclass(frozen=True)
class ParseError:
    """A call-looking fragment that could not be read: which format, why, and the fragment."""

    format: str
    message: str
    snippet: str

    def __str__(self) -> str:
        return (
            f"could not parse a {self.format} tool call ({self.message}) in: {self.snippet[:200]!r}"
        )


class ParsedCalls(list):
    """``list[ToolCall]`` plus ``errors: list[ParseError]`` and the ``format`` that was used."""

    def __init__(self, calls=(), errors=(), format: str = ""):
        super().__init__(calls)
        self.errors: list[ParseError] = list(errors)
        self.format = format


def _call_from_obj(
    obj: Any, fmt: str, snippet: str, index: int, arg_keys=("arguments", "parameters")
):
    """A ToolCall from a decoded JSON object, or a ParseError saying what is missing."""
    if not isinstance(obj, dict):
        return ParseError(fmt, f"expected a JSON object, got {type(obj).__name__}", snippet)
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ParseError(fmt, 'missing "name" (a non-empty string)', snippet)
    args: Any = {}
    for key in arg_keys:
        if key in obj:
            args = obj[key]
            break
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError):
            return ParseError(fmt, "arguments string is not valid JSON", snippet)
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return ParseError(
            fmt, f"arguments must be a JSON object, got {type(args).__name__}", snippet
        )
    return ToolCall(name=name, arguments=args, id=str(obj.get("id") or f"call_{index}"))


# --------------------------------------------------------------------------- hermes
_HERMES = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)


def _parse_hermes(text: str) -> ParsedCalls:
    out = ParsedCalls(format="hermes")
    for m in _HERMES.finditer(text):
        body = m.group(1).strip()
        body = re.sub(r"^```(?:json)?\s*|\s*```$", "", body)
        try:
            obj = json.loads(body)
        except (ValueError, RecursionError) as e:
            out.errors.append(ParseError("hermes", f"invalid JSON: {e}", body[:500]))
            continue
        item = _call_from_obj(obj, "hermes", body, len(out))
        (out.errors if isinstance(item, ParseError) else out).append(item)
    return out


def _render_hermes(calls: list[ToolCall]) -> str:
    def body(c: ToolCall) -> str:  # "<\/" keeps an end tag inside a string from closing the call
        return json.dumps({"name": c.name, "arguments": c.arguments}, ensure_ascii=False).replace(
            "</", "<\\/"
        )

    return "\n".join(f"<tool_call>\n{body(c)}\n</tool_call>" for c in calls)


# --------------------------------------------------------------------------- llama3 JSON
_LLAMA_START = re.compile(r'\{\s*"(?:name|type)"\s*:')
_DECODER = json.JSONDecoder()


def _parse_llama3(text: str) -> ParsedCalls:
    out = ParsedCalls(format="llama3")
    text = text.replace("<|python_tag|>", "")
    pos = 0
    while (m := _LLAMA_START.search(text, pos)) is not None:
        try:
            obj, end = _DECODER.raw_decode(text, m.start())
        except (ValueError, RecursionError) as e:
            out.errors.append(
                ParseError(
                    "llama3",
                    f"invalid JSON: {e.args[0] if e.args else e}",
                    text[m.start() : m.start() + 200],
                )
            )
            pos = m.end()
            continue
        snippet = text[m.start() : end]
        if isinstance(obj, dict) and ("parameters" in obj or "arguments" in obj or "name" in obj):
            item = _call_from_obj(obj, "llama3", snippet, len(out), ("parameters", "arguments"))
            (out.errors if isinstance(item, ParseError) else out).append(item)
        pos = end
    return out


def _render_llama3(calls: list[ToolCall]) -> str:
    return "; ".join(
        json.dumps({"name": c.name, "parameters": c.arguments}, ensure_ascii=False) for c in calls
    )


# --------------------------------------------------------------------------- gemma tool_code / python call syntax
_TOOL_CODE = re.compile(r"```tool_code[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)
_PY_FENCE = re.compile(r"```(?:python|py)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


def _literal(node: ast.AST) -> Any:
    """``ast.literal_eval`` plus ``true/false/null`` spelled the JSON way."""
    if isinstance(node, ast.Name) and node.id in ("true", "false", "null"):
        return {"true": True, "false": False, "null": None}[node.id]
    return ast.literal_eval(node)


def _calls_in_code(code: str, fmt: str) -> tuple[list[ToolCall], list[ParseError]]:
    calls: list[ToolCall] = []
    errors: list[ParseError] = []
    try:
        tree = ast.parse(code.strip(), mode="exec")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
        return [], [ParseError(fmt, f"not valid Python call syntax: {e}", code)]
    for stmt in tree.body:
        node = stmt.value if isinstance(stmt, ast.Expr) else None
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "print"
            and len(node.args) == 1
            and isinstance(node.args[0], ast.Call)
        ):
            node = node.args[0]  # print(fn(...))
        if not isinstance(node, ast.Call) or not isinstance(node.func, (ast.Name, ast.Attribute)):
            errors.append(
                ParseError(fmt, "expected a function call such as fn(a=1)", _seg(code, stmt))
            )
            continue
        name = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
        if node.args:
            errors.append(
                ParseError(
                    fmt,
                    f"{name}(...) uses positional arguments; use keywords: fn(a=1)",
                    _seg(code, stmt),
                )
            )
            continue
        try:
            args = {kw.arg: _literal(kw.value) for kw in node.keywords if kw.arg is not None}
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as e:
            errors.append(
                ParseError(fmt, f"argument values must be literals ({e})", _seg(code, stmt))
            )
            continue
        if any(kw.arg is None for kw in node.keywords):
            errors.append(
                ParseError(fmt, "**kwargs are not allowed in a tool call", _seg(code, stmt))
            )
            continue
        calls.append(ToolCall(name=name, arguments=args, id=""))
    return calls, errors


def _seg(code: str, node: ast.AST) -> str:
    try:
        return ast.get_source_segment(code.strip(), node) or code
    except Exception:  # noqa: BLE001
        return code


def _parse_gemma(text: str) -> ParsedCalls:
    out = ParsedCalls(format="gemma")
    for m in _TOOL_CODE.finditer(text):
        calls, errors = _calls_in_code(m.group(1), "gemma")
        base = len(out)
        out.extend([ToolCall(c.name, c.arguments, f"call_{base + i}") for i, c in enumerate(calls)])
        out.errors.extend(errors)
    return out


def _py_repr(value: Any) -> str:
    return repr(value)


def _render_gemma(calls: list[ToolCall]) -> str:
    lines = [
        f"{c.name}({', '.join(f'{k}={_py_repr(v)}' for k, v in c.arguments.items())})"
        for c in calls
    ]
    return "```tool_code\n" + "\n".join(lines) + "\n```"


def _parse_python(text: str, tool_name: str = "python") -> ParsedCalls:
    out = ParsedCalls(format="python")
    for m in _PY_FENCE.finditer(text):
        out.append(
            ToolCall(
                name=tool_name, arguments={"code": m.group(1).rstrip("\n")}, id=f"call_{len(out)}"
            )
        )
    return out


def _render_python(calls: list[ToolCall]) -> str:
    return "\n".join(f"```python\n{c.arguments.get('code', '')}\n```" for c in calls)


# --------------------------------------------------------------------------- dispatch
_PARSERS: dict[str, Callable[[str], ParsedCalls]] = {
    "hermes": _parse_hermes,
    "llama3": _parse_llama3,
    "gemma": _parse_gemma,
    "python": _parse_python,
}
_RENDERERS: dict[str, Callable[[list[ToolCall]], str]] = {
    "hermes": _render_hermes,
    "llama3": _render_llama3,
    "gemma": _render_gemma,
    "python": _render_python,
}
_ALIASES = {
    "qwen": "hermes",
    "qwen2": "hermes",
    "qwen3": "hermes",
    "smollm": "hermes",
    "llama": "llama3",
    "llama3.1": "llama3",
    "llama3.2": "llama3",
    "json": "llama3",
    "gemma3": "gemma",
    "tool_code": "gemma",
}
_MARKERS = (
    ("hermes", lambda t: "<tool_call>" in t),
    ("gemma", lambda t: "```tool_code" in t),
    ("llama3", lambda t: _LLAMA_START.search(t) is not None),
)
FORMATS = (*_PARSERS, "auto")


def check_format(format: str) -> str:
    fmt = _ALIASES.get(format, format) if isinstance(format, str) else format
    if fmt not in FORMATS:
        raise ConfigError(
            explain(
                "tool-call format",
                expected=f"one of {list(FORMATS)} (or {sorted(_ALIASES)})",
                received=format,
                fix="pass format='hermes' for Qwen-style models",
            )
        )
    return fmt


def has_tool_call(text: str, format: str = "auto") -> bool:
    """Whether ``text`` holds anything that looks like a call in ``format`` (parsable or not)."""
    calls = parse_tool_calls(text, format)
    return bool(calls) or bool(calls.errors)


def parse_tool_calls(text: str, format: str = "auto") -> ParsedCalls:
    """Every tool call in ``text`` (in order), with ``.errors`` for fragments that could not be read."""
    fmt = check_format(format)
    if not isinstance(text, str):
        return ParsedCalls(
            errors=[ParseError(fmt, f"expected text, got {type(text).__name__}", repr(text)[:200])],
            format=fmt,
        )
    if fmt == "auto":
        for name, present in _MARKERS:
            if present(text):
                return _PARSERS[name](text)
        return ParsedCalls(format="auto")
    return _PARSERS[fmt](text)


def format_tool_calls(calls: list[ToolCall], format: str = "hermes") -> str:
    """Render calls the way a model of that family writes them (the inverse of :func:`parse_tool_calls`)."""
    fmt = check_format(format)
    if fmt == "auto":
        fmt = "hermes"
    return _RENDERERS[fmt](list(calls))
