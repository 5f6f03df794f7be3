"""A 5-env suite on one shared engine with every env in flight, against today's per-env evaluation.

Both sides evaluate the same policy on the same rows: the core suite's five envs (Arithmetic,
Countdown, MathWord, CalcMath, FrozenLake), ``num_seeds`` held-out seeds x ``k`` samples each, the
same env seeds and sampling seeds, the same engine row length.

* ``per_env``: what ``gymllm eval ENV1 ... ENV5`` does today (:func:`gymllm.cli.evaluate.run_eval`): a
  fresh engine per env, the envs one after another, each through the rollout orchestrator;
* ``suite``: :func:`gymllm.suites.run_suite`: one engine serves all five envs, all in flight at once
  (barrier-free), rows written as episodes end.

Both sides run in ``--rounds`` rounds. Round 0 is cold: the suite side runs first and compiles the
engine's programs; the per-env side then reuses those of its shapes the suite side compiled (jitted
steps are cached per engine config and shape in this process), so the cold figure favours the per-env
side. Later rounds alternate the order; each side's median over them is the headline (a mixed
suite meets more shapes, so a later round may still compile some: compiling every shape up front,
``JaxEngine.warmup``, takes longer than --quick's budget on a small CPU). ``rows_match``: per env,
the two sides' mean reward and pass@1 agree (same seeds, same sampling seeds).

RESULT keys: ``suite_vs_per_env`` (per-env wall time / suite wall time, medians of the warm rounds;
goal >= 2), ``suite_s``, ``per_env_s``, ``cold_suite_vs_per_env`` (round 0), ``rounds`` (every round's
seconds per side), ``rows`` (episodes per side), ``rows_match``, ``per_env_rows`` (each env's figures
on both sides), ``cpu``, ``cores``, ``load_average`` (start, end).

    python benchmarks/suite.py --quick
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 seeds x 2 samples, short replies (about 2 minutes)")
    parser.add_argument("--model", default="tiny-qwen3", help="tiny-<family> or a model name")
    parser.add_argument("--max-len", type=int, default=1024, help="the engines' tokens per row (both sides)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of both sides: round 0 compiles, the medians of the others are the headline")
    args = parser.parse_args()

    from gymllm.cli.evaluate import load_model, run_eval
    from gymllm.suites import PolicySpec, RunnerConfig, load_suite, run_suite
    from gymllm.utils.host import describe_cpu

    sizes = (dict(num_seeds=4, k=2, max_tokens=16, max_turns=2) if args.quick
             else dict(num_seeds=16, k=4, max_tokens=64, max_turns=4))
    suite = load_suite("core", overrides={**sizes, "temperature": 0.7, "seed_base": 1_000_000})
    load_start = os.getloadavg()[0]
    print(f"cpu: {describe_cpu()} ({os.cpu_count()} cores), load average {load_start:.1f}", flush=True)

    loaded = load_model(args.model)

    def suite_side() -> tuple[float, dict[str, Any]]:
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as out:
            summary = run_suite(suite, [PolicySpec(label=args.model, loaded=loaded)], out, write_report=False,
                                config=RunnerConfig(max_len=args.max_len, progress=False))
        return time.perf_counter() - t0, summary

    def per_env_side() -> tuple[float, list[dict[str, Any]]]:
        t0 = time.perf_counter()
        rows = run_eval([e.id for e in suite.envs], model=args.model, num_seeds=sizes["num_seeds"], k=sizes["k"],
                        seed_offset=1_000_000, temperature=0.7, max_tokens=sizes["max_tokens"],
                        max_turns=sizes["max_turns"], max_len=args.max_len)
        return time.perf_counter() - t0, rows

    times: dict[str, list[float]] = {"suite": [], "per_env": []}
    for r in range(args.rounds):
        # round 0 compiles: the suite side first, so what the per-env side reuses favours it; then the order
        # alternates so neither side always runs after the other
        for side in (("suite", "per_env") if r % 2 == 0 else ("per_env", "suite")):
            if side == "suite":
                dt, summary = suite_side()
            else:
                dt, rows = per_env_side()
            times[side].append(dt)
            print(f"round {r} {side}: {dt:.1f} s" + (" (cold: compiles)" if r == 0 else ""), flush=True)
    warm = {s: sorted(v[1:])[(len(v) - 1) // 2] if len(v) > 1 else v[0] for s, v in times.items()}
    suite_s, per_env_s = warm["suite"], warm["per_env"]

    ours = {r["env"]: r for r in summary["results"]}
    per_env_rows: dict[str, Any] = {}
    match = True
    for e, row in zip(suite.envs, rows):
        mine = ours[e.name]
        same = (abs(mine["mean_reward"] - row["mean_reward"]) < 1e-6 and abs(mine["pass_at"]["1"] - row["pass@1"]) < 1e-9
                and mine["samples"] == row["episodes"])
        match &= same
        per_env_rows[e.name] = {"suite": [mine["mean_reward"], mine["pass_at"]["1"], mine["samples"], mine["errors"]],
                                "per_env": [row["mean_reward"], row["pass@1"], row["episodes"]], "match": same}
    result = {"suite_vs_per_env": round(per_env_s / suite_s, 3), "suite_s": round(suite_s, 2),
              "per_env_s": round(per_env_s, 2), "cold_suite_vs_per_env": round(times["per_env"][0] / times["suite"][0], 3),
              "rounds": {k: [round(x, 2) for x in v] for k, v in times.items()}, "rows": sum(len(e.seeds) * e.k for e in suite.envs),
              "rows_match": match, "per_env_rows": per_env_rows, "model": args.model, "quick": args.quick,
              "cpu": describe_cpu(), "cores": os.cpu_count(), "load_average": [load_start, os.getloadavg()[0]]}
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
