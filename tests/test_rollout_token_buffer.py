"""Token-in, token-out buffer: alignment, verbatim sampled ids, chat-template deltas, fallback.

Uses the tiny models' real byte-level BPE tokenizer and Qwen2.5's ChatML-with-tools template
(``gymllm.models.tiny.tiny_tokenizer``). The peer for deltas is a full re-render of the whole
conversation through the same chat template.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gymllm.rollout.agents import ModelAgent, ToolAgent
from gymllm.rollout.token_buffer import TokenBuffer, check_prefix_preserving, render

from gymllm.models import tiny  # noqa: E402

IM_END = 2


@functools.lru_cache(maxsize=1)
def tok():
    return tiny.tiny_tokenizer(512)


# odd Unicode, whitespace and CRLF; never the template's special-token text
_alphabet = st.characters(blacklist_categories=("Cs",), blacklist_characters="<>|")
odd_text = st.one_of(
    st.text(_alphabet, min_size=0, max_size=40),
    st.sampled_from(
        [
            "",
            " ",
            "\r\n",
            "\t\t x",
            "naïve café 日本 🙂",
            "line1\r\nline2\n\n",
            "  leading",
            "trailing  ",
        ]
    ),
)
long_text = st.text(_alphabet, min_size=200, max_size=1500)


@st.composite
def sampled_turn(draw):
    """(ids, logprobs, versions, canonical_text or None)."""
    if draw(st.booleans()):  # the tokenizer's canonical encoding of some text, closed by <|im_end|>
        text = "A" + draw(odd_text)
        ids = tok().encode(text) + [IM_END]
        canonical = text
    else:  # arbitrary ids: non-canonical splits, possibly unterminated (finish "length")
        ids = draw(
            st.lists(st.integers(0, 511), min_size=1, max_size=24)
        )  # special and tool tokens too
        if draw(st.booleans()):
            ids = ids + [IM_END]
        canonical = None
    lps = draw(
        st.lists(
            st.floats(-20.0, 0.0, allow_nan=False, width=32), min_size=len(ids), max_size=len(ids)
        )
    )
    vers = draw(st.lists(st.integers(0, 50), min_size=len(ids), max_size=len(ids)))
    return ids, lps, vers, canonical


@st.composite
def observation(draw):
    kind = draw(st.sampled_from(["user", "tool", "long_tool"]))
    if kind == "user":
        return [{"role": "user", "content": draw(odd_text)}]
    content = draw(long_text) if kind == "long_tool" else draw(odd_text)
    return [{"role": "tool", "content": content, "name": "calc", "tool_call_id": "call_0"}]


conversation = st.tuples(
    odd_text, st.lists(st.tuples(sampled_turn(), observation()), min_size=1, max_size=4)
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv=conversation)
def test_ids_mask_logprobs_aligned_and_sampled_ids_verbatim(conv):
    first, turns = conv
    t = tok()
    agent = ModelAgent(t)
    buf = TokenBuffer(t, prefix_preserving=True, stop_token_ids=t.stop_token_ids)
    msgs = agent.initial_messages(first, {})
    prompt0 = buf.start(msgs)
    assert prompt0 == t.encode(render(t, msgs, add_generation_prompt=True))
    history = list(msgs)
    prompts = [prompt0]
    for (ids, lps, vers, _), obs in turns:
        assert buf.prompt_ids == prompts[-1]
        message, _ = agent.act(ids, "stop" if ids[-1] in t.stop_token_ids else "length")
        buf.add_sampled(ids, lps, vers, message)
        # reference history: the turn's text is every sampled id but a closing <|im_end|>
        content = t.decode(ids[:-1] if ids[-1] == IM_END else ids)
        history += [{"role": "assistant", "content": content}, *obs]
        buf.add_observation(obs)
        prompts.append(buf.prompt_ids)
    assert not buf.fallback and len(buf.rows) == 1
    row = buf.rows[0].arrays()
    ids_all, mask, lp, ver = (
        row["token_ids"],
        row["loss_mask"],
        row["behaviour_logprobs"],
        row["versions"],
    )
    assert len(ids_all) == len(mask) == len(lp) == len(ver)
    # append-only: every prompt sent to the engine is a prefix of the final buffer
    for p in prompts:
        assert ids_all[: len(p)].tolist() == p
    # the sampled ids, logprobs and versions sit verbatim in the turn spans; mask 1 exactly there
    spans = buf.rows[0].turn_boundaries
    assert len(spans) == len(turns)
    expect_mask = np.zeros(len(ids_all), np.int8)
    for (s, e), ((ids, lps, vers, _), _) in zip(spans, turns):
        assert ids_all[s:e].tolist() == ids
        np.testing.assert_array_equal(lp[s:e], np.asarray(lps, np.float32))
        assert ver[s:e].tolist() == vers
        expect_mask[s:e] = 1
    np.testing.assert_array_equal(mask, expect_mask)
    assert np.all(lp[mask == 0] == 0) and np.all(ver[mask == 0] == -1)
    # the text between the spans is exactly what the chat template renders around those turns
    text = render(t, history, add_generation_prompt=True)
    assert t.decode(ids_all.tolist()) == text
    # peer: with canonical samples the buffer equals a full re-tokenization of the conversation
    if all(c is not None for (_, _, _, c), _ in turns):
        assert ids_all.tolist() == t.encode(text)


def test_unterminated_turn_is_closed_with_template_tokens_outside_the_mask():
    t = tok()
    buf = TokenBuffer(t, stop_token_ids=t.stop_token_ids)
    buf.start([{"role": "user", "content": "hi"}])
    n0 = len(buf.prompt_ids)
    buf.add_sampled(
        [300, 301], [-1.0, -2.0], [0, 0], {"role": "assistant", "content": t.decode([300, 301])}
    )
    delta = buf.add_observation([{"role": "user", "content": "more"}])
    assert delta[0] == IM_END  # the env/template closed the turn; the model did not sample it
    row = buf.rows[0]
    assert row.loss_mask[n0 : n0 + 2] == [1, 1] and row.loss_mask[n0 + 2] == 0


def test_terminated_turn_keeps_the_models_own_stop_token_in_the_mask():
    t = tok()
    buf = TokenBuffer(t, stop_token_ids=t.stop_token_ids)
    buf.start([{"role": "user", "content": "hi"}])
    n0 = len(buf.prompt_ids)
    buf.add_sampled(
        [300, IM_END], [-1.0, -0.5], [3, 3], {"role": "assistant", "content": t.decode([300])}
    )
    delta = buf.add_observation([{"role": "user", "content": "more"}])
    assert IM_END not in delta[:1]
    row = buf.rows[0]
    assert row.token_ids[n0 : n0 + 2] == [300, IM_END] and row.loss_mask[n0 : n0 + 3] == [1, 1, 0]


# a template that rewrites earlier assistant turns (like Qwen3 dropping earlier <think> blocks)
_REWRITING = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' and not loop.last -%}{{ '<|im_start|>assistant\\n[earlier]<|im_end|>\\n' }}"
    "{%- else -%}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif -%}"
    "{%- endfor -%}{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)


def test_non_prefix_preserving_template_falls_back_to_one_row_per_model_call(caplog):
    from gymllm.models.tokenizer import TokenizerBundle

    base = tok()
    t = TokenizerBundle(
        tokenizer=base.tokenizer,
        chat_template=_REWRITING,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    assert check_prefix_preserving(base, ("user", "tool")) is True
    assert check_prefix_preserving(t, ("user",)) is False
    agent = ModelAgent(t)
    buf = TokenBuffer(
        t, prefix_preserving=False, stop_token_ids=t.stop_token_ids, trajectory_id="x"
    )
    history = [{"role": "user", "content": "q"}]
    buf.start(history)
    samples = [[300, 301, IM_END], [302, IM_END], [303, 304, 305]]
    for i, ids in enumerate(samples):
        assert buf.prompt_ids == t.encode(render(t, history, add_generation_prompt=True))
        msg, _ = agent.act(ids, "stop")
        buf.add_sampled(ids, [-0.5] * len(ids), [i] * len(ids), msg)
        history.append(msg)
        if i < len(samples) - 1:
            obs = [{"role": "user", "content": f"obs {i}"}]
            buf.add_observation(obs)
            history += obs
    assert len(buf.rows) == len(samples)
    for row, ids in zip(buf.rows, samples):
        ((s, e),) = row.turn_boundaries
        assert (
            row.token_ids[s:e] == ids and e == len(row.token_ids) and sum(row.loss_mask) == len(ids)
        )
    # detected while rendering, too: a buffer that assumed prefix preservation switches and logs it
    buf2 = TokenBuffer(
        t, prefix_preserving=True, stop_token_ids=t.stop_token_ids, trajectory_id="y"
    )
    buf2.start([{"role": "user", "content": "q"}])
    buf2.add_sampled(
        [300, IM_END], [0.0, 0.0], [0, 0], {"role": "assistant", "content": t.decode([300])}
    )
    with caplog.at_level("WARNING", logger="gymllm.rollout"):
        buf2.add_observation([{"role": "user", "content": "more"}])
    assert buf2.fallback and len(buf2.rows) == 2 and "falling back" in caplog.text


def test_tool_agent_passes_schemas_to_the_template_and_parses_native_calls():
    t = tok()
    schema = {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "math",
            "parameters": {"type": "object", "properties": {"e": {"type": "string"}}},
        },
    }
    agent = ToolAgent(t)
    tools = agent.tools({"tools": [schema]})
    assert tools == [schema]
    text = render(t, agent.initial_messages("2+2?", {}), tools, add_generation_prompt=True)
    assert '"name": "calc"' in text and "<tools>" in text
    call = '<tool_call>\n{"name": "calc", "arguments": {"e": "2+2"}}\n</tool_call>'
    ids = t.encode(call) + [IM_END]
    msg, action = agent.act(ids, "stop")
    assert action == call and msg == {"role": "assistant", "content": call}
    assert [(c.name, c.arguments) for c in agent.last_tool_calls] == [("calc", {"e": "2+2"})]
    with pytest.raises(Exception, match="a str \\(user message\\) or a list"):
        agent.observation_messages(42)
