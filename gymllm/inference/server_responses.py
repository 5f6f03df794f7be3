"""The OpenAI-compatible server's answer side: choices, usage, incremental detokenization, tool calls
and the server-sent-event stream, each shaped from the engine's :class:`~gymllm.inference.Completion`.

Beyond OpenAI's fields every choice carries ``token_ids``, ``versions`` and ``prompt_token_ids``. The
text leaves out the stop token or stop string that ended it (OpenAI's rule); ``token_ids`` keep it.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, AsyncIterator, Callable, Sequence

from gymllm.errors import EngineError
from gymllm.inference.completion import Completion
from gymllm.inference.params import SamplingParams

__all__ = [
    "visible_ids",
    "visible_text",
    "TextDelta",
    "token_strings",
    "token_record",
    "completion_choice",
    "split_tool_calls",
    "chat_choice",
    "usage",
    "sse",
    "stream_tokens",
    "stream_response",
]


# ---------------------------------------------------------------- response shaping (pure)
def visible_ids(c: Completion) -> list[int]:
    """The sampled ids the text shows: all but a final stop token (its id stays in ``token_ids``)."""
    ids = [int(t) for t in c.token_ids]
    if (
        ids
        and c.finish_reason == "stop"
        and isinstance(c.stop_reason, int)
        and ids[-1] == c.stop_reason
    ):
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
        delta, self.sent = text[len(self.sent) :], text
        return delta

    def flush(self, final: Completion) -> str:
        """Whatever is still held back, less the stop token or stop string that ended the request."""
        if self.tokenizer is None:
            return ""
        text = visible_text(final, self.tokenizer)
        if not text.startswith(self.sent):  # a stop string already partly sent: nothing more to add
            return ""
        delta, self.sent = text[len(self.sent) :], text
        return delta


def token_strings(tokenizer: Any, ids: Sequence[int], as_ids: bool) -> list[str]:
    if as_ids or tokenizer is None:
        return [f"token_id:{int(t)}" for t in ids]
    return [tokenizer.decode([int(t)]) for t in ids]


def token_record(c: Completion, prompt: list[int]) -> dict[str, Any]:
    return {
        "finish_reason": c.finish_reason,
        "stop_reason": c.stop_reason,
        "token_ids": [int(t) for t in c.token_ids],
        "versions": [int(v) for v in c.versions],
        "prompt_token_ids": prompt,
    }


def completion_choice(
    index: int, c: Completion, prompt: list[int], tokenizer: Any, body: Any
) -> dict:
    logprobs = None
    if body.logprobs is not None:
        logprobs = {
            "tokens": token_strings(tokenizer, c.token_ids, bool(body.return_tokens_as_token_ids)),
            "token_logprobs": [float(x) for x in c.logprobs],
            "top_logprobs": None,
            "text_offset": None,
        }
    return {
        "index": index,
        "text": visible_text(c, tokenizer),
        "logprobs": logprobs,
        **token_record(c, prompt),
    }


CALL_MARKERS = ("<tool_call>", "```tool_code", "<|python_tag|>")


def split_tool_calls(text: str, fmt: str) -> tuple[str | None, list[dict]]:
    """``(content, tool_calls)`` of an assistant text in the model's tool-call format."""
    from gymllm.tools.parsers import parse_tool_calls

    calls = parse_tool_calls(text, fmt)
    if not calls:
        return text, []
    cut = min((i for i in (text.find(m) for m in CALL_MARKERS) if i >= 0), default=0)
    content = text[:cut].strip() or None
    out = [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)},
        }
        for c in calls
    ]
    return content, out


