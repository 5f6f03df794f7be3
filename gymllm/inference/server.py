"""An OpenAI-compatible HTTP server over any :class:`~gymllm.inference.Engine` (FastAPI + uvicorn).

    app = build_app(engine, tokenizer, "smollm2")
    serve(engine, tokenizer, "smollm2", host="127.0.0.1", port=8000)   # blocks (``gymllm serve``)
    with ServerThread(app) as server: ...server.url...                 # loopback, free port

Routes: ``POST /v1/completions`` (``prompt`` as text, one list of token ids, or a list of either),
``POST /v1/chat/completions`` (rendered with the tokenizer's chat template), both streaming (SSE,
``"stream": true``) and not; ``GET /v1/models``; ``GET /health``; in training mode (a
:class:`~gymllm.inference.proxy.SessionRecorder`) also ``POST /v1/sessions/{id}/reward`` and
``GET /v1/training/stats``. Bodies and answers are the pydantic models of
:mod:`gymllm.inference.server_models`, published at ``/openapi.json``.

Beyond OpenAI's fields every choice carries ``token_ids`` (sampled ids, the stop token included),
``versions`` (policy version per token) and ``prompt_token_ids``, and ``logprobs`` are returned
whenever requested (values under the temperature-processed distribution). As in OpenAI's API the
text leaves out the stop token or stop string that ended it. With ``tools`` in a chat request, tool
calls the model wrote in its family's format (``gymllm.tools.parsers``) come back as the message's
``tool_calls`` with ``finish_reason: "tool_calls"``. Request extensions: ``top_k``,
``stop_token_ids``, ``session_id`` (prefix reuse across a trajectory's turns); the vLLM flags
``return_token_ids`` / ``return_tokens_as_token_ids`` are accepted; unknown fields are ignored.

Limits (:class:`~gymllm.inference.server_models.ServerConfig`): ``n <= max_n``, ``max_tokens`` at most
the context, at most ``max_prompts`` prompts, bodies over ``max_body_bytes`` get a 413. Binds to
loopback by default; binding any other address needs an API key, then checked as
``Authorization: Bearer <key>`` on ``/v1/*`` (401 without it).

Bad requests get a 4xx with an OpenAI-style ``{"error": {"message", "type", "param", "code"}}``
body and the server keeps serving: invalid JSON, wrong types, lone surrogates, empty prompt, prompt
longer than the context, unknown model, out-of-range fields.
"""

import asyncio
import hmac
import ipaddress
import json
import socket
import threading
import time
import uuid
from typing import Any, AsyncIterator, Callable, Sequence

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException

from gymllm.errors import ConfigError, EngineError, GymLLMError, explain
from gymllm.inference.completion import Completion
from gymllm.inference.params import SamplingParams
from gymllm.inference.proxy import Plan, SessionError, SessionRecorder
from gymllm.inference.server_models import (ChatCompletionResponse, CompletionResponse, ErrorResponse, Health,
                                            ModelList, RewardRequest, RewardResponse, ServerConfig, max_tokens_cap,
                                            request_models)


class RequestError(GymLLMError, ValueError):
    """A client error: answered with ``status`` and an OpenAI-style error body."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.param, self.code = status, param, code


def error_response(exc: RequestError) -> Response:
    """The error body as ASCII JSON (a lone surrogate echoed from the request cannot break it)."""
    kind = "invalid_request_error" if exc.status < 500 else "server_error"
    if exc.status == 401:
        kind = "authentication_error"
    body = {"error": {"message": str(exc), "type": kind, "param": exc.param, "code": exc.code}}
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
    return Response(json.dumps(body, ensure_ascii=True), status_code=exc.status, media_type="application/json",
                    headers=headers)


_ERRORS = {s: {"model": ErrorResponse} for s in (400, 401, 404, 409, 413, 429, 500, 503)}

# what a field expects, and how to fix it, for validation messages
_EXPECTED = {
    "prompt": ("a string, a list of token ids, or a list of those", 'send e.g. "prompt": [1, 2, 3] or "prompt": "Hello"'),
    "messages": ('a non-empty list of {"role": ..., "content": ...} objects', "send at least one message"),
}


def _is_union_tag(part: str) -> bool:
    """pydantic's names for union branches in an error location ("str", "list[int]", "function-after[...]")."""
    return "[" in part or part in {"str", "int", "float", "bool", "dict", "list", "none"} or \
        part.startswith(("function-", "json-or-python", "constrained-"))


