"""The OpenAI-compatible server over real loopback HTTP (uvicorn on a free port), driven by the
client engine and by raw httpx, checked against the in-process engine it serves."""

from __future__ import annotations

import asyncio
import json

import httpx
import numpy as np
import pytest

from gymllm.errors import EngineError
from gymllm.inference import (
    EngineConfig,
    JaxEngine,
    OpenAIClientEngine,
    SamplingParams,
    ServerThread,
    build_app,
)
from gymllm.models import make_tiny

CFG = EngineConfig(
    num_slots=12, max_len=64, min_bucket=64, max_prefill_batch=2
)  # as test_engine: shared compiles
MODEL = "tiny-llama"


@pytest.fixture(scope="module")
def lm():
    return make_tiny("llama")


@pytest.fixture(scope="module")
def engine(lm):
    eng = JaxEngine.from_loaded(lm, config=CFG, stop_token_ids=())
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def server(engine, lm):
    with ServerThread(build_app(engine, lm.tokenizer, MODEL)) as s:
        yield s


def run(coro):
    return asyncio.run(coro)


def sse_events(resp: httpx.Response) -> list:
    out = []
    for line in resp.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_client_engine_over_http_equals_the_engine_in_process(server, engine):
    prompts = [[5, 6, 7, 8], [40, 41], list(range(100, 130)), [9] * 10, [300, 301, 302], [7, 7]]
    greedy = SamplingParams(temperature=0.0, max_tokens=9)

    async def main():
        client = OpenAIClientEngine(server.url, MODEL)
        try:
            remote = await asyncio.gather(
                *(client.generate(p, greedy) for p in prompts)
            )  # batched on the server
            local = [await engine.generate(p, greedy) for p in prompts]
            sampled = await client.generate(
                prompts[0], SamplingParams(temperature=1.0, max_tokens=6, seed=3)
            )
            direct = await engine.generate(
                prompts[0], SamplingParams(temperature=1.0, max_tokens=6, seed=3)
            )
            return remote, local, sampled, direct, await client.models()
        finally:
            await client.close()

    remote, local, sampled, direct, models = run(main())
    for r, loc, p in zip(remote, local, prompts):
        assert (
            r.token_ids.tolist() == loc.token_ids.tolist()
            and r.finish_reason == loc.finish_reason == "length"
        )
        np.testing.assert_allclose(r.logprobs, loc.logprobs, atol=1e-4)
        assert r.versions.tolist() == [engine.version] * 9 and r.prompt_len == len(p)
    assert sampled.token_ids.tolist() == direct.token_ids.tolist()  # seeds travel over HTTP
    assert models == [MODEL]


def test_session_prefix_reuse_through_http(server):
    async def main():
        client = OpenAIClientEngine(server.url, MODEL)
        try:
            sp = SamplingParams(temperature=1.0, max_tokens=5, seed=1)
            p1 = list(range(200, 220))
            t1 = await client.generate(p1, sp, session_id="http-traj")
            t2 = await client.generate(
                p1 + t1.token_ids.tolist() + [11, 12], sp, session_id="http-traj"
            )
            return t1, t2
        finally:
            await client.close()

    t1, t2 = run(main())
    assert t1.cached_prompt_len == 0 and t2.cached_prompt_len == 20 + 5 - 1


def test_streaming_completions_and_chat(server, lm):
    body = {"model": MODEL, "prompt": [5, 6, 7, 8], "max_tokens": 9, "temperature": 0.0}
    with httpx.Client(base_url=server.url, timeout=60) as http:
        full = http.post("/v1/completions", json={**body, "logprobs": 1}).json()["choices"][0]
        with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as resp:
            assert resp.headers["content-type"].startswith("text/event-stream")
            events = sse_events(resp)
        messages = [{"role": "user", "content": "What is 2 + 2?"}]
        chat = http.post(
            "/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": messages,
                "max_tokens": 8,
                "temperature": 0.0,
                "logprobs": True,
            },
        ).json()
        with http.stream(
            "POST",
            "/v1/chat/completions",
            json={"messages": messages, "max_tokens": 8, "temperature": 0.0, "stream": True},
        ) as resp:
            chat_events = sse_events(resp)

    assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "length"
    tokens = [t for e in events[:-2] for t in e["choices"][0]["token_ids"]]
    assert tokens == full["token_ids"]
    assert (
        "".join(e["choices"][0]["text"] for e in events[:-1])
        == full["text"]
        == lm.tokenizer.decode(tokens)
    )
    np.testing.assert_allclose(
        [e["choices"][0]["logprob"] for e in events[:-2]],
        full["logprobs"]["token_logprobs"],
        atol=1e-4,
    )

    choice = chat["choices"][0]
    want_prompt = lm.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True
    )
    assert choice["prompt_token_ids"] == want_prompt and chat["usage"]["prompt_tokens"] == len(
        want_prompt
    )
    assert choice["message"]["content"] == lm.tokenizer.decode(choice["token_ids"])
    assert len(choice["logprobs"]["content"]) == len(choice["token_ids"]) == 8
    streamed = "".join(e["choices"][0]["delta"].get("content", "") for e in chat_events[:-1])
    assert streamed == choice["message"]["content"] and chat_events[-1] == "[DONE]"


