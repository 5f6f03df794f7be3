"""The parent's file access inside a sandbox's work dir, by descriptors only.

Every helper takes the work dir's own directory descriptor (``root_fd``) and a relative path, and
resolves every component beneath it without following any link, so code running in the sandbox
(which owns every name in the work dir) cannot redirect the parent outside it, not even by swapping a
directory of the path with a symbolic link between a check and an open (``renameat2(RENAME_EXCHANGE)``):

- :func:`open_beneath` opens with ``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS
  | RESOLVE_NO_XDEV)`` where the kernel has it (Linux >= 5.6; Python has no wrapper, so ``ctypes``
  calls ``syscall(437, ...)`` with a ``struct open_how``), else walks one component at a time, each
  opened relative to the last one's descriptor with ``O_NOFOLLOW | O_DIRECTORY``; ``..`` is refused
  before any call. Only regular files are opened (``O_NONBLOCK``: a FIFO never blocks the parent);
- :func:`make_parents` creates the missing directories of a path the same way (``mkdirat`` then a
  one-component open of what is there: a link swapped in is refused);
- :func:`empty_dir` removes everything beneath a directory descriptor: each level is opened from its
  parent's descriptor with ``O_NOFOLLOW`` and the walk never climbs back by name (no ``..``); levels past
  :data:`MAX_DEPTH` are moved up to the top (by descriptors) and removed from there, so any depth works
  with a bounded number of open descriptors;
- :func:`tree_usage` adds up what a tree holds, the same way (the fallback disk cap where no tmpfs exists).

``race_hook`` is a seam for tests: when set, it is called as ``race_hook(event, dir_fd, name)`` right
before each resolution (``"open"`` / ``"parents"``: the path's check is done, the open is next;
``"descend"``: :func:`empty_dir` has just opened the directory ``name`` as ``dir_fd`` and is about to
empty it), so a test performs a swap
at the worst moment deterministically instead of racing for it.
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import os
import stat
import sys
from typing import Callable

from gymllm.errors import ToolError, explain

__all__ = [
    "MAX_DEPTH",
    "openat2_available",
    "split_path",
    "open_beneath",
    "open_dir_beneath",
    "make_parents",
    "empty_dir",
    "tree_usage",
    "race_hook",
]

SYS_OPENAT2 = 437  # the same on every architecture (the unified syscall table)
RESOLVE_NO_XDEV, RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS, RESOLVE_BENEATH = (
    0x01,
    0x02,
    0x04,
    0x08,
)
RESOLVE = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV
MAX_DEPTH = 48
"""Directory levels :func:`empty_dir` holds open at once; deeper ones are moved up and removed from the top."""

race_hook: Callable[[str, int, str], None] | None = None
"""Test seam: called as ``race_hook(event, dir_fd, name)`` right before a resolution (see the module doc)."""

USE_OPENAT2: bool | None = None
"""``None``: use ``openat2`` where the kernel has it; ``False`` forces the component walk (tests cover both)."""


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
_PROBED: list[bool] = []


def _openat2(dir_fd: int, path: str, flags: int, mode: int, resolve: int) -> int:
    how = _OpenHow(
        flags=flags, mode=mode if flags & (os.O_CREAT | os.O_TMPFILE) else 0, resolve=resolve
    )
    fd = _LIBC.syscall(
        ctypes.c_long(SYS_OPENAT2),
        ctypes.c_int(dir_fd),
        os.fsencode(path),
        ctypes.byref(how),
        ctypes.c_size_t(ctypes.sizeof(how)),
    )
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return fd


def openat2_available() -> bool:
    """Whether this kernel has ``openat2`` (Linux >= 5.6), probed once."""
    if not _PROBED:
        ok = False
        if _LIBC is not None and os.uname().machine in ("x86_64", "aarch64"):
            try:
                os.close(_openat2(-100, "/", os.O_PATH | os.O_CLOEXEC, 0, 0))  # AT_FDCWD
                ok = True
            except OSError:
                ok = False
        _PROBED.append(ok)
    return _PROBED[0]


def _use_openat2() -> bool:
    return openat2_available() if USE_OPENAT2 is None else bool(USE_OPENAT2 and openat2_available())


def _refuse(
    rel: str, why: str, fix: str = "use a relative path of plain directories in the work dir"
) -> ToolError:
    return ToolError(
        explain(
            "Sandbox file path",
            expected="a path inside the work dir, without links",
            received=f"{rel!r} ({why})",
            fix=fix,
        )
    )


def split_path(rel: str) -> list[str]:
    """The components of a relative path (``.`` and empty ones dropped); ToolError for ``..``, absolute, empty."""
    if not isinstance(rel, str) or not rel or "\0" in rel:
        raise ToolError(
            explain(
                "Sandbox file path",
                expected="a non-empty str without NUL bytes",
                received=repr(rel),
                fix='e.g. "data/input.txt"',
            )
        )
    if rel.startswith("/"):
        raise _refuse(rel, "absolute", "use a path relative to the work dir")
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise _refuse(rel, "'..' leaves the directory", "use a relative path without '..'")
    if not parts:
        raise _refuse(rel, "names the work dir itself", "name a file inside the work dir")
    return parts


def _hook(event: str, dir_fd: int, name: str) -> None:
    if race_hook is not None:
        race_hook(event, dir_fd, name)


def _step(dir_fd: int, name: str, rel: str) -> int:
    """Open one directory component beneath ``dir_fd`` (``O_PATH``), refusing a link or anything else."""
    try:
        if _use_openat2():
            return _openat2(
                dir_fd, name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, 0, RESOLVE
            )
        return os.open(
            name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd
        )
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EXDEV):
            raise _refuse(rel, f"{name!r} is a link or not a directory") from None
        raise


def _walk(root_fd: int, parts: list[str], rel: str, *, create: bool) -> int:
    """A new descriptor of the directory holding ``parts[-1]``, one component at a time."""
    fd = os.dup(root_fd)
    try:
        for name in parts[:-1]:
            if create:
                try:
                    os.mkdir(name, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
            nxt = _step(fd, name, rel)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFDIR: "a directory",
    stat.S_IFLNK: "a symbolic link",
}


def _not_regular(rel: str, what: str) -> ToolError:
    return ToolError(
        explain(
            "Sandbox file",
            expected="a regular file",
            received=f"{rel!r} ({what})",
            fix="read and write only regular files in the work dir",
        )
    )


def open_beneath(
    root_fd: int, rel: str, flags: int, mode: int = 0o644, *, create_parents: bool = False
) -> int:
    """Open the regular file ``rel`` beneath ``root_fd`` without following any link; return a blocking fd.

    ``create_parents`` makes missing directories first (see :func:`make_parents`). Raises ToolError for a
    path that leaves the dir, passes a link, or names anything but a regular file; ``OSError`` otherwise
    (e.g. ``FileNotFoundError``).
    """
    parts = split_path(rel)
    flags |= os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    if create_parents:
        make_parents(root_fd, rel)
    _hook("open", root_fd, rel)
    try:
        if _use_openat2():
            fd = _openat2(root_fd, "/".join(parts), flags, mode, RESOLVE)
        else:
            dir_fd = _walk(root_fd, parts, rel, create=False)
            try:
                fd = os.open(parts[-1], flags, mode, dir_fd=dir_fd)
            finally:
                os.close(dir_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EXDEV, errno.ENOTDIR):
            raise _refuse(rel, f"a component is a link or not a directory: {e.strerror}") from None
        if e.errno in (errno.ENXIO, errno.ENODEV):  # a FIFO with no reader, a device
            raise _not_regular(rel, e.strerror) from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise _not_regular(rel, _KINDS.get(stat.S_IFMT(st.st_mode), "not a regular file"))
    os.set_blocking(fd, True)
    return fd


def open_dir_beneath(root_fd: int, rel: str) -> int:
    """A readable descriptor of the directory ``rel`` beneath ``root_fd`` (``"."``: a copy of ``root_fd``)."""
    if isinstance(rel, str) and rel.strip("/.") == "" and rel and not rel.startswith("/"):
        return os.dup(root_fd)
    parts = split_path(rel)
    _hook("open", root_fd, rel)
    dir_fd = _walk(root_fd, parts + [""], rel, create=False)  # every component a plain directory
    try:
        return os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


def make_parents(root_fd: int, rel: str) -> None:
    """Create the missing directories of ``rel`` (all but its last component) beneath ``root_fd``."""
    parts = split_path(rel)
    _hook("parents", root_fd, rel)
    os.close(_walk(root_fd, parts, rel, create=True))


def _open_dir(dir_fd: int, name: str) -> int:
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except (
        PermissionError
    ):  # the code took its own rights away: give the owner's back (by descriptor)
        path_fd = os.open(
            name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd
        )
        try:
            os.chmod(f"/proc/self/fd/{path_fd}", 0o700)
        finally:
            os.close(path_fd)
        return os.open(name, flags, dir_fd=dir_fd)


def _quietly(remove, name: str, dir_fd: int) -> None:
    try:
        remove(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


def _empty(fd: int, root_fd: int, depth: int, names) -> bool:
    """Remove what is in ``fd``; True when some deeper directory was moved up to ``root_fd`` for later."""
    try:
        os.fchmod(fd, 0o700)
    except OSError:
        pass
    moved = False
    while True:
        with os.scandir(fd) as it:
            entries = list(itertools.islice(it, 4096))
        if not entries:
            return moved
        for entry in entries:
            if not entry.is_dir(follow_symlinks=False):
                _quietly(os.unlink, entry.name, fd)
                continue
            if depth >= MAX_DEPTH:
                while True:
                    new = f".gymllm-deep-{next(names)}"
                    try:
                        os.stat(new, dir_fd=root_fd, follow_symlinks=False)
                    except FileNotFoundError:
                        break
                os.rename(entry.name, new, src_dir_fd=fd, dst_dir_fd=root_fd)
                moved = True
                continue
            try:
                sub = _open_dir(fd, entry.name)
            except FileNotFoundError:
                continue
            try:
                _hook("descend", sub, entry.name)
                moved |= _empty(sub, root_fd, depth + 1, names)
            finally:
                os.close(sub)
            _quietly(
                os.rmdir, entry.name, fd
            )  # gone: moved elsewhere in the tree, found by the next listing


def empty_dir(root_fd: int) -> bool:
    """Remove everything beneath the directory ``root_fd`` by descriptors (any depth, any rights the code set).

    Never follows a link and never climbs back by name. Returns True when the directory is empty; an
    error (e.g. a directory the parent cannot write even as its owner) stops it and returns False.
    """
    names = itertools.count()
    try:
        for _ in range(
            1_000_000
        ):  # each pass removes MAX_DEPTH levels at least; a bound never reached
            if not _empty(root_fd, root_fd, 0, names):
                break
        with os.scandir(root_fd) as it:
            return next(it, None) is None
    except OSError:
        return False


def tree_usage(root_fd: int, *, limit: int | None = None) -> int:
    """Bytes the tree beneath ``root_fd`` holds: allocated blocks of every entry plus 4 KiB per entry.

    By descriptors (levels opened from their parent's with ``O_NOFOLLOW``), iterative; levels past
    :data:`MAX_DEPTH` are not counted. Stops early once past ``limit``. Only named files count: this is
    the fallback where the work dir is not a size-limited tmpfs.
    """
    total = 0
    stack = [(os.dup(root_fd), None)]
    try:
        while stack:
            fd, it = stack[-1]
            if it is None:
                try:
                    it = iter(list(os.scandir(fd)))
                except OSError:
                    it = iter(())
                stack[-1] = (fd, it)
            entry = next(it, None)
            if entry is None:
                os.close(stack.pop()[0])
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            total += st.st_blocks * 512 + 4096
            if limit is not None and total > limit:
                return total
            if stat.S_ISDIR(st.st_mode) and len(stack) < MAX_DEPTH:
                try:
                    stack.append(
                        (
                            os.open(
                                entry.name,
                                os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                                dir_fd=fd,
                            ),
                            None,
                        )
                    )
                except OSError:
                    pass
    finally:
        for fd, _ in stack:
            os.close(fd)
    return total
