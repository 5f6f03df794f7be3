"""One request inside the JAX engine: what it asked for, what it has sampled, and how it ends.

:class:`EngineRequest` is the engine's record of one completion being sampled: the prompt, the
:class:`~gymllm.inference.SamplingParams`, its key, its cache row (a
:class:`~gymllm.inference.slot_table.Placement`) and the tokens, logprobs and policy versions sampled so
far. It owns the per-request rules: when it finishes (:meth:`EngineRequest.finish_reason`: a stop id, a
stop string, ``max_tokens`` or the context), how many tokens it may still sample
(:meth:`EngineRequest.budget`), the :class:`~gymllm.inference.Completion` it ends with, and handing
results to the caller's event loop from the engine thread (:meth:`EngineRequest.deliver`).
:class:`RequestFailed` is the error a caller receives when a device step failed under its request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import numpy as np

from gymllm.errors import EngineError
from gymllm.inference.completion import Completion
from gymllm.inference.params import SamplingParams
from gymllm.inference.slot_table import Placement


class RequestFailed(EngineError):
    """A valid request failed inside the engine (a device step raised); other requests keep running."""


@dataclasses.dataclass(eq=False)
class EngineRequest:
    """One completion being sampled. Written by the engine thread only (``cancelled`` by the caller)."""

    prompt: list[int]
    params: SamplingParams
    key: np.ndarray  # [2] uint32
    session_id: str | None
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    stream: asyncio.Queue | None = None
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)
    submitted: float = dataclasses.field(default_factory=time.perf_counter)
    first_token: float = float("nan")
    placement: Placement | None = None
    cancelled: bool = False
    stop_reason: int | str | None = None
    kv_version: Any = (
        None  # the version (kv tag) of all k/v in the row; None once it spans versions
    )
    adapter: int = 0  # the stack index of the request's LoRA adapter (0: the base model; gymllm.inference.adapters)

    @property
    def slot(self) -> int:
        assert self.placement is not None
        return self.placement.slot

    def cached_ids(self) -> list[int]:
        """Ids whose k/v this request's row holds: the prompt and every sampled id fed back."""
        return self.prompt + self.tokens[:-1]

    def record(self, token: int, logprob: float, version: int, kv_tag: Any = None) -> None:
        """Append one sampled token, produced by a forward under policy ``version``; ``kv_tag``: what the
        row's k/v are computed under now (default: ``version``; see :meth:`WeightStore.kv_tag
        <gymllm.inference.weights.WeightStore.kv_tag>`)."""
        self.tokens.append(token)
        self.logprobs.append(logprob)
        self.versions.append(version)
        if self.kv_version != (version if kv_tag is None else kv_tag):
            self.kv_version = None  # this row now mixes versions: its prefix is not reused

    def record_many(
        self, tokens: list[int], logprobs: list[float], version: int, kv_tag: Any = None
    ) -> None:
        """:meth:`record` for several tokens sampled under one ``version`` (a decode chunk's)."""
        self.tokens.extend(tokens)
        self.logprobs.extend(logprobs)
        self.versions.extend([version] * len(tokens))
        if tokens and self.kv_version != (version if kv_tag is None else kv_tag):
            self.kv_version = None

    def budget(self, max_len: int) -> int:
        """Tokens this request may still sample (``max_tokens`` and the context limit ``max_len``)."""
        return min(
            self.params.max_tokens - len(self.tokens), max_len - len(self.prompt) - len(self.tokens)
        )

    def finish_reason(
        self, token: int, stop_ids: frozenset[int], tokenizer: Any, max_len: int
    ) -> str | None:
        """After sampling ``token``: "stop" (a stop id, or a stop string in the decoded tail; sets
        ``stop_reason``), "length" (``max_tokens`` or the context ``max_len`` reached), or None."""
        if token in stop_ids or token in self.params.stop_token_ids:
            self.stop_reason = token
            return "stop"
        if self.params.stop and tokenizer is not None:
            hit = self.stop_string(tokenizer)
            if hit is not None:
                self.stop_reason = hit
                return "stop"
        if (
            len(self.tokens) >= self.params.max_tokens
            or len(self.prompt) + len(self.tokens) >= max_len
        ):
            return "length"
        return None

    def stop_string(self, tokenizer: Any) -> str | None:
        """The first of ``params.stop`` found in the decoded tail of the sampled tokens, or None."""
        window = max(len(s) for s in self.params.stop) + 8  # tokens enough to spell any stop string
        tail = tokenizer.decode(self.tokens[-window:])
        for s in self.params.stop:
            if s in tail:
                return s
        return None

    def completion(self, reason: str, tokenizer: Any) -> Completion:
        """The :class:`Completion` this request ends with (``text`` decoded when there is a tokenizer)."""
        text = tokenizer.decode(self.tokens) if tokenizer is not None else None
        return Completion(
            token_ids=self.tokens,
            logprobs=self.logprobs,
            finish_reason=reason,
            versions=self.versions,
            prompt_len=len(self.prompt),
            ttft_s=self.first_token - self.submitted,
            latency_s=time.perf_counter() - self.submitted,
            text=text,
            stop_reason=self.stop_reason,
            cached_prompt_len=self.placement.reuse_len if self.placement else 0,
        )

    def deliver(self, kind: str, payload: Any) -> None:
        """Hand a result to the caller's event loop from the engine thread: ``kind`` "token" (a streamed
        ``(token, logprob, version)``), "done" (the Completion) or "error" (an exception)."""

        def put() -> None:
            if kind == "token":
                if self.stream is not None:
                    self.stream.put_nowait(payload)
                return
            if self.stream is not None:
                self.stream.put_nowait(payload)
            if self.future.done():
                return
            if kind == "error":
                self.future.set_exception(payload)
            else:
                self.future.set_result(payload)

        try:
            self.loop.call_soon_threadsafe(put)
        except RuntimeError:  # the caller's loop is closed: nobody is waiting any more
            pass
