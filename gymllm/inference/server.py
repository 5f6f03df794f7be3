"""An OpenAI-compatible HTTP server over any :class:`~gymllm.inference.Engine` (FastAPI + uvicorn).

    app = build_app(engine, tokenizer, "smollm2")
    serve(engine, tokenizer, "smollm2", host="127.0.0.1", port=8000)   # blocks (``gymllm serve``)
    with ServerThread(app) as server: ...server.url...                 # loopback, free port

Routes: ``POST /v1/completions`` (``prompt`` as text, one list of token ids, or a list of either),
``POST /v1/chat/completions`` (rendered with the tokenizer's chat template), both streaming (SSE,
``"stream": true``) and not; ``GET /v1/models``; ``GET /health``.

Beyond OpenAI's fields every choice carries ``token_ids`` (sampled ids), ``versions`` (policy
version per token) and ``prompt_token_ids``, and ``logprobs`` are returned whenever requested
(values under the temperature-processed distribution). Request extensions: ``top_k``,
``stop_token_ids``, ``session_id`` (prefix reuse across a trajectory's turns); the vLLM flags
``return_token_ids`` / ``return_tokens_as_token_ids`` are accepted.

Bad requests get a 4xx with an OpenAI-style ``{"error": {"message", "type", "param", "code"}}``
body and the server keeps serving: invalid JSON, empty prompt, prompt longer than the context,
unknown model, malformed fields.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import uuid
from typing import Any, AsyncIterator, Sequence

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from gymllm.errors import ConfigError, EngineError, GymLLMError
from gymllm.inference.completion import Completion
from gymllm.inference.params import SamplingParams


class RequestError(GymLLMError, ValueError):
    """A client error: answered with ``status`` and an OpenAI-style error body."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.param, self.code = status, param, code


def _error_body(exc: RequestError) -> dict[str, Any]:
    kind = "invalid_request_error" if exc.status < 500 else "server_error"
    return {"error": {"message": str(exc), "type": kind, "param": exc.param, "code": exc.code}}


# ---------------------------------------------------------------- request parsing (pure)
_PARAM_FIELDS = ("temperature", "top_p", "top_k", "max_tokens", "stop", "stop_token_ids", "seed", "n")


def sampling_params_from_body(body: dict[str, Any], *, default_max_tokens: int = 256) -> SamplingParams:
    """Map OpenAI request fields to :class:`SamplingParams` (``max_completion_tokens`` too)."""
    kw: dict[str, Any] = {k: body[k] for k in _PARAM_FIELDS if body.get(k) is not None}
    if body.get("max_completion_tokens") is not None and "max_tokens" not in kw:
        kw["max_tokens"] = body["max_completion_tokens"]
    kw.setdefault("max_tokens", default_max_tokens)
    if kw.get("top_k") == -1:  # vLLM's spelling of "off"
        kw["top_k"] = 0
    try:
        return SamplingParams(**kw)
    except (ConfigError, TypeError) as exc:
        field = next((f for f in _PARAM_FIELDS if f"SamplingParams.{f}" in str(exc)), None)
        raise RequestError(str(exc), param=field) from None


def _is_ids(x: Any) -> bool:
    return isinstance(x, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in x)


def prompts_from_body(body: dict[str, Any], tokenizer: Any) -> list[list[int]]:
    """``prompt`` as text, token ids, or a list of either -> a list of token-id prompts."""
    prompt = body.get("prompt")
    if isinstance(prompt, str) or _is_ids(prompt):
        items = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) or _is_ids(p) for p in prompt):
        items = prompt
    else:
        raise RequestError(
            "prompt: expected a string, a list of token ids, or a list of those, received "
            f"{type(prompt).__name__}. Fix: send e.g. \"prompt\": [1, 2, 3] or \"prompt\": \"Hello\"",
            param="prompt",
        )
    out = []
    for p in items:
        if isinstance(p, str):
            if tokenizer is None:
                raise RequestError("prompt: text needs a server tokenizer; send token ids instead", param="prompt")
            p = tokenizer.encode(p)
        if not p:
            raise RequestError("prompt: expected at least one token, received an empty prompt. "
                               "Fix: send a non-empty prompt", param="prompt")
        out.append(list(p))
    return out