def validation_error(exc: RequestValidationError) -> RequestError:
    """FastAPI's validation errors -> one clear RequestError naming the first bad field."""
    errors = exc.errors()
    e = errors[0] if errors else {"type": "", "loc": (), "msg": "invalid request"}
    loc = [str(x) for x in e.get("loc", ()) if x != "body"]
    if e.get("type") == "json_invalid":
        detail = (e.get("ctx") or {}).get("error", e.get("msg"))
        return RequestError(f"invalid JSON body: {detail}. Fix: send a JSON object", code="invalid_json")
    received = e.get("input")
    if not loc:
        what = "a body that is not JSON" if isinstance(received, (bytes, str)) else type(received).__name__
        return RequestError(f"body: expected a JSON object (Content-Type: application/json), received {what}. "
                            "Fix: send a JSON object with the request's fields")
    field = loc[0]
    path = ".".join(x for x in loc if not _is_union_tag(x))
    received = "nothing (the field is required)" if e.get("type") == "missing" else repr(received)[:100]
    if path == field and field in _EXPECTED:
        expected, fix = _EXPECTED[field]
        why = [x.get("msg") for x in errors if x.get("type") == "value_error"]  # e.g. a lone surrogate
        detail = f" ({why[0]})" if why else ""
        return RequestError(f"{path}: expected {expected}, received {received}{detail}. Fix: {fix}", param=field)
    return RequestError(f"{path}: {e.get('msg', 'invalid value')}; received {received}. Fix: correct this field "
                        "(the schema is at /openapi.json)", param=field)


# ---------------------------------------------------------------- request mapping (pure)
_PARAM_FIELDS = ("temperature", "top_p", "top_k", "max_tokens", "stop", "stop_token_ids", "seed", "n")


def sampling_params_from_body(body: Any, *, default_max_tokens: int = 256) -> SamplingParams:
    """Map OpenAI request fields (a model or a dict) to :class:`SamplingParams` (``max_completion_tokens`` too)."""
    get = body.get if isinstance(body, dict) else (lambda k, d=None: getattr(body, k, d))
    kw: dict[str, Any] = {k: get(k) for k in _PARAM_FIELDS if get(k) is not None}
    if get("max_completion_tokens") is not None and "max_tokens" not in kw:
        kw["max_tokens"] = get("max_completion_tokens")
    kw.setdefault("max_tokens", default_max_tokens)
    if kw.get("top_k") == -1:  # vLLM's spelling of "off"
        kw["top_k"] = 0
    try:
        return SamplingParams(**kw)
    except (ConfigError, TypeError) as exc:
        field = next((f for f in _PARAM_FIELDS if f"SamplingParams.{f}" in str(exc)), None)
        raise RequestError(str(exc), param=field) from None


def prompts_from_body(prompt: Any, tokenizer: Any) -> list[list[int]]:
    """``prompt`` (validated: text, token ids, or a list of either) -> a list of token-id prompts."""
    items = [prompt] if isinstance(prompt, str) or not prompt or isinstance(prompt[0], int) else list(prompt)
    out = []
    for p in items:
        if isinstance(p, str):
            if tokenizer is None:
                raise RequestError("prompt: text needs a server tokenizer; send token ids instead", param="prompt")
            p = tokenizer.encode(p)
        if not p:
            raise RequestError("prompt: expected at least one token, received an empty prompt. "
                               "Fix: send a non-empty prompt", param="prompt")
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
                calls.append({"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": args}})
            d["tool_calls"] = calls
        if m.tool_call_id is not None:
            d["tool_call_id"] = m.tool_call_id
        if m.name is not None:
            d["name"] = m.name
        out.append(d)
    return out


def render_chat(messages: list[dict], tools: list | None, tokenizer: Any) -> list[int]:
    if tokenizer is None:
        raise RequestError("chat completions need a server tokenizer with a chat template", status=400)
    try:
        ids = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True)
    except Exception as exc:  # a template error is the client's message shape
        raise RequestError(f"messages: the chat template could not render them: {exc!r}"[:500], param="messages") from None
    if not ids:
        raise RequestError("messages: rendered to an empty prompt. Fix: send some content", param="messages")
    return list(ids)


