"""The OpenAI-compatible server's request side: client errors, validation messages, body limits, and the
mapping of validated request bodies to engine inputs (sampling parameters, token-id prompts, chat messages).

Every client error is a :class:`RequestError`, answered by :func:`error_response` with an OpenAI-style
``{"error": {"message", "type", "param", "code"}}`` body whose message says what was expected, what was
received and how to fix it.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Sequence

from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response

from gymllm.errors import ConfigError, GymLLMError
from gymllm.inference.params import SamplingParams
from gymllm.inference.server_models import ErrorResponse
from gymllm.utils.serving import TOO_LARGE, read_body, replaying

__all__ = [
    "RequestError",
    "error_response",
    "ERROR_RESPONSES",
    "validation_error",
    "PARAM_FIELDS",
    "sampling_params_from_body",
    "prompts_from_body",
    "template_messages",
    "render_chat",
    "BodyLimit",
]


class RequestError(GymLLMError, ValueError):
    """A client error: answered with ``status`` and an OpenAI-style error body."""

    def __init__(
        self, message: str, *, status: int = 400, param: str | None = None, code: str | None = None
    ):
        super().__init__(message)
        self.status, self.param, self.code = status, param, code


def error_response(exc: RequestError) -> Response:
    """The error body as ASCII JSON (a lone surrogate echoed from the request cannot break it)."""
    kind = "invalid_request_error" if exc.status < 500 else "server_error"
    if exc.status == 401:
        kind = "authentication_error"
    body = {"error": {"message": str(exc), "type": kind, "param": exc.param, "code": exc.code}}
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
    return Response(
        json.dumps(body, ensure_ascii=True),
        status_code=exc.status,
        media_type="application/json",
        headers=headers,
    )


ERROR_RESPONSES = {s: {"model": ErrorResponse} for s in (400, 401, 404, 409, 413, 429, 500, 503)}

# what a field expects, and how to fix it, for validation messages
_EXPECTED = {
    "prompt": (
        "a string, a list of token ids, or a list of those",
        'send e.g. "prompt": [1, 2, 3] or "prompt": "Hello"',
    ),
    "messages": (
        'a non-empty list of {"role": ..., "content": ...} objects',
        "send at least one message",
    ),
}


def _is_union_tag(part: str) -> bool:
    """pydantic's names for union branches in an error location ("str", "list[int]", "function-after[...]")."""
    return (
        "[" in part
        or part in {"str", "int", "float", "bool", "dict", "list", "none"}
        or part.startswith(("function-", "json-or-python", "constrained-"))
    )


def validation_error(exc: RequestValidationError) -> RequestError:
    """FastAPI's validation errors -> one clear RequestError naming the first bad field."""
    errors = exc.errors()
    e = errors[0] if errors else {"type": "", "loc": (), "msg": "invalid request"}
    loc = [str(x) for x in e.get("loc", ()) if x != "body"]
    if e.get("type") == "json_invalid":
        detail = (e.get("ctx") or {}).get("error", e.get("msg"))
        return RequestError(
            f"invalid JSON body: {detail}. Fix: send a JSON object", code="invalid_json"
        )
    received = e.get("input")
    if not loc:
        what = (
            "a body that is not JSON"
            if isinstance(received, (bytes, str))
            else type(received).__name__
        )
        return RequestError(
            f"body: expected a JSON object (Content-Type: application/json), received {what}. "
            "Fix: send a JSON object with the request's fields"
        )
    field = loc[0]
    path = ".".join(x for x in loc if not _is_union_tag(x))
    received = (
        "nothing (the field is required)" if e.get("type") == "missing" else repr(received)[:100]
    )
    if path == field and field in _EXPECTED:
        expected, fix = _EXPECTED[field]
        why = [
            x.get("msg") for x in errors if x.get("type") == "value_error"
        ]  # e.g. a lone surrogate
        detail = f" ({why[0]})" if why else ""
        return RequestError(
            f"{path}: expected {expected}, received {received}{detail}. Fix: {fix}", param=field
        )
    return RequestError(
        f"{path}: {e.get('msg', 'invalid value')}; received {received}. Fix: correct this field "
        "(the schema is at /openapi.json)",
        param=field,
    )


# ---------------------------------------------------------------- request mapping (pure)
PARAM_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "stop",
    "stop_token_ids",
    "seed",
    "n",
)


