"""``gymllm serve`` against numbers chosen to overflow the engine, and against a dead engine: each hostile
field is a 400 naming it (the engine never sees it), a request the engine cannot lay out fails alone (the
engine loop serves on), ``/health`` answers 503 once the engine stops, and :func:`serve` then exits with
an error so a supervisor can restart it. Real uvicorn on 127.0.0.1 over a real (tiny) JaxEngine."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import httpx
import pytest

from gymllm.errors import EngineError
from gymllm.inference import EngineConfig, JaxEngine, SamplingParams, ServerThread, build_app
from gymllm.models import make_tiny

CFG = EngineConfig(
    num_slots=12, max_len=64, min_bucket=64, max_prefill_batch=2
)  # as test_server: shared compiles
GOOD = {"prompt": [1, 2, 3], "max_tokens": 2}


@pytest.fixture(scope="module")
def lm():
    return make_tiny("llama")


def _engine(lm) -> JaxEngine:
    return JaxEngine.from_loaded(lm, config=CFG, stop_token_ids=())


@pytest.fixture(scope="module")
def server(lm):
    engine = _engine(lm)
    with ServerThread(build_app(engine, lm.tokenizer, "tiny-llama")) as s:
        yield s, engine
    engine.shutdown()


HOSTILE = [  # (field, raw JSON value)
    ("top_k", "2147483648"),
    ("top_k", "9223372036854775808"),
    ("top_k", "-2"),
    ("top_k", "1e999"),
    ("seed", "18446744073709551616"),
    ("seed", "-9223372036854775809"),
    ("seed", "NaN"),
    ("temperature", "NaN"),
    ("temperature", "Infinity"),
    ("temperature", "1e308"),
    ("temperature", "-1"),
    ("top_p", "NaN"),
    ("top_p", "0"),
    ("top_p", "-Infinity"),
    ("n", "9223372036854775808"),
    ("max_tokens", "9223372036854775808"),
    ("max_tokens", "-1"),
    ("max_completion_tokens", "2147483648"),
    ("logprobs", "2147483648"),
    ("stop_token_ids", "[2147483648]"),
]


@pytest.mark.parametrize("field,value", HOSTILE, ids=[f"{f}={v}" for f, v in HOSTILE])
def test_hostile_numbers_are_a_400_naming_the_field(server, field, value):
    s, engine = server
    body = (
        '{"prompt": [1, 2, 3], "max_tokens": 2, "%s": %s}' % (field, value)
        if field != "max_tokens"
        else '{"prompt": [1, 2, 3], "max_tokens": %s}' % value
    )
    with httpx.Client(base_url=s.url, timeout=120) as http:
        r = http.post("/v1/completions", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400, (r.status_code, r.text[:300])
        err = r.json()["error"]
        assert err["param"] == field and field in err["message"], err
        ok = http.post("/v1/completions", json=GOOD)  # the server, and its engine, serve on
        assert ok.status_code == 200 and len(ok.json()["choices"][0]["token_ids"]) == 2, ok.text[
            :300
        ]
        assert http.get("/health").status_code == 200


def test_a_request_the_engine_cannot_lay_out_fails_alone(lm):
    """Past the server's bounds (a direct caller): the loop fails that request and serves the one beside it."""
    engine = _engine(lm)

    async def main():
        with (
            engine.paused()
        ):  # both wait, then are admitted in one prefill batch: the bad one beside the good
            bad = asyncio.ensure_future(
                engine.generate([1, 2, 3], SamplingParams(max_tokens=2, top_k=2**31))
            )
            good = asyncio.ensure_future(
                engine.generate([4, 5, 6], SamplingParams(max_tokens=2, seed=1))
            )
            for _ in range(3):
                await asyncio.sleep(0)  # both submitted before the loop runs again
        return await asyncio.gather(bad, good, return_exceptions=True)

    try:
        bad, good = asyncio.run(main())
        assert isinstance(bad, EngineError) and "OverflowError" in str(bad), bad
        assert not isinstance(good, BaseException) and len(good.token_ids) == 2, good
        again = asyncio.run(engine.generate([1, 2], SamplingParams(max_tokens=2)))
        assert len(again.token_ids) == 2 and engine.serving and engine.failure is None
    finally:
        engine.shutdown()


def test_health_is_503_once_the_engine_stops(lm):
    engine = _engine(lm)
    with ServerThread(build_app(engine, lm.tokenizer, "tiny-llama")) as s:
        assert httpx.get(s.url + "/health").status_code == 200
        engine.shutdown()
        r = httpx.get(s.url + "/health")
        assert r.status_code == 503 and "engine stopped" in r.json()["error"]["message"], r.text


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_serve_exits_with_an_error_once_the_engine_stops(lm):
    from gymllm.inference.server import serve
    from gymllm.utils.serving import ServerStopped

    engine = _engine(lm)
    port, outcome = _free_port(), []

    def run():
        try:
            serve(engine, lm.tokenizer, "tiny-llama", port=port, log_level="warning")
            outcome.append("returned")
        except BaseException as e:  # noqa: BLE001 - recorded and asserted below
            outcome.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    deadline = time.monotonic() + 60  # a watchdog on startup, not a timing assertion
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.05)
    engine.shutdown()
    t.join(timeout=60)
    assert not t.is_alive(), "serve() kept running over a stopped engine"
    assert isinstance(outcome[0], ServerStopped) and "engine stopped" in str(outcome[0]), outcome
