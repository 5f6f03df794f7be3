"""The sandbox's cgroups (v1): a ``pids`` and a ``memory`` child of this process's own cgroup, where writable.

``make_cgroups(config)`` makes them for one run (``pids.max = max_processes``; ``memory.limit_in_bytes``
and, where the kernel has it, ``memory.memsw.limit_in_bytes = memory_mb``); the launcher joins them before
anything else, so a fork bomb hits ``pids.max`` and all the run's processes together stay under the memory
limit (tmpfs pages the run writes in its work dir included). ``remove_cgroup`` kills what is left and
removes one. Where no writable hierarchy exists nothing is made and the run reports it.
"""

from __future__ import annotations

import itertools
import os
import signal
import time

__all__ = ["own_cgroup", "make_cgroups", "remove_cgroup"]

_COUNTER = itertools.count()


def own_cgroup(controller: str) -> str | None:
    """This process's cgroup directory in the v1 ``controller`` hierarchy, when it exists and is writable."""
    base = f"/sys/fs/cgroup/{controller}"
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        if controller in controllers.split(","):
            path = os.path.normpath(base + rel)
            return path if os.path.isdir(path) and os.access(path, os.W_OK) else None
    return None


def make_cgroups(config) -> dict[str, str]:
    """Child cgroups (under this process's own) capping processes and total memory: ``{controller: path}``."""
    limits = {
        "pids": {"pids.max": config.max_processes},
        "memory": {
            "memory.limit_in_bytes": config.memory_mb * 2**20,
            "memory.memsw.limit_in_bytes": config.memory_mb * 2**20,
        },
    }
    made: dict[str, str] = {}
    for controller, files in limits.items():
        parent = own_cgroup(controller)
        if parent is None:
            continue
        path = os.path.join(parent, f"gymllm-sbx-{os.getpid()}-{next(_COUNTER)}")
        try:
            os.mkdir(path)
            first = True
            for name, value in files.items():
                try:
                    with open(os.path.join(path, name), "w") as f:
                        f.write(str(value))
                except OSError:
                    if first:
                        raise
                first = False
            made[controller] = path
        except OSError:
            remove_cgroup(path)
    return made


def remove_cgroup(path: str | None) -> None:
    """Kill what is left in the cgroup at ``path`` and remove it (retried while the kernel still counts it busy)."""
    if not path:
        return
    for _ in range(50):
        try:
            with open(os.path.join(path, "cgroup.procs")) as f:
                pids = [int(x) for x in f.read().split()]
        except OSError:
            pids = []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)
