"""What a run compiles, and what a second identical run compiles: the README Quickstart (``gymllm train``, the
"default" preset) twice in one fresh persistent-cache directory, cold then warm, each a fresh process.

Both runs are ``gymllm train`` subprocesses on whatever device JAX finds (nothing pins the platform; set
``JAX_PLATFORMS`` yourself to choose), each in a fresh run directory, with ``GYMLLM_COMPILE_CACHE`` naming
one new directory (empty for the cold run, as the cold run left it for the warm one). The figures are
read from the files each run writes: ``compiles.jsonl`` (every XLA compile and cache load, written by the
run's :class:`gymllm.telemetry.compiles.CompileLog`), ``metrics.jsonl`` (``step_wall_s``, ``compile_s``)
and its printed ``trained N steps in X s`` (the training time ``benchmarks/quickstart.py`` reports).

RESULT keys: ``programs`` (model-program compiles of the cold run: jits of gymllm's functions, not loaded
from the cache; eager single ops apart), ``programs_all`` (every compile, eager ops included),
``programs_distinct``, ``compile_s`` (seconds compiling, cold), ``quickstart_train_s`` (cold training time),
``first_step_s`` (the cold run's first step wall), ``quickstart_train_s_warm``, ``first_step_s_warm``,
``programs_warm`` (model programs the warm run compiled: the goal is 0), ``programs_warm_all``,
``programs_warm_new`` (of those, programs whose cache key the cold run never had: shapes the warm run
needed and the cold one did not, e.g. the engine's request timing), ``programs_loaded_warm``,
``compile_s_warm``, ``wall_s`` / ``wall_s_warm`` (whole commands), ``malloc_hugepages`` (whether the
``gymllm`` command's malloc ran on transparent huge pages; ``GYMLLM_HUGEPAGES=0``: not), ``steps``, ``preset``,
``device_kind`` / ``platform`` (``jax.devices()[0]``), ``cpu``, ``loadavg``. On a TPU the training
times are also given as ``quickstart_train_s_tpu`` / ``quickstart_train_s_tpu_warm``.

    python benchmarks/compile.py --quick              # the Quickstart with 4 steps instead of 12
    python benchmarks/compile.py --preset tiny        # a fast check of the script (tiny model)
    python benchmarks/compile.py -- --run.warmup true # extra arguments go to gymllm train
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

from gymllm.utils import host_memory

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))


TRAINED = re.compile(r"trained (\d+) steps in ([0-9.]+)s")
QUICK_STEPS = 4


def device() -> dict:
    """``jax.devices()[0]``'s kind and platform, in a subprocess under the environment the runs get."""
    code = "import jax; d = jax.devices()[0]; print('DEVICE', d.platform, '|', d.device_kind)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("DEVICE ")), None)
    if line is None:
        raise SystemExit(f"could not ask JAX for its device: {out.stderr[-2000:]}")
    platform, kind = line[len("DEVICE ") :].split(" | ", 1)
    return {"platform": platform.strip(), "device_kind": kind.strip()}


