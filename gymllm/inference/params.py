"""SamplingParams: how one request is sampled (frozen, keyword-only, validated).

``temperature == 0`` means greedy decoding. ``top_k == 0`` and ``top_p == 1`` disable those
filters. ``stop_token_ids`` and ``stop`` (strings) end a request with finish reason "stop";
``max_tokens`` ends it with "length". ``seed`` makes sampling reproducible (sample ``i`` of a
request uses a key derived from ``(seed, i)``); without a seed every request gets a fresh key.
``n`` is the number of samples of one prompt (see ``Engine.generate_n``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from gymllm.errors import EngineError
from gymllm.validation import check_range, is_int, is_number, require


def _tuple_of(
    name: str,
    value: Any,
    item: Callable[[Any], bool],
    ok: Callable[[Any], bool],
    expected: str,
    example: str,
) -> tuple[Any, ...]:
    """``value`` as a tuple (a lone ``item`` becomes a 1-tuple) whose entries all pass ``ok``."""
    if item(value):
        value = (value,)
    try:
        out = tuple(value)
    except TypeError:
        out = None
    require(
        out is not None and all(ok(v) for v in out),
        f"SamplingParams.{name}",
        expected=expected,
        received=value,
        fix=f"pass e.g. {name}={example} or {name}=()",
    )
    return out


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _stop_str(value: Any) -> bool:
    return isinstance(value, str) and bool(value)


def _token_id(value: Any) -> bool:
    return is_int(value) and value >= 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """Per-request sampling settings; see the module docstring for the meaning of each field."""

    temperature: float = 1.0
    """Sampling temperature (0 = greedy)."""
    top_p: float = 1.0
    """Nucleus sampling's probability mass (1 = off)."""
    top_k: int = 0
    """Sample among the k most likely tokens (0 = off)."""
    max_tokens: int = 256
    """Most tokens one request generates (finish reason length)."""
    stop_token_ids: tuple[int, ...] = ()
    """Token ids that end a request (finish reason stop)."""
    stop: tuple[str, ...] = ()
    """Strings that end a request (finish reason stop)."""
    seed: int | None = None
    """Makes sampling reproducible (sample i uses a key derived from (seed, i)); None: a fresh key per request."""
    n: int = 1
    """Samples of one prompt (Engine.generate_n)."""

    def __post_init__(self) -> None:
        c = "SamplingParams"
        t, p = self.temperature, self.top_p
        require(
            is_number(t) and t >= 0,
            f"{c}.temperature",
            expected="a finite float >= 0 (0 = greedy)",
            received=t,
            fix="use e.g. temperature=1.0",
        )
        require(
            is_number(p) and 0 < p <= 1,
            f"{c}.top_p",
            expected="a float in (0, 1] (1 = off)",
            received=p,
            fix="use e.g. top_p=0.95 or 1.0",
        )
        check_range(
            c, "top_k", self.top_k, lo=0, integer=True, fix="use e.g. top_k=50 or 0 (0 = off)"
        )
        check_range(
            c, "max_tokens", self.max_tokens, lo=1, integer=True, fix="use e.g. max_tokens=256"
        )
        check_range(
            c,
            "seed",
            self.seed,
            integer=True,
            optional=True,
            fix="use e.g. seed=0 or leave it None",
        )
        check_range(c, "n", self.n, lo=1, integer=True, fix="use n=1")
        object.__setattr__(self, "temperature", float(t))
        object.__setattr__(self, "top_p", float(p))
        for name, item, ok, expected, example in (
            (
                "stop_token_ids",
                is_int,
                _token_id,
                "a sequence of non-negative int token ids",
                "(2,)",
            ),
            ("stop", _is_str, _stop_str, "a sequence of non-empty strings", "('</answer>',)"),
        ):
            value = _tuple_of(name, getattr(self, name), item, ok, expected, example)
            object.__setattr__(self, name, value)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def replace(self, **changes: Any) -> "SamplingParams":
        return dataclasses.replace(self, **changes)


def require_one_sample(
    params: SamplingParams,
    call: str = "generate",
    fix: str = "call generate_n(prompt_ids, params) to get n completions",
) -> None:
    """An engine's single-sample ``call`` (``generate``, ``stream``) refuses ``params.n != 1``
    (:class:`~gymllm.errors.EngineError`)."""
    require(
        params.n == 1,
        "SamplingParams.n",
        expected=f"1 for {call}",
        received=params.n,
        fix=fix,
        error=EngineError,
    )


def require_prompt(prompt_ids: Any) -> None:
    """An engine refuses an empty prompt (:class:`~gymllm.errors.EngineError`)."""
    require(
        len(prompt_ids) > 0,
        "prompt_ids",
        expected="at least one token id",
        received=[],
        fix="pass a non-empty prompt",
        error=EngineError,
    )
