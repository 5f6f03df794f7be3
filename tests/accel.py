"""Test support for running the default tier on whatever device JAX finds (issue 42).

The default tier runs on the CPU (CI has no accelerator). ``GYMLLM_TEST_DEVICE=accelerator`` runs it
on the accelerator JAX finds (a TPU or a GPU; ``tests/conftest.py`` reads the variable before JAX is
imported):

    GYMLLM_TEST_DEVICE=accelerator python -m pytest tests/test_models.py tests/test_engine.py \\
        tests/test_losses.py tests/test_learner.py tests/test_compute_dtype.py tests/test_accel_tolerances.py

Two things differ on an accelerator, and the comparisons against a reference account for both:

* **Matmul precision.** At JAX's default precision a TPU runs a float32 matmul as bf16 passes (about
  3 significant digits): attention vs a NumPy reference differs by ~4e-3 there, cached decode vs the
  full forward by ~1e-2. A test module marked ``pytest.mark.highest_precision`` runs under
  ``jax_default_matmul_precision="highest"`` on an accelerator (about 7 digits; set by an autouse
  module fixture in conftest, for the whole module, so module-scoped engines compile once under it).
  On the CPU the mark changes nothing (float32 matmuls are exact there already).
* **Transcendentals.** exp/log/tanh/erf on a TPU agree with NumPy's to 4-5 digits, whatever the
  matmul precision. :func:`tolerance` gives each kind of comparison its CPU tolerance (the one the
  test always had) and a wider accelerator one, still orders of magnitude under what a one-line bug
  moves (``tests/test_accel_tolerances.py`` injects such bugs and checks they are caught at these
  tolerances).
"""

from __future__ import annotations

import functools
import os
import socket

#: what ``GYMLLM_TEST_DEVICE`` may say: ``cpu`` (the default; CI) or ``accelerator`` (the one JAX finds)
DEVICE_CHOICES = ("cpu", "accelerator")

#: per kind of comparison, (CPU tolerances, accelerator tolerances) as ``assert_allclose`` keywords
TOLERANCES: dict[str, tuple[dict[str, float], dict[str, float]]] = {
    # two float32 forwards of one model down different code paths (cache, packing, chunks)
    "logits": ({"atol": 2e-5, "rtol": 1e-5}, {"atol": 2e-4, "rtol": 1e-4}),
    # a JAX float32 computation vs a NumPy float64 reference of the same math
    "reference": ({"atol": 1e-5, "rtol": 1e-7}, {"atol": 1e-4, "rtol": 1e-5}),
    # log-probs of the same tokens from two programs (engine vs trainer forward, reused prefix vs fresh)
    "logprob": ({"atol": 1e-4, "rtol": 0.0}, {"atol": 1e-3, "rtol": 0.0}),
    # a gradient accumulated in micro-batches vs one batch's gradient
    "grad": ({"atol": 1e-7, "rtol": 2e-4}, {"atol": 1e-6, "rtol": 2e-3}),
}


def requested_device() -> str:
    """``GYMLLM_TEST_DEVICE`` (default ``cpu``); a value outside :data:`DEVICE_CHOICES` is an error."""
    value = os.environ.get("GYMLLM_TEST_DEVICE", "cpu").strip().lower() or "cpu"
    if value not in DEVICE_CHOICES:
        raise ValueError(
            f"GYMLLM_TEST_DEVICE: expected one of {DEVICE_CHOICES}, received {value!r}. Fix: unset it "
            "for the CPU, or GYMLLM_TEST_DEVICE=accelerator to run on the TPU or GPU JAX finds."
        )
    return value


def platform() -> str:
    """The platform of JAX's first device: ``cpu``, ``tpu`` or ``gpu``."""
    import jax

    p = jax.devices()[0].platform
    return "gpu" if p in ("cuda", "rocm") else p


def on_accelerator() -> bool:
    return platform() != "cpu"


def tolerance(kind: str) -> dict[str, float]:
    """``assert_allclose`` keywords for ``kind`` (a key of :data:`TOLERANCES`) on the device under test."""
    if kind not in TOLERANCES:
        raise KeyError(f"tolerance: expected a kind in {sorted(TOLERANCES)}, received {kind!r}")
    cpu, accel = TOLERANCES[kind]
    return dict(accel if on_accelerator() else cpu)


@functools.lru_cache(maxsize=1)
def loopback_unavailable() -> str:
    """Why a TCP socket cannot be bound on 127.0.0.1 here ("" when it can). Probed once, by binding
    127.0.0.1:0 (the lent TPU machine has no network at all, not even loopback)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
    except OSError as e:
        return f"no TCP socket can be bound on 127.0.0.1 on this machine ({e})"
    return ""
