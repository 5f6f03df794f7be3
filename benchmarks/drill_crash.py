"""Crash drill: SIGKILL `gymllm train --preset tiny` at K moments, resume each time, check the whole run.

One uninterrupted reference run and one drilled run of the same config (eta = 0, no prefix reuse,
a checkpoint every step, trajectory logging on) are each a real ``gymllm train`` process. The drilled
run is killed with SIGKILL at moments picked in turn from four kinds, each watched from outside:

- ``rollout``: a random moment after the attempt's first new step (rollouts and learner overlap);
- ``learner``: right after a step's metrics row lands (the next step's groups are being trained);
- ``checkpoint``: as soon as Orbax's temporary checkpoint directory appears (mid-write);
- ``log``: as soon as ``trajectories.jsonl`` grows (mid-write of a step's trajectory records).

After each kill the same command resumes from the latest checkpoint; after K kills it runs to the end.
Then, over the whole run: every trained group id appears exactly once in the logs (no group lost
against the reference run, none duplicated), ``metrics.jsonl`` steps are 1..N once each, no torn
record in either log, and the final weights equal the uninterrupted run's.

    python benchmarks/drill_crash.py            # 20 kills, 40 steps
    python benchmarks/drill_crash.py --quick    # 4 kills, 8 steps (about two minutes idle)

Ends with ``RESULT {json}``: ``kills``, ``lost_groups``, ``duplicated_groups``, ``torn_records`` (goal
0, 0, 0 over >= 20 kills), ``steps_ok``, ``weights_match``, ``max_weight_diff``.
"""

from __future__ import annotations

import argparse
import collections
import os
import pathlib
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

KINDS = ("rollout", "learner", "checkpoint", "log")
#: small settings on top of --preset tiny (fast steps; deterministic with eta 0 and no prefix reuse)
SMALL = (
    "--env.num-envs",
    "8",
    "--rollout.group-size",
    "4",
    "--rollout.max-concurrency",
    "8",
    "--engine.num-slots",
    "8",
    "--learner.groups-per-step",
    "2",
    "--learner.micro-batch-size",
    "8",
)


def train_command(run_dir: pathlib.Path, steps: int, extra: Sequence[str] = ()) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gymllm.cli.main",
        "train",
        "--preset",
        "tiny",
        "--run-dir",
        str(run_dir),
        "--learner.num-steps",
        str(steps),
        "--rollout.max-staleness",
        "0",
        "--engine.no-prefix-reuse",
        "--run.checkpoint-every",
        "1",
        "--run.no-console",
        "--run.no-report",
        *extra,
    ]


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONUNBUFFERED="1")  # JAX_PLATFORMS: --cpu or the user's


def _size(p: pathlib.Path) -> int:
    try:
        return p.stat().st_size
    except FileNotFoundError:
        return 0


def _metric_steps(run_dir: pathlib.Path) -> int:
    return _size(run_dir / "metrics.jsonl")


def _ckpt_tmp(run_dir: pathlib.Path) -> bool:
    ck = run_dir / "checkpoints"
    try:
        return any("tmp" in p.name for p in ck.iterdir())
    except FileNotFoundError:
        return False


def kill_once(
    cmd: list[str], run_dir: pathlib.Path, kind: str, rng: random.Random, timeout_s: float
) -> str:
    """Start ``cmd``, SIGKILL it at a ``kind`` moment; returns what happened ('killed:<kind>' or 'finished')."""
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        start_m = _metric_steps(run_dir)
        traj0 = _size(run_dir / "trajectories.jsonl")
        deadline = time.monotonic() + timeout_s
        armed_at = None
        delay = rng.uniform(0.0, 1.5)
        while time.monotonic() < deadline and proc.poll() is None:
            grown = _metric_steps(run_dir) > start_m
            if kind == "checkpoint" and grown and _ckpt_tmp(run_dir):
                break
            if kind == "log" and _size(run_dir / "trajectories.jsonl") > traj0 and grown:
                break
            if kind == "learner" and grown:
                break
            if kind == "rollout" and grown:
                armed_at = armed_at or time.monotonic()
                if time.monotonic() - armed_at >= delay:
                    break
            time.sleep(0.002)
        if proc.poll() is not None:
            if proc.returncode != 0:
                raise RuntimeError(
                    f"train exited {proc.returncode}: {proc.stderr.read().decode()[-2000:]}"
                )
            return "finished"
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        return f"killed:{kind}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def finish(cmd: list[str], timeout_s: float) -> None:
    out = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=timeout_s)
    if out.returncode != 0:
        raise RuntimeError(f"train exited {out.returncode}: {out.stderr[-3000:]}")