def chat_prompt_from_body(body: dict[str, Any], tokenizer: Any) -> list[int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages
    ):
        raise RequestError("messages: expected a non-empty list of {\"role\": ..., \"content\": ...} objects, "
                           f"received {str(messages)[:100]!r}. Fix: send at least one message", param="messages")
    if tokenizer is None:
        raise RequestError("chat completions need a server tokenizer with a chat template", status=400)
    try:
        ids = tokenizer.apply_chat_template(messages, tools=body.get("tools"), add_generation_prompt=True,
                                            tokenize=True)
    except Exception as exc:  # a template error is the client's message shape
        raise RequestError(f"messages: the chat template could not render them: {exc}", param="messages") from None
    if not ids:
        raise RequestError("messages: rendered to an empty prompt. Fix: send some content", param="messages")
    return list(ids)


# ---------------------------------------------------------------- response shaping (pure)
class _TextDelta:
    """Incremental detokenization that never emits half a UTF-8 character."""

    def __init__(self, tokenizer: Any):
        self.tokenizer, self.ids, self.sent = tokenizer, [], ""

    def push(self, token: int) -> str:
        self.ids.append(token)
        if self.tokenizer is None:
            return ""
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):
            return ""
        delta, self.sent = text[len(self.sent):], text
        return delta

    def flush(self) -> str:
        """Whatever was held back (a trailing incomplete character decodes as U+FFFD at the end)."""
        if self.tokenizer is None:
            return ""
        text = self.tokenizer.decode(self.ids)
        delta, self.sent = text[len(self.sent):], text
        return delta


def _token_strings(tokenizer: Any, ids: Sequence[int], as_ids: bool) -> list[str]:
    if as_ids or tokenizer is None:
        return [f"token_id:{int(t)}" for t in ids]
    return [tokenizer.decode([int(t)]) for t in ids]


def completion_choice(index: int, c: Completion, prompt: list[int], tokenizer: Any, body: dict) -> dict:
    text = c.text if c.text is not None else (tokenizer.decode(c.token_ids) if tokenizer is not None else "")
    logprobs = None
    if body.get("logprobs") is not None:
        logprobs = {"tokens": _token_strings(tokenizer, c.token_ids, bool(body.get("return_tokens_as_token_ids"))),
                    "token_logprobs": [float(x) for x in c.logprobs], "top_logprobs": None, "text_offset": None}
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": c.finish_reason,
            "stop_reason": c.stop_reason, "token_ids": [int(t) for t in c.token_ids],
            "versions": [int(v) for v in c.versions], "prompt_token_ids": prompt}


def chat_choice(index: int, c: Completion, prompt: list[int], tokenizer: Any, body: dict) -> dict:
    text = c.text if c.text is not None else tokenizer.decode(c.token_ids)
    logprobs = None
    if body.get("logprobs"):
        toks = _token_strings(tokenizer, c.token_ids, bool(body.get("return_tokens_as_token_ids")))
        logprobs = {"content": [{"token": t, "logprob": float(lp), "bytes": list(t.encode()), "top_logprobs": []}
                                for t, lp in zip(toks, c.logprobs)]}
    return {"index": index, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
            "finish_reason": c.finish_reason, "stop_reason": c.stop_reason,
            "token_ids": [int(t) for t in c.token_ids], "versions": [int(v) for v in c.versions],
            "prompt_token_ids": prompt}


def _usage(prompts: list[list[int]], completions: list[Completion]) -> dict[str, int]:
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


