"""Remote envs over OpenEnv on loopback (`gymllm serve-env` processes, `from_openenv` clients), side by side.

* **Per-step overhead**: ``gymllm/Echo-v0`` stepped in this process, and the same env served by a
  ``gymllm serve-env`` process and stepped through :func:`gymllm.envs.from_openenv` (sync ``step``:
  JSON over OpenEnv's WebSocket and back). Rounds interleave the two; ``remote_step_overhead_ms`` is
  the p50 of remote steps minus the p50 of local steps (resets are not timed).
* **Scaling over server processes**: a CPU-bound env (a fixed amount of pure-Python work per step,
  so one server process is held by its GIL) served by 1, 2 and 4 ``gymllm serve-env`` processes;
  ``make_vec`` over ``NUM_ENVS`` remote envs spread round-robin over the processes, consumed
  barrier-free (``recv(min_ready=1)`` and re-send), the three settings interleaved in rounds.
  ``remote_scaling_4``: the median over rounds of env-steps/s with 4 processes / with 1 (on 2 cores
  the ceiling is about 2).

On a shared machine the scaling figure says little: gymllm's client and its servers then compete
for one scheduler share (Linux autogroups), so more server processes mostly take time from the
client; ``load_average`` is reported with it. Measured at load 17-39 on 2 cores, 4 processes were
0.39-0.86x one process; read it on an idle machine.

RESULT keys: ``remote_step_overhead_ms`` (goal <= 2), ``remote_scaling_4`` (goal >= 1.6 on 2 cores),
with ``local_step_ms_p50``, ``remote_step_ms_p50``, ``steps_per_s`` by process count and ``cpu``.

    python benchmarks/remote_env.py --quick
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import gymllm
from gymllm.core import TextEnv
from gymllm.envs.openenv_adapter import from_openenv

HERE = Path(__file__).resolve().parent
NUM_ENVS = 16


class CpuEnv(TextEnv):
    """Each step does ``work`` iterations of pure-Python arithmetic (about 1 ms per 20k here) and echoes."""

    def __init__(self, work: int = 60_000):
        super().__init__()
        self.work = work

    def _reset(self, *, seed, options):
        return "go", {}

    def _step(self, action):
        acc = 0
        for i in range(self.work):
            acc = (acc * 31 + i) % 1_000_003
        return f"{action}:{acc}", 0.0, False, {}


def make_cpu_env() -> CpuEnv:
    return CpuEnv()


def cpu_model() -> str:
    from gymllm.utils.host import describe_cpu

    return describe_cpu()


def start_server(env: str, *extra: str) -> tuple[subprocess.Popen, str]:
    """A `gymllm serve-env ENV --port 0` process (this directory importable) and its URL."""
    environ = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gymllm.cli.main", "serve-env", env, "--port", "0", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=environ,
    )
    out = []
    for line in proc.stdout:
        out.append(line)
        if line.startswith("serving "):
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            return proc, line.split(" on ")[1].split()[0]
    raise RuntimeError("serve-env did not start:\n" + "".join(out))


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()


def time_steps(env, n: int) -> list[float]:
    """Seconds per ``env.step`` over ``n`` steps (episodes reset untimed)."""
    out = []
    env.reset(seed=0)
    for t in range(n):
        a = f"word {t}"
        t0 = time.perf_counter()
        _obs, _r, term, trunc, _info = env.step(a)
        out.append(time.perf_counter() - t0)
        if term or trunc:
            env.reset(seed=t)
    return out


def overhead(rounds: int, steps: int) -> dict:
    proc, url = start_server("gymllm/Echo-v0")
    try:
        local = gymllm.make("gymllm/Echo-v0", episode_length=10_000)
        remote = from_openenv(url)
        time_steps(remote, 50)  # warm-up (connections, first-call costs)
        time_steps(local, 50)
        loc, rem = [], []
        for _ in range(rounds):
            loc += time_steps(local, steps)
            rem += time_steps(remote, steps)
        remote.close()
        local.close()
    finally:
        stop([proc])
    lp50, rp50 = statistics.median(loc) * 1e3, statistics.median(rem) * 1e3
    return {
        "local_step_ms_p50": round(lp50, 4),
        "remote_step_ms_p50": round(rp50, 4),
        "remote_step_ms_p90": round(sorted(rem)[int(0.9 * len(rem))] * 1e3, 4),
        "remote_step_overhead_ms": round(rp50 - lp50, 4),
    }


def window(vec, seconds: float) -> float:
    """Env-steps/s of ``vec`` over ``seconds``, barrier-free: every received env is re-sent at once."""
    vec.send(["a"] * NUM_ENVS)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        *_, ids = vec.recv(min_ready=1)
        n += len(ids)
        vec.send(["a"] * len(ids), env_ids=ids)
    rate = n / (time.perf_counter() - t0)
    vec.recv(min_ready=NUM_ENVS)  # drain: every env is idle again
    return rate


def scaling(rounds: int, seconds: float) -> dict:
    """make_vec over NUM_ENVS remote envs spread round-robin over 1, 2 and 4 server processes, timed in
    interleaved rounds (the machine is shared: each round's ratio is taken, then the median)."""
    procs: list[subprocess.Popen] = []
    vecs = {}
    try:
        urls = []
        for _ in range(4):
            p, u = start_server("remote_env:make_cpu_env", "--max-sessions", "64")
            procs.append(p)
            urls.append(u)
        for k in (1, 2, 4):
            vecs[k] = gymllm.make_vec(
                [lambda u=urls[i % k]: from_openenv(u) for i in range(NUM_ENVS)]
            )
            vecs[k].reset(seed=0)
            window(vecs[k], 0.3)  # warm-up
        rates: dict[int, list[float]] = {1: [], 2: [], 4: []}
        for _ in range(rounds):
            for k in (1, 2, 4):
                rates[k].append(window(vecs[k], seconds))
    finally:
        for v in vecs.values():
            v.close()
        stop(procs)
    return {
        "steps_per_s": {str(k): round(statistics.median(v), 1) for k, v in rates.items()},
        "remote_scaling_2": round(statistics.median(b / a for a, b in zip(rates[1], rates[2])), 3),
        "remote_scaling_4": round(statistics.median(b / a for a, b in zip(rates[1], rates[4])), 3),
        "remote_scaling_4_rounds": [round(b / a, 3) for a, b in zip(rates[1], rates[4])],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer steps (well under a minute here)"
    )
    args = parser.parse_args()
    rounds, steps, srounds, seconds = (5, 200, 4, 1.5) if args.quick else (10, 500, 8, 3.0)
    cpu = cpu_model()
    print(f"cpu: {cpu} ({os.cpu_count()} cores), load average {os.getloadavg()[0]:.1f}", flush=True)
    result = {"cpu": cpu, "cores": os.cpu_count(), "num_envs": NUM_ENVS, "quick": args.quick}
    result.update(overhead(rounds, steps))
    print(
        f"per-step: local p50 {result['local_step_ms_p50']} ms, remote p50 {result['remote_step_ms_p50']} ms "
        f"-> overhead {result['remote_step_overhead_ms']} ms",
        flush=True,
    )
    result.update(scaling(srounds, seconds))
    print(f"scaling: steps/s by server processes {result['steps_per_s']}", flush=True)
    result["load_average"] = round(os.getloadavg()[0], 1)
    from results import emit_result  # the RESULT line, and its record in benchmarks/results/

    emit_result("remote_env", result)


if __name__ == "__main__":
    main()
