"""Tool schemas and argument coercion are pydantic's: compared with pydantic's own schema and validation."""

import dataclasses
import enum
from typing import Literal, Optional

import pydantic
import pytest

from gymllm.errors import ToolError
from gymllm.tools import tool
from gymllm.tools.tool import json_schema_for, parse_docstring, tidy_schema


class Unit(enum.Enum):
    CELSIUS = "celsius"
    KELVIN = "kelvin"


class Priority(enum.IntEnum):
    LOW = 1
    HIGH = 2


@dataclasses.dataclass
class Point:
    x: int
    y: int = 0


def _pydantic_params(fn) -> dict:
    """pydantic's schema of ``fn``'s arguments (a validate_call'd function's own), tidied the same way."""
    fields = {}
    import inspect

    for name, p in inspect.signature(fn).parameters.items():
        fields[name] = (p.annotation, ... if p.default is p.empty else p.default)
    model = pydantic.create_model("M", **fields)
    return tidy_schema(model.model_json_schema())


SIGNATURES = [
    (Optional[int], None),
    (Literal["a", "b", 3], "a"),
    (list[int], None),
    (float, 1.5),
    (Unit, None),
    (Priority, None),
    (list[Unit], None),
    (dict[str, int], None),
    (tuple[int, str], None),
    (Point, None),
    (Optional[list[str]], None),
    (int | str, 3),
    (bool, True),
]


@pytest.mark.parametrize("annotation,default", SIGNATURES, ids=[str(a) for a, _ in SIGNATURES])
def test_parameter_schema_is_pydantics(annotation, default):
    def f(value, other: str = "x"):
        """F."""

    f.__annotations__ = {"value": annotation, "other": str}
    if default is not None:
        f.__defaults__ = (default, "x")
    t = tool(f)
    ours = dict(t.parameters["properties"]["value"])
    theirs = dict(_pydantic_params(f)["properties"]["value"])
    # the one documented difference: a default is shown only when it is a JSON scalar
    if not isinstance(default, (int, float, str, bool)) and default is not None:
        theirs.pop("default", None)
    assert ours == theirs
    assert json_schema_for(annotation) == tidy_schema(
        pydantic.TypeAdapter(annotation).json_schema()
    )
    assert t.parameters["required"] == ([] if default is not None else ["value"])
    assert t.parameters["properties"]["other"] == {"type": "string", "default": "x"}


def test_optional_is_shown_as_its_type_but_still_accepts_null():
    @tool
    def f(tags: Optional[list[str]] = None) -> str:
        """F."""
        return str(tags)

    assert f.parameters["properties"]["tags"] == {
        "type": "array",
        "items": {"type": "string"},
        "default": None,
    }
    assert f.validate({"tags": None}) == {"tags": None}
    assert f.validate({"tags": ["a"]}) == {"tags": ["a"]}


def test_coercion_matches_pydantic_validation():
    @tool
    def f(
        n: int,
        unit: Unit,
        pri: Priority = Priority.LOW,
        xs: list[int] = (),
        p: Optional[Point] = None,
        label: str = "",
    ) -> str:
        """F."""
        return ""

    args = {"n": "7", "unit": "kelvin", "pri": 2, "xs": ["1", 2.0], "p": {"x": "3"}, "label": 5}
    got = f.validate(args)
    ref = pydantic.TypeAdapter(Point).validate_python({"x": "3"})
    assert got == {
        "n": 7,
        "unit": Unit.KELVIN,
        "pri": Priority.HIGH,
        "xs": [1, 2],
        "p": ref,
        "label": "5",
    }
    with pytest.raises(ToolError, match=r"'xs\[1\]'.*an integer"):
        f.validate({"n": 1, "unit": "celsius", "xs": [1, "two"]})
    with pytest.raises(ToolError, match=r"'unit'.*one of 'celsius' or 'kelvin'"):
        f.validate({"n": 1, "unit": "fahrenheit"})
    with pytest.raises(ToolError, match=r"'p\.x'"):
        f.validate({"n": 1, "unit": "celsius", "p": {"x": "nope"}})


def test_docstrings_through_docstring_parser_in_every_style():
    google = parse_docstring("""Convert a
    temperature.

    Args:
        value (float): the reading,
            in the given unit.
        unit: its unit.
    """)
    rest = parse_docstring("""Convert a temperature.

    :param value: the reading, in the given unit.
    :param unit: its unit.
    """)
    assert google == (
        "Convert a temperature.",
        {"value": "the reading, in the given unit.", "unit": "its unit."},
    )
    assert rest == google
    assert parse_docstring(None) == ("", {})


def test_untyped_parameter_accepts_anything():
    @tool
    def f(x, y: int = 1):
        """F."""

    assert f.parameters["properties"]["x"] == {}
    assert f.validate({"x": [1, {"a": None}]}) == {"x": [1, {"a": None}]}
