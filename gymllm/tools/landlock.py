"""Landlock through ``ctypes`` (Linux >= 5.13): confine this process's file-system access, unprivileged.

Standard library only: the sandbox's child (run as a script, ``python -I -S``) loads this file by path.

    from gymllm.tools import landlock
    landlock.abi_version()                              # 0 where the kernel lacks Landlock, else 1..7
    landlock.restrict([("/usr", landlock.READ_ACCESS), ("/tmp/box", landlock.ALL_FS_ACCESS)])

After :func:`restrict` the process and every process it starts can open files only beneath the
given paths with the given rights (a rule on a regular file allows only file rights on it). What
else :func:`restrict` makes the kernel refuse, by ABI version:

- ABI >= 2: linking or renaming a file into a directory that grants more than its source does
  (``REFER``; without it every cross-directory link or rename is refused with ``EXDEV``);
- ABI >= 3: truncating files outside the rules; ABI >= 5: ``ioctl`` on devices opened outside them;
- ABI >= 4: every TCP ``bind`` and ``connect`` (no network rule is added);
- ABI >= 6: signals to, and abstract UNIX sockets of, processes outside this Landlock domain.

Landlock also stops ``ptrace`` (and ``/proc/<pid>/mem``, ``environ``, ``root`` ... which need ptrace
access) of processes outside the domain. It does not restrict ``stat``, path traversal or
``readlink``: names and metadata stay visible, contents do not. It cannot be undone by the process.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import sys

__all__ = [
    "ALL_FS_ACCESS",
    "READ_ACCESS",
    "FILE_ACCESS",
    "LandlockError",
    "abi_version",
    "handled_fs_access",
    "restrict",
]

SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = (
    444,
    445,
    446,
)  # the same on every architecture
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = 1 << 8, 1 << 9, 1 << 10, 1 << 11, 1 << 12
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1

READ_ACCESS = EXECUTE | READ_FILE | READ_DIR
"""Read-only rights: read files, list directories, execute programs."""
FILE_ACCESS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
"""The rights that apply to a regular file (or device) itself; a file rule is masked to these."""
ALL_FS_ACCESS = (1 << 16) - 1 & ~(MAKE_CHAR | MAKE_BLOCK)
"""Everything but device nodes: read, write, create, remove, rename within, truncate."""


class LandlockError(OSError):
    """Landlock is missing or a Landlock call failed (``errno`` holds the kernel's answer)."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # the kernel's struct is __attribute__((packed)): 12 bytes
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.syscall.restype = ctypes.c_long


def _syscall(*args) -> int:
    res = _LIBC.syscall(*args)
    if res < 0:
        err = ctypes.get_errno()
        raise LandlockError(err, f"landlock syscall {args[0]}: {os.strerror(err)}")
    return res


def abi_version() -> int:
    """The kernel's Landlock ABI version, or 0 where it has none (too old, not in ``lsm=``, not Linux)."""
    if not sys.platform.startswith("linux"):
        return 0  # syscall 444 means something else elsewhere
    try:
        return _syscall(
            ctypes.c_long(SYS_CREATE_RULESET),
            None,
            ctypes.c_size_t(0),
            ctypes.c_uint32(CREATE_RULESET_VERSION),
        )
    except LandlockError as e:
        if e.errno in (errno.ENOSYS, errno.EOPNOTSUPP):
            return 0
        raise


def handled_fs_access(abi: int) -> int:
    """Every file-system right the given ABI knows (all are handled: refused unless a rule allows)."""
    rights = (1 << 13) - 1
    if abi >= 2:
        rights |= REFER
    if abi >= 3:
        rights |= TRUNCATE
    if abi >= 5:
        rights |= IOCTL_DEV
    return rights


def restrict(rules: list[tuple[str, int]], *, deny_tcp: bool = True, scope: bool = True) -> dict:
    """Confine this process (and its future children) to ``rules``: ``[(path, rights), ...]``.

    A path that does not exist is skipped. ``deny_tcp`` refuses TCP bind/connect (ABI >= 4);
    ``scope`` refuses signals and abstract UNIX sockets across the domain (ABI >= 6). Sets
    ``no_new_privs`` (needed to restrict without privileges). Returns what took effect:
    ``{"abi", "rules", "tcp", "scoped"}``. Raises :class:`LandlockError` where Landlock is missing
    or a call fails.
    """
    abi = abi_version()
    if abi < 1:
        raise LandlockError(
            errno.ENOSYS, "Landlock is not available (needs Linux >= 5.13 with landlock in lsm=)"
        )
    handled = handled_fs_access(abi)
    attr = _RulesetAttr(handled_access_fs=handled)
    size = 8
    if abi >= 4:
        attr.handled_access_net = (NET_BIND_TCP | NET_CONNECT_TCP) if deny_tcp else 0
        size = 16
    if abi >= 6:
        attr.scoped = (SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL) if scope else 0
        size = 24
    ruleset = _syscall(
        ctypes.c_long(SYS_CREATE_RULESET),
        ctypes.byref(attr),
        ctypes.c_size_t(size),
        ctypes.c_uint32(0),
    )
    added = 0
    try:
        for path, rights in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # a missing path grants nothing
            try:
                allowed = rights & handled
                if not stat.S_ISDIR(os.fstat(fd).st_mode):
                    allowed &= FILE_ACCESS
                rule = _PathBeneathAttr(allowed_access=allowed, parent_fd=fd)
                _syscall(
                    ctypes.c_long(SYS_ADD_RULE),
                    ctypes.c_int(ruleset),
                    ctypes.c_int(RULE_PATH_BENEATH),
                    ctypes.byref(rule),
                    ctypes.c_uint32(0),
                )
                added += 1
            finally:
                os.close(fd)
        if _LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            err = ctypes.get_errno()
            raise LandlockError(err, f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(err)}")
        _syscall(ctypes.c_long(SYS_RESTRICT_SELF), ctypes.c_int(ruleset), ctypes.c_uint32(0))
    finally:
        os.close(ruleset)
    return {
        "abi": abi,
        "rules": added,
        "tcp": bool(abi >= 4 and deny_tcp),
        "scoped": bool(abi >= 6 and scope),
    }