# ---------------------------------------------------------------- response shaping (pure)
def visible_ids(c: Completion) -> list[int]:
    """The sampled ids the text shows: all but a final stop token (its id stays in ``token_ids``)."""
    ids = [int(t) for t in c.token_ids]
    if ids and c.finish_reason == "stop" and isinstance(c.stop_reason, int) and ids[-1] == c.stop_reason:
        ids = ids[:-1]
    return ids


def visible_text(c: Completion, tokenizer: Any) -> str:
    """The completion's text without the stop token or stop string that ended it (OpenAI's rule)."""
    if tokenizer is None:
        return c.text or ""
    text = tokenizer.decode(visible_ids(c))
    if c.finish_reason == "stop" and isinstance(c.stop_reason, str):
        i = text.find(c.stop_reason)
        if i >= 0:
            text = text[:i]
    return text


class TextDelta:
    """Incremental detokenization that never emits half a UTF-8 character and holds back a possible
    stop token until the next token shows it was not the end."""

    def __init__(self, tokenizer: Any, stop_ids: frozenset[int] = frozenset()):
        self.tokenizer, self.stop_ids, self.ids, self.sent = tokenizer, stop_ids, [], ""

    def _text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    def push(self, token: int) -> str:
        self.ids.append(int(token))
        if self.tokenizer is None:
            return ""
        shown = self.ids[:-1] if self.ids[-1] in self.stop_ids else self.ids
        text = self._text(shown)
        if text.endswith("\ufffd") or not text.startswith(self.sent):
            return ""
        delta, self.sent = text[len(self.sent):], text
        return delta

    def flush(self, final: Completion) -> str:
        """Whatever is still held back, less the stop token or stop string that ended the request."""
        if self.tokenizer is None:
            return ""
        text = visible_text(final, self.tokenizer)
        if not text.startswith(self.sent):  # a stop string already partly sent: nothing more to add
            return ""
        delta, self.sent = text[len(self.sent):], text
        return delta


def _token_strings(tokenizer: Any, ids: Sequence[int], as_ids: bool) -> list[str]:
    if as_ids or tokenizer is None:
        return [f"token_id:{int(t)}" for t in ids]
    return [tokenizer.decode([int(t)]) for t in ids]


def _record(c: Completion, prompt: list[int]) -> dict[str, Any]:
    return {"finish_reason": c.finish_reason, "stop_reason": c.stop_reason, "token_ids": [int(t) for t in c.token_ids],
            "versions": [int(v) for v in c.versions], "prompt_token_ids": prompt}


def completion_choice(index: int, c: Completion, prompt: list[int], tokenizer: Any, body: Any) -> dict:
    logprobs = None
    if body.logprobs is not None:
        logprobs = {"tokens": _token_strings(tokenizer, c.token_ids, bool(body.return_tokens_as_token_ids)),
                    "token_logprobs": [float(x) for x in c.logprobs], "top_logprobs": None, "text_offset": None}
    return {"index": index, "text": visible_text(c, tokenizer), "logprobs": logprobs, **_record(c, prompt)}


_CALL_MARKERS = ("<tool_call>", "```tool_code", "<|python_tag|>")


def split_tool_calls(text: str, fmt: str) -> tuple[str | None, list[dict]]:
    """``(content, tool_calls)`` of an assistant text in the model's tool-call format."""
    from gymllm.tools.parsers import parse_tool_calls

    calls = parse_tool_calls(text, fmt)
    if not calls:
        return text, []
    cut = min((i for i in (text.find(m) for m in _CALL_MARKERS) if i >= 0), default=0)
    content = text[:cut].strip() or None
    out = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}} for c in calls]
    return content, out


def chat_choice(index: int, c: Completion, prompt: list[int], tokenizer: Any, body: Any,
                tool_format: str | None = None) -> dict:
    text = visible_text(c, tokenizer)
    record = _record(c, prompt)
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_format and c.finish_reason != "length":
        content, calls = split_tool_calls(text, tool_format)
        if calls:
            message = {"role": "assistant", "content": content, "tool_calls": calls}
            record["finish_reason"] = "tool_calls"
    logprobs = None
    if body.logprobs:
        toks = _token_strings(tokenizer, c.token_ids, bool(body.return_tokens_as_token_ids))
        logprobs = {"content": [{"token": t, "logprob": float(lp), "bytes": list(t.encode()), "top_logprobs": []}
                                for t, lp in zip(toks, c.logprobs)]}
    return {"index": index, "message": message, "logprobs": logprobs, **record}


