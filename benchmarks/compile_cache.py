"""Benchmark the persistent compilation cache: a run's whole wall from a cold cache and again from a warm one.

The run is the peers' gymllm side (``benchmarks/peers/run_gymllm.py``: streaming GRPO learner +
JaxEngine on the peers' spec, ``run.warmup`` compiling every engine and learner shape before the
first step), each time a fresh process, timed from its start to its exit. Per round: once with an
empty cache directory (``GYMLLM_COMPILE_CACHE``: every program compiled, those that took >= 1 s
stored) and once more with the same directory (the stored programs loaded). The mean step after the
two warm-up steps is reported for both, so a loaded program is seen to run as fast as a compiled one.

Ends with ``RESULT {json}``: ``warm_vs_cold`` (cold wall / warm wall, tiny config; the mean over
rounds), ``cold_s`` / ``warm_s`` (whole walls), ``step_s_cold`` / ``step_s_warm``, the same keys with
``_medium`` (not with ``--quick``), ``cache_mb``, ``cpu``, ``loadavg``.

    python benchmarks/compile_cache.py --quick      # tiny config, 2 rounds
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import peers  # noqa: E402  (the spec and the runner's RESULT parser)

from gymllm.utils.host import describe_cpu, loadavg  # noqa: E402


def timed_run(spec_file: str, cache_dir: str) -> dict:
    env = dict(os.environ, GYMLLM_COMPILE_CACHE=cache_dir, TOKENIZERS_PARALLELISM="false")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    t = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(HERE / "peers" / "run_gymllm.py"), "--spec", spec_file],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"run_gymllm.py exited {proc.returncode}: {proc.stderr[-2000:]}")
    r = peers.parse_result(proc.stdout)
    return {"wall_s": wall, "mean_step_s": r["mean_step_s"]}


def measure(size: str, rounds: int, steps: int, tmp: str, tok_file: str) -> dict:
    spec_file = f"{tmp}/spec-{size}.json"
    pathlib.Path(spec_file).write_text(
        json.dumps(peers.peer_spec(size, steps=steps, tokenizer_file=tok_file))
    )
    cold, warm, mb = [], [], []
    for rnd in range(rounds):
        cache = tempfile.mkdtemp(
            prefix=f"xla-{size}-{rnd}-", dir=tmp
        )  # empty: this round's cold run
        cold.append(timed_run(spec_file, cache))
        mb.append(sum(f.stat().st_size for f in pathlib.Path(cache).iterdir()) / 2**20)
        warm.append(timed_run(spec_file, cache))
        print(
            f"[{size} round {rnd + 1}/{rounds}] cold {cold[-1]['wall_s']:.1f} s, warm {warm[-1]['wall_s']:.1f} s "
            f"(x{cold[-1]['wall_s'] / warm[-1]['wall_s']:.2f}); steps {cold[-1]['mean_step_s']:.3f} / "
            f"{warm[-1]['mean_step_s']:.3f} s; cache {mb[-1]:.1f} MB",
            flush=True,
        )
    ratios = [c["wall_s"] / w["wall_s"] for c, w in zip(cold, warm)]
    return {
        "warm_vs_cold": statistics.mean(ratios),
        "warm_vs_cold_rounds": ratios,
        "cold_s": [c["wall_s"] for c in cold],
        "warm_s": [w["wall_s"] for w in warm],
        "step_s_cold": statistics.mean(c["mean_step_s"] for c in cold),
        "step_s_warm": statistics.mean(w["mean_step_s"] for w in warm),
        "cache_mb": max(mb),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--quick", action="store_true", help="tiny config only, 2 rounds (about 3 minutes here)"
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="cold + warm pairs per config (default 3; --quick: 2)",
    )
    ap.add_argument("--steps", type=int, default=4, help="optimizer steps per run")
    from results.device import choose_platform

    choose_platform()  # --cpu: JAX on the CPU (children too); else JAX_PLATFORMS or JAX's default
    args = ap.parse_args()
    rounds = args.rounds or (2 if args.quick else 3)
    sizes = ("tiny",) if args.quick else ("tiny", "medium")
    cpu, load0 = describe_cpu(), loadavg()
    print(f"CPU: {cpu}; load average {load0}", flush=True)
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="gymllm-bench-cc-") as tmp:
        tok_file = peers.write_tokenizer(tmp)
        for size in sizes:
            res = measure(size, rounds, args.steps, tmp, tok_file)
            out.update({(k if size == "tiny" else f"{k}_{size}"): v for k, v in res.items()})
    out.update(cpu=cpu, loadavg={"start": load0, "end": loadavg()}, rounds=rounds, steps=args.steps)
    from results import emit_result  # the RESULT line, and its record in benchmarks/results/
    from results.device import child_device_info

    emit_result(
        "compile_cache", out, device=child_device_info()
    )  # the device the runs compiled for


if __name__ == "__main__":
    main()
