"""Keep freed host memory in the process: XLA:CPU's per-call buffers then stop page-faulting.

XLA:CPU allocates every temporary and output buffer of a call with ``malloc`` and frees it at the
end. glibc hands blocks of a few hundred KB back to the kernel (``mmap``/``munmap``, or trimming
the heap top), so the next call faults every page in again: a tiny model's gradient step (16 x 80
tokens, d 64) took about 8,700 minor page faults per call, 84 ms of CPU, and 62 ms with freed memory
kept (890 faults). :func:`keep_freed_memory` raises glibc's mmap and trim thresholds (``mallopt``),
as a caching allocator would: the process's resident memory stays at its peak instead.
Blocks of 32 MB and more are still mapped and unmapped per call: a real model's activations and
gradients are that large, and keeping them on the heap fragmented a SmolLM2 run to 10-11 GB resident
(5 GB with malloc left alone), while small blocks are where the faults per byte are.

These are settings of the whole process (every library's allocations in it), so they are applied only
on request: ``gymllm.train.trainer.train`` calls :func:`keep_freed_memory`, which changes nothing
unless ``GYMLLM_KEEP_FREED_MEMORY=1`` is set in the environment (or a caller passes ``enabled=True``).
A training process of its own (``gymllm train``, the benchmarks) is where it pays:
``GYMLLM_KEEP_FREED_MEMORY=1 gymllm train ...``. A no-op (returns False) where glibc's ``mallopt`` is
unavailable; once applied it stays for the life of the process (glibc has no undo).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3  # glibc malloc.h
_done: bool | None = None


ENV_VAR = "GYMLLM_KEEP_FREED_MEMORY"


def requested() -> bool:
    """Whether the environment asks for it: ``GYMLLM_KEEP_FREED_MEMORY`` is ``1`` (or ``true``/``yes``/``on``)."""
    return os.environ.get(ENV_VAR, "").strip().lower() in ("1", "true", "yes", "on")


def keep_freed_memory(
    *,
    enabled: bool | None = None,
    mmap_threshold: int = 32 << 20,
    trim_threshold: int = 1 << 31,
    top_pad: int = 64 << 20,
) -> bool:
    """Raise glibc's malloc thresholds once per process, only on request (see the module docstring).

    ``enabled``: True applies them, False leaves malloc alone, None (default) follows
    ``GYMLLM_KEEP_FREED_MEMORY``. Returns True if they are applied (now or by an earlier call)."""
    global _done
    if _done is not None:
        return _done
    if not (requested() if enabled is None else enabled):
        return False  # not requested: nothing changed, and a later call may still opt in
    _done = False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = all(
        mallopt(p, v) == 1
        for p, v in (
            (_M_MMAP_THRESHOLD, min(mmap_threshold, 2**31 - 1)),
            (_M_TRIM_THRESHOLD, min(trim_threshold, 2**31 - 1)),
            (_M_TOP_PAD, min(top_pad, 2**31 - 1)),
        )
    )
    _done = ok
    return ok