def _usage(prompts: list[list[int]], completions: list[Completion]) -> dict[str, Any]:
    p = sum(len(x) for x in prompts)
    n = sum(c.num_tokens for c in completions)
    cached = sum(c.cached_prompt_len for c in completions)  # prompt tokens served from a reused prefix
    return {"prompt_tokens": p, "completion_tokens": n, "total_tokens": p + n,
            "prompt_tokens_details": {"cached_tokens": cached}}


# ---------------------------------------------------------------- engine calls
async def _run_one(engine: Any, prompt: list[int], params: SamplingParams, session_id: str | None) -> list[Completion]:
    """``params.n`` completions of one prompt through whatever the engine offers."""
    try:
        if params.n == 1:
            return [await engine.generate(prompt, params, session_id=session_id)]
        if hasattr(engine, "generate_n"):
            return list(await engine.generate_n(prompt, params))
        one = params.replace(n=1)
        seeds = [None if params.seed is None else params.seed + i for i in range(params.n)]
        return list(await asyncio.gather(*(engine.generate(prompt, one.replace(seed=s)) for s in seeds)))
    except EngineError as exc:  # a failure inside the engine is the server's fault, the rest the client's
        failed = type(exc).__name__ == "RequestFailed"
        raise RequestError(str(exc), status=500 if failed else 400, param=None if failed else "prompt") from None


def _check_prompt(engine: Any, prompt: list[int], max_len: int | None) -> None:
    if hasattr(engine, "validate_prompt"):
        try:
            engine.validate_prompt(prompt)
        except EngineError as exc:
            raise RequestError(str(exc), param="prompt", code="context_length_exceeded"
                               if "at most" in str(exc) else None) from None
    elif max_len is not None and len(prompt) >= max_len:
        raise RequestError(f"prompt: expected at most {max_len - 1} tokens, received {len(prompt)}. "
                           "Fix: shorten the prompt", param="prompt", code="context_length_exceeded")


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj)}\n\n"


async def _stream_tokens(engine: Any, prompt: list[int], params: SamplingParams, session_id: str | None
                         ) -> AsyncIterator[tuple[int, float, int] | Completion]:
    if hasattr(engine, "stream"):
        async for item in engine.stream(prompt, params, session_id=session_id):
            yield item
        return
    c = await engine.generate(prompt, params, session_id=session_id)  # no token stream: one burst
    for t, lp, v in zip(c.token_ids, c.logprobs, c.versions):
        yield int(t), float(lp), int(v)
    yield c


# ---------------------------------------------------------------- guards
def is_loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, api_key: str | None) -> None:
    """Refuse to bind a non-loopback address without an API key (a clear error at startup)."""
    if not is_loopback(host) and not api_key:
        raise ConfigError(explain("server host", expected="a loopback address (127.0.0.1, ::1, localhost), or an "
                                  "API key when binding any other address", received=f"{host!r} without an API key",
                                  fix="pass --api-key KEY (or set GYMLLM_API_KEY), or bind --host 127.0.0.1"))


