"""The benchmarks' results store: every ``RESULT {json}`` a benchmark prints is also kept as a record.

Each benchmark ends with ``emit_result(name, result)``: it prints the ``RESULT {json}`` line as before
(``gymllm bench`` and the tests parse it) and appends one record to ``benchmarks/results/NAME.jsonl``:

    {"benchmark": "vector_env", "result": {...the RESULT json...}, "runs": 1,
     "cpu": "AMD EPYC 9B14 (no AMX)", "cores": 2, "date": "2026-12-04T05:40:12Z",
     "commit": "<git rev-parse HEAD>", "dirty": false, "command": "python benchmarks/vector_env.py --quick",
     "load": [1.9, 1.7, 1.5], "notes": null, "source": "run",
     "device": {"platform": "tpu", "kind": "TPU v5 lite", "count": 1}}

``device`` (``results/device.py``) is where the figures were measured: JAX's devices in the benchmark's
process, or, for one whose JAX work runs in child processes, the ``JAX_PLATFORMS`` they were given. The
RESULT line carries it too (key ``device``, unless the benchmark reports its own). Records from before
it existed have none: JAX was pinned to the CPU then.

``python benchmarks/results/render.py`` writes the tables of ``docs/benchmarks.md`` from these records
(figures on the page are never typed by hand). Records imported from the README's text, for figures
measured before this store existed, carry ``"source": "imported from the README text of commit 0a52cdd"``
with the commit, machine, load and number of runs that text gave (null or "not stated" where it gave
none); their values are strings exactly as the text had them, ``spread`` maps a key to its range over
runs, ``reported_in`` names the commit that first reported the figure, and ``lead`` marks the
measurement the README's row led with. Figures a benchmark printed during development on a branch,
before its merge, carry ``"source": "copied from the output of a development run on branch NAME"``
with that branch's commit and the load it ran under.

Where the record goes: ``$GYMLLM_BENCH_RECORDS`` (a directory; ``off`` records nothing), else this
directory. Inside a pytest run (``PYTEST_CURRENT_TEST`` set) nothing is recorded unless
``GYMLLM_BENCH_RECORDS`` names a directory, so tests that run a benchmark never touch the store.
``$GYMLLM_BENCH_NOTES`` becomes the record's ``notes`` (say what else ran on the machine);
``$GYMLLM_BENCH_COMMIT`` names the commit where the checkout's git history is absent or stale (a copy on a
lent machine); when set it wins over ``git rev-parse HEAD``.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import shlex
import subprocess
import sys
from typing import Any

from . import device as device_module  # noqa: F401 - results.device: the device a run measured on

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
RECORD_FIELDS = (
    "benchmark",
    "result",
    "runs",
    "cpu",
    "date",
    "commit",
    "command",
    "load",
    "notes",
    "source",
)


def records_dir() -> pathlib.Path | None:
    """Where records are appended: ``$GYMLLM_BENCH_RECORDS``, else this directory; None when switched off
    (``off``, or inside pytest without an explicit directory)."""
    env = os.environ.get("GYMLLM_BENCH_RECORDS")
    if env is not None:
        return None if env.strip().lower() in ("", "off", "0", "no") else pathlib.Path(env)
    if os.environ.get("PYTEST_CURRENT_TEST"):
        return None
    return HERE


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _cpu() -> str:
    try:
        from gymllm.utils.host import describe_cpu

        return describe_cpu()
    except Exception:  # noqa: BLE001 - a record without the CPU's flags beats no record
        try:
            for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
        except OSError:
            pass
        return "unknown CPU"


def make_record(
    benchmark: str,
    result: dict[str, Any],
    *,
    argv: list[str] | None = None,
    device: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The record of one run: the RESULT, the CPU, UTC date, commit (and whether the tree had local
    changes), the command line, the load average at the end, ``$GYMLLM_BENCH_NOTES`` and the device."""
    from . import device as dev

    argv = list(sys.argv if argv is None else argv)
    if dev.CPU_FLAG_TAKEN and dev.CPU_FLAG not in argv:
        argv.append(dev.CPU_FLAG)
    status = _git("status", "--porcelain", "--untracked-files=no")
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {
        "benchmark": benchmark,
        "result": result,
        "runs": 1,
        "cpu": _cpu(),
        "cores": os.cpu_count(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        # a lent machine's copy may carry a stale .git beside the current files: the variable wins
        "commit": os.environ.get("GYMLLM_BENCH_COMMIT") or _git("rev-parse", "HEAD") or None,
        "dirty": bool(status) if status is not None else None,
        "command": "python "
        + shlex.join([os.path.relpath(argv[0], REPO) if argv and argv[0] else "?", *argv[1:]]),
        "load": load,
        "notes": os.environ.get("GYMLLM_BENCH_NOTES") or None,
        "source": "run",
        "device": device
        or (result["device"] if isinstance(result.get("device"), dict) else dev.device_info()),
    }


def append_record(record: dict[str, Any], directory: pathlib.Path) -> pathlib.Path:
    """Append ``record`` as one line of ``directory/BENCHMARK.jsonl`` (one ``write`` on an O_APPEND
    file, so concurrent runs do not interleave lines)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{record['benchmark']}.jsonl"
    line = (json.dumps(record, sort_keys=False) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    return path


def emit_result(
    benchmark: str,
    result: dict[str, Any],
    *,
    record: bool = True,
    device: dict[str, Any] | None = None,
    tpu_keys: dict[str, str] | None = None,
) -> str:
    """Print ``RESULT {json}`` (flushed) and append the run's record; returns the printed line.

    Args:
        benchmark: The script's name without ``.py`` (the record file's name).
        result: The RESULT dict, JSON-serializable.
        record: False prints only (a dry rehearsal whose figures mean nothing).
        device: The record's device when the benchmark knows it better than this process does (its
            figures were measured by child processes); default :func:`results.device.device_info`.
        tpu_keys: ``{key: tpu_key}``: on a TPU the RESULT also gives ``result[key]`` as
            ``tpu_key`` (the issue's name for the chip's figure).

    The RESULT gains a ``device`` key (``results.device.device_info``) unless it has one.
    """
    from .device import device_info, from_result

    device = device or from_result(result)
    if tpu_keys and (device or device_info()).get("platform") == "tpu":
        result = {**result, **{tpu: result[key] for key, tpu in tpu_keys.items()}}
    if "device" not in result:
        result = {**result, "device": device or device_info()}
    line = "RESULT " + json.dumps(result)
    print(line, flush=True)
    directory = records_dir() if record else None
    if directory is not None:
        try:
            path = append_record(make_record(benchmark, result, device=device), directory)
            print(
                f"(recorded in {path}; python benchmarks/results/render.py updates docs/benchmarks.md)",
                file=sys.stderr,
                flush=True,
            )
        except OSError as e:  # the figure is printed either way; say why it was not kept
            print(f"(not recorded: {e})", file=sys.stderr, flush=True)
    return line


__all__ = ["emit_result", "make_record", "append_record", "records_dir", "RECORD_FIELDS"]