def run_train(run_dir: pathlib.Path, cache: pathlib.Path, args: list[str]) -> dict:
    """One ``gymllm train`` in a subprocess; its figures from the files it wrote."""
    from gymllm.telemetry.compiles import read_compiles, summarize

    env = dict(os.environ, GYMLLM_COMPILE_CACHE=str(cache), TOKENIZERS_PARALLELISM="false")
    env.pop(
        "JAX_COMPILATION_CACHE_DIR", None
    )  # else the process's own directory would win over ours
    cmd = [
        sys.executable,
        "-m",
        "gymllm.cli.entry",  # the `gymllm` command
        "train",
        "--run-dir",
        str(run_dir),
        "--run.no-console",
        *args,
    ]
    t = time.perf_counter()
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=env, cwd=run_dir.parent, timeout=3600
    )
    wall = time.perf_counter() - t
    if proc.returncode:
        raise SystemExit(f"gymllm train failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    m = TRAINED.search(proc.stdout + proc.stderr)
    if m is None:
        raise SystemExit(
            f"expected 'trained N steps in Xs' in gymllm train's output, received {proc.stdout[-500:]!r}"
        )
    rows = [
        json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines() if ln.strip()
    ]
    rows = [r for r in rows if "step_wall_s" in r]
    recs = read_compiles(run_dir / "compiles.jsonl")
    if not recs:
        raise SystemExit(
            f"{run_dir / 'compiles.jsonl'}: expected the run's compile records, found none"
        )
    stall = (
        next(
            (
                s
                for s in reversed((run_dir / "summary.txt").read_text().splitlines())
                if s.startswith("biggest stall")
            ),
            "",
        )
        if (run_dir / "summary.txt").exists()
        else ""
    )
    return {
        "steps": int(m.group(1)),
        "train_s": float(m.group(2)),
        "wall_s": wall,
        "records": recs,
        "figures": summarize(recs),
        "first_step_s": float(rows[0]["step_wall_s"]) if rows else None,
        "first_step_compile_s": float(rows[0].get("compile_s", 0.0)) if rows else None,
        "biggest_stall": stall,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--quick",
        action="store_true",
        help=f"the Quickstart with {QUICK_STEPS} steps instead of 12",
    )
    ap.add_argument(
        "--preset", default="default", choices=("default", "tiny"), help="gymllm train's preset"
    )
    ap.add_argument(
        "--keep-runs",
        type=pathlib.Path,
        default=None,
        help="keep the two run directories (cold/, warm/) and the cache under this directory "
        "instead of a temporary one (e.g. to read their traces afterwards)",
    )
    ap.add_argument("extra", nargs="*", help="arguments for gymllm train (after --)")
    a = ap.parse_args()
    from gymllm.utils.host import describe_cpu, loadavg

    cpu, load0, dev = describe_cpu(), loadavg(), device()
    print(
        f"CPU: {cpu}; device: {dev['device_kind']} ({dev['platform']}); load average {load0}",
        flush=True,
    )
    args = [
        "--preset",
        a.preset,
        *(["--learner.num-steps", str(QUICK_STEPS)] if a.quick else []),
        *a.extra,
    ]
    keep = a.keep_runs
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        if any(keep.iterdir()):
            raise SystemExit(
                f"--keep-runs {keep}: expected an empty or new directory (the cold run needs an "
                "empty compile cache); pick another directory or empty it"
            )
    with (
        contextlib.nullcontext(str(keep))
        if keep is not None
        else tempfile.TemporaryDirectory(prefix="gymllm-bench-compile-")
    ) as tmp:
        cache = pathlib.Path(tmp) / "xla"
        cold = run_train(pathlib.Path(tmp) / "cold", cache, args)
        print(
            f"cold: trained {cold['steps']} steps in {cold['train_s']:.1f} s; {cold['figures']['programs']} "
            f"programs compiled ({cold['figures']['programs_all']} compiles in all) in "
            f"{cold['figures']['compile_s']:.1f} s; first step {cold['first_step_s']:.1f} s",
            flush=True,
        )
        warm = run_train(pathlib.Path(tmp) / "warm", cache, args)
    cf, wf = cold["figures"], warm["figures"]
    cold_keys = {r.get("key") for r in cold["records"]} - {None}
    warm_prog = [
        r for r in warm["records"] if r.get("kind") == "program" and not r.get("cache_hit")
    ]
    out = {
        "preset": a.preset,
        "steps": cold["steps"],
        "quick": a.quick,
        "programs": cf["programs"],
        "programs_all": cf["programs_all"],
        "programs_distinct": cf["programs_distinct"],
        "compile_s": cf["compile_s"],
        "compile_s_programs": cf["compile_s_programs"],
        "quickstart_train_s": cold["train_s"],
        "first_step_s": cold["first_step_s"],
        "first_step_compile_s": cold["first_step_compile_s"],
        "wall_s": cold["wall_s"],
        "programs_warm": wf["programs"],
        "programs_warm_all": wf["programs_all"],
        "programs_warm_new": sum(r.get("key") not in cold_keys for r in warm_prog),
        "programs_warm_names": sorted(r["name"] for r in warm_prog),
        "programs_loaded_warm": wf["programs_loaded"],
        "compile_s_warm": wf["compile_s"],
        "quickstart_train_s_warm": warm["train_s"],
        "first_step_s_warm": warm["first_step_s"],
        "wall_s_warm": warm["wall_s"],
        # whether the `gymllm` command's malloc took transparent huge pages (GYMLLM_HUGEPAGES=0: not)
        "malloc_hugepages": host_memory.malloc_on_hugepages(),
        "biggest_stall": cold["biggest_stall"],
        "biggest_stall_warm": warm["biggest_stall"],
        "slowest": cf["slowest"],
        **dev,
    }
    out.update(cpu=cpu, loadavg={"start": load0, "end": loadavg()})
    print(
        f"warm: trained {warm['steps']} steps in {warm['train_s']:.1f} s; {wf['programs']} programs compiled "
        f"({out['programs_warm_new']} of them new shapes), {wf['programs_loaded']} loaded from the cache; "
        f"compile {wf['compile_s']:.1f} s; first step {warm['first_step_s']:.1f} s",
        flush=True,
    )
    from results import emit_result  # the RESULT line, and its record in benchmarks/results/

    emit_result(
        "compile",
        out,
        tpu_keys={
            "quickstart_train_s": "quickstart_train_s_tpu",
            "quickstart_train_s_warm": "quickstart_train_s_tpu_warm",
        },
    )


if __name__ == "__main__":
    main()
