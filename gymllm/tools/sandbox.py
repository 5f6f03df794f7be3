"""A subprocess sandbox: a private work dir in which Python code or shell commands run isolated.

The work dir is a size-limited tmpfs only this sandbox's runs see (:mod:`gymllm.tools.sandbox_workdir`:
``max_disk_mb`` is the kernel's, and on the host its path is an empty directory); the parent reaches its
files by descriptors, never following a link (:mod:`gymllm.tools.sandbox_fs`); runs and file helpers of
one ``Sandbox`` take turns, and ``close()`` kills a run in progress before dropping the work dir.

Required kernel layers (unprivileged, inherited by every process the code starts, irreversible); a
run where one is missing raises :class:`SandboxUnavailableError` naming it, never a silent
downgrade (``SandboxConfig(allow_missing=("landlock",))`` and the like run without it, on purpose):

- **Landlock** (:mod:`gymllm.tools.landlock`): files open only in the work dir (read-write) and,
  read-only, in what the interpreter and shell need (the Python installs, ``/usr``, the libraries,
  a few ``/etc`` files, ``/dev/null``..., ``/proc`` only when it is the sandbox's own); no TCP
  bind/connect; no signals, ``ptrace`` or abstract UNIX sockets reaching processes outside;
- **seccomp** (:mod:`gymllm.tools.seccomp`): no ``socket()`` of any family (inet, inet6, unix,
  netlink, ...), no ``ptrace``, mount, namespace, ``io_uring``, ``bpf``, ``TIOCSTI``, ``inotify``,
  ``fanotify`` ...; file locks succeed without locking (nothing another sandbox could observe); in Python
  mode without ``allow_subprocess`` no ``fork``/``clone``/``execve`` at all (threads stay), which
  also holds for ``fork`` called through ``ctypes``;
- a **process-count limit** (``process_limit``): that seccomp rule in Python mode, else a ``pids``
  cgroup (root is exempt from ``RLIMIT_NPROC``) or ``RLIMIT_NPROC`` for a non-root user;
- **signal isolation** (``signals``): Landlock's scope (ABI >= 6) or a PID namespace.

Further layers (each reported in :attr:`SandboxResult.isolation`, so a caller knows what took effect):

- **kernel namespaces** (Linux, when user namespaces are allowed; best effort): the code runs as uid 1000
  of the work dir's user namespace with no capabilities; no network (an empty
  network namespace), the whole file system read-only except the work dir (a private mount
  namespace), no view of or signals to host processes (a PID namespace whose death kills everything
  inside, with its own ``/proc``);
- **rlimits**: CPU seconds, address space (memory bombs fail with ``MemoryError``), file size,
  open files, core dumps, and process count (for a non-root user);
- **cgroups** (v1, nested under this process's own, where writable): ``pids.max`` and a memory
  limit on all the sandbox's processes together (``memory_mb``), so many processes cannot add up past it;
- a **Python audit hook** in Python mode: writes outside the work dir, sockets and new processes
  are refused with readable messages before the kernel sees them (and where the mount and network
  namespaces are missing ``ctypes`` is refused too);
- the **disk cap** ``max_disk_mb``: the tmpfs's size (``isolation["disk_cap"] == "tmpfs (kernel)"``), or, where
  no tmpfs could be made, a poll of the named files that kills the run past it (``"poll (why)"``);
- a **wall-clock timeout** that kills the whole process group, and stdout/stderr capped at
  ``max_output_bytes`` each (the rest is drained and counted, never buffered);
- an **allowlisted environment**: the code sees only ``PATH``, ``HOME`` and ``TMPDIR`` (the work dir),
  ``LANG``, ``TERM`` and two ``PYTHON*`` switches, never the trainer's variables (tokens, keys).

Its config and result are :mod:`gymllm.tools.sandbox_config`; the child process, seen from the parent
(spec, pipes, status, kill), is :mod:`gymllm.tools.sandbox_process`.

Usage::

    with Sandbox(SandboxConfig(timeout_s=5)) as sb:
        res = sb.run_python("print(2 + 2)")      # res.stdout == "4\\n"
        res = sb.run_shell("ls -la && cat x.txt")
        sb.read_file("out.txt"); sb.write_files({"in.txt": "..."}); sb.listdir()
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Mapping

from gymllm.errors import ToolError, explain
from gymllm.tools.sandbox_cgroups import make_cgroups, remove_cgroup
from gymllm.tools.sandbox_config import (
    GUARANTEES,
    SandboxConfig,
    SandboxResult,
    SandboxUnavailableError,
)
from gymllm.tools.sandbox_fs import empty_dir, open_beneath, open_dir_beneath
from gymllm.tools.sandbox_process import (
    CHILD,
    CappedReader,
    child_spec,
    feed,
    kill_group,
    read_status,
    shell_env,
)
from gymllm.tools.sandbox_workdir import WorkDir
from gymllm.validation import require_instance


_DISK_POLL_S = 0.02
_CLOSE_WAIT_S = 60.0  # how long close() waits for a killed run's thread to hand the sandbox back


class Sandbox:
    """A private work dir (dropped on :meth:`close`) in which code and commands run isolated.

    The work dir is a size-limited tmpfs that only this sandbox's runs see (:mod:`gymllm.tools.sandbox_workdir`;
    a plain directory where user namespaces are unavailable, see ``SandboxResult.isolation["disk_cap"]``):
    :attr:`workdir` is its path *as the code sees it*; on the host that path is an empty directory, so
    read and write files through :meth:`read_file`, :meth:`write_files`, :meth:`listdir` and :meth:`clear`.

    One operation at a time: a run and the file helpers hold the sandbox in turn (a call from another
    thread, or after an ``asyncio`` timeout left a run going, waits for it), so nothing of the parent
    touches the work dir while code of this sandbox runs. :meth:`close` kills a run in progress first,
    waits for it, then drops the work dir.

    Args:
        config: limits; defaults to ``SandboxConfig()``.
        files: ``{relative path: text or bytes}`` written into the work dir before any run.
    """

    def __init__(
        self, config: SandboxConfig | None = None, *, files: Mapping[str, str | bytes] | None = None
    ):
        self.config = config or SandboxConfig()
        self._dir = WorkDir(max_disk_mb=self.config.max_disk_mb, namespaces=self.config.namespaces)
        self.workdir = self._dir.path
        self._closed = False
        self._lock = threading.Lock()  # one run or file operation at a time
        self._state = threading.Lock()  # guards _closed and _proc between close() and a run
        self._proc: subprocess.Popen | None = None
        self._started = threading.Event()
        if files:
            self.write_files(files)

    # -- files (read and written by the trusted parent, by descriptors beneath the work dir) ----------
    @contextlib.contextmanager
    def _exclusive(self, what: str):
        """Hold the sandbox for one operation: a run, or a file helper, never both at once (see the class doc)."""
        with self._lock:
            if self._closed:
                raise ToolError(
                    explain(
                        f"Sandbox.{what}",
                        expected="an open sandbox",
                        received="a closed one",
                        fix="create a new Sandbox",
                    )
                )
            yield

    def write_files(self, files: Mapping[str, str | bytes]) -> None:
        """Write ``{relative path: text or bytes}`` into the work dir, making missing directories.

        Every component is resolved beneath the work dir without following a link (see
        :mod:`gymllm.tools.sandbox_fs`); only regular files are written. Waits for a run in progress.
        """
        with self._exclusive("write_files"):
            for rel, data in files.items():
                if not isinstance(data, (str, bytes)):
                    raise ToolError(
                        explain(
                            "Sandbox.write_files",
                            expected="str or bytes contents",
                            received=f"{rel!r}: {type(data).__name__}",
                            fix="encode the contents",
                        )
                    )
                try:
                    fd = open_beneath(
                        self._dir.fd, rel, os.O_WRONLY | os.O_CREAT, create_parents=True
                    )
                    with open(fd, "wb", closefd=True) as f:
                        f.truncate(0)
                        f.write(data.encode() if isinstance(data, str) else data)
                except OSError as e:
                    if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                        raise
                    raise ToolError(
                        explain(
                            "Sandbox.write_files",
                            expected=f"room in the work dir (max_disk_mb="
                            f"{self.config.max_disk_mb})",
                            received=f"{rel!r}: {e.strerror}",
                            fix="remove files or raise SandboxConfig.max_disk_mb",
                        )
                    ) from None

    def read_file(self, relpath: str, *, binary: bool = False) -> str | bytes:
        """A regular file of the work dir: its text (UTF-8), or its bytes with ``binary=True``.

        A FIFO, device or socket is refused, never waited on; a link anywhere in the path is refused;
        text that is not UTF-8 raises ToolError (read it with ``binary=True``). Waits for a run in progress.
        """
        with self._exclusive("read_file"):
            with open(open_beneath(self._dir.fd, relpath, os.O_RDONLY), "rb") as f:
                data = f.read()
        if binary:
            return data
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ToolError(
                explain(
                    "Sandbox.read_file",
                    expected="UTF-8 text",
                    received=f"{relpath!r}: undecodable byte at offset {e.start}",
                    fix="pass binary=True to get the bytes",
                )
            ) from None

    def listdir(self, relpath: str = ".") -> list[str]:
        """The sorted names in a directory of the work dir (``"."``: the work dir itself)."""
        with self._exclusive("listdir"):
            fd = open_dir_beneath(self._dir.fd, relpath)
            try:
                return sorted(os.listdir(fd))
            finally:
                os.close(fd)

    def clear(self) -> None:
        """Remove everything in the work dir (by descriptors, any depth, any rights the code set)."""
        with self._exclusive("clear"):
            if not empty_dir(self._dir.fd):
                raise ToolError(
                    explain(
                        "Sandbox.clear",
                        expected="an emptied work dir",
                        received="entries left",
                        fix="create a new Sandbox",
                    )
                )

    def disk_usage(self) -> int:
        """Bytes the work dir holds (the tmpfs's count: unlinked and ``O_TMPFILE`` files included)."""
        with self._exclusive("disk_usage"):
            return self._dir.usage()

    # -- runs -------------------------------------------------------------------------------
    def run_python(
        self, code: str, *, timeout_s: float | None = None, stdin: str | None = None
    ) -> SandboxResult:
        """Run Python source in a fresh isolated interpreter (stdlib + ``extra_paths``)."""
        require_instance(
            code,
            str,
            "Sandbox.run_python code",
            expected="a str of Python source",
            fix="pass the code as text",
            error=ToolError,
        )
        return self._run(
            {
                "mode": "python",
                "code": code,
                "extra_paths": list(self.config.extra_paths),
                "allow_subprocess": self.config.allow_subprocess,
            },
            timeout_s,
            stdin,
        )

    def run_shell(
        self, command: str, *, timeout_s: float | None = None, stdin: str | None = None
    ) -> SandboxResult:
        """Run a ``bash -c`` command line in the work dir."""
        require_instance(
            command,
            str,
            "Sandbox.run_shell command",
            expected="a str command line",
            fix="pass the command as text",
            error=ToolError,
        )
        return self.run_argv(["bash", "-c", command], timeout_s=timeout_s, stdin=stdin)

    def run_argv(
        self, argv: list[str], *, timeout_s: float | None = None, stdin: str | None = None
    ) -> SandboxResult:
        """Exec a program (looked up on a minimal PATH) in the work dir."""
        return self._run(
            {"mode": "exec", "argv": list(argv), "env": shell_env(self.workdir)}, timeout_s, stdin
        )

    async def arun_python(self, code: str, **kw) -> SandboxResult:
        return await asyncio.to_thread(self.run_python, code, **kw)

    async def arun_shell(self, command: str, **kw) -> SandboxResult:
        return await asyncio.to_thread(self.run_shell, command, **kw)

    def _run(self, extra: dict, timeout_s: float | None, stdin: str | None) -> SandboxResult:
        with self._exclusive("run"):
            try:
                return self._run_held(extra, timeout_s, stdin)
            finally:
                with self._state:
                    self._proc = None
                self._started.clear()

    def _run_held(self, extra: dict, timeout_s: float | None, stdin: str | None) -> SandboxResult:
        timeout = self.config.timeout_s if timeout_s is None else timeout_s
        cgroups = make_cgroups(self.config)
        r_fd, w_fd = os.pipe()
        spec = child_spec(self.config, self.workdir, self._dir.ns_fds, extra, w_fd, cgroups)
        start = time.perf_counter()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", CHILD, json.dumps(spec)],
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd="/",
                env=shell_env(self.workdir),
                pass_fds=(w_fd, *self._dir.ns_fds.values()),
                start_new_session=True,
            )
        except OSError as e:
            os.close(r_fd)
            os.close(w_fd)
            for path in cgroups.values():
                remove_cgroup(path)
            raise ToolError(f"sandbox could not start: {e}") from e
        with self._state:
            self._proc = proc
            closing = self._closed
        self._started.set()
        os.close(w_fd)
        readers = [
            CappedReader(proc.stdout, self.config.max_output_bytes),
            CappedReader(proc.stderr, self.config.max_output_bytes),
        ]
        for r in readers:
            r.start()
        writer = None
        if (
            stdin is not None
        ):  # fed from a thread: a program that never reads cannot hold the parent past the timeout
            writer = threading.Thread(target=feed, args=(proc.stdin, stdin.encode()), daemon=True)
            writer.start()
        timed_out, used = (False, None) if closing else self._watch(proc, start + timeout)
        kill_group(proc)
        for path in cgroups.values():
            remove_cgroup(path)
        if writer is not None:
            writer.join(timeout=2.0)
        for r in readers:
            r.join(timeout=2.0)
        for pipe in (proc.stdout, proc.stderr):
            pipe.close()
        isolation = read_status(r_fd)
        if isolation.get("refused"):
            raise SandboxUnavailableError(
                explain(
                    "Sandbox isolation",
                    expected=f"every required layer {GUARANTEES}",
                    received=f"missing {isolation['refused']}",
                    fix="run on a kernel that has it, or pass SandboxConfig(allow_missing=(...)) naming it to run "
                    "without it knowingly",
                )
            )
        isolation.setdefault("cgroups", {})
        isolation["cgroup"] = bool(
            isolation["cgroups"].get("pids")
        )  # the fork-bomb limit took effect
        isolation["disk_cap"] = self._dir.describe()
        stderr = readers[1].text()
        if used is not None:
            stderr += (
                f"\n[sandbox: the work dir reached {used / 2**20:.1f} MiB, over its cap "
                f"max_disk_mb={self.config.max_disk_mb}; the run was killed. Remove files or raise "
                f"SandboxConfig.max_disk_mb]"
            )
        elif self._dir.full():
            stderr += (
                f"\n[sandbox: the work dir is full (max_disk_mb={self.config.max_disk_mb}): writes failed "
                f"with ENOSPC. Remove files or raise SandboxConfig.max_disk_mb]"
            )
        if self._closed:
            stderr += "\n[sandbox: closed during the run; the run was killed]"
        return SandboxResult(
            stdout=readers[0].text(),
            stderr=stderr,
            exit_code=proc.returncode if not timed_out else -int(signal.SIGKILL),
            timed_out=timed_out,
            truncated=any(r.dropped for r in readers),
            duration_s=time.perf_counter() - start,
            isolation=isolation,
        )

    def _watch(self, proc: subprocess.Popen, deadline: float) -> tuple[bool, int | None]:
        """Wait for ``proc`` until ``deadline``; returns ``(timed_out, bytes used when over max_disk_mb else None)``.

        On the tmpfs the kernel enforces ``max_disk_mb``: nothing is polled. On a plain directory (the
        fallback) the tree's size is walked by descriptors every ``_DISK_POLL_S`` (longer where the walk takes
        long), so what the code writes within one interval may pass the cap before the kill, and files it
        unlinked while holding them open are not seen.
        """
        if self._dir.kind == "tmpfs":
            try:
                proc.wait(timeout=max(deadline - time.perf_counter(), 0.0))
                return False, None
            except subprocess.TimeoutExpired:
                return True, None
        cap = self.config.max_disk_mb * 2**20
        while True:
            left = deadline - time.perf_counter()
            if left <= 0:
                return True, None
            t0 = time.perf_counter()
            used = self._dir.usage(limit=cap)
            if used > cap:
                return False, used
            walk = time.perf_counter() - t0
            try:
                proc.wait(timeout=min(left, max(_DISK_POLL_S, 5 * walk)))
            except subprocess.TimeoutExpired:
                continue
            used = self._dir.usage(limit=cap)
            return False, (used if used > cap else None)

    @property
    def running(self) -> bool:
        """Whether a run's process is going now (set once it started, cleared when it is gone)."""
        return self._started.is_set()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run (its work directory is gone)."""
        return self._closed

    def close(self) -> None:
        """Kill a run in progress and wait for it, then drop the work dir and all in it; never raises.

        The tmpfs is freed by the kernel once its descriptors are closed (nothing is removed by name); a plain
        directory is emptied by descriptors (:func:`gymllm.tools.sandbox_fs.empty_dir`, any depth, any rights
        the code set). Later calls of any method but ``close`` raise ToolError.
        """
        self._close(wait_s=_CLOSE_WAIT_S)

    def _close(self, *, wait_s: float) -> None:
        with self._state:
            if self._closed:
                return
            self._closed = True  # no run or file operation starts from now on
            proc = self._proc
        if proc is not None:
            kill_group(proc, wait=False)  # the run's own thread reaps it and releases the sandbox
        if self._lock.acquire(
            timeout=wait_s
        ):  # bounded: a run thread frozen at interpreter exit never hangs it
            try:
                self._dir.close()
            finally:
                self._lock.release()

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self._close(wait_s=2.0)
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass


def run_python(
    code: str, config: SandboxConfig | None = None, *, files: Mapping[str, str] | None = None
) -> SandboxResult:
    """Run Python source once in a fresh sandbox (work dir removed afterwards)."""
    with Sandbox(config, files=files) as sb:
        return sb.run_python(code)
