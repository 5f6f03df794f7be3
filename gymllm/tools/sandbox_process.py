"""The child process of a :class:`~gymllm.tools.sandbox.Sandbox` run, seen from the parent: the
launcher (:data:`CHILD`, ``_sandbox_child.py``) and its JSON spec (:func:`child_spec`), stdin fed and
stdout/stderr read capped (:func:`feed`, :class:`CappedReader`), the status the launcher reports
(:func:`read_status`), the shell's allowlisted environment (:func:`shell_env`) and killing the
run's whole process group (:func:`kill_group`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

from gymllm.tools.sandbox_config import SandboxConfig

__all__ = ["CHILD", "CappedReader", "child_spec", "feed", "kill_group", "read_status", "shell_env"]


CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sandbox_child.py")


def feed(pipe, data: bytes) -> None:
    """Write ``data`` to the child's stdin and close it; a child that exits or never reads ends it quietly."""
    try:
        pipe.write(data)
    except (OSError, ValueError):
        pass
    finally:
        try:
            pipe.close()
        except (OSError, ValueError):
            pass


class CappedReader(threading.Thread):
    """Reads a pipe to its end, keeping the first ``cap`` bytes and counting the rest."""

    def __init__(self, pipe, cap: int):
        super().__init__(daemon=True)
        self.pipe, self.cap, self.kept, self.dropped = pipe, cap, bytearray(), 0

    def run(self) -> None:
        try:
            while (
                chunk := self.pipe.read1(65536)
                if hasattr(self.pipe, "read1")
                else self.pipe.read(65536)
            ):
                room = self.cap - len(self.kept)
                self.kept += chunk[: max(room, 0)]
                self.dropped += max(len(chunk) - max(room, 0), 0)
        except (OSError, ValueError):
            pass

    def text(self) -> str:
        out = self.kept.decode("utf-8", errors="replace")
        if self.dropped:
            out += f"\n... [output truncated: {self.dropped} more bytes]"
        return out


def child_spec(
    c: SandboxConfig,
    workdir: str,
    ns_fds: dict,
    extra: dict,
    status_fd: int,
    cgroups: dict[str, str],
) -> dict:
    """The launcher's JSON spec for one run."""
    limits = {
        "cpu_s": int(c.timeout_s) + 1,
        "address_space_bytes": c.memory_mb * 2**20,
        "file_size_bytes": c.max_file_mb * 2**20,
        "open_files": c.max_open_files,
        "core_bytes": 0,
        "processes": c.max_processes,
    }
    iso = {
        "net": c.namespaces and not c.network,
        "fs": c.namespaces,
        "pid": c.namespaces,
        "ipc": c.namespaces,
    }
    return {
        "workdir": workdir,
        "ns_fds": dict(ns_fds),
        "limits": limits,
        "isolate": iso,
        "network": c.network,
        "status_fd": status_fd,
        "cgroups": cgroups,
        "read_paths": list(c.read_paths),
        "python_paths": sorted(
            {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(sys.executable)}
        ),
        "extra_paths": list(c.extra_paths),
        "allow_missing": list(c.allow_missing),
        **extra,
    }


def kill_group(proc: subprocess.Popen, *, wait: bool = True) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher, the namespace init, and their group
    except OSError:
        pass
    if wait:
        proc.wait()


def read_status(fd: int) -> dict:
    try:
        data = os.read(fd, 65536)
    finally:
        os.close(fd)
    try:
        return json.loads(data.decode()) if data else {}
    except ValueError:
        return {}


def shell_env(workdir: str) -> dict[str, str]:
    bindir = os.path.dirname(sys.executable)
    return {
        "PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin",
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "TERM": "dumb",
    }
