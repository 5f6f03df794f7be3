"""The OpenAI-compatible server's requests, responses and limits as pydantic models.

FastAPI validates every body against these models and publishes them at ``/openapi.json``, so the
schema describes the real API. Request models are built per app by :func:`request_models` because
their bounds come from the :class:`ServerConfig` and the engine (``n <= max_n``, ``max_tokens <=``
the context, at most ``max_prompts`` prompts, token ids ``>= 0``).

* Unknown fields are ignored (as vLLM does), so clients sending newer OpenAI fields keep working.
* Every string must be encodable as UTF-8: a lone surrogate (``"\\ud800"``, which JSON can spell)
  is a 400 naming the field, never a 500 from the tokenizer.
* Every numeric field has bounds in its model (non-finite floats refused, ints within what the engine's
  arrays hold: ``top_k``, ``max_tokens``, ``n`` and token ids below 2**31, ``seed`` a signed 64-bit int),
  so a hostile number is a 400 naming the field; :class:`~gymllm.inference.params.SamplingParams`
  checks the sampling fields' meaning (temperature >= 0, 0 < top_p <= 1, ...) again.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, create_model

from gymllm.validation import check_fields, check_range, require


# ---------------------------------------------------------------- limits
@dataclasses.dataclass(frozen=True, kw_only=True)
class ServerConfig:
    """Limits and switches of one server app (validated on creation).

    max_n: most samples per prompt (``n``); max_prompts: most prompts in one completions request;
    max_body_bytes: request bodies larger than this get a 413; default_max_tokens: ``max_tokens``
    when the request has none; max_tokens_cap: largest ``max_tokens`` accepted (None: the engine's
    context length); api_key: when set, ``/v1/*`` needs ``Authorization: Bearer <api_key>``;
    tool_format: the ``gymllm.tools.parsers`` format used to turn the model's tool-call text into
    ``tool_calls`` ("auto" detects it; "none" never parses).
    """

    max_n: int = 16
    max_prompts: int = 64
    max_body_bytes: int = 1_000_000
    default_max_tokens: int = 256
    max_tokens_cap: int | None = None
    api_key: str | None = None
    tool_format: str = "auto"

    def __post_init__(self) -> None:
        names = ("max_n", "max_prompts", "max_body_bytes", "default_max_tokens")
        check_fields("ServerConfig", self, names, lo=1, integer=True, fix="pass e.g. {field}=16")
        check_range(
            "ServerConfig",
            "max_tokens_cap",
            self.max_tokens_cap,
            lo=1,
            integer=True,
            optional=True,
            fix="pass None (the engine's context) or e.g. 2048",
        )
        require(
            self.api_key is None or (isinstance(self.api_key, str) and len(self.api_key) >= 8),
            "ServerConfig.api_key",
            expected="None or a string of >= 8 characters",
            received="a short key" if isinstance(self.api_key, str) else self.api_key,
            fix="pass a longer random key, e.g. from `python -c 'import secrets; "
            "print(secrets.token_urlsafe(24))'`",
        )


# ---------------------------------------------------------------- field types
def _utf8(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"expected text encodable as UTF-8, received a lone surrogate at index {exc.start} "
            "(e.g. \\ud800). Fix: send valid Unicode"
        ) from None
    return value


Text = Annotated[str, AfterValidator(_utf8)]
INT32_MAX = 2**31 - 1
MAX_TEMPERATURE = 100.0
"""Every numeric request field is bounded here (a 400 naming the field), never left to overflow in the engine."""
TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


# ---------------------------------------------------------------- chat pieces
class FunctionCall(_Lenient):
    name: Text
    arguments: Union[Text, dict[str, Any]] = Field(
        default="{}", description="JSON text of the arguments (OpenAI's form) or the object itself"
    )


class ToolCallModel(_Lenient):
    id: Text = ""
    type: Literal["function"] = "function"
    function: FunctionCall


class ContentPart(_Lenient):
    type: Text = "text"
    text: Text = ""


class ChatMessage(_Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[Text, list[ContentPart], None] = None
    name: Text | None = None
    tool_calls: list[ToolCallModel] | None = None
    tool_call_id: Text | None = None


class FunctionSpec(_Lenient):
    name: Text
    description: Text = ""
    parameters: dict[str, Any] = Field(default_factory=dict)


class ToolSpec(_Lenient):
    type: Literal["function"] = "function"
    function: FunctionSpec


# ---------------------------------------------------------------- requests (bounds filled per app)
class _SamplingFields(_Lenient):
    model: Text | None = None
    temperature: float | None = Field(
        default=None, ge=0, le=MAX_TEMPERATURE, allow_inf_nan=False, description="0 = greedy"
    )
    top_p: float | None = Field(
        default=None, gt=0, le=1, allow_inf_nan=False, description="1 = off"
    )
    top_k: int | None = Field(default=None, ge=-1, le=INT32_MAX, description="0 or -1 = off")
    max_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)
    stop: Union[Text, list[Text], None] = None
    stop_token_ids: list[TokenId] | None = None
    seed: int | None = Field(
        default=None, ge=-(2**63), le=2**63 - 1, description="a signed 64-bit int"
    )
    n: int | None = Field(default=None, ge=1, le=INT32_MAX)
    stream: bool = False
    user: Text | None = Field(default=None, description="names the session in training mode")
    session_id: Text | None = Field(
        default=None, description="prefix reuse across a trajectory's turns"
    )
    metadata: dict[str, Any] | None = Field(
        default=None, description="training mode: group_id, task_id"
    )
    return_token_ids: bool | None = None
    return_tokens_as_token_ids: bool | None = None


class CompletionRequestBase(_SamplingFields):
    prompt: Any = None
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False


class ChatRequestBase(_SamplingFields):
    messages: list[ChatMessage]
    tools: list[ToolSpec] | None = None
    tool_choice: Union[Literal["none", "auto", "required"], dict[str, Any], None] = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)


def max_tokens_cap(config: ServerConfig, max_len: int | None) -> int | None:
    """The largest ``max_tokens`` a request may ask for: ``config.max_tokens_cap``, else the context."""
    return config.max_tokens_cap or max_len


def request_models(
    config: ServerConfig, max_len: int | None
) -> tuple[type[BaseModel], type[BaseModel]]:
    """``(CompletionRequest, ChatCompletionRequest)`` with this server's bounds in their schema."""
    cap = max_tokens_cap(config, max_len)
    # the cap is published here and enforced by the server after the prompt checks (a too-long prompt
    # is the clearer error when both are wrong)
    max_tokens = Annotated[
        int | None,
        Field(
            default=None, ge=1, le=INT32_MAX, json_schema_extra={"maximum": cap} if cap else None
        ),
    ]
    n = Annotated[int | None, Field(default=None, ge=1, le=config.max_n)]
    ids = list[
        TokenId
    ]  # length: checked against the context after tokenizing (a clear 400 either way)
    one = Union[Text, ids]
    prompt = Annotated[
        Union[one, Annotated[list[one], Field(min_length=1, max_length=config.max_prompts)]],
        Field(description="text, token ids, or a list of either"),
    ]
    common: dict[str, Any] = {
        "max_tokens": (max_tokens, None),
        "max_completion_tokens": (max_tokens, None),
        "n": (n, None),
    }
    completion = create_model(
        "CompletionRequest", __base__=CompletionRequestBase, prompt=(prompt, ...), **common
    )
    messages = Annotated[list[ChatMessage], Field(min_length=1, max_length=4096)]
    chat = create_model(
        "ChatCompletionRequest", __base__=ChatRequestBase, messages=(messages, ...), **common
    )
    return completion, chat


# ---------------------------------------------------------------- responses
class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict[str, int] = Field(default_factory=dict)


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None = None
    text_offset: list[int] | None = None


class _TokenRecord(BaseModel):
    """gymllm's additions to every choice: the ids, their policy versions and the prompt's ids."""

    finish_reason: str | None = None
    stop_reason: Union[int, str, None] = None
    token_ids: list[int] = Field(default_factory=list)
    versions: list[int] = Field(default_factory=list)
    prompt_token_ids: list[int] = Field(default_factory=list)


class CompletionChoice(_TokenRecord):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None


class _ResponseHead(BaseModel):
    """What both completion answers carry besides their choices."""

    id: str
    created: int
    model: str
    usage: Usage


class CompletionResponse(_ResponseHead):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]


class TokenLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[dict[str, Any]] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob]


class ResponseFunctionCall(BaseModel):
    name: str
    arguments: str = Field(description="the arguments as JSON text (OpenAI's form)")


class ResponseToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: ResponseFunctionCall


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ResponseToolCall] | None = None


class ChatChoice(_TokenRecord):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None


class ChatCompletionResponse(_ResponseHead):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "gymllm"
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(BaseModel):
    status: str
    model: str
    version: int


class RewardRequest(_Lenient):
    reward: float = Field(
        description="the episode's outcome reward (finite)", allow_inf_nan=False, ge=-1e12, le=1e12
    )
    info: dict[str, Any] = Field(default_factory=dict, description="stored with the trajectory")


class RewardResponse(BaseModel):
    session_id: str
    group_id: str
    reward: float
    segments: int
    model_calls: int
    sampled_tokens: int