def chat_choice(
    index: int,
    c: Completion,
    prompt: list[int],
    tokenizer: Any,
    body: Any,
    tool_format: str | None = None,
) -> dict:
    text = visible_text(c, tokenizer)
    record = token_record(c, prompt)
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_format and c.finish_reason != "length":
        content, calls = split_tool_calls(text, tool_format)
        if calls:
            message = {"role": "assistant", "content": content, "tool_calls": calls}
            record["finish_reason"] = "tool_calls"
    logprobs = None
    if body.logprobs:
        toks = token_strings(tokenizer, c.token_ids, bool(body.return_tokens_as_token_ids))
        logprobs = {
            "content": [
                {"token": t, "logprob": float(lp), "bytes": list(t.encode()), "top_logprobs": []}
                for t, lp in zip(toks, c.logprobs)
            ]
        }
    return {"index": index, "message": message, "logprobs": logprobs, **record}


def usage(prompts: list[list[int]], completions: list[Completion]) -> dict[str, Any]:
    p = sum(len(x) for x in prompts)
    n = sum(c.num_tokens for c in completions)
    cached = sum(
        c.cached_prompt_len for c in completions
    )  # prompt tokens served from a reused prefix
    return {
        "prompt_tokens": p,
        "completion_tokens": n,
        "total_tokens": p + n,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj)}\n\n"


async def stream_tokens(
    engine: Any, prompt: list[int], params: SamplingParams, session_id: str | None
) -> AsyncIterator[tuple[int, float, int] | Completion]:
    if hasattr(engine, "stream"):
        async for item in engine.stream(prompt, params, session_id=session_id):
            yield item
        return
    c = await engine.generate(prompt, params, session_id=session_id)  # no token stream: one burst
    for t, lp, v in zip(c.token_ids, c.logprobs, c.versions):
        yield int(t), float(lp), int(v)
    yield c


async def stream_response(
    engine,
    tokenizer,
    head,
    prompt,
    params,
    session_id,
    chat: bool,
    body: Any,
    stop_ids: frozenset,
    tool_format: str | None,
    on_done: Callable | None,
):
    """SSE chunks: one per token (text delta, token id, logprob, version), a final one, [DONE]."""
    obj = "chat.completion.chunk" if chat else "text_completion"
    delta = TextDelta(tokenizer, frozenset(stop_ids))
    as_ids = bool(body.return_tokens_as_token_ids)
    if chat:
        yield sse(
            {
                **head,
                "object": obj,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": ""},
                        "finish_reason": None,
                    }
                ],
            }
        )
    try:
        async for item in stream_tokens(engine, prompt, params, session_id):
            if isinstance(item, Completion):
                rest = delta.flush(item)
                final: dict[str, Any] = {
                    "index": 0,
                    "finish_reason": item.finish_reason,
                    "stop_reason": item.stop_reason,
                }
                if chat:
                    choice = chat_choice(0, item, prompt, tokenizer, body, tool_format)
                    final["finish_reason"] = choice["finish_reason"]
                    final["delta"] = {"content": rest} if rest else {}
                    if choice["message"].get("tool_calls"):
                        final["delta"]["tool_calls"] = [
                            {"index": i, **c} for i, c in enumerate(choice["message"]["tool_calls"])
                        ]
                    if on_done is not None:
                        on_done(item, choice)
                else:
                    final["text"] = rest
                    if on_done is not None:
                        on_done(item, final)
                yield sse(
                    {**head, "object": obj, "choices": [final], "usage": usage([prompt], [item])}
                )
                break
            token, logprob, version = item
            text = delta.push(token)
            choice = {
                "index": 0,
                "finish_reason": None,
                "token_ids": [token],
                "versions": [version],
                "logprob": logprob,
            }
            tok_str = token_strings(tokenizer, [token], as_ids)[0]
            if chat:
                choice["delta"] = {"content": text}
                choice["logprobs"] = {
                    "content": [{"token": tok_str, "logprob": logprob, "top_logprobs": []}]
                }
            else:
                choice["text"] = text
                choice["logprobs"] = {"tokens": [tok_str], "token_logprobs": [logprob]}
            yield sse({**head, "object": obj, "choices": [choice]})
    except EngineError as exc:
        yield sse(
            {"error": {"message": str(exc), "type": "server_error", "param": None, "code": None}}
        )
    yield "data: [DONE]\n\n"
