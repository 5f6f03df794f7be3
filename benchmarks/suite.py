"""A 5-env suite on one shared engine with every env in flight, against today's per-env evaluation.

Both sides evaluate the same policy on the same rows: the core suite's five envs (Arithmetic,
Countdown, MathWord, CalcMath, FrozenLake), ``num_seeds`` held-out seeds x ``k`` samples each, the
same env seeds and sampling seeds, the same engine row length.

* ``per_env``: what ``gymllm eval env ENV1 ... ENV5`` does today (:func:`gymllm.cli.evaluate.run_eval`): a
  fresh engine per env, the envs one after another, each through the rollout orchestrator;
* ``suite``: :func:`gymllm.suites.run_suite`: one engine serves all five envs, all in flight at once
  (barrier-free), rows written as episodes end.

Both sides run in rounds. Round 0 is cold: the suite side runs first and compiles the engine's
programs; the per-env side then reuses those of its shapes the suite side compiled (jitted steps are
cached per engine config and shape in this process), so the cold figure favours the per-env side.
Later rounds alternate the order. Which shapes a round meets depends on how requests happen to batch,
so a warm round may still compile (counted with ``jax.monitoring``); rounds continue until each side
has ``--clean-rounds`` warm rounds without a compilation (at most ``--max-rounds``), and the medians of
those are the headline (if a side never gets one: warm wall time minus its compile seconds,
``net_of_compile``). Compiling every shape up front (``JaxEngine.warmup``) takes longer than --quick's
budget on a small CPU. ``rows_match``: per env, the two sides' mean reward and pass@1 agree (same
seeds, same sampling seeds).

RESULT keys: ``suite_vs_per_env`` (per-env wall time / suite wall time, warm medians; goal >= 2; null
when any of the suite side's rows failed: a side that did less work has no comparable time),
``failed_rows`` and ``first_error`` (the suite side's failed rows over every round, and one message),
``suite_s``, ``per_env_s``, ``cold_suite_vs_per_env`` (round 0), ``net_of_compile``, ``rounds`` (per
side: each round's wall seconds, compilations and compile seconds), ``rows`` (episodes per side),
``rows_match``, ``per_env_rows`` (each env's figures on both sides), ``cpu``, ``cores``,
``load_average`` (start, end).

``--num-slots`` sets each engine's rows decoded together on both sides (16, ``gymllm eval``'s default);
``inflight`` gives each engine as many as it has episodes in flight (a per-env engine: one env's, up to
``EvalConfig.max_concurrency``; the suite's engine: every env's). On a CPU a decode call costs about in
proportion to its rows, so 16 is the like-for-like figure there; on a GPU a decode call costs about the
same for 16 or 160 rows, and ``inflight`` is what each side would be run with. ``--model shape:NAME``
(random weights in a real architecture, :func:`accelerator_check.shaped_model`) and ``--full-sizes``
(the full rows under --quick's round limits) are for an accelerator run.

    python benchmarks/suite.py --quick
    python benchmarks/suite.py --quick --full-sizes --model shape:smollm2-135m --num-slots inflight   # a GPU
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import tempfile
import time
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="4 seeds x 2 samples, short replies (about 2 minutes)"
    )
    parser.add_argument(
        "--model",
        default="tiny-qwen3",
        help="tiny-<family>, a model name, or shape:NAME (random weights in a real architecture)",
    )
    parser.add_argument(
        "--num-slots",
        default="16",
        help="rows each engine decodes together, both sides (16: gymllm eval's default); "
        "`inflight`: each engine as many as it has episodes in flight (per-env: one env's, "
        "suite: every env's), where batching is cheap (a GPU)",
    )
    parser.add_argument(
        "--engine",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="an EngineConfig field for both sides' engines, e.g. decode_chunk=8 (repeatable)",
    )
    parser.add_argument(
        "--full-sizes",
        action="store_true",
        help="with --quick's round limits, the full run's rows (16 seeds x 4 samples, 64 tokens)",
    )
    parser.add_argument(
        "--max-len", type=int, default=1024, help="the engines' tokens per row (both sides)"
    )
    parser.add_argument("--max-rounds", type=int, default=8, help="rounds of both sides at most")
    parser.add_argument(
        "--clean-rounds",
        type=int,
        default=2,
        help="stop once each side has this many warm rounds without a compilation",
    )
    from results.device import choose_platform

    choose_platform()  # --cpu: JAX on the CPU (children too); else JAX_PLATFORMS or JAX's default
    args = parser.parse_args()

    from gymllm.cli.evaluate import eval_env, load_model
    from gymllm.inference.params import SamplingParams
    from gymllm.rollout.evaluation import EvalConfig
    from gymllm.suites import PolicySpec, RunnerConfig, load_suite, run_suite
    from gymllm.utils.host import describe_cpu

    sizes = (
        dict(num_seeds=4, k=2, max_tokens=16, max_turns=2)
        if args.quick and not args.full_sizes
        else dict(num_seeds=16, k=4, max_tokens=64, max_turns=4)
    )
    suite = load_suite("core", overrides={**sizes, "temperature": 0.7, "seed_base": 1_000_000})
    load_start = os.getloadavg()[0]
    print(
        f"cpu: {describe_cpu()} ({os.cpu_count()} cores), load average {load_start:.1f}", flush=True
    )

    inflight = args.num_slots == "inflight"
    if not inflight and not args.num_slots.isdigit():
        parser.error(
            f"--num-slots: expected a positive int or `inflight`, received {args.num_slots!r}"
        )
    per_env_cap = (
        EvalConfig().max_concurrency
    )  # the per-env path's episodes in flight; the suite's per env
    rows_of = {e.name: len(e.seeds) * e.k for e in suite.envs}
    per_env_slots = {
        e.name: (min(per_env_cap, rows_of[e.name]) if inflight else int(args.num_slots))
        for e in suite.envs
    }
    suite_slots = (
        sum(min(per_env_cap, n) for n in rows_of.values()) if inflight else int(args.num_slots)
    )

    from gymllm.inference import EngineConfig, JaxEngine

    import engine_settings

    engine_fields: dict[str, Any] = dict(engine_settings.parse(item) for item in args.engine)
    if args.model.startswith("shape:"):
        from accelerator_check import (
            shaped_model,
        )  # the same architectures the accelerator check uses

        loaded = shaped_model(args.model)
    else:
        loaded = load_model(args.model)

    def suite_side() -> tuple[float, dict[str, Any]]:
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as out:
            engine = EngineConfig(num_slots=suite_slots, max_len=args.max_len, **engine_fields)
            policy = PolicySpec(
                label=args.model,
                loaded=loaded,
                make_engine=lambda: JaxEngine.from_loaded(loaded, config=engine),
            )
            summary = run_suite(
                suite,
                [policy],
                out,
                write_report=False,
                config=RunnerConfig(
                    max_len=args.max_len,
                    num_slots=suite_slots,
                    max_concurrency_per_env=per_env_cap,
                    progress=False,
                ),
            )
            errors = [
                row["error"]
                for line in (pathlib.Path(out) / "results.jsonl").read_text().splitlines()
                if line.strip() and (row := json.loads(line))["error"]
            ]
        summary["errors"] = len(errors)
        summary["first_error"] = errors[0][:500] if errors else None
        return time.perf_counter() - t0, summary

    def per_env_side() -> tuple[float, list[dict[str, Any]]]:
        # what `gymllm eval env ENV1 ... ENV5` runs (run_eval): a fresh engine per env, one env after another
        t0 = time.perf_counter()
        config = EvalConfig(
            seeds=sizes["num_seeds"],
            k=sizes["k"],
            seed_base=1_000_000,
            max_turns=sizes["max_turns"],
            success_threshold=1.0,
            sampling=SamplingParams(temperature=0.7, max_tokens=sizes["max_tokens"]),
        )
        rows = [
            asyncio.run(
                eval_env(
                    e.id,
                    loaded,
                    config=config,
                    max_len=args.max_len,
                    num_slots=per_env_slots[e.name],
                    engine=engine_fields,
                )
            )
            for e in suite.envs
        ]
        return time.perf_counter() - t0, rows

    import jax

    compiled = {"n": 0, "s": 0.0}

    def on_event(event: str, duration: float, **_: Any) -> None:
        if event.startswith("/jax/core/compile/"):
            compiled["s"] += duration
            compiled["n"] += event.endswith("backend_compile_duration")

    jax.monitoring.register_event_duration_secs_listener(on_event)
    runs: dict[str, list[dict[str, float]]] = {"suite": [], "per_env": []}

    def clean(side: str) -> list[float]:
        return [r["wall_s"] for r in runs[side][1:] if r["compiles"] == 0]

    first_error = None
    for r in range(args.max_rounds):
        # round 0 compiles: the suite side first, so what the per-env side reuses favours it; then the order
        # alternates so neither side always runs after the other
        for side in ("suite", "per_env") if r % 2 == 0 else ("per_env", "suite"):
            n0, s0 = compiled["n"], compiled["s"]
            if side == "suite":
                dt, summary = suite_side()
            else:
                dt, rows = per_env_side()
            runs[side].append(
                {
                    "wall_s": round(dt, 3),
                    "compiles": compiled["n"] - n0,
                    "compile_s": round(compiled["s"] - s0, 3),
                    **({"errors": summary["errors"]} if side == "suite" else {}),
                }
            )
            if side == "suite" and summary["errors"]:
                first_error = first_error or summary["first_error"]
                print(
                    f"round {r} suite: {summary['errors']} of its rows failed, e.g. {summary['first_error']}",
                    flush=True,
                )
            print(
                f"round {r} {side}: {dt:.2f} s, {compiled['n'] - n0} compilations ({compiled['s'] - s0:.2f} s)",
                flush=True,
            )
        if r >= 1 and min(len(clean("suite")), len(clean("per_env"))) >= args.clean_rounds:
            break

    def median(xs: list[float]) -> float:
        return sorted(xs)[(len(xs) - 1) // 2]

    net_of_compile = min(len(clean("suite")), len(clean("per_env"))) == 0
    if (
        net_of_compile
    ):  # every warm round still compiled something: its compile seconds are taken out
        suite_s, per_env_s = (
            median([r["wall_s"] - r["compile_s"] for r in runs[s][1:]] or [runs[s][0]["wall_s"]])
            for s in ("suite", "per_env")
        )
    else:
        suite_s, per_env_s = median(clean("suite")), median(clean("per_env"))

    ours = {r["env"]: r for r in summary["results"]}
    per_env_rows: dict[str, Any] = {}
    match = True
    for e, row in zip(suite.envs, rows):
        mine = ours[e.name]
        same = (
            abs(mine["mean_reward"] - row["mean_reward"]) < 1e-6
            and abs(mine["pass_at"]["1"] - row["pass@1"]) < 1e-9
            and mine["samples"] == row["episodes"]
        )
        match &= same
        per_env_rows[e.name] = {
            "suite": [mine["mean_reward"], mine["pass_at"]["1"], mine["samples"], mine["errors"]],
            "per_env": [row["mean_reward"], row["pass@1"], row["episodes"]],
            "match": same,
        }
    failed_rows = sum(r.get("errors", 0) for r in runs["suite"])
    result = {
        # a side whose rows failed did less work: its time is no figure
        "suite_vs_per_env": None if failed_rows else round(per_env_s / suite_s, 3),
        "failed_rows": failed_rows,
        "first_error": first_error,
        "suite_s": round(suite_s, 2),
        "per_env_s": round(per_env_s, 2),
        "cold_suite_vs_per_env": round(
            runs["per_env"][0]["wall_s"] / runs["suite"][0]["wall_s"], 3
        ),
        "net_of_compile": net_of_compile,
        "rounds": runs,
        "rows": sum(len(e.seeds) * e.k for e in suite.envs),
        "rows_match": match,
        "per_env_rows": per_env_rows,
        "model": args.model,
        "num_slots": {"suite": suite_slots, "per_env": per_env_slots},
        "engine": engine_fields,
        "quick": args.quick,
        "device": jax.devices()[0].device_kind,
        "cpu": describe_cpu(),
        "cores": os.cpu_count(),
        "load_average": [load_start, os.getloadavg()[0]],
    }
    from results import emit_result  # the RESULT line, and its record in benchmarks/results/

    emit_result("suite", result, tpu_keys={"suite_vs_per_env": "suite_shared_vs_per_env_tpu"})


if __name__ == "__main__":
    main()
