"""Which device a benchmark runs on. No benchmark pins the CPU: JAX picks its default backend (the TPU
or GPU where there is one) unless ``--cpu`` is passed or ``JAX_PLATFORMS`` is set by the user.

Every benchmark that runs JAX calls :func:`choose_platform` before it imports JAX::

    from results.device import choose_platform
    choose_platform()  # honours --cpu (JAX_PLATFORMS=cpu, for this process and its children)

and :func:`results.emit_result` puts :func:`device_info` into the RESULT (key ``device``, unless the
benchmark set one) and into the record, so every figure says where it was measured. A benchmark whose
JAX work runs in child processes (``gymllm train`` subprocesses) never imports JAX itself (it would hold
the chip the children need); its record then says which platform the children were given.
"""

from __future__ import annotations

import os
import sys
from typing import Any

CPU_FLAG = "--cpu"

#: whether choose_platform took ``--cpu`` out of ``sys.argv`` (the record's command line puts it back)
CPU_FLAG_TAKEN = False


def choose_platform(argv: list[str] | None = None) -> str | None:
    """Honour ``--cpu`` in ``argv`` (default ``sys.argv``): set ``JAX_PLATFORMS=cpu`` and take the flag out
    of ``sys.argv`` (so the script's own parser never sees it; the record keeps it). Without it the
    user's ``JAX_PLATFORMS`` stands, or none (JAX then picks the accelerator if any). Call before
    importing JAX. Returns the ``JAX_PLATFORMS`` now in force (None: JAX's default)."""
    global CPU_FLAG_TAKEN
    args = sys.argv if argv is None else argv
    if CPU_FLAG in args:
        os.environ["JAX_PLATFORMS"] = "cpu"
        while CPU_FLAG in args:
            args.remove(CPU_FLAG)
        CPU_FLAG_TAKEN = CPU_FLAG_TAKEN or argv is None
    return os.environ.get("JAX_PLATFORMS") or None


def choose_platform_args(argv: Any = None) -> list[str] | None:
    """:func:`choose_platform` for a ``main(argv=None)``: returns the arguments without ``--cpu`` (None
    stays None: ``sys.argv`` itself was cleaned), for the script's ``parse_args``."""
    if argv is None:
        choose_platform()
        return None
    args = list(argv)
    choose_platform(args)
    return args


def device_info() -> dict[str, Any]:
    """``{"platform", "kind", "count"}`` of JAX's devices when this process imported JAX (``platform``
    is ``cpu``, ``tpu`` or ``gpu``; ``kind`` is ``device_kind``, e.g. "TPU v5 lite"); otherwise
    ``{"platform": None, "kind": ..., "jax_platforms": ...}`` naming what the children were given."""
    jax = sys.modules.get("jax")
    if jax is not None:
        try:
            devs = jax.devices()
        except RuntimeError as e:  # a backend that failed to start: say so in the record
            return {"platform": None, "kind": f"JAX found no device ({e})"[:200], "count": 0}
        plat = devs[0].platform
        return {
            "platform": "gpu" if plat in ("cuda", "rocm") else plat,
            "kind": devs[0].device_kind,
            "count": len(devs),
        }
    return {
        "platform": None,
        "kind": "no JAX in the benchmark's own process",
        "jax_platforms": os.environ.get("JAX_PLATFORMS") or None,
    }


def child_device_info(timeout: float = 300.0) -> dict[str, Any]:
    """:func:`device_info` as a child process sees it (the environment the benchmark's children get),
    asked in a short-lived subprocess that lets go of the device before they start."""
    import json
    import subprocess

    code = (
        "import json, jax; d = jax.devices(); p = d[0].platform; print('DEVICE ' + json.dumps({'platform': "
        "'gpu' if p in ('cuda', 'rocm') else p, 'kind': d[0].device_kind, 'count': len(d)}))"
    )
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout
        )
    except (OSError, subprocess.SubprocessError) as e:
        return {"platform": None, "kind": f"could not ask JAX for its device ({e})"[:200]}
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("DEVICE ")), None)
    if line is None:
        return {
            "platform": None,
            "kind": f"could not ask JAX for its device: {out.stderr.strip()[-150:]}",
        }
    return json.loads(line[len("DEVICE ") :])


def from_result(result: dict[str, Any]) -> dict[str, Any] | None:
    """The device a RESULT reports in ``platform`` / ``device_kind`` keys (benchmarks/compile.py's), or None."""
    if isinstance(result.get("platform"), str) and isinstance(result.get("device_kind"), str):
        return {
            "platform": "gpu" if result["platform"] in ("cuda", "rocm") else result["platform"],
            "kind": result["device_kind"],
            "count": result.get("device_count", 1),
        }
    return None


def describe(device: Any) -> str:
    """One line for the benchmarks page: "CPU", "TPU v5 lite x1", or what the record says."""
    if isinstance(device, str):
        return device
    if not isinstance(device, dict):
        return "CPU (before device records)"  # every benchmark pinned JAX to the CPU then
    plat = device.get("platform")
    if plat == "cpu":
        return "CPU"
    if plat is None:
        given = device.get("jax_platforms")
        return (
            f"children with JAX_PLATFORMS={given}"
            if given
            else "JAX's default device in child processes"
        )
    return f"{device.get('kind', plat)} x{device.get('count', 1)}"


def platform_of(device: Any) -> str:
    """``cpu``, ``tpu``, ``gpu`` or ``other`` (a string from an imported record: its words decide)."""
    if isinstance(device, dict):
        plat = device.get("platform")
        if plat in ("cpu", "tpu", "gpu"):
            return plat
        given = (device.get("jax_platforms") or "").split(",")[0]
        return given if given in ("cpu", "tpu", "gpu") else "other"
    if isinstance(device, str):
        low = device.lower()
        return (
            "tpu"
            if "tpu" in low
            else "gpu"
            if any(w in low for w in ("nvidia", "gpu", "cuda", "h100", "h200"))
            else "cpu"
            if low.startswith("cpu")
            else "other"
        )
    return "cpu"


__all__ = [
    "choose_platform",
    "choose_platform_args",
    "device_info",
    "child_device_info",
    "from_result",
    "describe",
    "platform_of",
    "CPU_FLAG",
]
