"""Tool-call parsers: arbitrary text never crashes them; rendered calls parse back to the same calls."""

from __future__ import annotations

import keyword

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gymllm.tools import FORMATS, format_tool_calls, parse_tool_calls
from gymllm.tools.parsers import ParsedCalls
from gymllm.types import ToolCall

_json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
_json = st.recursive(
    _json_leaf,
    lambda c: st.one_of(
        st.lists(c, max_size=3), st.dictionaries(st.text(max_size=8), c, max_size=3)
    ),
    max_leaves=8,
)
_ident = st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True).filter(
    lambda s: not keyword.iskeyword(s) and s not in ("true", "false", "null")
)
_calls = st.lists(
    st.builds(lambda n, a: ToolCall(n, a), _ident, st.dictionaries(_ident, _json, max_size=4)),
    min_size=1,
    max_size=3,
)

# Fragments that look like calls, mixed into the random text so the parsers' error paths get exercised.
_fragments = st.sampled_from(
    [
        "<tool_call>",
        "</tool_call>",
        '{"name": ',
        '"arguments": ',
        "```tool_code\n",
        "```python\n",
        "```",
        "fn(",
        "a=1)",
        "print(",
        "{",
        "}",
        "<|python_tag|>",
        '"',
        "\\",
        "[",
        "]",
        ",",
        "\n",
        "(",
        ")",
        "**k",
        "lambda: 0",
    ]
)
_text = st.lists(st.one_of(st.text(max_size=30), _fragments), max_size=20).map("".join)


@settings(max_examples=50, deadline=None)
@given(_text, st.sampled_from(FORMATS))
def test_arbitrary_text_never_crashes(text, fmt):
    out = parse_tool_calls(text, fmt)
    assert isinstance(out, ParsedCalls)
    assert all(isinstance(c, ToolCall) and isinstance(c.arguments, dict) for c in out)
    assert all(e.format and e.message for e in out.errors)


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>" + "[" * 100_000,
        '{"name": "f", "arguments": ' + "[" * 100_000,
        "```tool_code\nf(a=" + "[" * 100_000 + ")\n```",
        '<tool_call>{"name": "f", "arguments": "' + "[" * 100_000 + '"}</tool_call>',
    ],
)
def test_pathologically_nested_input_is_an_error_not_a_crash(text):
    out = parse_tool_calls(text)
    assert out == [] and len(out.errors) == 1


def _strip_ids(calls):
    return [(c.name, c.arguments) for c in calls]


@pytest.mark.parametrize("fmt", ["hermes", "llama3", "gemma"])
@settings(max_examples=25, deadline=None)
@given(calls=_calls, prefix=st.text(alphabet="abc ,.!?\n", max_size=20))
def test_rendered_calls_round_trip(fmt, calls, prefix):
    text = prefix + format_tool_calls(calls, fmt)
    parsed = parse_tool_calls(text, fmt)
    assert _strip_ids(parsed) == _strip_ids(calls) and not parsed.errors
    assert _strip_ids(parse_tool_calls(text, "auto")) == _strip_ids(calls)
    assert [c.id for c in parsed] == [f"call_{i}" for i in range(len(calls))]


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.text(alphabet=st.characters(blacklist_characters="`"), max_size=60),
        min_size=1,
        max_size=3,
    )
)
def test_fenced_python_round_trip(codes):
    calls = [ToolCall("python", {"code": c.rstrip("\n")}) for c in codes]
    assert _strip_ids(parse_tool_calls(format_tool_calls(calls, "python"), "python")) == _strip_ids(
        calls
    )


def test_family_examples_and_errors():
    qwen = (
        'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+2"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "python", "arguments": "{\\"code\\": \\"print(1)\\"}"}\n</tool_call>'
    )
    assert _strip_ids(parse_tool_calls(qwen, "qwen")) == [
        ("calculator", {"expression": "2+2"}),
        ("python", {"code": "print(1)"}),
    ]
    unclosed = parse_tool_calls('<tool_call>\n{"name": "f", "arguments": {}}', "hermes")
    assert _strip_ids(unclosed) == [("f", {})]
    llama = (
        '<|python_tag|>{"type": "function", "name": "get_weather", "parameters": {"city": "Paris"}}'
    )
    assert _strip_ids(parse_tool_calls(llama, "auto")) == [("get_weather", {"city": "Paris"})]
    gemma = "```tool_code\nprint(default_api.get_weather(city='Paris', days=3, metric=true))\n```"
    assert _strip_ids(parse_tool_calls(gemma)) == [
        ("get_weather", {"city": "Paris", "days": 3, "metric": True})
    ]
    assert (
        parse_tool_calls("The answer is 4.") == []
        and not parse_tool_calls("The answer is 4.").errors
    )

    bad = parse_tool_calls(
        '<tool_call>{"arguments": {}}</tool_call><tool_call>{"name": "f", "arguments": 3}'
        "</tool_call><tool_call>nope</tool_call>",
        "hermes",
    )
    assert bad == [] and [e.message.split(" ")[0] for e in bad.errors] == [
        "missing",
        "arguments",
        "invalid",
    ]
    pos = parse_tool_calls(
        "```tool_code\nf(1, 2)\nx = os.system('ls')\nf(a=open('x'))\n```", "gemma"
    )
    assert pos == [] and len(pos.errors) == 3 and "keywords" in pos.errors[0].message
    assert "literals" in pos.errors[2].message
