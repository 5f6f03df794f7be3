"""Token-in, token-out (TITO) trajectory buffer.

One append-only buffer per trajectory::

    ids = prompt ids ++ sampled ids (verbatim) ++ observation delta ++ sampled ids ++ ...

* sampled ids are stored exactly as the engine returned them (never decoded and re-encoded), with
  ``loss_mask == 1`` on every one of them (the model's own stop token included), their behaviour
  logprobs and the policy version of each token;
* template and observation tokens get ``loss_mask == 0``, logprob 0 and version -1;
* an observation's ids are a chat-template delta: the text that
  ``render(history + new, add_generation_prompt=True)`` adds after ``render(history)``, preceded by
  the template's end-of-turn text after an assistant message (``closing``); when the sampled ids
  already end with that end-of-turn token it is not repeated.

When the chat template is not prefix-preserving for the roles the env appends (checked once per
tokenizer by :func:`check_prefix_preserving`, or detected while rendering), the buffer falls back to
one training row per model call: each call is prompted with the re-rendered conversation and becomes
its own row. The switch is logged.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Protocol, Sequence

import numpy as np

from gymllm.types import Message

log = logging.getLogger("gymllm.rollout")

_SENTINEL = "\u2063GYMLLM_SENTINEL\u2063"


class ChatTokenizer(Protocol):
    """The part of ``gymllm.models.TokenizerBundle`` the rollout layer uses."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def apply_chat_template(
        self,
        messages: list,
        tools: list | None = None,
        add_generation_prompt: bool = False,
        tokenize: bool = False,
    ) -> Any: ...


def render(
    tokenizer: ChatTokenizer,
    messages: list[Message],
    tools: list | None = None,
    add_generation_prompt: bool = False,
) -> str:
    """The chat template's text for ``messages`` (tools only when given)."""
    kwargs: dict[str, Any] = {"add_generation_prompt": add_generation_prompt, "tokenize": False}
    if tools:
        kwargs["tools"] = tools
    return tokenizer.apply_chat_template(list(messages), **kwargs)


def _probe_message(role: str) -> Message:
    if role == "tool":
        return {"role": "tool", "content": "42", "tool_call_id": "call_0", "name": "probe"}
    return {"role": role, "content": "Next: say more."}


def check_prefix_preserving(
    tokenizer: ChatTokenizer, roles: Sequence[str] = ("user",), tools: list | None = None
) -> bool:
    """True when appending a message of each role (and a later assistant turn) keeps the rendering
    of the earlier conversation as an exact text prefix. Uses the bundle's own check when it has one."""
    own = getattr(tokenizer, "is_prefix_preserving", None)
    if own is not None and not tools:
        try:
            return bool(own(roles=tuple(roles)))
        except TypeError:
            return bool(own(tuple(roles)))
    base: list[Message] = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello there."},
    ]
    try:
        prev = render(tokenizer, base, tools)
        for role in roles:
            ext = base + [_probe_message(role)]
            if not render(tokenizer, ext, tools, add_generation_prompt=True).startswith(prev):
                return False
            later = ext + [{"role": "assistant", "content": "Done."}]
            if not render(tokenizer, later, tools).startswith(prev):
                return False
    except Exception as e:  # a template that cannot render a role cannot be extended with it
        log.warning("chat template failed the prefix check for roles %s: %r", roles, e)
        return False
    return True


def closing_text(tokenizer: ChatTokenizer, tools: list | None = None) -> str:
    """What the template renders right after an assistant message's content (e.g. ``<|im_end|>\\n``)."""
    msgs: list[Message] = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": _SENTINEL},
    ]
    text = render(tokenizer, msgs, tools)
    i = text.rfind(_SENTINEL)
    return text[i + len(_SENTINEL) :] if i >= 0 else ""


@dataclasses.dataclass
class Row:
    """One training row: ids with aligned mask, behaviour logprobs, versions and sampled spans."""

    token_ids: list[int] = dataclasses.field(default_factory=list)
    loss_mask: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)
    turn_boundaries: list[tuple[int, int]] = dataclasses.field(default_factory=list)

    def extend_context(self, ids: Sequence[int]) -> None:
        n = len(ids)
        self.token_ids.extend(int(i) for i in ids)
        self.loss_mask.extend([0] * n)
        self.logprobs.extend([0.0] * n)
        self.versions.extend([-1] * n)

    def extend_sampled(
        self, ids: Sequence[int], logprobs: Sequence[float], versions: Sequence[int]
    ) -> None:
        start = len(self.token_ids)
        self.token_ids.extend(int(i) for i in ids)
        self.loss_mask.extend([1] * len(ids))
        self.logprobs.extend(float(x) for x in logprobs)
        self.versions.extend(int(v) for v in versions)
        self.turn_boundaries.append((start, len(self.token_ids)))

    def arrays(self) -> dict[str, np.ndarray]:
        return {
            "token_ids": np.asarray(self.token_ids, dtype=np.int32),
            "loss_mask": np.asarray(self.loss_mask, dtype=np.int8),
            "behaviour_logprobs": np.asarray(self.logprobs, dtype=np.float32),
            "versions": np.asarray(self.versions, dtype=np.int32),
        }


