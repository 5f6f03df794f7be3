"""gymllm.spaces: Text accepts any Unicode (Gymnasium's Text does not), Chat validates messages."""

import copy
import json
import pickle

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gymllm.errors import ConfigError
from gymllm.spaces import Chat, Text

UNICODE = "héllo ✓ 日本 🙂"


def test_text_accepts_unicode_where_gymnasium_text_rejects_it():
    assert not gym.spaces.Text(max_length=64).contains(UNICODE)  # the peer's limitation
    assert Text(64).contains(UNICODE)
    assert UNICODE in Text(64)


@settings(max_examples=50, deadline=None)
@given(s=st.text(max_size=40), lo=st.integers(0, 20), extra=st.integers(0, 20))
def test_text_contains_is_a_length_check_on_any_unicode(s, lo, extra):
    space = Text(lo + extra, min_length=lo)
    assert space.contains(s) == (lo <= len(s) <= lo + extra)


def test_text_rejects_non_str_and_lone_surrogates_with_reasons():
    space = Text(8)
    assert not space.contains(b"bytes") and "bytes" in space.why_not(b"bytes")
    assert not space.contains(3)
    assert not space.contains("a\ud800b") and "surrogate" in space.why_not("a\ud800b")
    assert "9 characters" in space.why_not("x" * 9)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), lo=st.integers(0, 5), hi=st.integers(5, 200))
def test_text_sample_is_in_space_and_seeded(seed, lo, hi):
    a, b = Text(hi, min_length=lo, seed=seed), Text(hi, min_length=lo, seed=seed)
    xs, ys = [a.sample() for _ in range(5)], [b.sample() for _ in range(5)]
    assert xs == ys
    assert all(a.contains(x) for x in xs)
    assert len(a.sample(mask=lo)) == lo


def test_text_sample_draws_non_ascii_and_differs_across_seeds():
    a, b = Text(64, seed=1), Text(64, seed=2)
    xs = [a.sample() for _ in range(20)]
    assert any(not x.isascii() for x in xs)
    assert xs != [b.sample() for _ in range(20)]


def test_text_equality_hash_pickle_and_rng_state_survive():
    a = Text(10, min_length=1, seed=3)
    assert (
        a == Text(10, min_length=1)
        and a != Text(11, min_length=1)
        and hash(a) == hash(Text(10, min_length=1))
    )
    a.sample()
    b = pickle.loads(pickle.dumps(a))
    c = copy.deepcopy(a)
    assert b == a and [b.sample() for _ in range(3)] == [a.sample() for _ in range(3)] == [
        c.sample() for _ in range(3)
    ]


def test_text_jsonable_round_trip():
    space = Text(32)
    batch = [UNICODE, "", "plain"]
    assert space.from_jsonable(json.loads(json.dumps(space.to_jsonable(batch)))) == batch


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"max_length": -1}, "max_length"),
        ({"max_length": 3, "min_length": 4}, "min_length"),
        ({"max_length": 2.5}, "max_length"),
        ({"alphabet": ""}, "alphabet"),
    ],
)
def test_text_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ConfigError, match=f"Text.{field}"):
        Text(**kwargs)


def test_text_batches_in_gymnasium_vector_utils():
    batched = gym.vector.utils.batch_space(Text(8), 3)
    assert isinstance(batched, gym.spaces.Tuple) and batched.contains(("a", "é", "✓"))


GOOD = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": UNICODE},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "1", "type": "function", "function": {"name": "calc", "arguments": {"x": 1}}}
        ],
    },
    {"role": "tool", "content": "1", "tool_call_id": "1", "name": "calc"},
]


def test_chat_accepts_messages_with_tool_calls():
    assert Chat(8).contains(GOOD)
    assert Chat(8).contains([])


@pytest.mark.parametrize(
    "bad,reason",
    [
        ([{"role": "bot", "content": "x"}], "role 'bot'"),
        ([{"role": "user"}], "without 'content'"),
        ([{"role": "user", "content": 3}], "content"),
        ([{"role": "user", "content": "x", "extra": 1}], "unknown key 'extra'"),
        ([{"role": "assistant", "content": "", "tool_calls": [{"function": {}}]}], "function.name"),
        ([{"role": "tool", "content": "x", "tool_call_id": 5}], "tool_call_id"),
        ("not a list", "not list"),
        ([["role", "user"]], "not dict"),
    ],
)
def test_chat_rejects_bad_messages_with_a_reason(bad, reason):
    space = Chat(8)
    assert not space.contains(bad)
    assert reason in space.why_not(bad)


def test_chat_limits_message_count_and_roles():
    assert not Chat(1).contains(GOOD[:2])
    assert not Chat(8, roles=("user", "assistant")).contains(GOOD[:1])
    assert Chat(8, min_messages=2).why_not(GOOD[:1]).startswith("1 messages")


messages = st.lists(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["system", "user", "assistant", "tool"]),
            "content": st.text(max_size=20),
        }
    ),
    max_size=6,
)


@settings(max_examples=40, deadline=None)
@given(msgs=messages)
def test_chat_contains_generated_messages_and_round_trips_json(msgs):
    space = Chat(6)
    assert space.contains(msgs)
    assert space.from_jsonable(json.loads(json.dumps(space.to_jsonable([msgs])))) == [msgs]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_chat_sample_in_space_seeded_and_pickles(seed):
    a, b = Chat(5, seed=seed), Chat(5, seed=seed)
    assert a.sample() == b.sample()
    assert a.contains(a.sample()) and a.contains(a.sample(mask=3)) and len(a.sample(mask=3)) == 3
    c = pickle.loads(pickle.dumps(a))
    assert c == a and c.sample() == a.sample()


def test_chat_equality_and_config_errors():
    assert Chat(4) == Chat(4) and Chat(4) != Chat(5) and Chat(4) != Text(4)
    with pytest.raises(ConfigError, match="Chat.roles"):
        Chat(4, roles=())
    with pytest.raises(ConfigError, match="Chat.min_messages"):
        Chat(2, min_messages=3)


def test_spaces_never_touch_global_rng():
    before = np.random.get_state()[1].copy()
    Text(16).sample()
    Chat(4).sample()
    assert np.array_equal(before, np.random.get_state()[1])