# ---------------------------------------------------------------- the app
def build_app(engine: Any, tokenizer: Any, model_name: str, *, max_len: int | None = None,
              default_max_tokens: int = 256):
    """A FastAPI app serving ``engine`` as ``model_name``."""
    max_len = max_len or getattr(engine, "max_len", None)
    app = FastAPI(title="gymllm", version="0.1.0")
    app.state.engine = engine

    @app.exception_handler(RequestError)
    async def _request_error(_: Request, exc: RequestError):
        return JSONResponse(_error_body(exc), status_code=exc.status)

    async def read_body(request: Request) -> dict[str, Any]:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise RequestError(f"invalid JSON body: {exc}. Fix: send a JSON object", code="invalid_json") from None
        if not isinstance(body, dict):
            raise RequestError(f"body: expected a JSON object, received {type(body).__name__}")
        model = body.get("model")
        if model is not None and model != model_name:
            raise RequestError(f"model: expected {model_name!r}, received {model!r}. Fix: use a model listed by "
                               "GET /v1/models", status=404, param="model", code="model_not_found")
        return body

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": model_name, "version": int(getattr(engine, "version", 0))}

    @app.get("/v1/models")
    async def models():
        card = {"id": model_name, "object": "model", "created": 0, "owned_by": "gymllm", "max_model_len": max_len}
        return {"object": "list", "data": [card]}

    async def respond(request: Request, chat: bool):
        body = await read_body(request)
        params = sampling_params_from_body(body, default_max_tokens=default_max_tokens)
        prompts = [chat_prompt_from_body(body, tokenizer)] if chat else prompts_from_body(body, tokenizer)
        for p in prompts:
            _check_prompt(engine, p, max_len)
        session_id = body.get("session_id")
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        head = {"id": rid, "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()), "model": model_name}
        if body.get("stream"):
            if len(prompts) != 1 or params.n != 1:
                raise RequestError("stream: expected one prompt and n == 1 when streaming, received "
                                   f"{len(prompts)} prompts and n={params.n}. Fix: send them as separate requests",
                                   param="stream")
            gen = _stream_response(engine, tokenizer, head, prompts[0], params, session_id, chat, body)
            return StreamingResponse(gen, media_type="text/event-stream")
        results = await asyncio.gather(*(_run_one(engine, p, params, session_id) for p in prompts))
        make = chat_choice if chat else completion_choice
        choices, flat = [], []
        for p, comps in zip(prompts, results):
            for c in comps:
                choices.append(make(len(choices), c, p, tokenizer, body))
                flat.append(c)
        return {**head, "choices": choices, "usage": _usage(prompts, flat)}

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await respond(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await respond(request, chat=True)

    return app


async def _stream_response(engine, tokenizer, head, prompt, params, session_id, chat: bool, body: dict):
    """SSE chunks: one per token (text delta, token id, logprob, version), a final one, [DONE]."""
    obj = "chat.completion.chunk" if chat else "text_completion"
    delta = _TextDelta(tokenizer)
    as_ids = bool(body.get("return_tokens_as_token_ids"))
    if chat:
        yield _sse({**head, "object": obj, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                         "finish_reason": None}]})
    try:
        async for item in _stream_tokens(engine, prompt, params, session_id):
            if isinstance(item, Completion):
                final = {"index": 0, "finish_reason": item.finish_reason, "stop_reason": item.stop_reason}
                rest = delta.flush()
                final.update({"delta": {"content": rest} if rest else {}} if chat else {"text": rest})
                usage = _usage([prompt], [item])
                yield _sse({**head, "object": obj, "choices": [final], "usage": usage})
                break
            token, logprob, version = item
            text = delta.push(token)
            choice: dict[str, Any] = {"index": 0, "finish_reason": None, "token_ids": [token],
                                      "versions": [version], "logprob": logprob}
            tok_str = _token_strings(tokenizer, [token], as_ids)[0]
            if chat:
                choice["delta"] = {"content": text}
                choice["logprobs"] = {"content": [{"token": tok_str, "logprob": logprob, "top_logprobs": []}]}
            else:
                choice["text"] = text
                choice["logprobs"] = {"tokens": [tok_str], "token_logprobs": [logprob]}
            yield _sse({**head, "object": obj, "choices": [choice]})
    except EngineError as exc:
        yield _sse(_error_body(RequestError(str(exc), status=500)))
    yield "data: [DONE]\n\n"


# ---------------------------------------------------------------- running it
def _loopback_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


class ServerThread:
    """Run an app under uvicorn in a background thread (default: loopback, a free port).

    ``with ServerThread(app) as s: httpx.get(s.url + "/health")``; ``stop()`` shuts it down.
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"):
        import uvicorn

        self._sock = _loopback_socket(host, port)
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
          log_level: str = "info", **app_kwargs: Any) -> None:
    """Serve until interrupted (the ``gymllm serve`` command). Binds to loopback unless told otherwise."""
    import uvicorn

    uvicorn.run(build_app(engine, tokenizer, model_name, **app_kwargs), host=host, port=port, log_level=log_level)
