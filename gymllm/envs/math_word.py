"""``gymllm/MathWord-v0``: math word problems with answer verification (numeric, then symbolic equivalence).

Problems come from a JSONL file: the packaged sample (``gymllm/envs/data/math_word_sample.jsonl``,
24 problems written for this package in the GSM8K format) or ``data_path=`` pointing at a local
GSM8K or MATH file. :func:`load_problems` reads:

- GSM8K: ``{"question": ..., "answer": "<reasoning>\\n#### 42"}``;
- MATH: ``{"problem": ..., "solution": "... \\boxed{\\frac{1}{2}} ..."}`` (``"answer"`` used when present);
- generic: ``{"question" | "problem" | "prompt": ..., "answer": ...}``.

Reset picks a problem with the env's ``np_random`` (or ``options={"index": i}``). ``step(reply)``
extracts the final answer (last ``\\boxed{}``, else ``#### x``, else "answer is x", else the last
number) and :func:`answers_match` compares it with the reference: exact rational comparison of
numbers (``1,000`` = ``1000``, ``0.5`` = ``1/2`` = ``50%``... of the same kind), then symbolic
equivalence with sympy over a safe parse of simple LaTeX (``\\frac``, ``\\sqrt``, ``^``, ``\\pi``;
no ``eval``), then ``math-verify`` when it is installed. Reward 1.0 when they match.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
from fractions import Fraction
from typing import Any

from gymllm.core import TextEnv
from gymllm.errors import ConfigError, explain
from gymllm.registration import register
from gymllm.validation import check_range, is_int, require, require_instance

__all__ = [
    "MathWordEnv",
    "Problem",
    "load_problems",
    "extract_answer",
    "answers_match",
    "SAMPLE_PATH",
    "EASY_PATH",
    "PACKAGED",
]

SAMPLE_PATH = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "data", "math_word_sample.jsonl"
)
EASY_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "math_word_easy.jsonl")
#: packaged problem sets by name (``data_path="easy"``): the GSM8K-style sample (two or three steps)
#: and 60 one-step problems over numbers up to 30 (a sum, a difference or a small product)
PACKAGED = {"sample": SAMPLE_PATH, "easy": EASY_PATH}


@dataclasses.dataclass(frozen=True)
class Problem:
    question: str
    answer: str
    solution: str = ""
    source: str = ""


# --------------------------------------------------------------------------- loading
def _boxed_all(text: str) -> list[str]:
    """Contents of every ``\\boxed{...}`` / ``\\fbox{...}`` with balanced braces."""
    out = []
    for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            out.append(text[m.end() : i - 1].strip())
    return out


def _problem_from_record(rec: Any, where: str) -> Problem:
    require_instance(
        rec,
        dict,
        f"problem record at {where}",
        expected="a JSON object",
        fix="write one JSON object per line",
    )
    question = rec.get("question") or rec.get("problem") or rec.get("prompt")
    require(
        isinstance(question, str) and question.strip(),
        f"problem record at {where}",
        expected='a "question", "problem" or "prompt" text',
        received=sorted(rec),
        fix="use the GSM8K or MATH jsonl format",
    )
    answer, solution = rec.get("answer"), rec.get("solution", "")
    if isinstance(answer, str) and "####" in answer:  # GSM8K
        solution, answer = answer, answer.rsplit("####", 1)[1].strip()
    elif answer is None and isinstance(solution, str):  # MATH
        boxed = _boxed_all(solution)
        answer = boxed[-1] if boxed else None
    require(
        answer is not None and (not isinstance(answer, str) or answer.strip()),
        f"problem record at {where}",
        expected="a reference answer ('#### x', 'answer', or a \\boxed{} in 'solution')",
        received=sorted(rec),
        fix="add the answer",
    )
    return Problem(
        question=question.strip(), answer=str(answer).strip(), solution=str(solution), source=where
    )


def load_problems(path: str | os.PathLike) -> list[Problem]:
    """Every problem in a GSM8K / MATH / generic JSONL file (blank lines skipped)."""
    path = os.fspath(path)
    require(
        os.path.isfile(path),
        "MathWord data_path",
        expected="an existing .jsonl file",
        received=path,
        fix="pass the path of a GSM8K or MATH jsonl file",
    )
    problems = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError as e:
                raise ConfigError(
                    explain(
                        f"{path}:{n}",
                        expected="one JSON object per line",
                        received=line[:80],
                        fix=f"fix the JSON ({e})",
                    )
                ) from None
            problems.append(_problem_from_record(rec, f"{os.path.basename(path)}:{n}"))
    require(
        problems,
        "MathWord data_path",
        expected="at least one problem",
        received=path,
        fix="point at a non-empty jsonl file",
    )
    return problems


# --------------------------------------------------------------------------- answer extraction
_NUMBER = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_ANSWER_IS = re.compile(r"answer\s*(?:is|:)\s*\$?\s*([^\n]+)", re.IGNORECASE)


def extract_answer(reply: str) -> str | None:
    """The final answer in a reply: last ``\\boxed{}``, else ``#### x``, else "answer is x", else the last number."""
    boxed = _boxed_all(reply)
    if boxed:
        return boxed[-1]
    if "####" in reply:
        tail = reply.rsplit("####", 1)[1].strip().splitlines()
        return tail[0].strip() if tail else None
    m = list(_ANSWER_IS.finditer(reply))
    if m:
        nums = _NUMBER.findall(m[-1].group(1))
        return nums[0] if nums else m[-1].group(1).strip().rstrip(".")
    nums = _NUMBER.findall(reply)
    return nums[-1] if nums else None


