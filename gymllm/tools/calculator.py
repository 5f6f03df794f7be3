"""A safe calculator: arithmetic expressions evaluated by walking Python's ``ast`` (never ``eval``).

Supported: integer and decimal literals (``1_000`` and ``1e3`` too), ``+ - * / // % **`` (``^`` is
read as a power, as people write it), unary ``+``/``-``, parentheses, the constants ``pi``, ``e``,
``tau``, and the functions ``sqrt abs round floor ceil exp log log2 log10 sin cos tan asin acos atan
sinh cosh tanh factorial gcd lcm min max hypot degrees radians``. ``×``/``÷`` are accepted.

Bounds keep every call cheap: the expression is at most 1000 characters and 200 nodes deep;
integer results stay below about 10,000 digits (a power or product that would exceed it is refused
before it is computed); ``factorial`` up to 1000. Exact integer arithmetic is kept where the
inputs are integers (``/`` gives an integer when the division is exact).

    evaluate("2 * (3 + 4) ** 2")   # 98
    calculator(expression="sqrt(2)")  # "1.41421356237"
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Any, Callable

from gymllm.errors import ToolError, explain
from gymllm.tools.tool import tool

__all__ = ["CalculatorError", "evaluate", "format_number", "calculator"]

MAX_CHARS = 1000
MAX_BITS = 33_300  # about 10,000 decimal digits
MAX_DEPTH = 200


class CalculatorError(ToolError, ValueError):
    """The expression is not valid calculator input, or its value is out of bounds."""


def _err(
    what: str, received: Any, fix: str, expected: str = "an arithmetic expression"
) -> CalculatorError:
    return CalculatorError(explain(what, expected=expected, received=received, fix=fix))


def _bits(x: Any) -> float:
    if isinstance(x, int):
        return abs(x).bit_length()
    return math.log2(abs(x)) if x not in (0, 0.0) and math.isfinite(x) else 0.0


def _check_int(x: Any) -> Any:
    if isinstance(x, int) and x.bit_length() > MAX_BITS:
        raise _err(
            "calculator result",
            f"an integer of {x.bit_length()} bits",
            "use smaller numbers",
            "at most about 10,000 digits",
        )
    if isinstance(x, float) and not math.isfinite(x):
        raise _err("calculator result", x, "keep the result finite", "a finite number")
    return x


def _pow(a: Any, b: Any) -> Any:
    if isinstance(b, int) and isinstance(a, int) and b >= 0 and _bits(a) * b > MAX_BITS:
        raise _err(
            "power",
            f"{a} ** {b}",
            "use a smaller base or exponent",
            "a result below about 10,000 digits",
        )
    if (
        isinstance(b, (int, float))
        and abs(b) > 10_000
        and not (isinstance(a, (int, float)) and abs(a) in (0, 1))
    ):
        raise _err(
            "power exponent",
            b,
            "use an exponent of at most 10000 in magnitude",
            "|exponent| <= 10000",
        )
    try:
        result = a**b
    except OverflowError:
        raise _err("power", f"{a} ** {b}", "use smaller numbers", "a finite result") from None
    if isinstance(result, complex):
        raise _err(
            "power", f"{a} ** {b}", "a negative base needs an integer exponent", "a real result"
        )
    return result


def _mul(a: Any, b: Any) -> Any:
    if isinstance(a, int) and isinstance(b, int) and _bits(a) + _bits(b) > MAX_BITS:
        raise _err(
            "product",
            "an integer product above 10,000 digits",
            "use smaller numbers",
            "a smaller result",
        )
    return a * b


def _div(a: Any, b: Any) -> Any:
    if b == 0:
        raise _err("division", f"{a} / 0", "do not divide by zero", "a non-zero divisor")
    if isinstance(a, int) and isinstance(b, int) and a % b == 0:
        return a // b
    return a / b


def _floordiv(a: Any, b: Any) -> Any:
    if b == 0:
        raise _err("floor division", f"{a} // 0", "do not divide by zero", "a non-zero divisor")
    return a // b


def _mod(a: Any, b: Any) -> Any:
    if b == 0:
        raise _err("modulo", f"{a} % 0", "do not take a remainder by zero", "a non-zero divisor")
    return a % b


def _factorial(n: Any) -> int:
    if isinstance(n, float) and n.is_integer():
        n = int(n)
    if not isinstance(n, int) or n < 0 or n > 1000:
        raise _err("factorial", n, "use an integer between 0 and 1000", "an integer in [0, 1000]")
    return math.factorial(n)


def _int_fn(fn: Callable[..., int]) -> Callable[..., int]:
    def wrapped(*args: Any) -> int:
        ints = [int(a) if isinstance(a, float) and a.is_integer() else a for a in args]
        if not all(isinstance(a, int) for a in ints):
            raise _err(fn.__name__, args, f"pass integers to {fn.__name__}", "integers")
        return fn(*ints)

    return wrapped


_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: _mul,
    ast.Div: _div,
    ast.FloorDiv: _floordiv,
    ast.Mod: _mod,
    ast.Pow: _pow,
    ast.BitXor: _pow,  # '^' means power on a calculator
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_CONSTANTS = {"pi": math.pi, "e": math.e, "tau": math.tau}
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "sqrt": math.sqrt,
    "abs": abs,
    "round": round,
    "floor": math.floor,
    "ceil": math.ceil,
    "exp": math.exp,
    "log": math.log,
    "ln": math.log,
    "log2": math.log2,
    "log10": math.log10,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "asin": math.asin,
    "acos": math.acos,
    "atan": math.atan,
    "sinh": math.sinh,
    "cosh": math.cosh,
    "tanh": math.tanh,
    "factorial": _factorial,
    "gcd": _int_fn(math.gcd),
    "lcm": _int_fn(math.lcm),
    "min": min,
    "max": max,
    "hypot": math.hypot,
    "degrees": math.degrees,
    "radians": math.radians,
}


def _eval(node: ast.AST, depth: int = 0) -> Any:
    if depth > MAX_DEPTH:
        raise _err("expression", "a too deeply nested expression", "simplify it")
    if isinstance(node, ast.Expression):
        return _eval(node.body, depth + 1)
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, (int, float))
        and not isinstance(node.value, bool)
    ):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        a, b = _eval(node.left, depth + 1), _eval(node.right, depth + 1)
        return _check_int(_BINOPS[type(node.op)](a, b))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand, depth + 1))
    if isinstance(node, ast.Name) and node.id in _CONSTANTS:
        return _CONSTANTS[node.id]
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _FUNCTIONS
    ):
        if node.keywords:
            raise _err(f"{node.func.id}()", "keyword arguments", "pass arguments by position")
        args = [_eval(a, depth + 1) for a in node.args]
        try:
            return _check_int(_FUNCTIONS[node.func.id](*args))
        except CalculatorError:
            raise
        except (ValueError, TypeError, OverflowError, ZeroDivisionError) as e:
            raise _err(
                f"{node.func.id}()", args, f"check the arguments ({e})", "arguments in its domain"
            ) from None
    if isinstance(node, ast.Name):
        raise _err(
            "name",
            node.id,
            f"use numbers, the constants {sorted(_CONSTANTS)} or functions {sorted(_FUNCTIONS)}",
            "a known constant or function",
        )
    raise _err(
        "expression element",
        type(node).__name__,
        "use numbers, + - * / // % ** ^, parentheses and the listed functions",
    )


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression; :class:`CalculatorError` for anything else."""
    if not isinstance(expression, str):
        raise _err(
            "calculator expression",
            type(expression).__name__,
            "pass the expression as a string",
            "a string",
        )
    if len(expression) > MAX_CHARS:
        raise _err(
            "calculator expression",
            f"{len(expression)} characters",
            "shorten it",
            f"at most {MAX_CHARS} characters",
        )
    text = expression.replace("×", "*").replace("÷", "/").replace("−", "-").strip()
    if not text:
        raise _err("calculator expression", expression, "write an expression such as 12 * (3 + 4)")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
        raise _err(
            "calculator expression", expression, f"fix the syntax ({getattr(e, 'msg', e)})"
        ) from None
    try:
        return _eval(tree)
    except RecursionError:
        raise _err("expression", "a too deeply nested expression", "simplify it") from None
    except OverflowError:
        raise _err(
            "calculator result", "an overflow", "use smaller numbers", "a finite number"
        ) from None


def format_number(x: int | float) -> str:
    """Integers exactly; floats with 12 significant digits (integral floats without ``.0``)."""
    if isinstance(x, int):
        return str(x)
    if x.is_integer() and abs(x) < 1e15:
        return str(int(x))
    return format(x, ".12g")


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly and return its value.

    Args:
        expression: an arithmetic expression, e.g. "12 * (345 + 6) / 7" or "sqrt(2) ** 3".
            Supports + - * / // % ** (or ^), parentheses, pi, e and functions such as sqrt, log,
            sin, floor, factorial, gcd, min, max.
    """
    return format_number(evaluate(expression))
