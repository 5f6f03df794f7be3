"""The ToolUse wrapper: pass-through equals the bare env, tool turns answer with tool messages, every
failure becomes a readable observation, async equals sync, and the env checker passes."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

import gymllm
from gymllm.errors import ConfigError, InvalidActionError, ResetNeededError
from gymllm.telemetry import Tracer, get_tracer, set_tracer
from gymllm.tools import ToolRegistry, calculator, format_tool_calls, tool
from gymllm.types import ToolCall
from gymllm.utils import check_env
from gymllm.wrappers import ToolUse


def call(name, fmt="hermes", **args):
    return format_tool_calls([ToolCall(name, args)], fmt)


@tool
async def slow_echo(text: str, delay: float = 0.0) -> str:
    """Echo text after a delay.

    Args:
        text: what to echo.
        delay: seconds to wait.
    """
    await asyncio.sleep(delay)
    return text


@tool
def hang(seconds: float) -> str:
    """Block the calling thread (a sync tool that overruns its timeout)."""
    time.sleep(seconds)
    return "woke"


@tool
def explode() -> str:
    """Always raises."""
    raise ValueError("tool blew up")


def make(**kw):
    return ToolUse(
        gymllm.make("gymllm/Arithmetic-v0"),
        tools=kw.pop("tools", [calculator, slow_echo, explode]),
        **kw,
    )


def test_pass_through_equals_the_bare_env():
    bare, wrapped = gymllm.make("gymllm/Arithmetic-v0"), make()
    obs_b, info_b = bare.reset(seed=7)
    obs_w, info_w = wrapped.reset(seed=7)
    assert obs_w == [{"role": "user", "content": obs_b}]
    assert info_w["tools"] == wrapped.tools_schema and info_w["answer"] == info_b["answer"]
    json.dumps(info_w["tools"])  # ready for apply_chat_template(tools=...)
    reply = f"\\boxed{{{info_b['answer']}}}"
    ob, rb, tb, trb, ib = bare.step(reply)
    ow, rw, tw, trw, iw = wrapped.step(reply)
    assert (ow, rw, tw, trw) == ([{"role": "user", "content": ob}], rb, tb, trb) and rw == 1.0
    assert iw["tool_turn"] is False and iw["correct"] is True
    with pytest.raises(ResetNeededError):
        wrapped.step("after the end")


@pytest.mark.parametrize("fmt", ["hermes", "llama3", "gemma"])
def test_tool_turn_answers_with_tool_messages(fmt):
    env = make(parser=fmt)
    _, info = env.reset(seed=1)
    obs, r, term, trunc, info = env.step(
        "Let me use the tool.\n" + call("calculator", fmt, expression="123 * 456")
    )
    assert obs == [
        {"role": "tool", "name": "calculator", "content": "56088", "tool_call_id": "call_0"}
    ]
    assert (
        (r, term, trunc) == (0.0, False, False)
        and info["tool_turn"]
        and info["num_tool_calls"] == 1
    )
    assert info["parsed_tool_calls"][0]["function"] == {
        "name": "calculator",
        "arguments": {"expression": "123 * 456"},
    }
    assert info["tool_calls"][0]["ok"] is True


def test_every_failure_becomes_an_observation():
    env = make(timeout_s=0.2)
    env.reset(seed=0)
    text = (
        call("nope")
        + call("calculator", expression="1/0")
        + call("calculator", expr="1")
        + call("explode")
        + call("slow_echo", text="late", delay=5)
        + "<tool_call>{not json</tool_call>"
    )
    obs, r, term, trunc, info = env.step(text)
    kinds = [c["error"] for c in info["tool_calls"]]
    assert kinds == ["unknown_tool", "exception", "bad_arguments", "exception", "timeout", "parse"]
    assert all(m["role"] == "tool" and m["content"].startswith("Error: ") for m in obs)
    assert "non-zero divisor" in obs[1]["content"] and "tool blew up" in obs[3]["content"]
    assert "expression" in obs[2]["content"]  # names what was expected
    assert info["num_tool_errors"] == 6 and not term and not trunc
    obs, r, term, *_ = env.step(call("slow_echo", text="fine"))  # the episode goes on
    assert obs[0]["content"] == "fine" and not term


def test_a_hung_sync_tool_does_not_block_the_step():
    env = make(tools=[hang], timeout_s=0.2)
    env.reset(seed=0)
    t0 = time.perf_counter()
    obs, *_, info = env.step(call("hang", seconds=8))
    assert (
        time.perf_counter() - t0 < 6 and info["tool_calls"][0]["error"] == "timeout"
    )  # not the 8 s hang
    assert env.step(call("hang", seconds=0))[0][0]["content"] == "woke"


def test_long_results_are_cut():
    env = make(tools=[slow_echo], max_result_chars=10)
    env.reset(seed=0)
    obs, *_, info = env.step(call("slow_echo", text="x" * 100))
    assert (
        obs[0]["content"] == "x" * 10 + "\n... [truncated 90 characters]"
        and info["tool_calls"][0]["ok"]
    )


def test_budget_then_pass_through():
    env = make(max_tool_calls=2)
    _, info = env.reset(seed=3)
    obs, *_, info1 = env.step(call("calculator", expression="1+1") * 3)
    assert [c["error"] for c in info1["tool_calls"]] == [None, None, "budget"]
    obs, r, term, trunc, info2 = env.step(
        call("calculator", expression="2+2")
    )  # budget used up: graded
    assert term and r == 0.0 and info2["tool_turn"] is False


def test_async_twin_matches_sync_and_spans_are_recorded():
    tracer = Tracer()
    old = get_tracer()
    set_tracer(tracer)
    try:
        actions = [
            call("slow_echo", text="héllo ✓"),
            call("calculator", expression="2**10"),
            "\\boxed{0}",
        ]

        def sync_run():
            env = make()
            out = [env.reset(seed=5)[0]]
            return out + [env.step(a)[:4] for a in actions]

        async def async_run():
            env = make()
            out = [(await env.areset(seed=5))[0]]
            for a in actions:
                out.append((await env.astep(a))[:4])
            return out

        assert sync_run() == asyncio.run(async_run())
        spans = [e for e in tracer.events() if e["name"] == "tool"]
        assert len(spans) == 4 and {e["track"] for e in spans} == {"tool"}
        assert [e["args"]["tool"] for e in spans] == ["slow_echo", "calculator"] * 2
    finally:
        set_tracer(old)


def test_check_env_with_tool_calls_and_builtin_names():
    env = ToolUse(
        gymllm.make("gymllm/Arithmetic-v0"), tools=["calculator", "python"], parser="hermes"
    )
    assert [t["function"]["name"] for t in env.tools_schema] == ["calculator", "python"]
    policy = lambda t: [call("calculator", expression="6*7"), "\\boxed{42}"][t % 2]  # noqa: E731
    check_env(env, policy=policy, skip_gymnasium=True)
    check_env(env)


def test_bad_configuration_and_actions():
    with pytest.raises(ConfigError, match="tool-call format"):
        make(parser="klingon")
    with pytest.raises(ConfigError, match="max_tool_calls"):
        make(max_tool_calls=-1)
    with pytest.raises(ConfigError, match="built-in"):
        make(tools=["web_search"])
    env = make(tools=ToolRegistry([calculator]))
    with pytest.raises(ResetNeededError):
        env.step(call("calculator", expression="1"))
    env.reset(seed=0)
    with pytest.raises(InvalidActionError):
        env.step(42)


def test_schemas_and_calls_round_trip_through_the_qwen_chat_template():
    """info["tools"] renders in Qwen2.5's ChatML template, and the <tool_call> text the template writes
    for info["parsed_tool_calls"] parses back to the same call (the template is the peer)."""
    from gymllm.models.chat_templates import CHATML_TOOLS_TEMPLATE, render_chat_template
    from gymllm.tools import parse_tool_calls

    env = make()
    obs, info = env.reset(seed=2)
    action = call("calculator", expression="17 * 23")
    tool_obs, *_, step_info = env.step(action)
    messages = [
        *obs,
        {"role": "assistant", "content": "", "tool_calls": step_info["parsed_tool_calls"]},
        *tool_obs,
    ]
    text = render_chat_template(CHATML_TOOLS_TEMPLATE, messages, tools=info["tools"])
    for schema in info["tools"]:
        assert json.dumps(schema, ensure_ascii=False) in text
    assert "<tool_response>\n391\n</tool_response>" in text
    assistant = text.split("<|im_start|>assistant\n", 1)[1].split("<|im_end|>", 1)[0]
    reparsed = parse_tool_calls(assistant, "hermes")
    assert [(c.name, c.arguments) for c in reparsed] == [("calculator", {"expression": "17 * 23"})]


def test_arbitrary_actions_never_crash_the_wrapper():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    pieces = st.sampled_from(
        [
            "<tool_call>",
            "</tool_call>",
            '{"name": "calculator", "arguments": {"expression": ',
            '"1/0"',
            '"2**99999"',
            '"sqrt(-1)"',
            '"((((1"',
            "}}",
            "{",
            '"name": "explode"',
            ",",
            "\n",
            "```tool_code\n",
            "calculator(expression='3*3')",
            "```",
            "\\boxed{1}",
        ]
    )
    text = st.lists(st.one_of(st.text(max_size=20), pieces), max_size=12).map("".join)
    env = make(parser="auto", max_tool_calls=100, tools=[calculator, explode])

    @settings(max_examples=40, deadline=None)
    @given(st.lists(text, min_size=1, max_size=3))
    def run(actions):
        obs, _ = env.reset(seed=0)
        for a in actions:
            obs, r, term, trunc, info = env.step(a)
            assert env.observation_space.contains(obs), obs
            if info["tool_turn"]:  # one tool message per result, errors readable as such
                assert [m["content"].startswith("Error: ") for m in obs] == [
                    not c["ok"] for c in info["tool_calls"]
                ]
            if term or trunc:
                break

    run()