# --------------------------------------------------------------------------- answer comparison
def _clean(s: str) -> str:
    s = s.strip().strip("$").strip()
    s = re.sub(r"\\text\{\s*([^{}]*)\}", r"\1", s)
    s = re.sub(r"\\(?:mathrm|textbf|mathbf)\{([^{}]*)\}", r"\1", s)
    s = (
        s.replace("\\$", "")
        .replace("\\%", "%")
        .replace("\\!", "")
        .replace("\\,", "")
        .replace("dfrac", "frac")
    )
    s = s.replace("tfrac", "frac").replace("\\left", "").replace("\\right", "")
    s = re.sub(r"(\d),(?=\d{3}\b)", r"\1", s)  # 1,000 -> 1000
    s = re.sub(
        r"(?<=\d)\s*(?:dollars?|cm|km|kg|g|m|liters?|minutes?|hours?|units?|degrees?|°)\.?$", "", s
    )
    return s.strip().rstrip(".").strip()


def _as_fraction(s: str) -> Fraction | None:
    s = s.replace(" ", "")
    pct = s.endswith("%")
    s = s.rstrip("%")
    m = re.fullmatch(r"\\frac\{(-?\d+)\}\{(-?\d+)\}", s) or re.fullmatch(r"(-?\d+)/(-?\d+)", s)
    try:
        value = Fraction(int(m.group(1)), int(m.group(2))) if m else Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None
    return value / 100 if pct else value


def _latex_to_expr(s: str) -> str:
    """Simple LaTeX to Python-expression text (then parsed by :func:`_to_sympy`, never evaluated)."""
    s = (
        s.replace("\\cdot", "*")
        .replace("\\times", "*")
        .replace("\\div", "/")
        .replace("\\pi", " pi ")
    )
    for _ in range(10):  # innermost first
        new = re.sub(r"\\frac\{([^{}]*)\}\{([^{}]*)\}", r"((\1)/(\2))", s)
        new = re.sub(r"\\sqrt\[([^\]]*)\]\{([^{}]*)\}", r"((\2)**(1/(\1)))", new)
        new = re.sub(r"\\sqrt\{([^{}]*)\}", r"sqrt(\1)", new)
        if new == s:
            break
        s = new
    s = re.sub(r"\\sqrt\s*(\d+)", r"sqrt(\1)", s)
    s = s.replace("^", "**").replace("{", "(").replace("}", ")")
    s = re.sub(r"(\d|\))\s*(?=[a-zA-Z(])", r"\1*", s)  # implicit multiplication: 2sqrt(2), 3(x)
    return s


def _to_sympy(text: str):
    """A sympy expression from arithmetic text via ``ast`` (numbers, + - * / **, sqrt, pi, e, symbols)."""
    import sympy

    funcs = {
        "sqrt": sympy.sqrt,
        "log": sympy.log,
        "ln": sympy.log,
        "sin": sympy.sin,
        "cos": sympy.cos,
        "tan": sympy.tan,
        "exp": sympy.exp,
    }
    consts = {"pi": sympy.pi, "e": sympy.E}
    ops = {
        ast.Add: lambda a, b: a + b,
        ast.Sub: lambda a, b: a - b,
        ast.Mult: lambda a, b: a * b,
        ast.Div: lambda a, b: a / b,
        ast.Pow: lambda a, b: a**b,
    }

    def walk(node, depth=0):
        if depth > 50:
            raise ValueError("too deep")
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, (int, float))
            and not isinstance(node.value, bool)
        ):
            return sympy.Rational(str(node.value))
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            a, b = walk(node.left, depth + 1), walk(node.right, depth + 1)
            if isinstance(node.op, ast.Pow) and (not b.is_number or abs(b) > 100):
                raise ValueError("exponent too large")
            return ops[type(node.op)](a, b)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = walk(node.operand, depth + 1)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.Name):
            return consts.get(node.id) or sympy.Symbol(node.id)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in funcs
            and len(node.args) == 1
            and not node.keywords
        ):
            return funcs[node.func.id](walk(node.args[0], depth + 1))
        raise ValueError(f"unsupported element {type(node).__name__}")

    return walk(ast.parse(text, mode="eval").body)


def _symbolic_equal(a: str, b: str) -> bool | None:
    """True/False when both parse as sympy expressions, None when either does not."""
    if len(a) > 200 or len(b) > 200:
        return None
    try:
        import sympy

        ea, eb = _to_sympy(_latex_to_expr(a)), _to_sympy(_latex_to_expr(b))
        diff = sympy.simplify(ea - eb)
        if diff == 0:
            return True
        if diff.is_number:
            return bool(abs(complex(diff.evalf())) < 1e-9)
        return False
    except Exception:  # noqa: BLE001 - any parse/simplify failure: undecided
        return None


