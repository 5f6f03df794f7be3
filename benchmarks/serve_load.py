"""A bounded load test of ``gymllm serve``: concurrent streaming clients on loopback for a fixed time.

A real ``gymllm serve --model.name tiny-qwen3`` process (uvicorn, the JaxEngine, SSE streaming) on 127.0.0.1;
``--clients`` asyncio clients each send streaming completions back to back for ``--duration-s`` seconds
(prompts and lengths vary per request, seeded). Measured: latency of each whole stream (request sent to
``[DONE]``), p50 and p99; errors (a non-200 answer, an error event in the stream, a missing ``[DONE]``, a
transport error); the server process's RSS after warm-up and at the end (growth as a ratio). Afterwards
the server must still answer ``/health`` with 200.

RESULT keys: ``serve_p99_ms``, ``serve_p50_ms``, ``serve_errors`` (goal 0), ``serve_rss_growth`` (goal
under 1.2), ``requests``, ``tokens_per_s``, ``clients``, ``duration_s``, ``load_average``.

    python benchmarks/serve_load.py            # 16 clients for 60 s
    python benchmarks/serve_load.py --quick    # 8 clients for 20 s (about 2 minutes with start-up)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, max_len: int, slots: int) -> tuple[subprocess.Popen, str]:
    from gymllm.utils.serving import wait_until_healthy

    port = _free_port()
    cmd = [
        sys.executable,
        "-m",
        "gymllm.cli.main",
        "serve",
        "--model.name",
        model,
        "--port",
        str(port),
        "--engine.max-len",
        str(max_len),
        "--engine.num-slots",
        str(slots),
        "--engine.min-bucket",
        str(max_len),
    ]
    env = {**os.environ, "GYMLLM_API_KEY": ""}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    wait_until_healthy(url, proc=proc, timeout_s=300)  # a watchdog on start-up
    return proc, url


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


async def one_stream(http, rng: random.Random, max_len: int) -> tuple[float, int, str | None]:
    """One streaming completion: (seconds, tokens, error or None)."""
    n = rng.randint(4, max_len // 4)
    body = {
        "prompt": [rng.randint(1, 200) for _ in range(n)],
        "max_tokens": rng.randint(4, max_len // 4),
        "stream": True,
        "temperature": 1.0,
        "seed": rng.randint(0, 2**31),
    }
    t, tokens, done = time.perf_counter(), 0, False
    try:
        async with http.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                return time.perf_counter() - t, 0, f"HTTP {r.status_code}"
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    done = True
                    break
                event = json.loads(data)
                if "error" in event:
                    return (
                        time.perf_counter() - t,
                        tokens,
                        f"stream error: {event['error'].get('message', '')[:100]}",
                    )
                tokens += len(event["choices"][0].get("token_ids") or [])
    except Exception as e:  # noqa: BLE001 - every failure is counted, the load goes on
        return time.perf_counter() - t, tokens, f"{type(e).__name__}: {e}"[:200]
    return time.perf_counter() - t, tokens, None if done else "no [DONE]"


async def load(url: str, clients: int, duration_s: float, max_len: int, seed: int) -> dict:
    import httpx

    latencies, errors, tokens = [], [], 0
    stop_at = time.monotonic() + duration_s

    async def client(i: int) -> None:
        nonlocal tokens
        rng = random.Random(seed * 1000 + i)
        async with httpx.AsyncClient(base_url=url, timeout=120) as http:
            while time.monotonic() < stop_at:
                dt, n, err = await one_stream(http, rng, max_len)
                latencies.append(dt)
                tokens += n
                if err is not None:
                    errors.append(err)

    t0 = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(clients)))
    wall = time.perf_counter() - t0
    return {"latencies": latencies, "errors": errors, "tokens": tokens, "wall": wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="8 clients for 20 s")
    ap.add_argument("--clients", type=int, default=None)
    ap.add_argument("--duration-s", type=float, default=None)
    ap.add_argument("--model", default="tiny-qwen3")
    ap.add_argument("--max-len", type=int, default=128)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    from results.device import choose_platform

    choose_platform()  # --cpu: JAX on the CPU (children too); else JAX_PLATFORMS or JAX's default
    args = ap.parse_args()
    clients = args.clients or (8 if args.quick else 16)
    duration = args.duration_s or (20.0 if args.quick else 60.0)

    import httpx

    from gymllm.utils.serving import stop_process

    proc, url = start_server(args.model, args.max_len, args.slots)
    try:
        asyncio.run(
            load(url, min(clients, 4), 5.0 if args.quick else 10.0, args.max_len, args.seed + 1)
        )  # warm-up
        rss0 = rss_bytes(proc.pid)
        out = asyncio.run(load(url, clients, duration, args.max_len, args.seed))
        rss1 = rss_bytes(proc.pid)
        healthy = httpx.get(url + "/health", timeout=10).status_code == 200
    finally:
        stop_process(proc, timeout_s=30)
    lat = sorted(out["latencies"])
    p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else float("nan")
    errors = len(out["errors"]) + (0 if healthy else 1)
    if out["errors"]:
        print("first errors:", out["errors"][:5], file=sys.stderr)
    result = {
        "serve_p99_ms": round(p99 * 1000, 1),
        "serve_p50_ms": round(statistics.median(lat) * 1000, 1) if lat else None,
        "serve_errors": errors,
        "serve_rss_growth": round(rss1 / rss0, 3) if rss0 else None,
        "requests": len(lat),
        "tokens_per_s": round(out["tokens"] / out["wall"], 1),
        "clients": clients,
        "duration_s": duration,
        "healthy_after": healthy,
        "load_average": round(os.getloadavg()[0], 2),
    }
    from results import emit_result  # the RESULT line, and its record in benchmarks/results/

    emit_result("serve_load", result)


if __name__ == "__main__":
    main()
