"""Text spaces for LLM environments: :class:`Text` (any Unicode string) and :class:`Chat` (messages).

Gymnasium's own ``spaces.Text`` is a charset-bound character space (it rejects ``"héllo ✓"``) and
is stored as integer arrays in shared memory. The spaces here hold plain Python ``str`` values:

    >>> Text(max_length=16).contains("héllo ✓")
    True
    >>> Chat(max_messages=4).contains([{"role": "user", "content": "hi"}])
    True

Both are :class:`gymnasium.spaces.Space` subclasses: ``sample()`` draws from the space's own RNG
(``seed()``), equality compares the parameters, instances pickle, and ``to_jsonable`` /
``from_jsonable`` convert batches for logging. ``why_not(x)`` returns the reason a value is not in
the space (``None`` when it is), which the env base class uses for its error messages.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from gymnasium.spaces import Space

from gymllm.validation import check_order, require

__all__ = ["Text", "Chat", "DEFAULT_ROLES", "SAMPLE_ALPHABET"]

# Characters that sample() draws from: ASCII plus multi-byte code points (2, 3 and 4 UTF-8 bytes),
# so that anything consuming samples is exercised on real Unicode.
SAMPLE_ALPHABET = (
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,;:!?'\"()[]{}<>+-*/=_\n\t"
    "éüñßøçÅΩπλжЯ✓→★漢字日本語한국어🙂🚀𝔘"
)
DEFAULT_ROLES = ("system", "user", "assistant", "tool")
_SAMPLE_CAP = 64  # longest sample drawn when max_length is larger


def _utf8_error(x: str) -> str | None:
    """Why ``x`` is not valid Unicode text (a lone surrogate cannot be encoded), or None."""
    if x.isascii():
        return None
    try:
        x.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"a lone surrogate at index {e.start} (not encodable as UTF-8)"
    return None


def _check_length_bounds(cls: str, lo_name: str, lo: int, hi_name: str, hi: int) -> None:
    for name, value in ((lo_name, lo), (hi_name, hi)):
        require(
            isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 0,
            f"{cls}.{name}",
            expected="an int >= 0",
            received=value,
            fix=f"pass {name}=<non-negative int>",
        )
    check_order(cls, lo_name, lo, hi_name, hi)


def _sample_string(rng: np.random.Generator, lo: int, hi: int, alphabet: str) -> str:
    n = int(rng.integers(lo, min(hi, max(lo, _SAMPLE_CAP)) + 1))
    idx = rng.integers(0, len(alphabet), size=n)
    return "".join(alphabet[i] for i in idx)


class Text(Space[str]):
    """Any Unicode ``str`` whose length (in code points) lies in ``[min_length, max_length]``.

    Unlike ``gymnasium.spaces.Text`` there is no charset: any valid Unicode text belongs.
    ``sample()`` draws up to 64 characters from :data:`SAMPLE_ALPHABET` (or ``alphabet``);
    ``sample(mask=n)`` draws exactly ``n`` characters.
    """

    def __init__(
        self,
        max_length: int = 1 << 20,
        *,
        min_length: int = 0,
        alphabet: str = SAMPLE_ALPHABET,
        seed: int | np.random.Generator | None = None,
    ):
        _check_length_bounds("Text", "min_length", min_length, "max_length", max_length)
        require(
            isinstance(alphabet, str) and alphabet,
            "Text.alphabet",
            expected="a non-empty str",
            received=alphabet,
            fix="pass alphabet='abc...'",
        )
        self.max_length = int(max_length)
        self.min_length = int(min_length)
        self.alphabet = alphabet
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def why_not(self, x: Any) -> str | None:
        """The reason ``x`` is not in this space, or None if it is."""
        if type(x) is str and self.min_length <= len(x) <= self.max_length and x.isascii():
            return None  # the common case, checked first (this runs on every env step)
        if not isinstance(x, str):
            return f"a value of type {type(x).__name__} (not str)"
        if not self.min_length <= len(x) <= self.max_length:
            return (
                f"a string of {len(x)} characters (allowed: {self.min_length}..{self.max_length})"
            )
        return _utf8_error(x)

    def contains(self, x: Any) -> bool:
        return self.why_not(x) is None

    def sample(self, mask: int | None = None, probability: Any | None = None) -> str:
        """A random string from the space's RNG; ``mask`` (an int) fixes the length."""
        require(
            probability is None,
            "Text.sample",
            expected="probability=None",
            received=probability,
            fix="pass mask=<length>",
        )
        if mask is not None:
            require(
                self.min_length <= int(mask) <= self.max_length,
                "Text.sample(mask=...)",
                expected=f"a length in {self.min_length}..{self.max_length}",
                received=mask,
                fix="pass a length inside the space's bounds",
            )
            lo = int(mask)
            idx = self.np_random.integers(0, len(self.alphabet), size=lo)
            return "".join(self.alphabet[i] for i in idx)
        return _sample_string(self.np_random, self.min_length, self.max_length, self.alphabet)

    def to_jsonable(self, sample_n: Iterable[str]) -> list[str]:
        return [str(s) for s in sample_n]

    def from_jsonable(self, sample_n: list[Any]) -> list[str]:
        return [str(s) for s in sample_n]

    def __eq__(self, other: Any) -> bool:
        return (
            isinstance(other, Text)
            and self.min_length == other.min_length
            and self.max_length == other.max_length
            and self.alphabet == other.alphabet
        )

    def __hash__(self) -> int:
        return hash(("gymllm.Text", self.min_length, self.max_length, self.alphabet))

    def __repr__(self) -> str:
        return f"Text(min_length={self.min_length}, max_length={self.max_length})"


