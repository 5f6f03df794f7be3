"""An OpenAI-compatible HTTP server over any :class:`~gymllm.inference.Engine` (FastAPI + uvicorn).

    app = build_app(engine, tokenizer, "smollm2")
    serve(engine, tokenizer, "smollm2", host="127.0.0.1", port=8000)   # blocks (``gymllm serve``)
    with ServerThread(app) as server: ...server.url...                 # loopback, free port

Routes: ``POST /v1/completions`` (``prompt`` as text, one list of token ids, or a list of either),
``POST /v1/chat/completions`` (rendered with the tokenizer's chat template), both streaming (SSE,
``"stream": true``) and not; ``GET /v1/models``; ``GET /health``; in training mode (a
:class:`~gymllm.inference.session_recorder.SessionRecorder`) also ``POST /v1/sessions/{id}/reward`` and
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
import time
import uuid
from typing import Any, Callable

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException

from gymllm.errors import EngineError
from gymllm.inference.completion import Completion
from gymllm.inference.params import SamplingParams
from gymllm.inference.session_recorder import Plan, SessionError, SessionRecorder
from gymllm.models.tokenizer import stop_ids
from gymllm.inference.server_models import (
    ChatCompletionResponse,
    CompletionResponse,
    ErrorResponse,
    Health,
    ModelList,
    RewardRequest,
    RewardResponse,
    ServerConfig,
    max_tokens_cap,
    request_models,
)
from gymllm.inference.server_requests import (
    ERROR_RESPONSES,
    BodyLimit,
    RequestError,
    error_response,
    prompts_from_body,
    render_chat,
    sampling_params_from_body,
    template_messages,
    validation_error,
)
from gymllm.inference.server_responses import chat_choice, completion_choice, stream_response, usage
from gymllm.utils import serving
from gymllm.utils.serving import require_secret_off_loopback

__all__ = ["build_app", "serve", "ServerThread", "check_bind", "engine_failure", "tool_format_for"]


# ---------------------------------------------------------------- engine calls
async def _run_one(
    engine: Any, prompt: list[int], params: SamplingParams, session_id: str | None
) -> list[Completion]:
    """``params.n`` completions of one prompt through whatever the engine offers."""
    try:
        if params.n == 1:
            return [await engine.generate(prompt, params, session_id=session_id)]
        if hasattr(engine, "generate_n"):
            return list(await engine.generate_n(prompt, params))
        one = params.replace(n=1)
        seeds = [None if params.seed is None else params.seed + i for i in range(params.n)]
        return list(
            await asyncio.gather(*(engine.generate(prompt, one.replace(seed=s)) for s in seeds))
        )
    except (
        EngineError
    ) as exc:  # a failure inside the engine is the server's fault, the rest the client's
        failed = type(exc).__name__ == "RequestFailed"
        raise RequestError(
            str(exc), status=500 if failed else 400, param=None if failed else "prompt"
        ) from None


def _check_prompt(engine: Any, prompt: list[int], max_len: int | None) -> None:
    if hasattr(engine, "validate_prompt"):
        try:
            engine.validate_prompt(prompt)
        except EngineError as exc:
            raise RequestError(
                str(exc),
                param="prompt",
                code="context_length_exceeded" if "at most" in str(exc) else None,
            ) from None
    elif max_len is not None and len(prompt) >= max_len:
        raise RequestError(
            f"prompt: expected at most {max_len - 1} tokens, received {len(prompt)}. "
            "Fix: shorten the prompt",
            param="prompt",
            code="context_length_exceeded",
        )


# ---------------------------------------------------------------- guards
def check_bind(host: str, api_key: str | None) -> None:
    """Refuse to bind a non-loopback address without an API key (a clear error at startup)."""
    require_secret_off_loopback(
        host,
        api_key,
        field="server host",
        expected="a loopback address (127.0.0.1, ::1, localhost), or an API key when binding "
        "any other address",
        fix="pass --api-key KEY (or set GYMLLM_API_KEY), or bind --host 127.0.0.1",
    )


def engine_failure(engine: Any) -> str | None:
    """Why ``engine`` no longer serves (its loop stopped), or None while it does (or cannot tell)."""
    serving = getattr(engine, "serving", None)
    if serving is None or serving:
        return None
    why = getattr(engine, "failure", None)
    return (
        f"the engine stopped serving ({why!r})" if why is not None else "the engine stopped serving"
    )


# ---------------------------------------------------------------- the app
def _session_of(request: Request, body: Any) -> tuple[str | None, str | None, str | None]:
    h = request.headers
    meta = body.metadata or {}
    gid, tid = meta.get("group_id"), meta.get("task_id")
    sid = h.get("x-session-id") or body.user
    return (
        sid,
        h.get("x-group-id") or (str(gid) if gid is not None else None),
        h.get("x-task-id") or (str(tid) if tid is not None else None),
    )


def build_app(
    engine: Any,
    tokenizer: Any,
    model_name: str,
    *,
    max_len: int | None = None,
    default_max_tokens: int | None = None,
    config: ServerConfig | None = None,
    recorder: SessionRecorder | None = None,
    admission: Callable[[], Any] | None = None,
    tool_format: str | None = None,
):
    """A FastAPI app serving ``engine`` as ``model_name``.

    config: limits and the API key (:class:`ServerConfig`); recorder: training mode (see
    :mod:`gymllm.inference.session_recorder`); admission: an async callable awaited before a session's first
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
    stops = stop_ids(tokenizer, getattr(engine, "default_stop_ids", None) or None)

    async def authorize(cred: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        if config.api_key is None:
            return
        if cred is None or not hmac.compare_digest(
            cred.credentials.encode(), config.api_key.encode()
        ):
            raise RequestError(
                "Authorization: expected 'Bearer <the server's API key>', received "
                f"{'no key' if cred is None else 'a wrong key'}. Fix: send the key given to "
                "gymllm serve --api-key",
                status=401,
                code="invalid_api_key",
            )

    authorized = {
        "responses": ERROR_RESPONSES,
        "dependencies": [Depends(authorize)],
    }  # every API route

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
            raise RequestError(
                f"model: expected {model_name!r}, received {body.model!r}. Fix: use a model listed by "
                "GET /v1/models",
                status=404,
                param="model",
                code="model_not_found",
            )

    @app.get("/health", response_model=Health, responses={503: {"model": ErrorResponse}})
    async def health():
        why = engine_failure(engine)
        if (
            why is not None
        ):  # a supervisor's probe sees the engine is gone (serve() exits non-zero too)
            raise RequestError(f"{why}. Fix: restart the server", status=503, code="engine_stopped")
        return {"status": "ok", "model": model_name, "version": int(getattr(engine, "version", 0))}

    @app.get("/v1/models", response_model=ModelList, **authorized)
    async def models():
        card = {
            "id": model_name,
            "object": "model",
            "created": 0,
            "owned_by": "gymllm",
            "max_model_len": max_len,
        }
        return {"object": "list", "data": [card]}

    def head(chat: bool) -> dict[str, Any]:
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        return {
            "id": rid,
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": model_name,
        }

    async def plan_session(
        request: Request, body: Any, make_plan: Callable[..., Plan]
    ) -> Plan | None:
        if recorder is None:
            return None
        sid, gid, tid = _session_of(request, body)
        if sid is None:
            return None
        if not recorder.is_open(sid) and admission is not None and not await admission():
            raise RequestError(
                "training mode: the trainer's group queue stayed full; expected room for a new "
                "session. Fix: retry later (the learner is behind)",
                status=503,
                code="queue_full",
            )
        try:
            return make_plan(
                sid, group_id=gid, task_id=tid, version=int(getattr(engine, "version", 0))
            )
        except SessionError as exc:
            raise RequestError(str(exc), status=exc.status, code="session") from None

    @app.post("/v1/completions", response_model=CompletionResponse, **authorized)
    async def completions(body: CompletionRequest, request: Request):  # type: ignore[valid-type]
        check_model(body)
        params = sampling_params_from_body(body, default_max_tokens=default_tokens)
        prompts = prompts_from_body(body.prompt, tokenizer)
        for p in prompts:
            _check_prompt(engine, p, max_len)
        plan = None
        if recorder is not None and len(prompts) == 1:
            plan = await plan_session(
                request, body, lambda sid, **kw: recorder.plan_tokens(sid, prompts[0], **kw)
            )
        _training_checks(plan, params, len(prompts))
        return await respond(body, head(False), prompts, params, False, plan)

    @app.post("/v1/chat/completions", response_model=ChatCompletionResponse, **authorized)
    async def chat_completions(body: ChatRequest, request: Request):  # type: ignore[valid-type]
        check_model(body)
        params = sampling_params_from_body(body, default_max_tokens=default_tokens)
        messages = template_messages(body.messages)
        tools = [t.model_dump() for t in body.tools] if body.tools else None
        plan = await plan_session(
            request, body, lambda sid, **kw: recorder.plan_chat(sid, messages, tools, **kw)
        )
        prompt = plan.prompt_ids if plan is not None else render_chat(messages, tools, tokenizer)
        _check_prompt(engine, prompt, max_len)
        _training_checks(plan, params, 1)
        return await respond(body, head(True), [prompt], params, True, plan, tools=bool(tools))

    def _training_checks(plan: Plan | None, params: SamplingParams, num_prompts: int) -> None:
        if cap is not None and params.max_tokens > cap:
            raise RequestError(
                f"max_tokens: expected at most {cap} (the context length), received "
                f"{params.max_tokens}. Fix: ask for fewer tokens",
                param="max_tokens",
            )
        if plan is not None and params.n != 1:
            raise RequestError(
                f"n: expected 1 in a training session, received {params.n}. Fix: run each sample "
                "as its own session (one session per episode)",
                param="n",
            )

    async def respond(
        body: Any,
        hd: dict,
        prompts: list[list[int]],
        params: SamplingParams,
        chat: bool,
        plan: Plan | None,
        tools: bool = False,
    ):
        use_fmt = fmt if (tools and getattr(body, "tool_choice", None) != "none") else None
        session_id = body.session_id or (
            plan.session_id if plan is not None else None
        )  # prefix reuse
        on_done = None
        if plan is not None:

            def on_done(c: Completion, choice: dict) -> None:
                recorder.record(plan, c, choice.get("message"), choice.get("finish_reason"))

        if body.stream:
            if len(prompts) != 1 or params.n != 1:
                raise RequestError(
                    "stream: expected one prompt and n == 1 when streaming, received "
                    f"{len(prompts)} prompts and n={params.n}. Fix: send them as separate requests",
                    param="stream",
                )
            gen = stream_response(
                engine,
                tokenizer,
                hd,
                prompts[0],
                params,
                session_id,
                chat,
                body,
                stops | set(params.stop_token_ids),
                use_fmt,
                on_done,
            )
            return StreamingResponse(gen, media_type="text/event-stream")
        results = await asyncio.gather(*(_run_one(engine, p, params, session_id) for p in prompts))
        choices, flat = [], []
        for p, comps in zip(prompts, results):
            for c in comps:
                choice = (
                    chat_choice(len(choices), c, p, tokenizer, body, use_fmt)
                    if chat
                    else completion_choice(len(choices), c, p, tokenizer, body)
                )
                if on_done is not None:
                    on_done(c, choice)
                choices.append(choice)
                flat.append(c)
        return {**hd, "choices": choices, "usage": usage(prompts, flat)}

    if recorder is not None:

        @app.post("/v1/sessions/{session_id}/reward", response_model=RewardResponse, **authorized)
        async def reward(session_id: str, body: RewardRequest):
            try:
                closed = recorder.close(session_id, body.reward, body.info)
            except SessionError as exc:
                raise RequestError(str(exc), status=exc.status, code="session") from None
            end = getattr(engine, "end_session", None)
            if end is not None:
                end(session_id)  # free the engine's cached prefix of this episode
            return {
                "session_id": session_id,
                "group_id": closed.group_id,
                "reward": closed.reward,
                "segments": len(closed.segments),
                "model_calls": closed.model_calls,
                "sampled_tokens": sum(s.num_sampled for s in closed.segments),
            }

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


# ---------------------------------------------------------------- running it
class ServerThread(serving.ServerThread):
    """Run an app under uvicorn in a background thread (default: loopback, a free port).

    ``with ServerThread(app) as s: httpx.get(s.url + "/health")``; ``stop()`` shuts it down. A
    non-loopback ``host`` needs an app built with an API key.
    """

    def __init__(
        self, app: Any, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"
    ):
        cfg = getattr(getattr(app, "state", None), "config", None)
        check_bind(host, getattr(cfg, "api_key", None))
        super().__init__(app, host, port, log_level=log_level, lifespan="off", name="gymllm-server")


def serve(
    engine: Any,
    tokenizer: Any,
    model_name: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "info",
    config: ServerConfig | None = None,
    **app_kwargs: Any,
) -> None:
    """Serve until interrupted (the ``gymllm serve`` command). Binds to loopback unless told otherwise;
    any other address needs ``config.api_key``. Should the engine stop serving (its loop died), the
    server shuts down and :class:`~gymllm.utils.serving.ServerStopped` is raised: the process exits
    non-zero, so a supervisor restarts it, instead of answering every request with an error."""
    check_bind(host, config.api_key if config else None)
    app = build_app(engine, tokenizer, model_name, config=config, **app_kwargs)
    serving.run_server(
        app, host, port, log_level=log_level, watchdog=lambda: engine_failure(engine)
    )