class BodyLimit:
    """ASGI middleware: a request body over ``max_bytes`` gets a 413, by its Content-Length before
    anything is read, or, for a chunked body, as soon as more than ``max_bytes`` arrived (at most
    that much is buffered, then handed to the app)."""

    def __init__(self, app: Any, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        too_big = RequestError(f"body: expected at most {self.max_bytes} bytes, received more. Fix: send a smaller "
                               "request (or start the server with a larger max_body_bytes)", status=413,
                               code="request_too_large")
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await error_response(too_big)(scope, receive, send)
        if length is not None and length.isdigit():
            return await self.app(scope, receive, send)  # the server reads at most Content-Length bytes
        chunks, seen, more = [], 0, True  # chunked: read at most max_bytes, then replay to the app
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunks.append(message.get("body", b""))
            seen += len(chunks[-1])
            more = message.get("more_body", False)
            if seen > self.max_bytes:
                return await error_response(too_big)(scope, receive, send)
        body, replayed = b"".join(chunks), False

        async def replay() -> dict:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


# ---------------------------------------------------------------- the app
def _session_of(request: Request, body: Any) -> tuple[str | None, str | None, str | None]:
    h = request.headers
    meta = body.metadata or {}
    gid, tid = meta.get("group_id"), meta.get("task_id")
    sid = h.get("x-session-id") or body.user
    return (sid, h.get("x-group-id") or (str(gid) if gid is not None else None),
            h.get("x-task-id") or (str(tid) if tid is not None else None))


def build_app(engine: Any, tokenizer: Any, model_name: str, *, max_len: int | None = None,
              default_max_tokens: int | None = None, config: ServerConfig | None = None,
              recorder: SessionRecorder | None = None, admission: Callable[[], Any] | None = None,
              tool_format: str | None = None):
    """A FastAPI app serving ``engine`` as ``model_name``.

    config: limits and the API key (:class:`ServerConfig`); recorder: training mode (see
    :mod:`gymllm.inference.proxy`); admission: an async callable awaited before a session's first
    request, returning False when the trainer's queue stays full (then a 503); tool_format: the
    parser format for ``tool_calls`` (default: :func:`tool_format_for` the tokenizer).
    """
    config = config or ServerConfig()
    if default_max_tokens is not None:
        config = ServerConfig(**{**config.__dict__, "default_max_tokens": default_max_tokens})
    max_len = max_len or getattr(engine, "max_len", None)
    fmt = tool_format if tool_format is not None else tool_format_for(tokenizer)
    fmt = None if fmt == "none" else fmt
    CompletionRequest, ChatRequest = request_models(config, max_len)
    cap = max_tokens_cap(config, max_len)
    default_tokens = min(config.default_max_tokens, cap) if cap else config.default_max_tokens
    app = FastAPI(title="gymllm", version="0.1.0", description=__doc__.split("\n\n")[0])
    app.state.engine, app.state.config, app.state.recorder = engine, config, recorder
    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes)
    bearer = HTTPBearer(auto_error=False)
    stop_ids = frozenset(int(i) for i in (getattr(engine, "default_stop_ids", None)
                                          or getattr(tokenizer, "stop_token_ids", ()) or ()))

    async def authorize(cred: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        if config.api_key is None:
            return
        if cred is None or not hmac.compare_digest(cred.credentials.encode(), config.api_key.encode()):
            raise RequestError("Authorization: expected 'Bearer <the server's API key>', received "
                               f"{'no key' if cred is None else 'a wrong key'}. Fix: send the key given to "
                               "gymllm serve --api-key", status=401, code="invalid_api_key")

    @app.exception_handler(RequestError)
    async def _request_error(_: Request, exc: RequestError):
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError):
        return error_response(validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException):
        return error_response(RequestError(str(exc.detail), status=exc.status_code))

    def check_model(body: Any) -> None:
        if body.model is not None and body.model != model_name:
            raise RequestError(f"model: expected {model_name!r}, received {body.model!r}. Fix: use a model listed by "
                               "GET /v1/models", status=404, param="model", code="model_not_found")

    @app.get("/health", response_model=Health)
    async def health():
        return {"status": "ok", "model": model_name, "version": int(getattr(engine, "version", 0))}

    @app.get("/v1/models", response_model=ModelList, responses=_ERRORS, dependencies=[Depends(authorize)])
    async def models():
        card = {"id": model_name, "object": "model", "created": 0, "owned_by": "gymllm", "max_model_len": max_len}
        return {"object": "list", "data": [card]}

    def head(chat: bool) -> dict[str, Any]:
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
                "model": model_name}

    async def plan_session(request: Request, body: Any, make_plan: Callable[..., Plan]) -> Plan | None:
        if recorder is None:
            return None
        sid, gid, tid = _session_of(request, body)
        if sid is None:
            return None
        if not recorder.is_open(sid) and admission is not None and not await admission():
            raise RequestError("training mode: the trainer's group queue stayed full; expected room for a new "
                               "session. Fix: retry later (the learner is behind)", status=503, code="queue_full")
        try:
            return make_plan(sid, group_id=gid, task_id=tid, version=int(getattr(engine, "version", 0)))
        except SessionError as exc:
            raise RequestError(str(exc), status=exc.status, code="session") from None

    @app.post("/v1/completions", response_model=CompletionResponse, responses=_ERRORS,
              dependencies=[Depends(authorize)])
    async def completions(body: CompletionRequest, request: Request):  # type: ignore[valid-type]
        check_model(body)
        params = sampling_params_from_body(body, default_max_tokens=default_tokens)
        prompts = prompts_from_body(body.prompt, tokenizer)
        for p in prompts:
            _check_prompt(engine, p, max_len)
        plan = None
        if recorder is not None and len(prompts) == 1:
            plan = await plan_session(request, body, lambda sid, **kw: recorder.plan_tokens(sid, prompts[0], **kw))
        _training_checks(plan, params, len(prompts))
        return await respond(body, head(False), prompts, params, False, plan)

    @app.post("/v1/chat/completions", response_model=ChatCompletionResponse, responses=_ERRORS,
              dependencies=[Depends(authorize)])
    async def chat_completions(body: ChatRequest, request: Request):  # type: ignore[valid-type]
        check_model(body)
        params = sampling_params_from_body(body, default_max_tokens=default_tokens)
        messages = template_messages(body.messages)
        tools = [t.model_dump() for t in body.tools] if body.tools else None
        plan = await plan_session(request, body, lambda sid, **kw: recorder.plan_chat(sid, messages, tools, **kw))
        prompt = plan.prompt_ids if plan is not None else render_chat(messages, tools, tokenizer)
        _check_prompt(engine, prompt, max_len)
        _training_checks(plan, params, 1)
        return await respond(body, head(True), [prompt], params, True, plan, tools=bool(tools))

    def _training_checks(plan: Plan | None, params: SamplingParams, num_prompts: int) -> None:
        if cap is not None and params.max_tokens > cap:
            raise RequestError(f"max_tokens: expected at most {cap} (the context length), received "
                               f"{params.max_tokens}. Fix: ask for fewer tokens", param="max_tokens")
        if plan is not None and params.n != 1:
            raise RequestError(f"n: expected 1 in a training session, received {params.n}. Fix: run each sample "
                               "as its own session (one session per episode)", param="n")

    async def respond(body: Any, hd: dict, prompts: list[list[int]], params: SamplingParams, chat: bool,
                      plan: Plan | None, tools: bool = False):
        use_fmt = fmt if (tools and getattr(body, "tool_choice", None) != "none") else None
        session_id = body.session_id or (plan.session_id if plan is not None else None)  # prefix reuse
        on_done = None
        if plan is not None:
            def on_done(c: Completion, choice: dict) -> None:
                recorder.record(plan, c, choice.get("message"), choice.get("finish_reason"))
        if body.stream:
            if len(prompts) != 1 or params.n != 1:
                raise RequestError("stream: expected one prompt and n == 1 when streaming, received "
                                   f"{len(prompts)} prompts and n={params.n}. Fix: send them as separate requests",
                                   param="stream")
            gen = _stream_response(engine, tokenizer, hd, prompts[0], params, session_id, chat, body,
                                   stop_ids | set(params.stop_token_ids), use_fmt, on_done)
            return StreamingResponse(gen, media_type="text/event-stream")
        results = await asyncio.gather(*(_run_one(engine, p, params, session_id) for p in prompts))
        choices, flat = [], []
        for p, comps in zip(prompts, results):
            for c in comps:
                choice = chat_choice(len(choices), c, p, tokenizer, body, use_fmt) if chat else \
                    completion_choice(len(choices), c, p, tokenizer, body)
                if on_done is not None:
                    on_done(c, choice)
                choices.append(choice)
                flat.append(c)
        return {**hd, "choices": choices, "usage": _usage(prompts, flat)}

    if recorder is not None:
        @app.post("/v1/sessions/{session_id}/reward", response_model=RewardResponse, responses=_ERRORS,
                  dependencies=[Depends(authorize)])
        async def reward(session_id: str, body: RewardRequest):
            try:
                closed = recorder.close(session_id, body.reward, body.info)
            except SessionError as exc:
                raise RequestError(str(exc), status=exc.status, code="session") from None
            end = getattr(engine, "end_session", None)
            if end is not None:
                end(session_id)  # free the engine's cached prefix of this episode
            return {"session_id": session_id, "group_id": closed.group_id, "reward": closed.reward,
                    "segments": len(closed.segments), "model_calls": closed.model_calls,
                    "sampled_tokens": sum(s.num_sampled for s in closed.segments)}

        @app.get("/v1/training/stats", dependencies=[Depends(authorize)])
        async def training_stats() -> dict[str, int]:
            return recorder.stats()

    return app