def _math_verify_equal(pred: str, gold: str) -> bool | None:
    try:
        import logging

        from math_verify import parse, verify

        logging.getLogger("math_verify").setLevel(
            logging.ERROR
        )  # it warns that we disabled its signal timeouts
    except ImportError:
        return None
    try:
        g = parse(f"${gold}$", parsing_timeout=None)
        p = parse(f"${pred}$", parsing_timeout=None)
        return bool(g and p and verify(g, p, timeout_seconds=None))
    except Exception:  # noqa: BLE001
        return None


def answers_match(pred: str | None, gold: str, *, use_math_verify: bool = True) -> bool:
    """Whether a predicted answer equals the reference (numerically, else symbolically)."""
    if pred is None or not isinstance(pred, str) or len(pred) > 500:
        return False
    p, g = _clean(pred), _clean(gold)
    if p == g:
        return True
    fp, fg = _as_fraction(p), _as_fraction(g)
    if fp is not None and fg is not None:
        return fp == fg or abs(float(fp) - float(fg)) <= 1e-9 * max(1.0, abs(float(fg)))
    same = _symbolic_equal(p, g)
    if same is not None:
        return same
    return bool(use_math_verify and _math_verify_equal(p, g))


# --------------------------------------------------------------------------- env
_PROMPT = (
    "{question}\n\nSolve the problem step by step, then give the final answer inside \\boxed{}."
)
#: the answer alone (the math_word recipe's prompt: SmolLM2-135M derails in long step-by-step replies)
SHORT_PROMPT = "{question}\n\nReply with the final answer only, as a number inside \\boxed{}."


def _check_prompt(prompt: str) -> str:
    require(
        isinstance(prompt, str) and "{question}" in prompt,
        "MathWordEnv.prompt",
        expected="a str containing {question}",
        received=prompt,
        fix="e.g. prompt='{question}\\nAnswer in \\\\boxed{}.'",
    )
    return prompt


_CACHE: dict[str, list[Problem]] = {}


def _cached_problems(path: str) -> list[Problem]:
    key = os.path.realpath(path)
    if key not in _CACHE:
        _CACHE[key] = load_problems(path)
    return _CACHE[key]


class MathWordEnv(TextEnv):
    """One math word problem per episode; reward 1.0 for a verified final answer.

    Args:
        data_path: a GSM8K / MATH / generic jsonl file, or a packaged set's name from :data:`PACKAGED`
            ("sample", the default; "easy": one-step problems).
        max_attempts: replies allowed (feedback "Incorrect. Try again." in between).
        prompt: the user message, a template with ``{question}`` (default: solve step by step, answer in
            ``\\boxed{}``; a small model does better asked for the answer alone, see :data:`SHORT_PROMPT`).
        use_math_verify: use ``math-verify`` as the last equivalence check when installed.
    """

    def __init__(
        self,
        *,
        data_path: str | os.PathLike | None = None,
        max_attempts: int = 1,
        prompt: str = "",
        use_math_verify: bool = True,
        max_turns: int | None = None,
        render_mode: str | None = None,
    ):
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        check_range(
            "MathWordEnv",
            "max_attempts",
            max_attempts,
            lo=1,
            integer=True,
            fix="pass max_attempts=1",
        )
        path = os.fspath(data_path) if data_path is not None else SAMPLE_PATH
        self.data_path = PACKAGED.get(path, path)
        self.problems = _cached_problems(self.data_path)
        self.max_attempts = max_attempts
        self.prompt = _check_prompt(prompt or _PROMPT)
        self.use_math_verify = use_math_verify
        self.problem: Problem | None = None
        self._index = 0

    def _reset(self, *, seed, options):
        index = (options or {}).get("index")
        if index is None:
            index = int(self.np_random.integers(len(self.problems)))
        require(
            is_int(index) and 0 <= index < len(self.problems),
            "MathWordEnv reset options['index']",
            expected=f"an int in [0, {len(self.problems)})",
            received=index,
            fix="omit it to draw a problem from the seed",
        )
        self._index, self.problem = index, self.problems[index]
        info = {
            "task_id": f"{os.path.basename(self.data_path)}#{index}",
            "answer": self.problem.answer,
        }
        return self.prompt.replace("{question}", self.problem.question), info

    def _step(self, action: str):
        pred = extract_answer(action)
        correct = answers_match(pred, self.problem.answer, use_math_verify=self.use_math_verify)
        done = correct or self.turn + 1 >= self.max_attempts
        obs = "Correct." if correct else ("Incorrect." if done else "Incorrect. Try again.")
        info = {
            "task_id": f"{os.path.basename(self.data_path)}#{self._index}",
            "answer": self.problem.answer,
            "parsed": pred,
            "correct": correct,
        }
        return obs, 1.0 if correct else 0.0, done, info


register("MathWord-v0", "gymllm.envs.math_word:MathWordEnv")