class TokenBuffer:
    """Builds a trajectory's training rows token-in, token-out (see the module docstring).

    Call order: :meth:`start` (initial messages) -> repeat { :attr:`prompt_ids` -> engine ->
    :meth:`add_sampled` -> env -> :meth:`add_observation` }.
    """

    def __init__(
        self,
        tokenizer: ChatTokenizer,
        *,
        tools: list | None = None,
        prefix_preserving: bool = True,
        stop_token_ids: Sequence[int] | None = None,
        trajectory_id: str = "",
    ):
        self.tokenizer = tokenizer
        self.tools = tools or None
        self.fallback = not prefix_preserving
        stops = (
            stop_token_ids
            if stop_token_ids is not None
            else getattr(tokenizer, "stop_token_ids", ())
        )
        self.stop_token_ids = frozenset(int(i) for i in (stops or ()))
        self.trajectory_id = trajectory_id
        self.messages: list[Message] = []
        self.rows: list[Row] = []
        self._closing: str | None = None
        self._last_sampled: list[int] = []
        self._awaiting_observation = False
        if self.fallback:
            log.info(
                "trajectory %s: chat template is not prefix-preserving; one training row per model call",
                trajectory_id,
            )

    # --- building ---------------------------------------------------------------------------
    def start(self, messages: list[Message]) -> list[int]:
        """Set the initial conversation; returns the first prompt's ids."""
        if self.rows:
            raise RuntimeError(
                "TokenBuffer.start called twice. Fix: use one TokenBuffer per trajectory."
            )
        self.messages = list(messages)
        row = Row()
        row.extend_context(self._encode_prompt())
        self.rows.append(row)
        return list(row.token_ids)

    @property
    def prompt_ids(self) -> list[int]:
        """The ids to send to the engine for the next model call."""
        return list(self.rows[-1].token_ids)

    def add_sampled(
        self,
        ids: Sequence[int],
        logprobs: Sequence[float],
        versions: Sequence[int],
        message: Message,
    ) -> None:
        """Append a model call's sampled ids verbatim (mask 1) and its assistant message to the history."""
        if not self.rows:
            raise RuntimeError(
                "TokenBuffer.add_sampled before start(). Fix: call start(messages) first."
            )
        if not (len(ids) == len(logprobs) == len(versions)):
            raise ValueError(
                f"TokenBuffer.add_sampled: expected ids, logprobs and versions of one length, received "
                f"{len(ids)}, {len(logprobs)}, {len(versions)}. Fix: pass the Completion's aligned arrays."
            )
        self.rows[-1].extend_sampled(ids, logprobs, versions)
        self.messages.append(message)
        self._last_sampled = [int(i) for i in ids]
        self._awaiting_observation = True

    def add_observation(self, new_messages: list[Message]) -> list[int]:
        """Append the env's messages; returns the ids added to the current row (the delta, mask 0).

        In fallback mode a new row starts, prompted with the re-rendered conversation.
        """
        if not self._awaiting_observation:
            raise RuntimeError(
                "TokenBuffer.add_observation without a model call before it. Fix: add_sampled first."
            )
        self._awaiting_observation = False
        prev = render(self.tokenizer, self.messages, self.tools)
        self.messages.extend(new_messages)
        if not self.fallback:
            full = render(self.tokenizer, self.messages, self.tools, add_generation_prompt=True)
            if full.startswith(prev):
                delta = self._delta_ids(full[len(prev) :])
                self.rows[-1].extend_context(delta)
                return delta
            self.fallback = True
            log.warning(
                "trajectory %s: chat template rewrote earlier turns (not prefix-preserving for %s); "
                "falling back to one training row per model call",
                self.trajectory_id,
                [m.get("role") for m in new_messages],
            )
        row = Row()
        row.extend_context(self._encode_prompt())
        self.rows.append(row)
        return list(row.token_ids)

    # --- helpers ----------------------------------------------------------------------------
    def _encode_prompt(self) -> list[int]:
        return list(
            self.tokenizer.encode(
                render(self.tokenizer, self.messages, self.tools, add_generation_prompt=True)
            )
        )

    def _delta_ids(self, rest: str) -> list[int]:
        if self._closing is None:
            self._closing = closing_text(self.tokenizer, self.tools)
        ids = list(self.tokenizer.encode(self._closing + rest))
        last = self._last_sampled[-1] if self._last_sampled else None
        if (
            self._closing
            and last is not None
            and last in self.stop_token_ids
            and ids
            and ids[0] == last
        ):
            ids = ids[1:]  # the model closed its own turn with the template's end-of-turn token
        return ids
