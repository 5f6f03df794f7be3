"""What the host machine is, for benchmark reports (the CPU model and whether it has AMX: bf16 matmul
speeds differ several-fold between CPUs with and without it), and the compute dtype that is fastest
on it (:func:`resolve_compute_dtype`, what ``compute_dtype="auto"`` means)."""

from __future__ import annotations

import pathlib
import platform

__all__ = ["cpu_model", "cpu_flags", "describe_cpu", "native_bf16", "resolve_compute_dtype"]


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


NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # CPU flags of bf16 matmul instructions


def native_bf16(*, flags: set[str] | None = None, backend: str | None = None) -> bool:
    """Whether bf16 matmuls run natively here: on any accelerator backend, and on a CPU with AMX or
    avx512_bf16 (``flags``/``backend`` default to this machine's CPU flags and JAX's default backend).

    Without them XLA:CPU converts bf16 element by element, and float32 is the faster dtype: measured on
    a 2-core AMD EPYC without either (``benchmarks/models.py``, SmolLM2-135M), float32 against bf16:
    decode at batch 16 104 vs 40 tok/s, prefill 446 vs 276 tok/s, fwd+bwd over 8 x 128 tokens 11.8 vs
    14.3 s (mixed precision 14.5 s). With AMX, bf16 was the faster one (prefill 904 vs 530 tok/s,
    fwd+bwd 8.6 vs 10.3 s). avx512_bf16 without AMX is counted as native, unmeasured here."""
    if backend is None:
        import jax

        backend = jax.default_backend()
    if backend != "cpu":
        return True
    flags = cpu_flags() if flags is None else flags
    return any(f in flags for f in NATIVE_BF16_FLAGS)


def resolve_compute_dtype(
    value: str | None, *, flags: set[str] | None = None, backend: str | None = None
) -> str | None:
    """``"auto"`` -> ``"bfloat16"`` where :func:`native_bf16`, else ``"float32"``; any other value unchanged
    (what an engine's, a learner's or an SFT learner's ``compute_dtype="auto"`` computes in)."""
    if value != "auto":
        return value
    return "bfloat16" if native_bf16(flags=flags, backend=backend) else "float32"


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages (``/proc/loadavg``; empty where unavailable): printed beside
    every benchmark figure, since a shared machine's load moves them."""
    try:
        with open("/proc/loadavg") as f:
            return [float(x) for x in f.read().split()[:3]]
    except OSError:
        return []