_OPTIONAL_MESSAGE_KEYS = {"tool_calls": list, "tool_call_id": str, "name": str}


def _tool_call_error(call: Any) -> str | None:
    if not isinstance(call, dict):
        return f"a tool call of type {type(call).__name__} (not dict)"
    fn = call.get("function")
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        return "a tool call without function.name (str)"
    if not isinstance(fn.get("arguments", {}), (dict, str)):
        return "a tool call whose function.arguments is neither dict nor str"
    return None


class Chat(Space[list]):
    """A list of chat messages (``gymllm.types.Message`` dicts), at most ``max_messages`` long.

    Each message has a ``role`` in ``roles`` and a ``content`` str of at most ``max_content_length``
    characters; optional keys are ``tool_calls`` (list of ``{"function": {"name", "arguments"}}``),
    ``tool_call_id`` and ``name``. Any other key is rejected so typos surface early.
    """

    def __init__(
        self,
        max_messages: int = 1024,
        *,
        min_messages: int = 0,
        roles: Sequence[str] = DEFAULT_ROLES,
        max_content_length: int = 1 << 20,
        seed: int | np.random.Generator | None = None,
    ):
        _check_length_bounds("Chat", "min_messages", min_messages, "max_messages", max_messages)
        roles = tuple(roles)
        require(
            roles and all(isinstance(r, str) and r for r in roles),
            "Chat.roles",
            expected="a non-empty sequence of role names",
            received=roles,
            fix=f"pass roles={DEFAULT_ROLES!r} or a subset",
        )
        self.max_messages = int(max_messages)
        self.min_messages = int(min_messages)
        self.roles = roles
        self.content = Text(max_content_length)
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def seed(self, seed: int | None = None) -> int | Any:
        out = super().seed(seed)
        self.content.seed(int(self.np_random.integers(2**31)))
        return out

    def message_error(self, m: Any) -> str | None:
        """Why one message is not valid here, or None."""
        if not isinstance(m, dict):
            return f"a message of type {type(m).__name__} (not dict)"
        if m.get("role") not in self.roles:
            return f"role {m.get('role')!r} (allowed: {', '.join(self.roles)})"
        if "content" not in m:
            return "a message without 'content'"
        err = self.content.why_not(m["content"])
        if err is not None:
            return f"content that is {err}"
        for key, value in m.items():
            if key in ("role", "content"):
                continue
            want = _OPTIONAL_MESSAGE_KEYS.get(key)
            if want is None:
                return f"unknown key {key!r} (allowed: role, content, {', '.join(_OPTIONAL_MESSAGE_KEYS)})"
            if not isinstance(value, want):
                return f"{key} of type {type(value).__name__} (expected {want.__name__})"
        for call in m.get("tool_calls", ()):
            err = _tool_call_error(call)
            if err is not None:
                return err
        return None

    def why_not(self, x: Any) -> str | None:
        """The reason ``x`` is not in this space, or None if it is."""
        if not isinstance(x, list):
            return f"a value of type {type(x).__name__} (not list of messages)"
        if not self.min_messages <= len(x) <= self.max_messages:
            return f"{len(x)} messages (allowed: {self.min_messages}..{self.max_messages})"
        for i, m in enumerate(x):
            err = self.message_error(m)
            if err is not None:
                return f"message {i}: {err}"
        return None

    def contains(self, x: Any) -> bool:
        return self.why_not(x) is None

    def sample(
        self, mask: int | None = None, probability: Any | None = None
    ) -> list[dict[str, str]]:
        """Random messages (``mask`` fixes their number) with roles and contents from this space's RNG."""
        require(
            probability is None,
            "Chat.sample",
            expected="probability=None",
            received=probability,
            fix="pass mask=<count>",
        )
        rng = self.np_random
        hi = min(self.max_messages, max(self.min_messages, 4))
        n = int(mask) if mask is not None else int(rng.integers(self.min_messages, hi + 1))
        out = []
        for _ in range(n):
            role = self.roles[int(rng.integers(len(self.roles)))]
            text = _sample_string(
                rng, self.content.min_length, self.content.max_length, self.content.alphabet
            )
            out.append({"role": role, "content": text})
        return out

    def to_jsonable(self, sample_n: Iterable[list]) -> list[list[dict[str, Any]]]:
        return [[dict(m) for m in s] for s in sample_n]

    def from_jsonable(self, sample_n: list[Any]) -> list[list[dict[str, Any]]]:
        return [[dict(m) for m in s] for s in sample_n]

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Chat) and (
            self.min_messages,
            self.max_messages,
            self.roles,
            self.content.max_length,
        ) == (other.min_messages, other.max_messages, other.roles, other.content.max_length)

    def __hash__(self) -> int:
        return hash(
            (
                "gymllm.Chat",
                self.min_messages,
                self.max_messages,
                self.roles,
                self.content.max_length,
            )
        )

    def __repr__(self) -> str:
        return f"Chat(max_messages={self.max_messages}, roles={self.roles})"
