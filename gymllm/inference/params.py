"""SamplingParams: how one request is sampled (frozen, keyword-only, validated).

``temperature == 0`` means greedy decoding. ``top_k == 0`` and ``top_p == 1`` disable those
filters. ``stop_token_ids`` and ``stop`` (strings) end a request with finish reason "stop";
``max_tokens`` ends it with "length". ``seed`` makes sampling reproducible (sample ``i`` of a
request uses a key derived from ``(seed, i)``); without a seed every request gets a fresh key.
``n`` is the number of samples of one prompt (see ``Engine.generate_n``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from gymllm.errors import ConfigError, explain


def _int_tuple(name: str, value: Any) -> tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value,)
    try:
        out = tuple(value)
    except TypeError:
        out = None
    if out is None or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in out):
        raise ConfigError(
            explain(f"SamplingParams.{name}", expected="a sequence of non-negative int token ids",
                    received=value, fix=f"pass e.g. {name}=(2,) or {name}=()")
        )
    return out


def _str_tuple(name: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = (value,)
    try:
        out = tuple(value)
    except TypeError:
        out = None
    if out is None or not all(isinstance(v, str) and v for v in out):
        raise ConfigError(
            explain(f"SamplingParams.{name}", expected="a sequence of non-empty strings",
                    received=value, fix=f"pass e.g. {name}=('</answer>',) or {name}=()")
        )
    return out


def _check(ok: bool, field: str, *, expected: str, received: Any, fix: str) -> None:
    if not ok:
        raise ConfigError(explain(f"SamplingParams.{field}", expected=expected, received=received, fix=fix))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """Per-request sampling settings; see the module docstring for the meaning of each field."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 256
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    seed: int | None = None
    n: int = 1

    def __post_init__(self) -> None:
        t = self.temperature
        _check(isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t >= 0,
               "temperature", expected="a finite float >= 0 (0 = greedy)", received=t, fix="use e.g. temperature=1.0")
        p = self.top_p
        _check(isinstance(p, (int, float)) and not isinstance(p, bool) and 0 < p <= 1,
               "top_p", expected="a float in (0, 1] (1 = off)", received=p, fix="use e.g. top_p=0.95 or 1.0")
        _check(_is_int(self.top_k) and self.top_k >= 0, "top_k", expected="an int >= 0 (0 = off)",
               received=self.top_k, fix="use e.g. top_k=50 or 0")
        _check(_is_int(self.max_tokens) and self.max_tokens >= 1, "max_tokens", expected="an int >= 1",
               received=self.max_tokens, fix="use e.g. max_tokens=256")
        _check(self.seed is None or _is_int(self.seed), "seed", expected="None or an int",
               received=self.seed, fix="use e.g. seed=0 or leave it None")
        _check(_is_int(self.n) and self.n >= 1, "n", expected="an int >= 1", received=self.n, fix="use n=1")
        object.__setattr__(self, "temperature", float(t))
        object.__setattr__(self, "top_p", float(p))
        object.__setattr__(self, "stop_token_ids", _int_tuple("stop_token_ids", self.stop_token_ids))
        object.__setattr__(self, "stop", _str_tuple("stop", self.stop))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def replace(self, **changes: Any) -> "SamplingParams":
        return dataclasses.replace(self, **changes)