def tool_format_for(tokenizer: Any, family: str | None = None) -> str:
    """The ``gymllm.tools.parsers`` format a model writes tool calls in: read from its chat template's
    markup when it has one (``<tool_call>``: hermes, ``tool_code``: gemma, ``<|python_tag|>``: llama3),
    else from the family, else ``"auto"``."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if "<tool_call>" in template:
        return "hermes"
    if "tool_code" in template:
        return "gemma"
    if "<|python_tag|>" in template or "ipython" in template:
        return "llama3"
    fam = (family or "").lower()
    if fam.startswith(("qwen", "smollm")):
        return "hermes"
    if fam.startswith("gemma"):
        return "gemma"
    if fam.startswith("llama"):
        return "llama3"
    return "auto"


async def _stream_response(engine, tokenizer, head, prompt, params, session_id, chat: bool, body: Any,
                           stop_ids: frozenset, tool_format: str | None, on_done: Callable | None):
    """SSE chunks: one per token (text delta, token id, logprob, version), a final one, [DONE]."""
    obj = "chat.completion.chunk" if chat else "text_completion"
    delta = TextDelta(tokenizer, frozenset(stop_ids))
    as_ids = bool(body.return_tokens_as_token_ids)
    if chat:
        yield _sse({**head, "object": obj, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                         "finish_reason": None}]})
    try:
        async for item in _stream_tokens(engine, prompt, params, session_id):
            if isinstance(item, Completion):
                rest = delta.flush(item)
                final: dict[str, Any] = {"index": 0, "finish_reason": item.finish_reason, "stop_reason": item.stop_reason}
                if chat:
                    choice = chat_choice(0, item, prompt, tokenizer, body, tool_format)
                    final["finish_reason"] = choice["finish_reason"]
                    final["delta"] = {"content": rest} if rest else {}
                    if choice["message"].get("tool_calls"):
                        final["delta"]["tool_calls"] = [{"index": i, **c} for i, c in
                                                        enumerate(choice["message"]["tool_calls"])]
                    if on_done is not None:
                        on_done(item, choice)
                else:
                    final["text"] = rest
                    if on_done is not None:
                        on_done(item, final)
                yield _sse({**head, "object": obj, "choices": [final], "usage": _usage([prompt], [item])})
                break
            token, logprob, version = item
            text = delta.push(token)
            choice = {"index": 0, "finish_reason": None, "token_ids": [token], "versions": [version], "logprob": logprob}
            tok_str = _token_strings(tokenizer, [token], as_ids)[0]
            if chat:
                choice["delta"] = {"content": text}
                choice["logprobs"] = {"content": [{"token": tok_str, "logprob": logprob, "top_logprobs": []}]}
            else:
                choice["text"] = text
                choice["logprobs"] = {"tokens": [tok_str], "token_logprobs": [logprob]}
            yield _sse({**head, "object": obj, "choices": [choice]})
    except EngineError as exc:
        yield _sse({"error": {"message": str(exc), "type": "server_error", "param": None, "code": None}})
    yield "data: [DONE]\n\n"


# ---------------------------------------------------------------- running it
def _bound_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


class ServerThread:
    """Run an app under uvicorn in a background thread (default: loopback, a free port).

    ``with ServerThread(app) as s: httpx.get(s.url + "/health")``; ``stop()`` shuts it down. A
    non-loopback ``host`` needs an app built with an API key.
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"):
        import uvicorn

        cfg = getattr(getattr(app, "state", None), "config", None)
        check_bind(host, getattr(cfg, "api_key", None))
        self._sock = _bound_socket(host, port)
        self.host, self.port = host, self._sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self._server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, lifespan="off"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name="gymllm-server", daemon=True)

    def start(self, timeout: float = 30.0) -> "ServerThread":
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise EngineError(f"server on {self.url} did not start within {timeout} s")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        self._sock.close()

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def serve(engine: Any, tokenizer: Any, model_name: str, *, host: str = "127.0.0.1", port: int = 8000,
          log_level: str = "info", config: ServerConfig | None = None, **app_kwargs: Any) -> None:
    """Serve until interrupted (the ``gymllm serve`` command). Binds to loopback unless told otherwise;
    any other address needs ``config.api_key``."""
    import uvicorn

    check_bind(host, config.api_key if config else None)
    uvicorn.run(build_app(engine, tokenizer, model_name, config=config, **app_kwargs), host=host, port=port,
                log_level=log_level)
