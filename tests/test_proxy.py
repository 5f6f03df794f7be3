"""Training mode of ``gymllm serve`` (the proxy): real loopback HTTP, the real tiny-model engine,
the `openai` client and raw httpx. The recorded ids are checked against what the engine was asked
and what it sampled (a spy around the engine), and against the orchestrator's TokenBuffer built from
the same conversation."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gymllm.inference import Completion, EngineConfig, JaxEngine, ServerThread, build_app
from gymllm.inference.session_recorder import SessionRecorder
from gymllm.models import make_tiny
from gymllm.rollout.group_queue import QueueClosed
from gymllm.rollout.proxy_source import ProxyGroupSource, ProxySourceConfig
from gymllm.rollout.token_buffer import TokenBuffer

CFG = EngineConfig(num_slots=2, max_len=512, min_bucket=512, max_prefill_batch=1, decode_lengths=1)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            },
        },
    }
]


class Spy:
    """Wraps an engine and keeps every (prompt ids, Completion) it served (the engine itself is real)."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    async def generate(self, prompt, params, session_id=None):
        c = await self.engine.generate(prompt, params, session_id=session_id)
        self.calls.append((list(map(int, prompt)), c))
        return c


class ScriptedEngine:
    """A stand-in engine for tool calls: a random tiny model never writes one, so this answers each
    request with the ids of a scripted text (a hermes tool call or plain text) plus the end-of-turn id."""

    def __init__(self, tokenizer, seed=0):
        self.tokenizer, self.rng = tokenizer, np.random.default_rng(seed)
        self.max_len, self.version, self.calls = CFG.max_len, 3, []
        self.end = tokenizer.token_to_id("<|im_end|>")

    async def generate(self, prompt, params, session_id=None):
        a, b = (int(x) for x in self.rng.integers(0, 50, 2))
        text = (
            f'<tool_call>\n{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}\n</tool_call>'
            if self.rng.random() < 0.6
            else f"It is {a + b}."
        )
        ids = self.tokenizer.encode(text) + [self.end]
        c = Completion(
            token_ids=ids,
            logprobs=self.rng.uniform(-3, 0, len(ids)),
            versions=[self.version] * len(ids),
            prompt_len=len(prompt),
            finish_reason="stop",
            stop_reason=self.end,
        )
        self.calls.append((list(map(int, prompt)), c))
        return c


@pytest.fixture(scope="module")
def lm():
    return make_tiny("qwen3")


@pytest.fixture(scope="module")
def jax_engine(lm):
    eng = JaxEngine.from_loaded(lm, config=CFG)
    yield eng
    eng.shutdown()


class Proxy:
    """A training-mode server on loopback with its recorder and group source."""

    def __init__(self, engine, tokenizer, **source_kw):
        self.source = ProxyGroupSource(ProxySourceConfig(**source_kw))
        self.recorder = SessionRecorder(tokenizer, on_closed=self.source.add)
        self.spy = engine if isinstance(engine, ScriptedEngine) else Spy(engine)
        app = build_app(
            self.spy,
            tokenizer,
            "policy",
            recorder=self.recorder,
            admission=self.source.wait_for_room,
        )
        self.server = ServerThread(app).start()
        self.url = self.server.url

    def close(self):
        self.source.close()
        self.server.stop()


@pytest.fixture(scope="module", params=["jax", "scripted"])
def proxy(request, lm, jax_engine):
    engine = jax_engine if request.param == "jax" else ScriptedEngine(lm.tokenizer)
    p = Proxy(engine, lm.tokenizer, group_size=1, max_queued_groups=1000)
    yield p
    p.close()


def chat(http, sid, messages, tools=None, max_tokens=4, seed=0, **headers):
    body = {
        "model": "policy",
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "seed": seed,
    }
    if tools:
        body["tools"] = tools
    r = http.post("/v1/chat/completions", json=body, headers={"X-Session-Id": sid, **headers})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def echo(message: dict) -> dict:
    """The assistant message as an OpenAI client sends it back (arguments as JSON text, nulls dropped)."""
    return {k: v for k, v in message.items() if v is not None}


