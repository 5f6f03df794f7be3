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

The large blocks fault too: each is mapped fresh per call and faulted in 4 KB at a time. The README
Quickstart on a 2-core EPYC took 31.9 million minor faults and 88.6 s of system time (of 321 s of
CPU). glibc's ``glibc.malloc.hugetlb=1`` tunable has malloc ask for transparent huge pages
(``madvise``) on what it maps, so a block faults in 2 MB at a time: a float32 [960, 49152] logits
step went from 2.76 million faults and 5.2 s of system time to 27,600 and 1.8 s (wall 10.3 -> 7.6 s), and
the Quickstart's warm run from 159-163 s to 135-140 s (cold: 166-181 s to 154-166 s).
A tunable is read only when a process starts, so the ``gymllm`` command starts itself again with it
(:func:`hugepage_tunables`, :func:`restart_with_hugepages`) where the kernel offers transparent huge
pages (``always`` or ``madvise``) and glibc is the C library; ``GYMLLM_HUGEPAGES=0`` turns that off.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import pathlib
import platform
import sys
from typing import Mapping, Sequence

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


HUGEPAGES_VAR = "GYMLLM_HUGEPAGES"
HUGETLB_TUNABLE = "glibc.malloc.hugetlb=1"
THP_MODE_FILE = pathlib.Path("/sys/kernel/mm/transparent_hugepage/enabled")


def thp_mode() -> str | None:
    """The kernel's transparent huge page mode (``always``, ``madvise``, ``never``), or None where
    there is no such setting (not Linux)."""
    try:
        text = THP_MODE_FILE.read_text()
    except OSError:
        return None
    chosen = [w[1:-1] for w in text.split() if w.startswith("[") and w.endswith("]")]
    return chosen[0] if chosen else None


def hugepage_tunables(environ: Mapping[str, str], *, mode: str | None, libc: str) -> str | None:
    """The ``GLIBC_TUNABLES`` value that adds :data:`HUGETLB_TUNABLE` to ``environ``'s, or None when the
    process should start as it is: ``GYMLLM_HUGEPAGES=0``, a C library other than glibc (``libc``, from
    :func:`platform.libc_ver`), transparent huge pages off or absent (``mode``), or a ``glibc.malloc.hugetlb``
    already chosen in ``environ`` (by the user, or by this process's earlier start)."""
    if environ.get(HUGEPAGES_VAR, "").strip().lower() in ("0", "false", "no", "off"):
        return None
    if libc != "glibc" or mode not in ("always", "madvise"):
        return None
    current = environ.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb=" in current:
        return None
    return f"{current}:{HUGETLB_TUNABLE}" if current else HUGETLB_TUNABLE


def malloc_on_hugepages(environ: Mapping[str, str] | None = None) -> bool:
    """Whether a process started with ``environ`` (default this one's) runs glibc's malloc on huge
    pages: the ``glibc.malloc.hugetlb`` already chosen there, else whether :func:`restart_with_hugepages`
    would choose it on this machine. What the benchmarks record as ``malloc_hugepages``."""
    environ = os.environ if environ is None else environ
    chosen = environ.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb=" in chosen:
        return "glibc.malloc.hugetlb=0" not in chosen
    return hugepage_tunables(environ, mode=thp_mode(), libc=platform.libc_ver()[0]) is not None


def restart_with_hugepages(orig_argv: Sequence[str] | None = None) -> None:
    """Start this process again (same pid, ``os.execve``) with :func:`hugepage_tunables`' value in
    ``GLIBC_TUNABLES``, when it gives one; otherwise return. ``orig_argv``: the interpreter's command
    line (default :data:`sys.orig_argv`: interpreter options and the script or ``-m`` module kept).
    Call it first thing, before any thread or file is opened."""
    value = hugepage_tunables(os.environ, mode=thp_mode(), libc=platform.libc_ver()[0])
    argv = list(sys.orig_argv if orig_argv is None else orig_argv)
    if value is None or not sys.executable or not argv:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *argv[1:]], {**os.environ, "GLIBC_TUNABLES": value})