def test_models_health_text_prompts_and_n(server):
    with httpx.Client(base_url=server.url, timeout=60) as http:
        assert http.get("/health").json()["status"] == "ok"
        card = http.get("/v1/models").json()["data"][0]
        assert card["id"] == MODEL and card["max_model_len"] == CFG.max_len
        r = http.post(
            "/v1/completions",
            json={
                "prompt": ["Hello there", [1, 2, 3]],
                "max_tokens": 3,
                "n": 2,
                "temperature": 1.0,
            },
        )
        assert r.status_code == 200
        choices = r.json()["choices"]
        assert [c["index"] for c in choices] == [0, 1, 2, 3] and all(
            len(c["token_ids"]) == 3 for c in choices
        )


BAD = [
    ("/v1/completions", {"model": MODEL, "prompt": []}, 400, "empty prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": list(range(1, 100))}, 400, "at most 63 tokens"),
    ("/v1/completions", {"model": "gpt-4", "prompt": [1, 2]}, 404, "model: expected"),
    ("/v1/completions", b"{not json", 400, "invalid JSON"),
    (
        "/v1/completions",
        {"prompt": [1, 2], "temperature": -1},
        400,  # bounded in the request model
        "temperature: Input should be greater than or equal to 0",
    ),
    ("/v1/completions", {"prompt": {"x": 1}}, 400, "prompt: expected"),
    ("/v1/completions", {"prompt": [1, 99999]}, 400, "ids in [0, 512)"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages: expected"),
    ("/v1/completions", {"prompt": [1, 2], "stream": True, "n": 2}, 400, "stream: expected"),
]


@pytest.mark.parametrize("path,body,status,message", BAD, ids=[b[3] for b in BAD])
def test_bad_requests_get_4xx_with_a_message_and_the_server_keeps_serving(
    server, path, body, status, message
):
    with httpx.Client(base_url=server.url, timeout=60) as http:
        kw = (
            {"content": body, "headers": {"content-type": "application/json"}}
            if isinstance(body, bytes)
            else {"json": body}
        )
        r = http.post(path, **kw)
        assert r.status_code == status
        err = r.json()["error"]
        assert message in err["message"] and err["type"] == "invalid_request_error"
        ok = http.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 2})
        assert ok.status_code == 200 and len(ok.json()["choices"][0]["token_ids"]) == 2


def test_client_engine_raises_engine_errors(server):
    async def main():
        client = OpenAIClientEngine(server.url, MODEL)
        wrong = OpenAIClientEngine(server.url, "other-model")
        dead = OpenAIClientEngine("http://127.0.0.1:9", MODEL, timeout=5)
        try:
            with pytest.raises(EngineError, match="answered 400.*at most 63"):
                await client.generate(list(range(1, 100)), SamplingParams())
            with pytest.raises(EngineError, match="answered 404"):
                await wrong.generate([1, 2], SamplingParams())
            with pytest.raises(EngineError, match="request failed"):
                await dead.generate([1, 2], SamplingParams())
            with pytest.raises(EngineError, match="out of band"):
                client.update_weights({"w": 1}, 3)
            client.update_weights(None, 3)
            assert client.version == 3
        finally:
            for c in (client, wrong, dead):
                await c.close()

    run(main())


