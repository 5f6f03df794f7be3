"""``gymllm/Countdown-v0``: reach a target number from given numbers with + - * / (procedural, always solvable).

Reset draws ``num_numbers`` numbers (small ones 1-10 and large ones 25/50/75/100, as in the TV
game) from the env's ``np_random`` and builds the target by combining a random subset with random
operations whose intermediate results stay positive integers, so every task has a solution. The
prompt asks for an expression inside ``<answer>...</answer>``.

``step(reply)`` reads the last ``<answer>`` block (else the last line that looks like an
expression), evaluates it exactly with fractions through Python's ``ast`` (no ``eval``), and checks
that it uses each given number at most once. Reward 1.0 when it equals the target, else 0.0;
``info["reason"]`` says why (``"correct"``, ``"wrong_value"``, ``"bad_numbers"``, ``"unparsable"``).
With ``max_attempts > 1`` a wrong reply gets feedback and another try.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from fractions import Fraction

from gymllm.core import TextEnv
from gymllm.errors import ConfigError, explain
from gymllm.registration import register

__all__ = ["CountdownEnv", "check_countdown", "evaluate_countdown"]

_SMALL = tuple(range(1, 11))
_LARGE = (25, 50, 75, 100)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_EXPR_LINE = re.compile(r"^[\d\s+\-*/×÷()]+$")
_OPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}


def evaluate_countdown(expr: str) -> tuple[Fraction, list[int]]:
    """Exact value of ``expr`` and the integer literals it uses; ``ValueError`` when it is not + - * / of integers."""
    text = expr.replace("×", "*").replace("÷", "/").replace("−", "-").strip()
    if not text or len(text) > 300:
        raise ValueError("empty or too long expression")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise ValueError(f"not an arithmetic expression: {e}") from None
    used: list[int] = []

    def walk(node: ast.AST) -> Fraction:
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, int)
            and not isinstance(node.value, bool)
        ):
            used.append(node.value)
            return Fraction(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            a, b = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Div) and b == 0:
                raise ValueError("division by zero")
            return _OPS[type(node.op)](a, b)
        raise ValueError(
            f"only integers, + - * / and parentheses are allowed, not {type(node).__name__}"
        )

    try:
        return walk(tree.body), used
    except RecursionError:
        raise ValueError("expression too deeply nested") from None


def check_countdown(expr: str, numbers: list[int], target: int) -> str:
    """``"correct"``, ``"wrong_value"``, ``"bad_numbers"`` or ``"unparsable"``."""
    try:
        value, used = evaluate_countdown(expr)
    except ValueError:
        return "unparsable"
    if Counter(used) - Counter(numbers):
        return "bad_numbers"
    return "correct" if value == target else "wrong_value"


def extract_expression(reply: str) -> str | None:
    """The last ``<answer>`` block, else the last line made only of digits, operators and parentheses."""
    blocks = _ANSWER.findall(reply)
    if blocks:
        body = blocks[-1].strip()
        return body.split("=")[0].strip() if "=" in body else body
    for line in reversed(reply.strip().splitlines()):
        line = line.split("=")[0].strip()
        if line and _EXPR_LINE.match(line) and re.search(r"\d", line):
            return line
    return None


def _int_arg(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(
            explain(
                f"CountdownEnv.{name}",
                expected=f"an int in [{low}, {high}]",
                received=value,
                fix=f"pass {name}= a value in that range",
            )
        )
    return value


class CountdownEnv(TextEnv):
    """Make ``target`` from ``num_numbers`` numbers with + - * / (each number at most once)."""

    def __init__(
        self,
        *,
        num_numbers: int = 4,
        max_target: int = 999,
        max_attempts: int = 1,
        max_turns: int | None = None,
        render_mode: str | None = None,
    ):
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        self.num_numbers = _int_arg("num_numbers", num_numbers, 2, 8)
        self.max_target = _int_arg("max_target", max_target, 10, 10**6)
        self.max_attempts = _int_arg("max_attempts", max_attempts, 1, 100)
        self.numbers: list[int] = []
        self.target = 0

    def _draw_numbers(self) -> list[int]:
        rng = self.np_random
        n_large = int(rng.integers(0, min(2, self.num_numbers - 1) + 1))
        large = [int(x) for x in rng.choice(_LARGE, size=n_large, replace=False)]
        small = [int(x) for x in rng.choice(_SMALL, size=self.num_numbers - n_large)]
        nums = large + small
        return [nums[int(i)] for i in rng.permutation(len(nums))]

    def _make_target(self, numbers: list[int]) -> tuple[int, str] | None:
        """Combine a random subset (>= 2 numbers) with random operations; None if the result is out of range."""
        rng = self.np_random
        k = int(rng.integers(2, len(numbers) + 1))
        order = [numbers[int(i)] for i in rng.permutation(len(numbers))[:k]]
        value, text = order[0], str(order[0])
        for x in order[1:]:
            options = [("+", value + x), ("*", value * x)]
            if value - x > 0:
                options.append(("-", value - x))
            if x > 1 and value % x == 0:
                options.append(("/", value // x))
            op, value = options[int(rng.integers(len(options)))]
            text = f"({text} {op} {x})"
        return (
            (value, text[1:-1] if text.startswith("(") else text)
            if 10 <= value <= self.max_target
            else None
        )

    def _reset(self, *, seed, options):
        for _ in range(100):
            self.numbers = self._draw_numbers()
            made = self._make_target(self.numbers)
            if made is not None:
                break
        else:  # pragma: no cover - vanishingly unlikely; a plain sum is always reachable
            made = (sum(self.numbers), " + ".join(map(str, self.numbers)))
        self.target, self._solution = made
        self._task_id = f"countdown-{'-'.join(map(str, self.numbers))}-{self.target}"
        prompt = (
            f"Using the numbers {self.numbers}, create an expression that equals {self.target}. "
            "You may use + - * / and parentheses, and each number at most once. "
            "Show your work, then give only the expression inside <answer></answer>, "
            "for example <answer>(1 + 2) * 3</answer>."
        )
        return prompt, {
            "task_id": self._task_id,
            "answer": str(self.target),
            "numbers": list(self.numbers),
        }

    def _step(self, action: str):
        expr = extract_expression(action)
        reason = "unparsable" if expr is None else check_countdown(expr, self.numbers, self.target)
        correct = reason == "correct"
        done = correct or self.turn + 1 >= self.max_attempts
        feedback = {
            "correct": "Correct.",
            "wrong_value": f"That does not equal {self.target}.",
            "bad_numbers": f"Use only the numbers {self.numbers}, each at most once.",
            "unparsable": "I could not read an expression inside <answer></answer>.",
        }[reason]
        obs = feedback if done else feedback + " Try again."
        info = {
            "task_id": self._task_id,
            "answer": str(self.target),
            "expression": expr,
            "reason": reason,
            "correct": correct,
        }
        return obs, 1.0 if correct else 0.0, done, info


register("Countdown-v0", "gymllm.envs.countdown:CountdownEnv")