def sampling_params_from_body(body: Any, *, default_max_tokens: int = 256) -> SamplingParams:
    """Map OpenAI request fields (a model or a dict) to :class:`SamplingParams` (``max_completion_tokens`` too)."""
    get = body.get if isinstance(body, dict) else (lambda k, d=None: getattr(body, k, d))
    kw: dict[str, Any] = {k: get(k) for k in PARAM_FIELDS if get(k) is not None}
    if get("max_completion_tokens") is not None and "max_tokens" not in kw:
        kw["max_tokens"] = get("max_completion_tokens")
    kw.setdefault("max_tokens", default_max_tokens)
    if kw.get("top_k") == -1:  # vLLM's spelling of "off"
        kw["top_k"] = 0
    try:
        return SamplingParams(**kw)
    except (ConfigError, TypeError) as exc:
        field = next((f for f in PARAM_FIELDS if f"SamplingParams.{f}" in str(exc)), None)
        raise RequestError(str(exc), param=field) from None


def prompts_from_body(prompt: Any, tokenizer: Any) -> list[list[int]]:
    """``prompt`` (validated: text, token ids, or a list of either) -> a list of token-id prompts."""
    items = (
        [prompt]
        if isinstance(prompt, str) or not prompt or isinstance(prompt[0], int)
        else list(prompt)
    )
    out = []
    for p in items:
        if isinstance(p, str):
            if tokenizer is None:
                raise RequestError(
                    "prompt: text needs a server tokenizer; send token ids instead", param="prompt"
                )
            p = tokenizer.encode(p)
        if not p:
            raise RequestError(
                "prompt: expected at least one token, received an empty prompt. "
                "Fix: send a non-empty prompt",
                param="prompt",
            )
        out.append([int(t) for t in p])
    return out


def template_messages(messages: Sequence[Any]) -> list[dict]:
    """Validated chat messages -> the dicts a chat template renders (content parts joined, tool-call
    arguments as objects when they are JSON text)."""
    out = []
    for m in messages:
        d: dict[str, Any] = {"role": m.role}
        content = m.content
        if isinstance(content, list):
            content = "".join(p.text for p in content)
        d["content"] = content or ""
        if m.tool_calls:
            calls = []
            for c in m.tool_calls:
                args = c.function.arguments
                if isinstance(args, str):
                    try:
                        args = json.loads(args) if args.strip() else {}
                    except ValueError:
                        pass
                calls.append(
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.function.name, "arguments": args},
                    }
                )
            d["tool_calls"] = calls
        if m.tool_call_id is not None:
            d["tool_call_id"] = m.tool_call_id
        if m.name is not None:
            d["name"] = m.name
        out.append(d)
    return out


def render_chat(messages: list[dict], tools: list | None, tokenizer: Any) -> list[int]:
    if tokenizer is None:
        raise RequestError(
            "chat completions need a server tokenizer with a chat template", status=400
        )
    try:
        ids = tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=True
        )
    except Exception as exc:  # a template error is the client's message shape
        raise RequestError(
            f"messages: the chat template could not render them: {exc!r}"[:500], param="messages"
        ) from None
    if not ids:
        raise RequestError(
            "messages: rendered to an empty prompt. Fix: send some content", param="messages"
        )
    return list(ids)


class BodyLimit:
    """ASGI middleware: a request body over ``max_bytes`` gets a 413, by its Content-Length before
    anything is read, or, for a chunked body, as soon as more than ``max_bytes`` arrived (at most
    that much is buffered, then handed to the app)."""

    def __init__(self, app: Any, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        too_big = RequestError(
            f"body: expected at most {self.max_bytes} bytes, received more. Fix: send a smaller "
            "request (or start the server with a larger max_body_bytes)",
            status=413,
            code="request_too_large",
        )
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await error_response(too_big)(scope, receive, send)
        if length is not None and length.isdigit():
            return await self.app(
                scope, receive, send
            )  # the server reads at most Content-Length bytes
        body = await read_body(
            receive, self.max_bytes
        )  # chunked: read at most max_bytes, then replay to the app
        if body is TOO_LARGE:
            return await error_response(too_big)(scope, receive, send)
        if body is not None:  # else the client went away
            await self.app(scope, replaying(body, receive), send)
