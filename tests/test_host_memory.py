"""Malloc on transparent huge pages for the ``gymllm`` command (gymllm.utils.host_memory): when the
process starts again with ``glibc.malloc.hugetlb=1``, what it keeps of the user's own tunables, that
``GYMLLM_HUGEPAGES=0`` leaves it alone, and that a child on huge pages faults its large blocks in far
fewer times."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from gymllm.utils import host_memory as hm

ON_HOST = platform.libc_ver()[0] == "glibc" and hm.thp_mode() in ("always", "madvise")
needs_thp = pytest.mark.skipif(
    not ON_HOST, reason="needs glibc and transparent huge pages (always or madvise) on this host"
)


@pytest.mark.parametrize(
    "environ, mode, libc, expected",
    [
        ({}, "madvise", "glibc", "glibc.malloc.hugetlb=1"),
        ({}, "always", "glibc", "glibc.malloc.hugetlb=1"),
        (
            {"GLIBC_TUNABLES": "glibc.malloc.tcache_count=0"},
            "madvise",
            "glibc",
            "glibc.malloc.tcache_count=0:glibc.malloc.hugetlb=1",
        ),
        (
            {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"},
            "madvise",
            "glibc",
            None,
        ),  # the user's choice
        ({"GYMLLM_HUGEPAGES": "0"}, "madvise", "glibc", None),
        ({}, "never", "glibc", None),
        ({}, None, "glibc", None),  # no such kernel setting (not Linux)
        ({}, "madvise", "", None),  # another C library (musl)
    ],
)
def test_when_the_process_starts_again_and_with_what(environ, mode, libc, expected):
    assert hm.hugepage_tunables(environ, mode=mode, libc=libc) == expected


def test_the_kernel_mode_is_the_bracketed_word(tmp_path, monkeypatch):
    f = tmp_path / "enabled"
    f.write_text("always [madvise] never\n")
    monkeypatch.setattr(hm, "THP_MODE_FILE", f)
    assert hm.thp_mode() == "madvise"
    monkeypatch.setattr(hm, "THP_MODE_FILE", tmp_path / "absent")
    assert hm.thp_mode() is None


SHOW = (
    "import os; from gymllm.utils.host_memory import restart_with_hugepages; "
    "restart_with_hugepages(); print('T=' + os.environ.get('GLIBC_TUNABLES', ''), os.getpid())"
)


def _child(code: str, **env: str) -> str:
    base = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "GYMLLM_HUGEPAGES")}
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


@needs_thp
def test_the_process_starts_again_once_with_the_tunable_and_keeps_its_pid():
    lines = _child(SHOW).split("\n")
    assert lines[0].startswith("T=glibc.malloc.hugetlb=1 ") and len([x for x in lines if x]) == 1
    assert _child(SHOW, GYMLLM_HUGEPAGES="0").startswith("T= ")
    kept = _child(SHOW, GLIBC_TUNABLES="glibc.malloc.tcache_count=0")
    assert kept.startswith("T=glibc.malloc.tcache_count=0:glibc.malloc.hugetlb=1 ")


FAULTS = (  # five 64 MB blocks from malloc itself (numpy asks for huge pages on its own), each touched
    "import ctypes, resource\n"
    "libc = ctypes.CDLL('libc.so.6'); libc.malloc.restype = ctypes.c_void_p\n"
    "libc.free.argtypes = [ctypes.c_void_p]\n"
    "r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
    "for _ in range(5):\n"
    "    p = libc.malloc(64 << 20); ctypes.memset(p, 1, 64 << 20); libc.free(p)\n"
    "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0)\n"
)


@needs_thp
def test_large_blocks_fault_in_far_fewer_times_on_huge_pages():
    small_pages = int(_child(FAULTS))
    huge_pages = int(_child(FAULTS, GLIBC_TUNABLES=hm.HUGETLB_TUNABLE))
    assert (
        small_pages >= 5 * (64 << 20) // 4096 // 2
    )  # every 4 KB page of five 64 MB blocks (at least half)
    assert huge_pages * 8 < small_pages, (huge_pages, small_pages)


def test_the_gymllm_entry_runs_the_command():
    out = subprocess.run(
        [sys.executable, "-m", "gymllm.cli.entry", "--version"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and out.stdout.startswith("gymllm "), out.stderr


def test_malloc_on_hugepages_reads_a_chosen_tunable_else_what_the_restart_would_choose(monkeypatch):
    from gymllm.utils import host_memory

    monkeypatch.setattr(host_memory, "thp_mode", lambda: "madvise")
    monkeypatch.setattr(platform, "libc_ver", lambda: ("glibc", "2.36"))
    assert host_memory.malloc_on_hugepages({}) is True
    assert host_memory.malloc_on_hugepages({"GYMLLM_HUGEPAGES": "0"}) is False
    assert host_memory.malloc_on_hugepages({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}) is False
    assert host_memory.malloc_on_hugepages({"GLIBC_TUNABLES": "x=1:glibc.malloc.hugetlb=1"}) is True
    monkeypatch.setattr(host_memory, "thp_mode", lambda: "never")
    assert host_memory.malloc_on_hugepages({}) is False
