"""``gymllm/CalcMath-v0``: multi-turn multi-digit arithmetic word problems where a calculator tool helps.

Each episode is one short word problem over ``digits``-digit numbers with two or three operations
(e.g. "A warehouse stores 4817 crates with 36 bottles each. It ships 20519 bottles. How many
bottles are left?"), drawn from the env's ``np_random``. Exact multi-digit products are where a
small model fails on its own and a calculator call succeeds, so tool use is what the reward teaches.

``gymllm.make("gymllm/CalcMath-v0", parser="hermes")`` returns
``ToolUse(CalcMathTask(...), tools=[calculator], parser=...)``: tool calls are answered with
``tool`` messages (reward 0), and the first reply without a call is graded: reward 1.0 when its
final answer (last ``\\boxed{}``, else the last integer) is exact. The reset observation is a system
message (how to call the calculator in the chosen format, and how to answer) plus the problem.

``simple=True`` draws one-operation problems instead (a sum, a difference or a product by a
one-digit count, e.g. "A box holds 47 pencils. How many pencils are in 6 boxes?"): with
``digits=2`` a 135M model solves some of them on its own and the calculator solves the rest, so
groups have reward variance from the first step (the recipe's setting).

The raw :class:`CalcMathTask` speaks messages throughout (reset: ``[system, user]``; step: one
``user`` message, "Correct." or "Incorrect."), so its ``observation_space`` is
:class:`~gymllm.spaces.Chat` and Gymnasium's ``check_env(env.unwrapped)`` passes; the wrapped env
returns the same messages.
"""

from __future__ import annotations

from typing import Any, Callable

from gymllm.core import TextEnv
from gymllm.errors import ConfigError, explain
from gymllm.registration import register
from gymllm.spaces import Chat
from gymllm.tools.calculator import calculator
from gymllm.tools.parsers import format_tool_calls
from gymllm.types import ToolCall

__all__ = ["CalcMathTask", "make_calc_math"]

# (template, answer function); numbers a, b, c, d are drawn with the chosen digits (d: a small count).
_TEMPLATES: tuple[tuple[str, Callable[..., int]], ...] = (
    (
        "A warehouse stores {a} crates with {b} bottles in each crate. It ships {c} bottles. "
        "How many bottles are left in the warehouse?",
        lambda a, b, c, d: a * b - c,
    ),
    (
        "A factory makes {a} bolts per hour for {b} hours and then {c} more bolts. How many bolts does it make?",
        lambda a, b, c, d: a * b + c,
    ),
    (
        "A school buys {d} buses for {a} dollars each and {b} desks for {c} dollars each. "
        "How many dollars does it spend?",
        lambda a, b, c, d: d * a + b * c,
    ),
    (
        "A farm harvests {a} kilograms of wheat on each of {d} fields and sells {b} kilograms. "
        "How many kilograms are left?",
        lambda a, b, c, d: a * d - b,
    ),
    ("Compute {a} * {b} - {c} * {d}.", lambda a, b, c, d: a * b - c * d),
    (
        "A stadium has {a} rows of {b} seats. For a game, {c} seats are closed. How many seats are open?",
        lambda a, b, c, d: a * b - c,
    ),
)

# one-operation problems: x >= y are drawn with the chosen digits, d is a one-digit count
_SIMPLE_TEMPLATES: tuple[tuple[str, Callable[..., int]], ...] = (
    ("A box holds {x} pencils. How many pencils are in {d} boxes?", lambda x, y, d: x * d),
    (
        "A shop has {x} apples and gets {y} more. How many apples does it have now?",
        lambda x, y, d: x + y,
    ),
    (
        "A library has {x} books and lends out {y} of them. How many books are left?",
        lambda x, y, d: x - y,
    ),
    ("Compute {x} + {y}.", lambda x, y, d: x + y),
    ("Compute {x} - {y}.", lambda x, y, d: x - y),
    ("Compute {x} * {d}.", lambda x, y, d: x * d),
)

_SYSTEM = (
    "You can use a calculator tool for exact arithmetic. To use it, write a tool call like this:\n"
    "{example}\nYou will get the result back. When you know the answer, reply without a tool call "
    "and put the final answer as an integer inside \\boxed{{}}."
)


