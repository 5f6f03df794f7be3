"""A sandbox's work dir: a private, size-limited tmpfs that only its own runs can see, held by descriptors.

Where user namespaces are allowed (unprivileged, or as root), a short-lived *keeper* process
(``_sandbox_keeper.py``) enters a new user + mount namespace, maps one unprivileged
uid (``INNER_UID``) to the caller's, mounts a tmpfs of ``max_disk_mb`` (``size=``, and ``nr_inodes=``
one per 4 KiB) on the work dir's path there, and waits. The parent opens the namespaces
(``/proc/<pid>/ns/user``, ``ns/mnt``) and the tmpfs's root directory (through ``/proc/<pid>/root``),
then lets the keeper exit: the descriptors keep the namespaces and the tmpfs alive. So:

- ``max_disk_mb`` is the kernel's: every page the code holds counts, named or not (unlinked-but-open
  files, ``O_TMPFILE``, sparse files' written pages); past it writes fail with ``ENOSPC``. The pages live
  in memory (tmpfs) and are charged to the memory cgroup of the run that writes them;
- every run joins those namespaces (``setns``) and sees the tmpfs at :attr:`WorkDir.path`; on the host
  that path is an empty directory: no other process, and no other sandbox, sees a name in it;
- the parent reaches files only through :attr:`WorkDir.fd` (:mod:`gymllm.tools.sandbox_fs`), and
  :meth:`WorkDir.close` drops the descriptors: the kernel frees the tmpfs once no process holds it, so
  nothing is removed by name.

Elsewhere (no user namespaces, or ``namespaces=False``) the work dir is a plain directory (``kind ==
"directory"``, with ``reason`` saying why): the parent polls its size by descriptors
(:func:`gymllm.tools.sandbox_fs.tree_usage`) and :meth:`close` empties it by descriptors.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from gymllm.tools import sandbox_fs

__all__ = ["KEEPER_SCRIPT", "INNER_UID", "WorkDir"]

KEEPER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sandbox_keeper.py")
INNER_UID = 1000
"""The uid (and gid) the code runs as inside its user namespace: not root there, no capabilities."""
_KEEPER_TIMEOUT_S = 20.0


class WorkDir:
    """The work dir of one :class:`~gymllm.tools.sandbox.Sandbox` (see the module doc).

    Args:
        max_disk_mb: the tmpfs's size.
        namespaces: try the private tmpfs (False: a plain directory).
    """

    def __init__(self, *, max_disk_mb: int, namespaces: bool = True):
        self.path = os.path.realpath(tempfile.mkdtemp(prefix="gymllm-sandbox-"))
        self.max_disk_mb = max_disk_mb
        self.kind = "directory"
        self.reason: str | None = "namespaces=False" if not namespaces else None
        self.ns_fds: dict[str, int] = {}
        self.fd = -1
        if namespaces:
            try:
                self._mount_private_tmpfs()
            except OSError as e:
                self.reason = f"no private tmpfs: {e}"
        if self.fd < 0:
            self.fd = os.open(
                self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
            )

    def _mount_private_tmpfs(self) -> None:
        spec = {
            "workdir": self.path,
            "size_mb": self.max_disk_mb,
            "inodes": max(1024, self.max_disk_mb * 256),
            "inner_uid": INNER_UID,
        }
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", KEEPER_SCRIPT, json.dumps(spec)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                cwd="/",
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            )
        except OSError as e:
            raise OSError(e.errno, f"cannot start the keeper: {e}") from None
        opened: dict[str, int] = {}
        try:
            line = proc.stdout.readline().decode(errors="replace").strip()
            if line != "ready":
                raise OSError(0, line or "the keeper exited without a word")
            for name in ("user", "mnt"):
                opened[name] = os.open(f"/proc/{proc.pid}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC)
            root = os.open(
                f"/proc/{proc.pid}/root{self.path}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
            )
            if os.fstat(root).st_dev == os.stat(self.path).st_dev:
                os.close(root)
                raise OSError(0, "the keeper's mount did not take")
        except BaseException:
            for fd in opened.values():
                os.close(fd)
            raise
        finally:
            try:
                proc.stdin.close()
                proc.stdout.close()
            except OSError:
                pass
            try:
                proc.wait(timeout=_KEEPER_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.ns_fds, self.fd, self.kind, self.reason = opened, root, "tmpfs", None

    def usage(self, *, limit: int | None = None) -> int:
        """Bytes in use: the tmpfs's own count (every page, named or not), else the named files' (a walk)."""
        if self.kind == "tmpfs":
            st = os.fstatvfs(self.fd)
            return (st.f_blocks - st.f_bfree) * st.f_frsize
        return sandbox_fs.tree_usage(self.fd, limit=limit)

    def full(self) -> bool:
        """Whether the tmpfs has no room left (no free block or no free inode)."""
        if self.kind != "tmpfs":
            return False
        st = os.fstatvfs(self.fd)
        return st.f_bavail * st.f_frsize < 64 * 1024 or st.f_favail == 0

    def describe(self) -> str:
        """For ``SandboxResult.isolation["disk_cap"]``: how ``max_disk_mb`` is enforced."""
        if self.kind == "tmpfs":
            return "tmpfs (kernel)"
        return f"poll ({self.reason})" if self.reason else "poll"

    def close(self) -> bool:
        """Drop the work dir (tmpfs: the descriptors; directory: its contents by descriptors), then remove the
        empty host directory. True when it is gone. Never raises."""
        ok = True
        if self.fd >= 0:
            if self.kind == "directory":
                ok = sandbox_fs.empty_dir(self.fd)
            os.close(self.fd)
            self.fd = -1
        for fd in self.ns_fds.values():
            os.close(fd)
        self.ns_fds = {}
        try:
            os.rmdir(self.path)
        except FileNotFoundError:
            pass
        except OSError:
            ok = False
        return ok and not os.path.lexists(self.path)
