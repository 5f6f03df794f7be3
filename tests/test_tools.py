"""@tool schemas, argument validation, the registry's error path, and the calculator against Python's own arithmetic."""

from __future__ import annotations

import asyncio
import enum
import fractions
import math
from typing import Literal, Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gymllm.errors import ConfigError, ToolError
from gymllm.tools import CalculatorError, ToolRegistry, calculator, tool
from gymllm.tools.calculator import evaluate, format_number
from gymllm.tools.tool import parse_docstring
from gymllm.types import ToolCall


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


def test_schema_from_google_docstring_and_signature():
    @tool
    def search(
        query: str,
        k: int = 3,
        tags: list[str] | None = None,
        mode: Literal["fast", "slow"] = "fast",
        color: Color = Color.RED,
        strict: bool = False,
    ) -> list[str]:
        """Search the notes.

        Longer text that is not the summary.

        Args:
            query: what to look for,
                over two lines.
            k (int): how many hits.
            tags: optional tags.

        Returns:
            the hits.
        """
        return [query] * k

    fn = search.schema["function"]
    assert fn["name"] == "search" and fn["description"] == "Search the notes."
    props = fn["parameters"]["properties"]
    assert props["query"] == {"type": "string", "description": "what to look for, over two lines."}
    assert props["k"] == {"type": "integer", "description": "how many hits.", "default": 3}
    assert props["tags"]["type"] == "array" and props["tags"]["items"] == {"type": "string"}
    assert props["mode"] == {"enum": ["fast", "slow"], "type": "string", "default": "fast"}
    assert props["color"] == {"type": "string", "enum": ["red", "blue"]}
    assert props["strict"]["type"] == "boolean"
    assert fn["parameters"]["required"] == ["query"]
    assert search(query="x", k=2) == ["x", "x"]  # still a plain callable


def test_numpy_docstring():
    summary, args = parse_docstring("""Add numbers.

    Parameters
    ----------
    a : int
        The first one.
    b : float
        The second
        one.

    Returns
    -------
    float
    """)
    assert summary == "Add numbers."
    assert args == {"a": "The first one.", "b": "The second one."}


def test_validate_coerces_exactly_and_rejects_clearly():
    @tool
    def f(n: int, x: float, flag: bool = False, name: Optional[str] = None) -> str:
        """F."""
        return f"{n} {x} {flag} {name}"

    assert f.validate({"n": "3", "x": 2, "flag": "true"}) == {"n": 3, "x": 2.0, "flag": True}
    with pytest.raises(ToolError, match="'n'.*an integer"):
        f.validate({"n": "3.5", "x": 1})
    with pytest.raises(ToolError, match="required"):
        f.validate({"x": 1})
    with pytest.raises(ToolError, match="unknown argument"):
        f.validate({"n": 1, "x": 1, "zzz": 0})
    with pytest.raises(ToolError, match="JSON object"):
        f.validate([1, 2])


def test_registry_turns_every_failure_into_a_result():
    @tool
    def boom(x: int) -> int:
        """Raise."""
        raise RuntimeError("kaput")

    @tool
    async def slow(seconds: float) -> str:
        """Sleep."""
        await asyncio.sleep(seconds)
        return "done"

    reg = ToolRegistry([calculator, boom, slow])
    assert [s["function"]["name"] for s in reg.schemas] == ["calculator", "boom", "slow"]

    async def go():
        return await asyncio.gather(
            reg.acall(ToolCall("calculator", {"expression": "6*7"}, "a")),
            reg.acall(ToolCall("nope", {}, "b")),
            reg.acall(ToolCall("boom", {"x": "not int"}, "c")),
            reg.acall(ToolCall("boom", {"x": 1}, "d")),
            reg.acall(ToolCall("slow", {"seconds": 5}, "e"), timeout_s=0.05),
            reg.acall(ToolCall("slow", {"seconds": 0}, "f"), timeout_s=1),
        )

    ok, unknown, bad, exc, timeout, fine = asyncio.run(go())
    assert (ok.ok, ok.content) == (True, "42")
    assert unknown.error == "unknown_tool" and "calculator" in unknown.content
    assert bad.error == "bad_arguments" and "'x'" in bad.content
    assert exc.error == "exception" and "kaput" in exc.content
    assert timeout.error == "timeout"
    assert fine.ok and fine.content == "done"
    with pytest.raises(ToolError, match="unique"):
        reg.add(tool(lambda expression: 0, name="calculator"))


# ------------------------------------------------------------------ calculator vs a reference
def _expr_tree(depth: int):
    leaf = st.integers(-(10**6), 10**6).map(
        lambda v: (str(v) if v >= 0 else f"({v})", fractions.Fraction(v))
    )
    if depth == 0:
        return leaf

    def combine(t):
        (sa, va), op, (sb, vb) = t
        if op == "/" and vb == 0:
            op = "*"
        value = {"+": va + vb, "-": va - vb, "*": va * vb, "/": va / vb if vb else None}[op]
        return f"({sa} {op} {sb})", value

    sub = _expr_tree(depth - 1)
    return st.one_of(leaf, st.tuples(sub, st.sampled_from("+-*/"), sub).map(combine))


@settings(max_examples=50, deadline=None)
@given(_expr_tree(3))
def test_calculator_matches_exact_rational_arithmetic(case):
    text, exact = case
    value = evaluate(text)
    if exact.denominator == 1 and isinstance(value, int):
        assert value == exact
    else:
        assert math.isclose(value, float(exact), rel_tol=1e-9, abs_tol=1e-9)


@pytest.mark.parametrize(
    "text,expected",
    [
        ("2 ^ 10", 1024),
        ("-(3) ** 2", -9),
        ("17 // 5", 3),
        ("17 % 5", 2),
        ("7 / 2", 3.5),
        ("8 / 2", 4),
        ("sqrt(16)", 4.0),
        ("factorial(5)", 120),
        ("gcd(12, 18)", 6),
        ("max(1, 7, 3)", 7),
        ("2 × 3 ÷ 4", 1.5),
        ("1_000 * 3", 3000),
        ("round(2.567, 2)", 2.57),
    ],
)
def test_calculator_cases(text, expected):
    assert evaluate(text) == expected


@pytest.mark.parametrize(
    "text,match",
    [
        ("__import__('os')", "name|element"),
        ("(1).__class__", "element"),
        ("2 ** 10**9", "power"),
        ("1 / 0", "non-zero"),
        ("9" * 1001, "characters"),
        ("x + 1", "name"),
        ("factorial(10**5)", "factorial"),
        ("sqrt(-1)", "domain"),
        ("10.0 ** 400", "finite"),
        ("", "expression"),
        ("(" * 300 + "1" + ")" * 300, "nested|syntax"),
        ("[1, 2]", "element"),
        ("lambda: 1", "element"),
        ("(-8) ** 0.5", "real"),
    ],
)
def test_calculator_refuses_with_a_clear_message(text, match):
    with pytest.raises(CalculatorError, match=match):
        evaluate(text)


def test_calculator_tool_and_formatting():
    assert calculator(expression="10 / 4") == "2.5"
    assert calculator(expression="2 ** 64") == str(2**64)
    assert format_number(1e20) == "1e+20" and format_number(3.0) == "3"
    with pytest.raises(ConfigError):
        from gymllm.tools import parse_tool_calls

        parse_tool_calls("x", format="klingon")