def take_group(source):
    return asyncio.run(asyncio.wait_for(source.get_group(), 30))


session_plans = st.lists(
    st.tuples(st.sampled_from(["user", "tool", "rewrite"]), st.integers(1, 5)),
    min_size=0,
    max_size=3,
)


@settings(
    max_examples=10,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(plan=session_plans, use_tools=st.booleans(), first_tokens=st.integers(1, 5))
def test_recorded_ids_are_exactly_what_the_engine_was_asked_and_sampled(
    proxy, lm, plan, use_tools, first_tokens
):
    tools = TOOLS if use_tools else None
    sid = f"s{time.monotonic_ns()}"
    start = len(proxy.spy.calls)
    messages = [{"role": "user", "content": "Add 2 and 3."}]
    rewrites, replies = 0, []
    with httpx.Client(base_url=proxy.url, timeout=120) as http:
        first = chat(http, sid, messages, tools, first_tokens)
        replies.append(first["message"])
        steps = [("user", first_tokens)] + list(plan)
        for i, (kind, n) in enumerate(plan):
            messages = messages + [echo(replies[-1])]
            calls = replies[-1].get("tool_calls") or []
            if kind == "tool" and calls:
                messages += [
                    {"role": "tool", "tool_call_id": c["id"], "content": str(i)} for c in calls
                ]
            elif kind == "rewrite":
                messages = [{"role": "user", "content": f"Start over {i}."}]
                rewrites += 1
            else:
                messages.append({"role": "user", "content": f"And {i} more?"})
            choice = chat(http, sid, messages, tools, n, seed=i + 1)
            replies.append(choice["message"])
            assert choice["token_ids"] == proxy.spy.calls[-1][1].token_ids.tolist()
        r = http.post(f"/v1/sessions/{sid}/reward", json={"reward": 0.5})
        assert r.status_code == 200 and r.json()["model_calls"] == len(steps)
    group = take_group(proxy.source)
    calls = proxy.spy.calls[start:]
    assert len(calls) == len(steps) and group.group_id == sid
    trajs = group.trajectories
    assert len(trajs) == 1 + rewrites and trajs[-1].info["segments_started"] == rewrites
    # every call's prompt is a prefix of its row, and the row's sampled spans are the engine's ids
    spans = [(t, a, b) for t in trajs for a, b in t.turn_boundaries]
    assert len(spans) == len(calls)
    for (traj, a, b), (prompt, c) in zip(spans, calls):
        assert traj.token_ids[:a].tolist() == prompt
        assert traj.token_ids[a:b].tolist() == c.token_ids.tolist()
        np.testing.assert_array_equal(traj.behaviour_logprobs[a:b], c.logprobs)
        np.testing.assert_array_equal(traj.versions[a:b], c.versions)
    for traj in trajs:
        assert (
            traj.num_sampled == sum(b - a for a, b in traj.turn_boundaries) and traj.reward == 0.5
        )
        assert set(traj.versions[traj.loss_mask == 0].tolist()) <= {-1}
    if (
        rewrites == 0
    ):  # the orchestrator's TokenBuffer, fed the same conversation, builds the same row
        buf = TokenBuffer(lm.tokenizer, tools=tools, stop_token_ids=lm.tokenizer.stop_token_ids)
        buf.start(messages[:1])
        convo = messages[1:]
        for (prompt, c), reply in zip(calls, replies):
            buf.add_sampled(
                c.token_ids.tolist(), c.logprobs.tolist(), c.versions.tolist(), echo(reply)
            )
            if convo:
                convo = convo[1:]  # the echoed reply
                new = []
                while convo and convo[0]["role"] != "assistant":
                    new.append(convo.pop(0))
                buf.add_observation(new)
        ref = buf.rows[0].arrays()
        for key in ("token_ids", "loss_mask", "versions"):
            np.testing.assert_array_equal(getattr(trajs[0], key), ref[key], err_msg=key)
        np.testing.assert_allclose(trajs[0].behaviour_logprobs, ref["behaviour_logprobs"])


def test_reward_for_unknown_and_closed_sessions(proxy):
    with httpx.Client(base_url=proxy.url, timeout=120) as http:
        r = http.post("/v1/sessions/nobody/reward", json={"reward": 1.0})
        assert r.status_code == 404 and "unknown id" in r.json()["error"]["message"]
        chat(http, "once", [{"role": "user", "content": "Hi"}])
        assert http.post("/v1/sessions/once/reward", json={"reward": 1.0}).status_code == 200
        r = http.post("/v1/sessions/once/reward", json={"reward": 1.0})
        assert r.status_code == 409 and "second one" in r.json()["error"]["message"]
        r = http.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
            headers={"X-Session-Id": "once"},
        )
        assert r.status_code == 409
        assert http.post("/v1/sessions/x/reward", json={"reward": "lots"}).status_code == 400
        assert (
            http.post(
                "/v1/sessions/x/reward",
                content=b'{"reward": NaN}',
                headers={"content-type": "application/json"},
            ).status_code
            == 400
        )
        r = http.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "Hi"}], "n": 2},
            headers={"X-Session-Id": "two"},
        )
        assert (
            r.status_code == 400
            and "n: expected 1 in a training session" in r.json()["error"]["message"]
        )
    take_group(proxy.source)
    with httpx.Client(
        base_url=proxy.url, timeout=120
    ) as http:  # the user field and metadata name them too
        body = {
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 2,
            "user": "by-body",
            "metadata": {"group_id": "g-meta", "task_id": "t-meta"},
        }
        assert http.post("/v1/chat/completions", json=body).status_code == 200
        assert (
            http.post("/v1/sessions/by-body/reward", json={"reward": 2.0}).json()["group_id"]
            == "g-meta"
        )
    group = take_group(proxy.source)
    assert (group.group_id, group.task_id, group.rewards.tolist()) == ("g-meta", "t-meta", [2.0])


