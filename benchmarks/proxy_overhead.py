"""Per-request overhead of the training proxy (``gymllm serve`` in training mode) over direct engine calls.

The same greedy request, interleaved in rounds: ``engine.generate(prompt_ids)`` in this process, and
the same conversation as an OpenAI chat request over loopback HTTP to a training-mode server on the
same engine (pydantic validation, the chat template, the session's token record, the JSON answer).
Each proxy request is its own session, closed with a reward, so the figure includes recording and
grouping. ``proxy_overhead_ms``: p50 of proxy requests minus p50 of direct calls.

RESULT keys: ``proxy_overhead_ms``, ``direct_ms_p50``, ``proxy_ms_p50``, ``requests``, ``load_average``.

    python benchmarks/proxy_overhead.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from typing import Any


def proxy_overhead_ms(
    engine: Any,
    tokenizer: Any,
    *,
    rounds: int = 5,
    requests: int = 20,
    max_tokens: int = 8,
    messages: list | None = None,
) -> dict[str, float]:
    """p50 latency of chat requests through a training-mode server on ``engine`` minus p50 of direct
    ``engine.generate`` calls of the same prompt ids (greedy, so both sample the same tokens)."""
    import httpx

    from gymllm.inference import SamplingParams, ServerThread, build_app
    from gymllm.inference.session_recorder import SessionRecorder
    from gymllm.rollout.proxy_source import ProxyGroupSource, ProxySourceConfig

    messages = messages or [{"role": "user", "content": "What is 17 + 25? Answer briefly."}]
    source = ProxyGroupSource(ProxySourceConfig(max_queued_groups=10**9))
    recorder = SessionRecorder(tokenizer, on_closed=source.add)
    app = build_app(engine, tokenizer, "policy", recorder=recorder)
    prompt = list(
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    )
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    body = {"model": "policy", "messages": messages, "max_tokens": max_tokens, "temperature": 0.0}
    direct, proxied = [], []
    loop = asyncio.new_event_loop()
    try:
        with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=120) as http:
            http.post("/v1/chat/completions", json=body)  # warm both paths
            loop.run_until_complete(engine.generate(prompt, params))
            n = 0
            for _ in range(rounds):
                for _ in range(requests):
                    t = time.perf_counter()
                    loop.run_until_complete(engine.generate(prompt, params))
                    direct.append(time.perf_counter() - t)
                    sid = f"bench-{n}"
                    n += 1
                    t = time.perf_counter()
                    r = http.post("/v1/chat/completions", json=body, headers={"X-Session-Id": sid})
                    http.post(f"/v1/sessions/{sid}/reward", json={"reward": 0.0})
                    proxied.append(time.perf_counter() - t)
                    assert r.status_code == 200, r.text
    finally:
        loop.close()
        source.close()
    d, p = statistics.median(direct) * 1e3, statistics.median(proxied) * 1e3
    return {
        "proxy_overhead_ms": round(p - d, 3),
        "direct_ms_p50": round(d, 3),
        "proxy_ms_p50": round(p, 3),
        "requests": len(proxied),
        "groups_released": source.stats().get("released", 0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer requests")
    parser.add_argument("--model", default="tiny-qwen3", help="tiny-<family> or a model name")
    from results.device import choose_platform

    choose_platform()  # --cpu: JAX on the CPU; else JAX_PLATFORMS as set, or JAX's default device
    args = parser.parse_args()
    from gymllm import models
    from gymllm.inference import EngineConfig, JaxEngine

    loaded = (
        models.make_tiny(args.model.removeprefix("tiny-"))
        if args.model.startswith("tiny-")
        else models.load(args.model)
    )
    engine = JaxEngine.from_loaded(
        loaded,
        config=EngineConfig(
            num_slots=2, max_len=256, min_bucket=256, max_prefill_batch=1, decode_lengths=1
        ),
    )
    try:
        result = proxy_overhead_ms(
            engine,
            loaded.tokenizer,
            rounds=3 if args.quick else 10,
            requests=10 if args.quick else 20,
        )
    finally:
        engine.shutdown()
    result.update(model=args.model, quick=args.quick, load_average=round(os.getloadavg()[0], 1))
    from results import emit_result  # the RESULT line, and its record in benchmarks/results/

    emit_result("proxy_overhead", result)


if __name__ == "__main__":
    main()