def test_the_client_engine_does_not_import_jax():
    import subprocess
    import sys

    code = (
        "import sys; from gymllm.inference import OpenAIClientEngine, SamplingParams; "
        "assert 'jax' not in sys.modules, 'jax imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# ---------------------------------------------------------------- OpenAI's text rules, tool calls
def test_text_leaves_out_the_stop_token_but_token_ids_keep_it(server, lm):
    """Force a stop on a token the greedy answer contains: the text is the decode of the ids before it."""
    body = {"prompt": [5, 6, 7, 8], "max_tokens": 9, "temperature": 0.0}
    with httpx.Client(base_url=server.url, timeout=60) as http:
        free = http.post("/v1/completions", json=body).json()["choices"][0]["token_ids"]
        stop = free[3]
        cut = free[: free.index(stop) + 1]
        done = http.post("/v1/completions", json={**body, "stop_token_ids": [stop]}).json()[
            "choices"
        ][0]
        chat_body = {
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 9,
            "temperature": 0.0,
        }
        chat_free = http.post("/v1/chat/completions", json=chat_body).json()["choices"][0][
            "token_ids"
        ]
        cstop = chat_free[2]
        chat = http.post(
            "/v1/chat/completions", json={**chat_body, "stop_token_ids": [cstop]}
        ).json()["choices"][0]
        with http.stream(
            "POST",
            "/v1/chat/completions",
            json={**chat_body, "stop_token_ids": [cstop], "stream": True},
        ) as resp:
            events = sse_events(resp)
    assert (
        done["token_ids"] == cut and done["finish_reason"] == "stop" and done["stop_reason"] == stop
    )
    assert done["text"] == lm.tokenizer.decode(cut[:-1])
    ccut = chat_free[: chat_free.index(cstop) + 1]
    assert chat["token_ids"] == ccut and chat["message"]["content"] == lm.tokenizer.decode(
        ccut[:-1]
    )
    streamed = "".join(
        e["choices"][0].get("delta", {}).get("content", "") or "" for e in events[:-1]
    )
    assert streamed == chat["message"]["content"]


class ScriptedEngine:
    """A stand-in engine that answers every request with the ids of the next scripted text plus the
    end-of-turn id: a random tiny model never writes a tool call, so tool-call shaping is tested on
    text we choose (the server, tokenizer, template and HTTP stack are the real ones)."""

    def __init__(self, tokenizer, texts):
        self.tokenizer, self.texts, self.prompts = tokenizer, list(texts), []
        self.max_len, self.version = 4096, 0
        self.end = tokenizer.token_to_id("<|im_end|>")

    async def generate(self, prompt, params, session_id=None):
        from gymllm.inference import Completion

        self.prompts.append(list(prompt))
        ids = self.tokenizer.encode(self.texts.pop(0)) + [self.end]
        return Completion(
            token_ids=ids,
            logprobs=[-0.5] * len(ids),
            versions=[self.version] * len(ids),
            prompt_len=len(prompt),
            finish_reason="stop",
            stop_reason=self.end,
        )


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


def test_tool_calls_come_back_as_tool_calls_through_the_openai_client(lm):
    openai = pytest.importorskip("openai")
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    engine = ScriptedEngine(lm.tokenizer, ["Let me add.\n" + call, "The sum is 5.", call])
    with ServerThread(build_app(engine, lm.tokenizer, "scripted")) as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
        msgs = [{"role": "user", "content": "What is 2 + 3?"}]
        r = client.chat.completions.create(model="scripted", messages=msgs, tools=TOOLS)
        choice = r.choices[0]
        msgs += [
            choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": choice.message.tool_calls[0].id, "content": "5"},
        ]
        r2 = client.chat.completions.create(model="scripted", messages=msgs, tools=TOOLS)
        plain = client.chat.completions.create(
            model="scripted", messages=msgs[:1]
        )  # no tools: no parsing
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me add."
    (tc,) = choice.message.tool_calls
    assert tc.function.name == "add" and json.loads(tc.function.arguments) == {"a": 2, "b": 3}
    assert r2.choices[0].message.content == "The sum is 5." and not r2.choices[0].message.tool_calls
    assert (
        r2.choices[0].finish_reason == "stop" and "<|im_end|>" not in r2.choices[0].message.content
    )
    assert plain.choices[0].message.content == call and plain.choices[0].finish_reason == "stop"
    # the echoed assistant message rendered the call back into the next prompt
    assert "<tool_call>" in lm.tokenizer.decode(
        engine.prompts[1]
    ) and "<tool_response>" in lm.tokenizer.decode(engine.prompts[1])


def test_openapi_schema_describes_the_bounds(server):
    with httpx.Client(base_url=server.url, timeout=60) as http:
        spec = http.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    assert schemas["CompletionRequest"]["properties"]["n"]["anyOf"][0]["maximum"] == 16
    assert schemas["CompletionRequest"]["properties"]["max_tokens"]["maximum"] == CFG.max_len
    assert "ChatCompletionResponse" in schemas and "/v1/chat/completions" in spec["paths"]
