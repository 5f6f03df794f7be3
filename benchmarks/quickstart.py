"""The README's Quickstart run, timed as a user runs it: ``gymllm train`` (the default preset:
SmolLM2-135M-Instruct on ArithmeticTool-v0, 12 steps), in a subprocess, in a fresh run directory.

Reported (issue 35: "the same 12 steps in at most a third of today's training time (345 s -> 115 s or
less) with the same learning curve (reward over all rollouts from about 0.3 to above 0.6)"):

* ``quickstart_train_s``: the run's own training time (the first step's start to the last step's end,
  ``TrainResult.wall_s``: what ``trained 12 steps in ...`` prints; goal <= 115 s); ``quickstart_wall_s``:
  the whole command (model load, compiles, checkpoints and the report included);
* ``reward_first3`` / ``reward_last3``: the mean reward over every rollout of steps 1-3 and 10-12
  (``rollout_reward_mean`` in ``metrics.jsonl``), and ``reward_per_step``;
* ``step_s``: each step's wall; ``engine_busy`` / ``trainer_idle``: the run's pipeline shares (step-wall
  weighted means of ``pipeline/engine_busy_fraction`` / ``pipeline/trainer_idle_fraction``);
  ``biggest_stall``: the last line of the run's ``summary.txt``.

There is no second side: the figure the issue compares against (345 s, measured on the machine the
issue was filed from) is history, not a run of this script, so no ratio is formed. ``--quick`` runs the
same command (it takes about 3.5 minutes on an idle 2-core CPU; a shorter run would not be the figure).
Extra arguments after ``--`` go to ``gymllm train``.

    python benchmarks/quickstart.py --quick
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

TRAINED = re.compile(r"trained (\d+) steps in ([0-9.]+)s")


def summarize(run_dir: pathlib.Path, stdout: str) -> dict:
    """The figures of a finished ``gymllm train`` run directory and its printed summary."""
    rows = [
        json.loads(line)
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if line.strip()
    ]
    rows = [r for r in rows if "step" in r and "rollout_reward_mean" in r]
    m = TRAINED.search(stdout)
    if m is None:
        raise RuntimeError(
            f"expected 'trained N steps in Xs' in gymllm train's output, received: {stdout[-500:]!r}"
        )
    walls = np.array([r["step_wall_s"] for r in rows])
    rewards = [float(r["rollout_reward_mean"]) for r in rows]
    summary = (run_dir / "summary.txt").read_text().strip().splitlines()
    return {
        "quickstart_train_s": float(m.group(2)),
        "steps": int(m.group(1)),
        "reward_first3": float(np.mean(rewards[:3])),
        "reward_last3": float(np.mean(rewards[-3:])),
        "reward_per_step": rewards,
        "step_s": walls.tolist(),
        "engine_busy": float(
            np.average([r["pipeline/engine_busy_fraction"] for r in rows], weights=walls)
        ),
        "trainer_idle": float(
            np.average([r["pipeline/trainer_idle_fraction"] for r in rows], weights=walls)
        ),
        "biggest_stall": next((s for s in reversed(summary) if s.startswith("biggest stall")), ""),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--quick",
        action="store_true",
        help="the same run (about 3.5 minutes on an idle 2-core CPU)",
    )
    ap.add_argument("extra", nargs="*", help="arguments for gymllm train (after --)")
    from results.device import choose_platform

    choose_platform()  # --cpu: JAX on the CPU (children too); else JAX_PLATFORMS or JAX's default
    args = ap.parse_args()
    from gymllm.utils.host import describe_cpu, loadavg

    cpu, load0 = describe_cpu(), loadavg()
    print(f"CPU: {cpu}; load average {load0}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = pathlib.Path(tmp) / "default"
        cmd = [
            sys.executable,
            "-m",
            "gymllm.cli.entry",  # the `gymllm` command
            "train",
            "--run-dir",
            str(run_dir),
            *args.extra,
        ]
        t = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
        wall = time.perf_counter() - t
        if proc.returncode:
            raise SystemExit(f"gymllm train failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
        out = summarize(run_dir, proc.stdout + proc.stderr)
    out.update(quickstart_wall_s=wall, cpu=cpu, loadavg={"start": load0, "end": loadavg()})
    print(
        f"Quickstart: {out['steps']} steps trained in {out['quickstart_train_s']:.1f}s ({wall:.1f}s the whole "
        f"command); reward over every rollout {out['reward_first3']:.2f} -> {out['reward_last3']:.2f} (steps 1-3 "
        f"-> last 3); engine busy {out['engine_busy']:.0%}, trainer idle {out['trainer_idle']:.0%}; "
        f"{out['biggest_stall']}",
        flush=True,
    )
    from results import emit_result
    from results.device import child_device_info

    emit_result("quickstart", out, device=child_device_info())  # the device `gymllm train` ran on


if __name__ == "__main__":
    main()
