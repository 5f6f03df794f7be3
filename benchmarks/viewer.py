"""Benchmark: how fast ``gymllm view`` opens the trajectory table of a big log, side by side with
reading the whole log per request.

The log: a training run's ``trajectories.jsonl`` of ``--trajectories`` (default 100,000) records in
the format :mod:`gymllm.train.run` writes (ids, step, group, reward, finish reason, 64 token ids,
sampled spans, versions, decoded response), about 60 MB.

Per round, a fresh viewer (:class:`gymllm.viewer.ViewerServer`, uvicorn on 127.0.0.1, background
indexing on, as ``gymllm view`` starts) is asked over HTTP for the table's first page (50 rows) right
after it starts. Side by side in the same round (just before the viewer starts): the same first page
the naive way, every line of the file parsed, then sliced (what a server without an index does per
request).

RESULT keys: ``viewer_page_ms`` (median first page over rounds, HTTP included; goal < 200 ms),
``full_read_page_ms`` (median, the naive way), ``speedup`` (their ratio), ``index_s`` (indexing the
whole log, with what the background indexer had done), ``filtered_page_ms`` (a filtered page once indexed: reward >= 0.5), ``detail_ms`` (one
trajectory's page data, the tokenizer already loaded), ``trajectories``, ``log_mb``, ``rounds``,
``cpu``, ``loadavg``.

Usage: python benchmarks/viewer.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

from results.device import choose_platform  # noqa: E402

choose_platform()  # --cpu: JAX on the CPU; else JAX_PLATFORMS as set, or JAX's default device
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import httpx  # noqa: E402

from gymllm.utils.host import describe_cpu, loadavg  # noqa: E402
from gymllm.viewer import ViewerConfig, ViewerServer  # noqa: E402


def write_run(root: pathlib.Path, n: int) -> pathlib.Path:
    """A run directory with config.json (tiny model) and a ``trajectories.jsonl`` of ``n`` records."""
    run = root / "big-run"
    run.mkdir()
    (run / "config.json").write_text(
        json.dumps(
            {
                "model": {"name": "tiny-qwen3", "vocab_size": 512},
                "env": {"id": "gymllm/TinyRepeat-v0"},
                "loss": {"advantage": {"estimator": "grpo"}},
            }
        )
    )
    with open(run / "trajectories.jsonl", "w") as f:
        for i in range(n):
            g, m = divmod(i, 8)
            ids = [(i * 7 + k * 13) % 500 for k in range(64)]
            f.write(
                json.dumps(
                    {
                        "step": g // 4 + 1,
                        "group_id": f"g{g}",
                        "trajectory_id": f"g{g}/m{m}/a0",
                        "task_id": f"task-{g % 50}",
                        "reward": ((i * 37) % 100) / 100.0,
                        "finish_reason": "stop",
                        "num_tokens": 64,
                        "num_sampled": 16,
                        "versions": [g // 4],
                        "response": "x" * 16,
                        "token_ids": ids,
                        "sampled_spans": [[48, 64]],
                    }
                )
                + "\n"
            )
    return run


def naive_first_page(path: pathlib.Path, size: int = 50) -> list[dict]:
    """The first page the naive way: parse every line of the log, then slice."""
    with open(path, "rb") as f:
        records = [json.loads(line) for line in f if line.strip()]
    return records[:size]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 rounds (about a minute here)")
    ap.add_argument(
        "--rounds", type=int, default=None, help="fresh viewers timed (default 7; --quick: 3)"
    )
    ap.add_argument("--trajectories", type=int, default=100_000)
    args = ap.parse_args()
    rounds = args.rounds or (3 if args.quick else 7)
    with tempfile.TemporaryDirectory(prefix="gymllm-viewer-bench-") as tmp:
        t = time.perf_counter()
        run = write_run(pathlib.Path(tmp), args.trajectories)
        log = run / "trajectories.jsonl"
        print(
            f"wrote {args.trajectories} trajectories ({log.stat().st_size / 1e6:.1f} MB) in "
            f"{time.perf_counter() - t:.1f} s",
            flush=True,
        )
        page_ms, naive_ms = [], []
        for r in range(rounds):
            t = time.perf_counter()  # the naive way first, with no viewer running beside it
            rows = naive_first_page(log)
            naive_ms.append((time.perf_counter() - t) * 1e3)
            assert rows[0]["trajectory_id"] == "g0/m0/a0"
            with (
                ViewerServer(ViewerConfig(runs=(str(run),), port=0)) as url,
                httpx.Client(base_url=url, timeout=300) as c,
            ):
                t = time.perf_counter()
                body = c.get(
                    "/api/trajectories", params={"run": "big-run", "page": 0, "size": 50}
                ).json()
                page_ms.append((time.perf_counter() - t) * 1e3)
                assert [row["id"] for row in body["rows"]][:2] == ["g0/m0/a0", "g0/m1/a0"], (
                    body.get("error")
                )
                if r == rounds - 1:  # once: the whole index, a filtered page, one trajectory
                    t = time.perf_counter()  # a filtered page indexes the whole log first
                    c.get("/api/trajectories", params={"run": "big-run", "reward_min": 0.99}).json()
                    index_s = time.perf_counter() - t
                    t = time.perf_counter()
                    filtered = c.get(
                        "/api/trajectories", params={"run": "big-run", "reward_min": 0.5}
                    ).json()
                    filtered_ms = (time.perf_counter() - t) * 1e3
                    assert filtered["complete"] and filtered["total"] == args.trajectories // 2, (
                        filtered["total"]
                    )
                    c.get(
                        "/api/trajectory", params={"run": "big-run", "id": "g100/m3/a0"}
                    )  # loads the tokenizer
                    t = time.perf_counter()
                    detail = c.get(
                        "/api/trajectory", params={"run": "big-run", "id": "g9000/m3/a0"}
                    ).json()
                    detail_ms = (time.perf_counter() - t) * 1e3
                    assert len(detail["tokens"]["ids"]) == 64, detail
            print(
                f"round {r + 1}/{rounds}: viewer first page {page_ms[-1]:.1f} ms, whole-file read "
                f"{naive_ms[-1]:.1f} ms",
                flush=True,
            )
        out = {
            "viewer_page_ms": round(statistics.median(page_ms), 2),
            "full_read_page_ms": round(statistics.median(naive_ms), 2),
            "speedup": round(statistics.median(naive_ms) / statistics.median(page_ms), 1),
            "index_s": round(index_s, 3),
            "filtered_page_ms": round(filtered_ms, 1),
            "detail_ms": round(detail_ms, 1),
            "trajectories": args.trajectories,
            "log_mb": round(log.stat().st_size / 1e6, 1),
            "rounds": rounds,
            "cpu": describe_cpu(),
            "loadavg": loadavg(),
        }
    from results import emit_result  # the RESULT line, and its record in benchmarks/results/

    emit_result("viewer", out)


if __name__ == "__main__":
    main()
