"""Hostile HTTP against a live ``gymllm serve --model.name tiny-qwen3`` (a real uvicorn subprocess on
127.0.0.1): schemathesis-generated requests from the server's own OpenAPI schema (valid and invalid
bodies) never get a 5xx, the server never crashes and its memory stays bounded; then a table of
named bad requests, each with its status and message, the server serving a good request after each."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import httpx
import pytest

schemathesis = pytest.importorskip("schemathesis")  # the test extra's schemathesis
psutil = pytest.importorskip("psutil")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402

from gymllm.utils.serving import stop_process, wait_until_healthy  # noqa: E402

MAX_LEN = 64
AUTH = {"Authorization": "Bearer hostile-test-key-0123"}
KEY = "hostile-test-key-0123"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(*args: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    cmd = [
        sys.executable,
        "-m",
        "gymllm.cli.main",
        "serve",
        "--model.name",
        "tiny-qwen3",
        "--port",
        str(port),
        "--engine.max-len",
        str(MAX_LEN),
        "--engine.num-slots",
        "2",
        "--engine.min-bucket",
        str(MAX_LEN),
        "--engine.decode-lengths",
        "1",
        *args,
    ]  # few compiled shapes: the test measures requests, not compiles
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "GYMLLM_API_KEY": ""}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_until_healthy(
        url, proc=proc, timeout_s=180
    )  # a watchdog on startup, not a timing assertion
    return proc, url


def _stop(proc: subprocess.Popen) -> None:
    stop_process(proc, timeout_s=30)


@pytest.fixture(scope="module")
def live():
    proc, url = _serve("--api-key", KEY)
    try:
        yield proc, url
    finally:
        _stop(proc)


def _client(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=120, headers=AUTH)


def _ok(http: httpx.Client) -> None:
    r = http.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 2})
    assert r.status_code == 200 and len(r.json()["choices"][0]["token_ids"]) == 2


def test_schemathesis_finds_no_server_error_and_memory_stays_bounded(live):
    proc, url = live
    schema = schemathesis.openapi.from_url(url + "/openapi.json")
    ops = [r.ok() for r in schema.get_all_operations()]
    assert {op.path for op in ops} >= {
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/models",
        "/health",
    }
    strategy = st.one_of(
        [
            op.as_strategy(generation_mode=mode)
            for op in ops
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
        ]
    )
    with _client(url) as http:  # compile the programs first, so RSS measures requests, not programs
        http.post("/v1/completions", json={"prompt": [5] * 3, "max_tokens": 40})
        http.post(
            "/v1/completions", json={"prompt": [5] * 50, "max_tokens": 10, "top_k": 3, "seed": 2}
        )
        _ok(http)
    rss_before = psutil.Process(proc.pid).memory_info().rss
    seen: dict[int, int] = {}

    @settings(
        max_examples=60,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def check(case):
        response = case.call(base_url=url, timeout=120, headers=AUTH)
        seen[response.status_code] = seen.get(response.status_code, 0) + 1
        assert response.status_code < 500, (
            case.as_curl_command(),
            response.status_code,
            response.text[:500],
        )
        if response.status_code >= 400:
            assert "message" in response.json()["error"]

    check()
    assert proc.poll() is None, "the server died"
    rss_after = psutil.Process(proc.pid).memory_info().rss
    assert rss_after - rss_before < 300 * 2**20, (
        f"RSS grew {(rss_after - rss_before) / 2**20:.0f} MiB"
    )
    assert any(s < 300 for s in seen) and any(400 <= s < 500 for s in seen), seen
    with _client(url) as http:
        _ok(http)


J = {"content-type": "application/json"}
BAD = [  # (name, path, body bytes or JSON, headers, status, message fragment)
    (
        "lone surrogate prompt",
        "/v1/completions",
        b'{"prompt": "\\ud800"}',
        J,
        400,
        "lone surrogate",
    ),
    (
        "lone surrogate in a list",
        "/v1/completions",
        b'{"prompt": ["ok", "a\\udfff"]}',
        J,
        400,
        "lone surrogate",
    ),
    (
        "lone surrogate chat",
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": "\\ud83d"}]}',
        J,
        400,
        "lone surrogate",
    ),
    (
        "n=1000",
        "/v1/completions",
        {"prompt": "hi", "n": 1000},
        None,
        400,
        "less than or equal to 16",
    ),
    (
        "max_tokens past the context",
        "/v1/completions",
        {"prompt": "hi", "max_tokens": 1000},
        None,
        400,
        f"at most {MAX_LEN}",
    ),
    (
        "max_tokens huge",
        "/v1/completions",
        {"prompt": "hi", "max_tokens": 10**15},
        None,
        400,
        "max_tokens: Input should be less than or equal to 2147483647",
    ),
    (
        "top_k past int32",
        "/v1/completions",
        {"prompt": "hi", "top_k": 2**31},
        None,
        400,
        "top_k: Input should be",
    ),
    (
        "max_tokens inf",
        "/v1/completions",
        b'{"prompt": "hi", "max_tokens": 1e400}',
        J,
        400,
        "max_tokens",
    ),
    (
        "body over the limit",
        "/v1/completions",
        json.dumps({"prompt": "x" * 1_100_000}).encode(),
        J,
        413,
        "at most 1000000 bytes",
    ),
    ("invalid JSON", "/v1/completions", b'{"prompt": ', J, 400, "invalid JSON"),
    ("not UTF-8", "/v1/completions", b"\xff\xfe{}", J, 400, "invalid JSON"),
    ("deeply nested", "/v1/completions", b"[" * 50_000 + b"]" * 50_000, J, 400, ""),
    ("body not an object", "/v1/completions", b"[1, 2]", J, 400, "expected a JSON object"),
    (
        "not JSON at all",
        "/v1/completions",
        b"prompt=hi",
        {"content-type": "text/plain"},
        400,
        "expected a JSON object",
    ),
    (
        "wrong type temperature",
        "/v1/completions",
        {"prompt": "hi", "temperature": "hot"},
        None,
        400,
        "temperature",
    ),
    ("wrong type prompt", "/v1/completions", {"prompt": {"x": 1}}, None, 400, "prompt: expected"),
    ("negative token id", "/v1/completions", {"prompt": [1, -5]}, None, 400, "prompt"),
    ("token id past vocab", "/v1/completions", {"prompt": [1, 10**9]}, None, 400, "ids in [0,"),
    (
        "prompt over context",
        "/v1/completions",
        {"prompt": [1] * (MAX_LEN + 5)},
        None,
        400,
        "at most",
    ),
    (
        "unknown model",
        "/v1/chat/completions",
        {"model": "gpt-9", "messages": [{"role": "user", "content": "a"}]},
        None,
        404,
        "model: expected",
    ),
    (
        "missing messages",
        "/v1/chat/completions",
        {"model": "tiny-qwen3"},
        None,
        400,
        "messages: expected",
    ),
    (
        "bad role",
        "/v1/chat/completions",
        {"messages": [{"role": "wizard", "content": "a"}]},
        None,
        400,
        "role",
    ),
    (
        "stream with n=2",
        "/v1/completions",
        {"prompt": "hi", "stream": True, "n": 2},
        None,
        400,
        "stream: expected",
    ),
    (
        "a reward route outside training mode",
        "/v1/sessions/abc/reward",
        {"reward": 1.0},
        None,
        404,
        "",
    ),
]


@pytest.mark.parametrize("name,path,body,headers,status,fragment", BAD, ids=[b[0] for b in BAD])
def test_named_bad_requests(live, name, path, body, headers, status, fragment):
    _, url = live
    with _client(url) as http:
        kw = {"content": body, "headers": headers} if isinstance(body, bytes) else {"json": body}
        r = http.post(path, **kw)
        assert r.status_code == status, r.text[:500]
        err = r.json()["error"]
        assert fragment in err["message"] and err["type"] == "invalid_request_error", err
        _ok(http)


def test_unknown_fields_are_ignored(live):
    _, url = live
    with _client(url) as http:
        r = http.post(
            "/v1/completions",
            json={
                "prompt": [1, 2],
                "max_tokens": 2,
                "frobnicate": {"x": [1]},
                "presence_penalty": 0.0,
            },
        )
        assert r.status_code == 200 and len(r.json()["choices"][0]["token_ids"]) == 2


def test_a_chunked_body_over_the_limit_gets_a_413(live):
    _, url = live

    def chunks():
        yield b'{"prompt": "'
        for _ in range(12):
            yield b"x" * 100_000
        yield b'"}'

    with _client(url) as http:
        r = http.post("/v1/completions", content=chunks(), headers=J)  # no Content-Length: chunked
        assert r.status_code == 413 and "at most" in r.json()["error"]["message"]
        _ok(http)


def test_non_loopback_without_a_key_is_refused_at_startup():
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "GYMLLM_API_KEY": ""}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "gymllm.cli.main",
            "serve",
            "--model.name",
            "tiny-qwen3",
            "--host",
            "0.0.0.0",
            "--port",
            str(_free_port()),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0 and "API key" in out.stderr and "--api-key" in out.stderr, (
        out.stderr[-1000:]
    )


def test_the_key_is_checked_as_a_bearer_token(live):
    _, url = live
    with httpx.Client(base_url=url, timeout=60) as http:
        body = {"prompt": [1, 2], "max_tokens": 2}
        assert http.get("/health").status_code == 200  # liveness stays open
        for headers in ({}, {"Authorization": "Bearer wrong-key-000000"}, {"Authorization": KEY}):
            r = http.post("/v1/completions", json=body, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", r.text
            assert http.get("/v1/models", headers=headers).status_code == 401
        assert http.post("/v1/completions", json=body, headers=AUTH).status_code == 200