class CalcMathTask(TextEnv):
    """The inner task of CalcMath: one problem; the first reply is graded (use :func:`make_calc_math`).

    Args:
        digits: digits of the large numbers (2..12; 1..12 with ``simple``).
        simple: one-operation problems (see the module doc) instead of two or three operations.
        parser: the tool-call format the system prompt shows (the :class:`ToolUse` wrapper parses it).
    """

    def __init__(
        self,
        *,
        digits: int = 4,
        simple: bool = False,
        parser: str = "hermes",
        max_turns: int | None = None,
        render_mode: str | None = None,
    ):
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        lo = 1 if simple else 2
        if isinstance(digits, bool) or not isinstance(digits, int) or not lo <= digits <= 12:
            raise ConfigError(
                explain(
                    "CalcMathTask.digits",
                    expected=f"an int in [{lo}, 12]",
                    received=digits,
                    fix="pass digits=4 (or simple=True for digits=1)",
                )
            )
        self.digits, self.simple = digits, bool(simple)
        self.observation_space = Chat()
        # the simple problems show a short call (a 135M model copies the example's numbers verbatim)
        example = ToolCall("calculator", {"expression": "12 * 34" if simple else "1234 * 56 - 789"})
        self._system = _SYSTEM.format(example=format_tool_calls([example], parser))
        self.answer = 0

    def _reset(self, *, seed, options):
        if self.simple:
            return self._reset_simple()
        rng = self.np_random
        lo, hi = 10 ** (self.digits - 1), 10**self.digits
        a, c = (int(x) for x in rng.integers(lo, hi, size=2))
        b = int(rng.integers(10, 100))  # a two-digit factor keeps products readable
        d = int(rng.integers(3, 10))
        k = int(rng.integers(len(_TEMPLATES)))
        text, fn = _TEMPLATES[k]
        self.answer = fn(a, b, c, d)
        self._task_id = f"calcmath-{k}-{a}-{b}-{c}-{d}"
        obs: list[dict[str, Any]] = [
            {"role": "system", "content": self._system},
            {"role": "user", "content": text.format(a=a, b=b, c=c, d=d)},
        ]
        return obs, {"task_id": self._task_id, "answer": str(self.answer)}

    def _reset_simple(self):
        rng = self.np_random
        lo, hi = 1 if self.digits == 1 else 10 ** (self.digits - 1), 10**self.digits
        x, y = sorted((int(v) for v in rng.integers(lo, hi, size=2)), reverse=True)
        d = int(rng.integers(3, 10))
        k = int(rng.integers(len(_SIMPLE_TEMPLATES)))
        text, fn = _SIMPLE_TEMPLATES[k]
        self.answer = fn(x, y, d)
        self._task_id = f"calcmath-simple-{k}-{x}-{y}-{d}"
        obs: list[dict[str, Any]] = [
            {"role": "system", "content": self._system},
            {"role": "user", "content": text.format(x=x, y=y, d=d)},
        ]
        return obs, {"task_id": self._task_id, "answer": str(self.answer)}

    def _step(self, action: str):
        from gymllm.envs.arithmetic import extract_answer

        parsed = extract_answer(action)
        correct = parsed == self.answer
        info = {
            "task_id": self._task_id,
            "answer": str(self.answer),
            "parsed": parsed,
            "correct": correct,
        }
        feedback = [{"role": "user", "content": "Correct." if correct else "Incorrect."}]
        return feedback, 1.0 if correct else 0.0, True, info


def make_calc_math(
    *,
    digits: int = 4,
    simple: bool = False,
    parser: str = "hermes",
    max_tool_calls: int = 6,
    timeout_s: float = 5.0,
    max_turns: int | None = None,
    render_mode: str | None = None,
):
    """``ToolUse(CalcMathTask(...), tools=[calculator])``: the registered ``gymllm/CalcMath-v0``."""
    from gymllm.wrappers.tool_use import ToolUse

    task = CalcMathTask(
        digits=digits, simple=simple, parser=parser, max_turns=max_turns, render_mode=render_mode
    )
    return ToolUse(
        task, tools=[calculator], parser=parser, max_tool_calls=max_tool_calls, timeout_s=timeout_s
    )


register("CalcMath-v0", "gymllm.envs.calc_math:make_calc_math")
