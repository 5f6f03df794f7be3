"""Property-based fuzzing of both HTTP servers from their own OpenAPI schemas (schemathesis), with numeric
extremes pushed into every numeric field the schema names: no request gets a 5xx, every error is JSON,
and the server answers a good request afterwards.

``gymllm serve`` runs over a tiny JaxEngine, ``gymllm serve-env`` over ``gymllm/Arithmetic-v0``, both in
uvicorn threads on 127.0.0.1. Schemathesis draws each request (valid and invalid bodies); a drawn
extreme (NaN, infinities, 2**31, 2**63, -2**63 - 1, negatives, 1e308) then replaces one numeric field,
sent as raw JSON (``NaN`` and ``Infinity`` as JSON spells them in the wild). Neither schema declares
OpenAPI links, so there is no stateful sequence to run (each request stands alone). The sweep is in the
slow tier; a short serve-env run stays in the default tier.
"""

from __future__ import annotations

import json
import logging

import httpx
import pytest

schemathesis = pytest.importorskip("schemathesis")  # the test extra's schemathesis
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402

EXTREMES = [
    float("nan"),
    float("inf"),
    float("-inf"),
    2**31,
    2**63,
    -(2**63) - 1,
    -1,
    -(2**31),
    1e308,
    0,
]


def numeric_fields(spec: dict) -> dict[tuple[str, str], list[str]]:
    """``{(METHOD, path): [numeric body fields]}`` read from an OpenAPI document ($refs and anyOf resolved)."""
    comps = spec.get("components", {}).get("schemas", {})

    def resolve(s: dict) -> dict:
        while "$ref" in s:
            s = comps[s["$ref"].rsplit("/", 1)[-1]]
        return s

    def numeric(s: dict) -> bool:
        s = resolve(s)
        return s.get("type") in ("integer", "number") or any(
            numeric(x) for x in s.get("anyOf", []) + s.get("oneOf", [])
        )

    out = {}
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            body = (
                (op.get("requestBody") or {})
                .get("content", {})
                .get("application/json", {})
                .get("schema")
            )
            if body is None:
                continue
            props = resolve(body).get("properties", {})
            names = [k for k, v in props.items() if numeric(v)]
            for k, v in props.items():  # one level down (an action's or a request's nested numbers)
                inner = resolve(v).get("properties", {})
                names += [f"{k}.{n}" for n, w in inner.items() if numeric(w)]
            out[(method.upper(), path)] = names
    return out


def _inject(body, field: str, value):
    body = dict(body) if isinstance(body, dict) else {}
    head, _, rest = field.partition(".")
    if rest:
        inner = body.get(head)
        body[head] = {**(inner if isinstance(inner, dict) else {}), rest: value}
    else:
        body[head] = value
    return body


def fuzz(
    url: str, good: tuple[str, dict], *, examples: int, headers: dict | None = None
) -> dict[int, int]:
    """Run the sweep against ``url``; return how many answers of each status it saw."""
    spec = httpx.get(url + "/openapi.json").json()
    fields = numeric_fields(spec)
    assert any(fields.values()), "the schema names no numeric field to push extremes into"
    schema = schemathesis.openapi.from_dict(spec)
    ops = [r.ok() for r in schema.get_all_operations()]
    ops = [op for op in ops if "{" not in op.path and op.path != "/mcp"]
    strategy = st.one_of(
        [
            op.as_strategy(generation_mode=mode)
            for op in ops
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
        ]
    )
    seen: dict[int, int] = {}

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy, extreme=st.sampled_from(EXTREMES), pick=st.integers(0, 10**6))
    def check(case, extreme, pick):
        body = case.body if isinstance(case.body, (dict, list)) else None
        numbers = fields.get((case.method.upper(), case.path), [])
        if numbers and not isinstance(body, list):
            body = _inject(body, numbers[pick % len(numbers)], extreme)
        kw = (
            {
                "content": json.dumps(body),
                "headers": {"content-type": "application/json", **(headers or {})},
            }
            if body is not None
            else {"headers": headers or {}}
        )
        r = httpx.request(
            case.method, url + case.formatted_path, params=case.query, timeout=120, **kw
        )
        seen[r.status_code] = seen.get(r.status_code, 0) + 1
        assert r.status_code < 500, (
            case.method,
            case.formatted_path,
            kw.get("content", "")[:300],
            r.text[:300],
        )
        if r.status_code >= 400:
            assert r.headers.get("content-type", "").startswith("application/json"), r.text[:300]
            r.json()

    check()
    ok = httpx.post(url + good[0], json=good[1], headers=headers or {}, timeout=120)
    assert ok.status_code == 200, ok.text[:300]
    return seen


@pytest.fixture(scope="module")
def env_server():
    pytest.importorskip("openenv", reason="the openenv extra (pip install 'gymllm[openenv]')")
    from gymllm.envs.openenv_server import ServeEnvConfig, ServerThread, build_app

    logging.getLogger("uvicorn.error").setLevel(logging.CRITICAL)
    with ServerThread(build_app(ServeEnvConfig(env="gymllm/Arithmetic-v0"))) as s:
        yield s.url


def test_serve_env_schema_names_its_numbers(env_server):
    fields = numeric_fields(httpx.get(env_server + "/openapi.json").json())
    assert "seed" in fields[("POST", "/reset")] and "timeout_s" in fields[("POST", "/step")]


def test_serve_env_fuzz_short(env_server):
    seen = fuzz(env_server, ("/reset", {"seed": 1}), examples=25)
    assert any(400 <= s < 500 for s in seen), seen


@pytest.mark.slow
def test_serve_env_fuzz_with_extremes(env_server):
    seen = fuzz(env_server, ("/reset", {"seed": 1}), examples=300)
    assert any(s < 300 for s in seen) and any(400 <= s < 500 for s in seen), seen


@pytest.mark.slow
def test_inference_server_fuzz_with_extremes():
    from gymllm.inference import EngineConfig, JaxEngine, ServerThread, build_app
    from gymllm.models import make_tiny

    lm = make_tiny("llama")
    engine = JaxEngine.from_loaded(
        lm, config=EngineConfig(num_slots=4, max_len=64, min_bucket=64), stop_token_ids=()
    )
    try:
        with ServerThread(build_app(engine, lm.tokenizer, "tiny-llama")) as s:
            fields = numeric_fields(httpx.get(s.url + "/openapi.json").json())
            assert {"top_k", "seed", "temperature", "n"} <= set(fields[("POST", "/v1/completions")])
            seen = fuzz(
                s.url, ("/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 2}), examples=300
            )
            assert any(s < 300 for s in seen) and any(400 <= s < 500 for s in seen), seen
            assert httpx.get(s.url + "/health").status_code == 200 and engine.serving
    finally:
        engine.shutdown()
