"""``gymllm/Arithmetic-v0``: multi-digit arithmetic with a verifiable answer and seeded generation.

The reset observation asks for one expression, e.g. ``"Compute 482 * 17 - 903. Give the final
answer as an integer inside \\boxed{}."``; the env draws operands and operators from its own RNG,
so a seed fixes the problem. ``step(reply)`` extracts the answer (the last ``\\boxed{...}``, else
the last integer in the reply), rewards 1.0 when it equals the exact value, and ends the episode;
with ``max_attempts > 1`` a wrong reply gets ``"Incorrect. Try again."`` until attempts run out.
``info`` carries ``task_id``, ``answer`` (the exact integer as a string) and, after a step,
``parsed`` and ``correct``.
"""

from __future__ import annotations

import re

from gymllm.core import TextEnv
from gymllm.errors import ConfigError, explain
from gymllm.registration import register
from gymllm.validation import check_range

__all__ = ["ArithmeticEnv", "extract_answer", "evaluate"]

_OPS = ("+", "-", "*")
_BOXED = re.compile(r"\\boxed\{\s*([^{}]*?)\s*\}")
_INT = re.compile(r"[-−]?\d[\d,]*")


def extract_answer(reply: str) -> int | None:
    """The integer a reply gives: the last ``\\boxed{...}`` if any, else the last integer; None if none."""
    boxed = _BOXED.findall(reply)
    candidates = _INT.findall(boxed[-1]) if boxed else _INT.findall(reply)
    if not candidates:
        return None
    text = candidates[-1].replace(",", "").replace("−", "-")
    try:
        return int(text)
    except ValueError:
        return None


def evaluate(operands: list[int], ops: list[str]) -> int:
    """Exact value of ``operands[0] ops[0] operands[1] ...`` with ``*`` before ``+``/``-``."""
    terms, signs = [operands[0]], []
    for op, x in zip(ops, operands[1:]):
        if op == "*":
            terms[-1] *= x
        else:
            terms.append(x)
            signs.append(1 if op == "+" else -1)
    return terms[0] + sum(s * t for s, t in zip(signs, terms[1:]))


class ArithmeticEnv(TextEnv):
    """Compute an expression of ``num_operands`` integers of up to ``digits`` digits each."""

    def __init__(
        self,
        *,
        digits: int = 3,
        num_operands: int = 2,
        ops: str = "+-*",
        max_attempts: int = 1,
        max_turns: int | None = None,
        render_mode: str | None = None,
    ):
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        for name, value, lo, default in (
            ("digits", digits, 1, 3),
            ("num_operands", num_operands, 2, 2),
            ("max_attempts", max_attempts, 1, 1),
        ):
            check_range(
                "ArithmeticEnv", name, value, lo=lo, integer=True, fix=f"pass {name}={default}"
            )
        self.digits, self.num_operands, self.max_attempts = digits, num_operands, max_attempts
        if not ops or any(o not in _OPS for o in ops):
            raise ConfigError(
                explain(
                    "ArithmeticEnv.ops",
                    expected=f"a non-empty string of {''.join(_OPS)}",
                    received=ops,
                    fix="pass ops='+-*'",
                )
            )
        self.ops = ops
        self._answer = 0
        self._task_id = ""

    def _draw(self) -> tuple[list[int], list[str]]:
        rng = self.np_random
        lo, hi = 10 ** (self.digits - 1) if self.digits > 1 else 0, 10**self.digits
        operands = [int(x) for x in rng.integers(lo, hi, size=self.num_operands)]
        ops = [self.ops[int(i)] for i in rng.integers(len(self.ops), size=self.num_operands - 1)]
        return operands, ops

    def _reset(self, *, seed, options):
        operands, ops = self._draw()
        expr = " ".join([str(operands[0])] + [f"{o} {x}" for o, x in zip(ops, operands[1:])])
        self._answer = evaluate(operands, ops)
        self._task_id = f"arith-{self.digits}d-{expr.replace(' ', '')}"
        prompt = f"Compute {expr}. Give the final answer as an integer inside \\boxed{{}}."
        return prompt, {"task_id": self._task_id, "answer": str(self._answer)}

    def _step(self, action: str):
        parsed = extract_answer(action)
        correct = parsed == self._answer
        done = correct or self.turn + 1 >= self.max_attempts
        obs = "Correct." if correct else ("Incorrect." if done else "Incorrect. Try again.")
        info = {
            "task_id": self._task_id,
            "answer": str(self._answer),
            "parsed": parsed,
            "correct": correct,
        }
        return obs, 1.0 if correct else 0.0, done, info


register("Arithmetic-v0", "gymllm.envs.arithmetic:ArithmeticEnv")