def test_groups_form_from_sessions_naming_their_group_through_the_openai_client(lm, jax_engine):
    openai = pytest.importorskip("openai")
    p = Proxy(jax_engine, lm.tokenizer, group_size=2)
    try:
        client = openai.OpenAI(base_url=p.url + "/v1", api_key="unused", max_retries=0)
        for member in range(2):
            headers = {
                "X-Session-Id": f"task7-m{member}",
                "X-Group-Id": "task7",
                "X-Task-Id": "add",
            }
            msgs = [{"role": "user", "content": "Add 2 and 3."}]
            r = client.chat.completions.create(
                model="policy", messages=msgs, max_tokens=3, seed=member, extra_headers=headers
            )
            msgs += [
                r.choices[0].message.model_dump(exclude_none=True),
                {"role": "user", "content": "Sure?"},
            ]
            client.chat.completions.create(
                model="policy", messages=msgs, max_tokens=3, extra_headers=headers
            )
            assert p.source.ready_groups == 0  # the group waits for its second member
            httpx.post(
                f"{p.url}/v1/sessions/task7-m{member}/reward", json={"reward": float(member)}
            )
        group = take_group(p.source)
        assert group.group_id == "task7" and group.task_id == "add" and len(group.trajectories) == 2
        assert group.rewards.tolist() == [0.0, 1.0] and [
            t.info["member"] for t in group.trajectories
        ] == [0, 1]
        assert all(len(t.turn_boundaries) == 2 for t in group.trajectories)  # both turns in one row
        stats = httpx.get(p.url + "/v1/training/stats").json()
        assert (
            stats["sessions_closed"] == 2
            and stats["model_calls"] == 4
            and stats["open_sessions"] == 0
        )
    finally:
        p.close()