def trained_arrays(run_dir: pathlib.Path) -> dict:
    from gymllm.models.trained import restore_trained

    return restore_trained(run_dir)[0]


def audit(run_dir: pathlib.Path, steps: int, group_size: int) -> dict:
    """What the run directory's logs say: steps, torn lines, groups (id -> trajectory records)."""
    from gymllm.telemetry.run_log import read_jsonl

    metrics, m_torn = read_jsonl(run_dir / "metrics.jsonl")
    trajs, t_torn = read_jsonl(run_dir / "trajectories.jsonl")
    by_group: dict[str, list[dict]] = collections.defaultdict(list)
    for t in trajs:
        by_group[t["group_id"]].append(t)
    dup = sorted(
        g
        for g, ts in by_group.items()
        if len(ts) != len({t["trajectory_id"] for t in ts}) or len({t["step"] for t in ts}) > 1
    )
    return {
        "steps": [m["step"] for m in metrics],
        "torn": len(m_torn) + len(t_torn),
        "groups": by_group,
        "duplicated": dup,
        "steps_ok": [m["step"] for m in metrics] == list(range(1, steps + 1)),
        "short_groups": sorted(
            g for g, ts in by_group.items() if len({t["trajectory_id"] for t in ts}) != group_size
        ),
    }


def run_drill(
    work: pathlib.Path,
    *,
    kills: int,
    steps: int,
    seed: int = 0,
    extra: Sequence[str] = SMALL,
    group_size: int = 4,
    timeout_s: float = 600.0,
    log=print,
) -> dict:
    """The drill; returns the RESULT dict (see the module docstring)."""
    import numpy as np

    rng = random.Random(seed)
    ref_dir, drill_dir = work / "reference", work / "drilled"
    t0 = time.perf_counter()
    finish(train_command(ref_dir, steps, extra), timeout_s)
    log(f"reference run: {steps} steps in {time.perf_counter() - t0:.1f}s")
    cmd = train_command(drill_dir, steps, extra)
    done, outcomes = 0, collections.Counter()
    t1 = time.perf_counter()
    while done < kills:
        what = kill_once(cmd, drill_dir, KINDS[done % len(KINDS)], rng, timeout_s)
        outcomes[what] += 1
        if what == "finished":
            break
        done += 1
    finish(cmd, timeout_s)
    log(f"drilled run: {done} kills {dict(outcomes)} in {time.perf_counter() - t1:.1f}s")
    ref, got = audit(ref_dir, steps, group_size), audit(drill_dir, steps, group_size)
    lost = sorted(set(ref["groups"]) - set(got["groups"]))
    extra_groups = sorted(set(got["groups"]) - set(ref["groups"]))
    a, b = trained_arrays(ref_dir), trained_arrays(drill_dir)
    diff = max(
        float(np.max(np.abs(np.asarray(a[k], np.float64) - np.asarray(b[k], np.float64))))
        for k in a
    )
    result = {
        "kills": done,
        "kill_kinds": {k.split(":")[-1]: v for k, v in outcomes.items()},
        "lost_groups": len(lost),
        "duplicated_groups": len(got["duplicated"]) + len(extra_groups),
        "torn_records": got["torn"],
        "steps_ok": got["steps_ok"],
        "short_groups": len(got["short_groups"]),
        "weights_match": diff <= 2e-4,
        "max_weight_diff": diff,
        "steps": steps,
    }
    if lost or extra_groups or got["duplicated"] or not got["steps_ok"]:
        log(
            f"lost {lost[:5]} extra {extra_groups[:5]} duplicated {got['duplicated'][:5]} steps {got['steps']}"
        )
    return result


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="4 kills, 8 steps")
    ap.add_argument("--kills", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work-dir", default=None, help="keep the two run directories here")
    from results.device import choose_platform_args

    argv = choose_platform_args(
        argv
    )  # --cpu: JAX on the CPU (children too); else JAX_PLATFORMS or JAX's default
    args = ap.parse_args(argv)
    kills = args.kills if args.kills is not None else (4 if args.quick else 20)
    steps = args.steps if args.steps is not None else (8 if args.quick else 40)
    print(f"cpu: {_cpu_model()}")
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(args.work_dir or tmp)
        result = run_drill(work, kills=kills, steps=steps, seed=args.seed)
    from results import emit_result  # the RESULT line, and its record in benchmarks/results/

    emit_result("drill_crash", result)
    ok = (
        result["lost_groups"] == result["duplicated_groups"] == result["torn_records"] == 0
        and result["steps_ok"]
    )
    return 0 if ok and result["weights_match"] else 1


def _cpu_model() -> str:
    from gymllm.utils.host import describe_cpu

    return describe_cpu()


if __name__ == "__main__":
    sys.exit(main())
