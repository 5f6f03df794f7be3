"""What a :class:`~gymllm.tools.sandbox.Sandbox` runs under and what a run returns: :class:`SandboxConfig`,
:class:`SandboxResult`, the required layers (:data:`GUARANTEES`) and :class:`SandboxUnavailableError`.

:mod:`gymllm.tools.sandbox` describes every layer these settings control.
"""

from __future__ import annotations

import dataclasses
import os

from gymllm.errors import ConfigError, ToolError, explain
from gymllm.validation import check_range

__all__ = ["GUARANTEES", "SandboxConfig", "SandboxResult", "SandboxUnavailableError"]

GUARANTEES = ("landlock", "seccomp", "process_limit", "signals")
"""The required layers; ``SandboxConfig.allow_missing`` may name those a run may go without."""


class SandboxUnavailableError(ToolError):
    """A required isolation layer is missing on this machine; the code was not run."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class SandboxConfig:
    """Limits of one sandbox run.

    Attributes:
        timeout_s: wall-clock limit per run; the process group is killed after it.
        memory_mb: address-space limit of every process (``RLIMIT_AS``).
        max_processes: process limit (pids cgroup, or ``RLIMIT_NPROC`` for a non-root user).
        max_output_bytes: bytes kept of stdout and of stderr each.
        max_file_mb: largest file a process may write (``RLIMIT_FSIZE``).
        max_disk_mb: total size of the work dir: the size of its tmpfs (every page the code holds, named or
            not, in memory; one inode per 4 KiB), past which writes fail with ENOSPC; a run's stderr then ends
            with a message naming this cap. Where no tmpfs can be made, a poll of named files kills the run.
        max_open_files: ``RLIMIT_NOFILE``.
        network: allow network access (default False: an empty network namespace).
        allow_subprocess: Python mode only: allow the code to start processes.
        namespaces: use Linux namespaces where available (net, mount, pid).
        extra_paths: directories appended to ``sys.path`` in Python mode (e.g. site-packages); readable.
        read_paths: further files or directories the code may read (read-only), e.g. a data set.
        allow_missing: required layers (of :data:`GUARANTEES`) this config may run without where the
            kernel lacks them, e.g. ``("landlock",)`` on a kernel older than 5.13. Default: none; a
            run missing one raises :class:`SandboxUnavailableError`. A layer that exists is applied anyway.
    """

    timeout_s: float = 10.0
    memory_mb: int = 512
    max_processes: int = 64
    max_output_bytes: int = 8192
    max_file_mb: int = 64
    max_disk_mb: int = 256
    max_open_files: int = 256
    network: bool = False
    allow_subprocess: bool = False
    namespaces: bool = True
    extra_paths: tuple[str, ...] = ()
    read_paths: tuple[str, ...] = ()
    allow_missing: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = (
            [g for g in self.allow_missing if g not in GUARANTEES]
            if isinstance(self.allow_missing, (tuple, list))
            else [self.allow_missing]
        )
        if unknown:
            raise ConfigError(
                explain(
                    "SandboxConfig.allow_missing",
                    expected=f"a tuple of names from {GUARANTEES}",
                    received=self.allow_missing,
                    fix='e.g. allow_missing=("landlock",)',
                )
            )
        for name in ("extra_paths", "read_paths"):
            paths = getattr(self, name)
            if not isinstance(paths, (tuple, list)) or not all(
                isinstance(p, str) and os.path.isabs(p) for p in paths
            ):
                raise ConfigError(
                    explain(
                        f"SandboxConfig.{name}",
                        expected="a tuple of absolute paths",
                        received=paths,
                        fix=f'e.g. {name}=("/data/shared",)',
                    )
                )
        for name, low in (
            ("timeout_s", 0.0),
            ("memory_mb", 16),
            ("max_processes", 1),
            ("max_output_bytes", 1),
            ("max_file_mb", 1),
            ("max_disk_mb", 1),
            ("max_open_files", 16),
        ):
            check_range(
                "SandboxConfig",
                name,
                getattr(self, name),
                lo=low,
                lo_open=name == "timeout_s",
                fix=f"pass {name}= a larger value",
            )


@dataclasses.dataclass
class SandboxResult:
    """What one run produced."""

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool
    truncated: bool
    duration_s: float
    isolation: dict

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def as_text(self) -> str:
        """A compact text form for a tool observation: stdout, then stderr, then the status."""
        parts = []
        if self.stdout:
            parts.append(self.stdout.rstrip("\n"))
        if self.stderr:
            parts.append("[stderr]\n" + self.stderr.rstrip("\n"))
        if self.timed_out:
            parts.append(f"[timed out after {self.duration_s:.1f}s]")
        elif self.exit_code != 0:
            parts.append(f"[exit code {self.exit_code}]")
        return "\n".join(parts) if parts else "[no output]"
