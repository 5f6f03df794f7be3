"""What the host machine is, for benchmark reports: the CPU model and whether it has AMX (bf16 matmul
speeds differ several-fold between CPUs with and without it)."""

from __future__ import annotations

import pathlib
import platform

__all__ = ["cpu_model", "cpu_flags", "describe_cpu"]


def _cpuinfo() -> list[str]:
    try:
        return pathlib.Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    for line in _cpuinfo():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def cpu_flags() -> set[str]:
    """The CPU's feature flags (empty where ``/proc/cpuinfo`` is unavailable)."""
    for line in _cpuinfo():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def describe_cpu() -> str:
    """E.g. ``"AMD EPYC (no AMX, avx512_bf16)"``: the line every benchmark prints beside its figures."""
    flags = cpu_flags()
    amx = "AMX" if "amx_bf16" in flags else "no AMX"
    bf16 = ", avx512_bf16" if "avx512_bf16" in flags else ""
    return f"{cpu_model()} ({amx}{bf16})"


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages (``/proc/loadavg``; empty where unavailable): printed beside
    every benchmark figure, since a shared machine's load moves them."""
    try:
        with open("/proc/loadavg") as f:
            return [float(x) for x in f.read().split()[:3]]
    except OSError:
        return []
