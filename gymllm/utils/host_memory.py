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

Called by ``gymllm.algos.trainer.train``; set ``GYMLLM_KEEP_FREED_MEMORY=0`` to leave malloc alone.
A no-op (returns False) where glibc's ``mallopt`` is unavailable.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3  # glibc malloc.h
_done: bool | None = None


def keep_freed_memory(*, mmap_threshold: int = 32 << 20, trim_threshold: int = 1 << 31,
                      top_pad: int = 64 << 20) -> bool:
    """Raise glibc's malloc thresholds once per process (see the module docstring); True if applied."""
    global _done
    if _done is not None:
        return _done
    _done = False
    if os.environ.get("GYMLLM_KEEP_FREED_MEMORY", "1") == "0":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = all(mallopt(p, v) == 1 for p, v in ((_M_MMAP_THRESHOLD, min(mmap_threshold, 2**31 - 1)),
                                            (_M_TRIM_THRESHOLD, min(trim_threshold, 2**31 - 1)),
                                            (_M_TOP_PAD, min(top_pad, 2**31 - 1))))
    _done = ok
    return ok
