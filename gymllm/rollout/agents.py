"""Conversation agents: env observations -> chat messages; model output -> env actions.

An agent never knows which model family it talks to: chat formatting lives in the tokenizer
bundle's chat template, tool-call syntax in the per-family parsers of ``gymllm.tools.parsers``.

* :class:`Agent` (base): turns an observation (a ``str`` = a new user message, or a list of
  messages) into messages, and holds the conversation's system prompt and tool schemas.
* :class:`ModelAgent`: the action is the model's text.
* :class:`ToolAgent`: tool schemas go to the chat template's ``tools``; the model writes calls in
  its native format; the history keeps the raw text (so re-renderings show the calls exactly as the
  model wrote them) and the action is that text, which the ``ToolUse`` wrapper parses and executes.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from gymllm.errors import InvalidActionError, explain
from gymllm.types import Message, ToolCall, as_messages


class Agent:
    """Base conversation agent. Subclasses implement :meth:`act`."""

    #: roles of the messages the env appends; checked for prefix preservation at load
    observation_roles: tuple[str, ...] = ("user",)

    def __init__(self, tokenizer: Any, *, system_prompt: str | None = None):
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        stops = getattr(tokenizer, "stop_token_ids", None) or ()
        eos = getattr(tokenizer, "eos_token_id", None)
        self.stop_token_ids = frozenset(int(i) for i in (*stops, *(() if eos is None else (eos,))))

    # --- observations ------------------------------------------------------------------------
    def observation_messages(self, observation: Any) -> list[Message]:
        """A ``str`` becomes one user message; a list of messages is taken as is
        (:func:`gymllm.types.as_messages`)."""
        messages = as_messages(observation)
        if messages is not None:
            return messages
        raise InvalidActionError(
            explain(
                "agent observation",
                expected="a str (user message) or a list of message dicts with a 'role'",
                received=type(observation).__name__,
                fix="return str or list[Message] observations from the env",
            )
        )

    def initial_messages(self, observation: Any, info: dict) -> list[Message]:
        msgs = self.observation_messages(observation)
        if self.system_prompt and not (msgs and msgs[0].get("role") == "system"):
            msgs = [{"role": "system", "content": self.system_prompt}, *msgs]
        return msgs

    def tools(self, info: dict) -> list[dict] | None:
        """Tool JSON schemas for the chat template (none for plain agents)."""
        return None

    # --- model output ------------------------------------------------------------------------
    def text_of(self, sampled_ids: Sequence[int]) -> str:
        """The sampled text without a trailing stop token (for the env and the history only)."""
        ids = [int(i) for i in sampled_ids]
        if ids and ids[-1] in self.stop_token_ids:
            ids = ids[:-1]
        return self.tokenizer.decode(ids)

    def act(self, sampled_ids: Sequence[int], finish_reason: str) -> tuple[Message, str]:
        """Returns ``(assistant message for the history, action for the env)``."""
        raise NotImplementedError


class ModelAgent(Agent):
    """Plain-text agent: the action is the model's text."""

    def act(self, sampled_ids: Sequence[int], finish_reason: str) -> tuple[Message, str]:
        text = self.text_of(sampled_ids)
        return {"role": "assistant", "content": text}, text


def _make_parser(fmt: str) -> Callable[[str], list[ToolCall]]:
    """``text -> calls`` with ``gymllm.tools.parsers.parse_tool_calls`` in format ``fmt``
    ("auto" detects the family from the markup; unreadable fragments are the ToolUse wrapper's to report)."""
    from gymllm.tools.parsers import parse_tool_calls  # import here: tools is a later-loaded layer

    def parse(text: str) -> list[ToolCall]:
        return list(parse_tool_calls(text, fmt))

    return parse


class ToolAgent(Agent):
    """Tool-calling agent (see the module docstring).

    ``tools``: JSON schemas used when the env's reset ``info`` has no ``"tools"``.
    ``parser``: a format name of ``gymllm.tools.parsers`` ("hermes", "llama3", ..., default "auto")
    or a callable ``text -> list[ToolCall]``.
    """

    observation_roles = ("user", "tool")

    def __init__(
        self,
        tokenizer: Any,
        *,
        system_prompt: str | None = None,
        tools: list[dict] | None = None,
        parser: str | Callable[[str], list[ToolCall]] = "auto",
    ):
        super().__init__(tokenizer, system_prompt=system_prompt)
        self._tools = list(tools) if tools else None
        self._parser = _make_parser(parser) if isinstance(parser, str) else parser
        self.last_tool_calls: list[ToolCall] = []

    def tools(self, info: dict) -> list[dict] | None:
        schemas = info.get("tools") if isinstance(info, dict) else None
        return list(schemas) if schemas else self._tools

    def parse(self, text: str) -> list[ToolCall]:
        return self._parser(text)

    def act(self, sampled_ids: Sequence[int], finish_reason: str) -> tuple[Message, str]:
        """The history keeps the raw text (the model's native call syntax, rendered back verbatim);
        the parsed calls are kept in :attr:`last_tool_calls` for accounting."""
        text = self.text_of(sampled_ids)
        self.last_tool_calls = self.parse(text) if finish_reason != "length" else []
        return {"role": "assistant", "content": text}, text