def test_a_full_queue_holds_new_sessions_until_the_learner_takes_a_group(lm, jax_engine):
    p = Proxy(jax_engine, lm.tokenizer, group_size=1, max_queued_groups=1)
    try:
        with httpx.Client(base_url=p.url, timeout=120) as http:
            chat(http, "a", [{"role": "user", "content": "Hi"}])
            http.post("/v1/sessions/a/reward", json={"reward": 1.0})
        assert p.source.ready_groups == 1 and not p.source.has_room()
        result = {}

        def session_b():
            with httpx.Client(base_url=p.url, timeout=120) as http:
                result["b"] = chat(http, "b", [{"role": "user", "content": "Hi"}])

        t = threading.Thread(target=session_b)
        t.start()
        deadline = time.monotonic() + 60  # a watchdog while waiting for the server to hold b back
        while p.source.waiting < 1:
            assert time.monotonic() < deadline, "session b never waited for room"
            time.sleep(0.01)
        assert "b" not in result and p.recorder.stats().get("sessions_started", 0) == 1
        assert take_group(p.source).group_id == "a"  # the learner takes a group: b is admitted
        t.join(timeout=60)
        assert "b" in result and p.recorder.is_open("b")
    finally:
        p.close()
    with pytest.raises(QueueClosed):
        take_group(p.source)

    async def drained():  # the trainer's loop shape: async with + get_group until QueueClosed
        source = ProxyGroupSource()
        async with source:
            source.add(p.recorder.close("b", 1.0))
            got = [await source.get_group()]
        with pytest.raises(QueueClosed):
            await source.get_group()
        return got

    (g,) = asyncio.run(drained())
    assert g.group_id == "b" and g.rewards.tolist() == [1.0]


# ---------------------------------------------------------------- examples/openai_agent.py
def _load_example():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "openai_agent.py"
    spec = importlib.util.spec_from_file_location("openai_agent_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class CalculatorPolicy(ScriptedEngine):
    """A stand-in policy that solves the arithmetic task with the calculator: it asks the tool for the
    problem's expression, then boxes the tool's answer (a random tiny model does neither)."""

    async def generate(self, prompt, params, session_id=None):
        import re

        text = self.tokenizer.decode(prompt)
        if text.rstrip().endswith("</tool_response><|im_end|>\n<|im_start|>assistant"):
            result = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", text, re.S)[-1]
            reply = f"The answer is \\boxed{{{result}}}."
        else:
            expr = re.findall(r"Compute (.*?)\. Give", text)[-1]
            reply = f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{expr}"}}}}\n</tool_call>'
        ids = self.tokenizer.encode(reply) + [self.end]
        c = Completion(
            token_ids=ids,
            logprobs=[-0.25] * len(ids),
            versions=[self.version] * len(ids),
            prompt_len=len(prompt),
            finish_reason="stop",
            stop_reason=self.end,
        )
        self.calls.append((list(map(int, prompt)), c))
        return c


@pytest.mark.parametrize("policy", ["calculator", "jax"])
def test_the_openai_agent_example_trains_through_the_proxy(lm, jax_engine, policy):
    openai = pytest.importorskip("openai")
    example = _load_example()
    engine = CalculatorPolicy(lm.tokenizer) if policy == "calculator" else jax_engine
    p = Proxy(engine, lm.tokenizer, group_size=2)
    try:
        client = openai.OpenAI(base_url=p.url + "/v1", api_key="unused", max_retries=0)
        episodes = [
            example.run_episode(
                client, p.url + "/v1", model="policy", seed=k, group_id=f"p{k}", max_tokens=24
            )
            for k in (0, 1)
            for _ in range(2)
        ]
        groups = [take_group(p.source) for _ in range(2)]
    finally:
        p.close()
    assert [g.group_id for g in groups] == ["p0", "p1"] and all(
        len(g.trajectories) == 2 for g in groups
    )
    got = sorted((t.info["session_id"], t.reward) for g in groups for t in g.trajectories)
    assert got == sorted((e["session"], e["reward"]) for e in episodes)
    if (
        policy == "calculator"
    ):  # the tool round trip is in one row: call, tool response (context), answer
        assert all(e["reward"] == 1.0 and e["tool_calls"] == 1 for e in episodes)
        for t in (t for g in groups for t in g.trajectories):
            assert len(t.turn_boundaries) == 2 and t.info["segments_started"] == 0
            (a0, b0), (a1, b1) = t.turn_boundaries
            assert "<tool_call>" in lm.tokenizer.decode(t.token_ids[a0:b0])
            assert "<tool_response>" in lm.tokenizer.decode(t.token_ids[b0:a1])
            assert "\\boxed{" in lm.tokenizer.decode(t.token_ids[a1:b1])
