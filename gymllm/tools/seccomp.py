"""A small seccomp-BPF syscall filter built by hand and installed through ``ctypes`` (unprivileged).

Standard library only: the sandbox's child (run as a script, ``python -I -S``) loads this file by path.

    from gymllm.tools import seccomp
    seccomp.available()                                   # True where the kernel has SECCOMP_MODE_FILTER
    seccomp.install(network=False, processes=False)       # this process and its children, irreversibly

The filter is a deny list (an interpreter needs hundreds of ordinary syscalls); every refusal returns
``EPERM`` unless noted. Always refused: ``ptrace`` and ``process_vm_readv/writev``, every mount and
namespace call (``mount``, ``umount2``, ``pivot_root``, ``chroot``, ``unshare``, ``setns``, the new
mount API), ``bpf``, ``perf_event_open``, ``io_uring_*`` (its operations bypass seccomp), kernel
modules and ``kexec``, keyrings, ``userfaultfd``, ``open_by_handle_at``, clock and host-name
changes, ``syslog``, ``pidfd_getfd``, ``process_madvise``, the ``TIOCSTI``/``TIOCLINUX`` ioctls
(typing into a terminal), ``inotify_init``/``inotify_init1`` and ``fanotify_init`` (a watch on a shared
directory would show another sandbox's activity, and instances count against the uid's host-wide
limit), the x32 ABI and any other architecture's syscalls (the process is killed).
With ``network=False``: ``socket()`` of every family; with ``network=True`` every family but ``AF_INET``
and ``AF_INET6`` (no ``AF_UNIX``: host pathname sockets stay out of reach). Always: ``socketpair`` of
any type but ``SOCK_STREAM`` and ``SOCK_SEQPACKET`` (a connected stream pair reaches no one, while a
datagram pair can ``sendto`` any pathname socket and pass descriptors out through it), and
``fallocate`` answers ``EOPNOTSUPP`` (``FALLOC_FL_KEEP_SIZE`` reserves blocks past ``RLIMIT_FSIZE``;
``posix_fallocate`` falls back to writes, which the limit caps). File locks cannot carry a message between sandboxes: ``flock`` and the ``fcntl`` commands that set a
record lock (``F_SETLK``, ``F_SETLKW``, ``F_OFD_SETLK``, ``F_OFD_SETLKW``) answer 0 *without taking a
lock* (no lock exists for another process to see, so SQLite and other single-process lock users keep
working; processes of one sandbox cannot exclude each other through locks either), the lock queries
(``F_GETLK``, ``F_OFD_GETLK``) answer ``ENOLCK``, and leases and directory notification (``F_SETLEASE``,
``F_GETLEASE``, ``F_NOTIFY``) ``EPERM``. With ``ipc=False`` (no private IPC
namespace): the SysV IPC calls (``shm*``, ``msg*``, ``sem*``) and POSIX message queues (``mq_*``).
With ``processes=False``: ``fork``, ``vfork``, ``clone`` without ``CLONE_THREAD`` (threads stay),
``execve``, ``execveat``; ``clone3`` returns ``ENOSYS`` so that libc falls back to ``clone``, whose
flags the filter can read.

Syscall numbers are tabled for x86_64 and aarch64 (tests check them against libseccomp's where it is
installed); elsewhere :func:`install` raises :class:`SeccompError`.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import sys

__all__ = ["SeccompError", "SYSCALLS", "available", "build_filter", "install"]

PR_SET_NO_NEW_PRIVS, PR_GET_SECCOMP, PR_SET_SECCOMP = 38, 21, 22
SECCOMP_MODE_FILTER = 2
SECCOMP_GET_ACTION_AVAIL = 2
RET_KILL_PROCESS, RET_ALLOW, RET_ERRNO = 0x80000000, 0x7FFF0000, 0x00050000
LD_W_ABS, JEQ_K, JGE_K, JSET_K, RET_K, AND_K = 0x20, 0x15, 0x35, 0x45, 0x06, 0x54
AF_INET, AF_INET6 = 2, 10
SOCK_STREAM, SOCK_SEQPACKET, SOCK_TYPE_MASK = 1, 5, 0xF
OFF_NR, OFF_ARCH = 0, 4
CLONE_THREAD = 0x00010000
TIOCSTI, TIOCLINUX = 0x5412, 0x541C
X32_SYSCALL_BIT = 0x40000000

_ALWAYS = (
    "ptrace process_vm_readv process_vm_writev mount umount2 pivot_root chroot unshare setns bpf "
    "perf_event_open kexec_load kexec_file_load init_module finit_module delete_module reboot swapon "
    "swapoff keyctl add_key request_key userfaultfd io_uring_setup io_uring_enter io_uring_register "
    "open_by_handle_at name_to_handle_at quotactl quotactl_fd acct settimeofday clock_settime "
    "clock_adjtime adjtimex syslog fsopen fsconfig fsmount fspick move_mount open_tree mount_setattr "
    "pidfd_getfd process_madvise vhangup sethostname setdomainname lookup_dcookie iopl ioperm uselib "
    "inotify_init inotify_init1 fanotify_init"
).split()
F_GETLK, F_SETLK, F_SETLKW, F_OFD_GETLK, F_OFD_SETLK, F_OFD_SETLKW = 5, 6, 7, 36, 37, 38
F_SETLEASE, F_GETLEASE, F_NOTIFY = 1024, 1025, 1026
LOCK_SETS = (F_SETLK, F_SETLKW, F_OFD_SETLK, F_OFD_SETLKW)
"""``fcntl`` commands that take or drop a record lock: accepted and not performed (see the module doc)."""
_IPC = (
    "shmget shmat shmctl shmdt msgget msgsnd msgrcv msgctl semget semop semtimedop semctl mq_open mq_unlink "
    "mq_timedsend mq_timedreceive mq_notify mq_getsetattr"
).split()

_UNIFIED = dict(  # numbered alike on every architecture (the syscalls added since Linux 5.1)
    io_uring_setup=425,
    io_uring_enter=426,
    io_uring_register=427,
    open_tree=428,
    move_mount=429,
    fsopen=430,
    fsconfig=431,
    fsmount=432,
    fspick=433,
    clone3=435,
    pidfd_getfd=438,
    process_madvise=440,
    mount_setattr=442,
    quotactl_fd=443,
)

_GENERIC = dict(  # asm-generic/unistd.h (aarch64)
    ptrace=117,
    process_vm_readv=270,
    process_vm_writev=271,
    mount=40,
    umount2=39,
    pivot_root=41,
    chroot=51,
    unshare=97,
    setns=268,
    bpf=280,
    perf_event_open=241,
    kexec_load=104,
    kexec_file_load=294,
    init_module=105,
    finit_module=273,
    delete_module=106,
    reboot=142,
    swapon=224,
    swapoff=225,
    keyctl=219,
    add_key=217,
    request_key=218,
    userfaultfd=282,
    open_by_handle_at=265,
    name_to_handle_at=264,
    quotactl=60,
    acct=89,
    settimeofday=170,
    clock_settime=112,
    clock_adjtime=266,
    adjtimex=171,
    syslog=116,
    vhangup=58,
    sethostname=161,
    setdomainname=162,
    lookup_dcookie=18,
    inotify_init1=26,
    fanotify_init=262,
    flock=32,
    fcntl=25,
    socket=198,
    clone=220,
    execve=221,
    execveat=281,
    ioctl=29,
    socketpair=199,
    fallocate=47,
    mq_open=180,
    mq_unlink=181,
    mq_timedsend=182,
    mq_timedreceive=183,
    mq_notify=184,
    mq_getsetattr=185,
    msgget=186,
    msgctl=187,
    msgrcv=188,
    msgsnd=189,
    semget=190,
    semctl=191,
    semtimedop=192,
    semop=193,
    shmget=194,
    shmctl=195,
    shmat=196,
    shmdt=197,
    **_UNIFIED,
)

_X86_64 = dict(
    ptrace=101,
    process_vm_readv=310,
    process_vm_writev=311,
    mount=165,
    umount2=166,
    pivot_root=155,
    chroot=161,
    unshare=272,
    setns=308,
    bpf=321,
    perf_event_open=298,
    kexec_load=246,
    kexec_file_load=320,
    init_module=175,
    finit_module=313,
    delete_module=176,
    reboot=169,
    swapon=167,
    swapoff=168,
    keyctl=250,
    add_key=248,
    request_key=249,
    userfaultfd=323,
    open_by_handle_at=304,
    name_to_handle_at=303,
    quotactl=179,
    acct=163,
    settimeofday=164,
    clock_settime=227,
    clock_adjtime=305,
    adjtimex=159,
    syslog=103,
    vhangup=153,
    sethostname=170,
    setdomainname=171,
    lookup_dcookie=212,
    iopl=172,
    ioperm=173,
    uselib=134,
    inotify_init=253,
    inotify_init1=294,
    fanotify_init=300,
    flock=73,
    fcntl=72,
    socket=41,
    fork=57,
    vfork=58,
    clone=56,
    execve=59,
    execveat=322,
    ioctl=16,
    socketpair=53,
    fallocate=285,
    shmget=29,
    shmat=30,
    shmctl=31,
    shmdt=67,
    semget=64,
    semop=65,
    semctl=66,
    msgget=68,
    msgsnd=69,
    msgrcv=70,
    msgctl=71,
    semtimedop=220,
    mq_open=240,
    mq_unlink=241,
    mq_timedsend=242,
    mq_timedreceive=243,
    mq_notify=244,
    mq_getsetattr=245,
    **_UNIFIED,
)

SYSCALLS = {"x86_64": (0xC000003E, _X86_64), "aarch64": (0xC00000B7, _GENERIC)}
"""``{machine: (AUDIT_ARCH_*, {syscall name: number})}``: the syscalls the filter names."""


class SeccompError(OSError):
    """seccomp is missing, the architecture has no syscall table here, or installing the filter failed."""


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def _arg_low(i: int) -> int:
    return 16 + 8 * i  # seccomp_data.args[i], low 32 bits (little-endian)


def _only_args(
    nr: int, arg: int, allowed: tuple[int, ...], deny: int, mask: int | None = None
) -> list[bytes]:
    """For syscall ``nr``: go on only where ``args[arg]`` (masked) is one of ``allowed``, else return ``deny``."""
    body = [_insn(LD_W_ABS, _arg_low(arg))] + ([_insn(AND_K, mask)] if mask is not None else [])
    body += [_insn(JEQ_K, v, len(allowed) - i, 0) for i, v in enumerate(allowed)]
    body += [_insn(RET_K, deny), _insn(LD_W_ABS, OFF_NR)]
    return [_insn(JEQ_K, nr, 0, len(body))] + body


def _fcntl_rules(nr: int) -> list[bytes]:
    """``fcntl``: lock commands answer 0 without locking; lock queries ``ENOLCK``; leases and ``F_NOTIFY`` ``EPERM``."""
    answers = [(c, RET_ERRNO | 0) for c in LOCK_SETS] + [
        (c, RET_ERRNO | errno.ENOLCK) for c in (F_GETLK, F_OFD_GETLK)
    ]
    answers += [(c, RET_ERRNO | errno.EPERM) for c in (F_SETLEASE, F_GETLEASE, F_NOTIFY)]
    body = [_insn(LD_W_ABS, _arg_low(1))]
    for cmd, ret in answers:
        body += [_insn(JEQ_K, cmd, 0, 1), _insn(RET_K, ret)]
    body.append(_insn(LD_W_ABS, OFF_NR))
    return [_insn(JEQ_K, nr, 0, len(body))] + body


def build_filter(
    *, network: bool, processes: bool, ipc: bool = False, machine: str | None = None
) -> bytes:
    """The BPF program (``struct sock_filter[]`` bytes) for the given policy and architecture."""
    machine = machine or os.uname().machine
    if machine not in SYSCALLS:
        raise SeccompError(
            errno.ENOSYS,
            f"no seccomp syscall table for the {machine!r} architecture "
            f"(known: {sorted(SYSCALLS)})",
        )
    arch, nr = SYSCALLS[machine]
    eperm, allow = RET_ERRNO | errno.EPERM, RET_ALLOW
    prog = [
        _insn(LD_W_ABS, OFF_ARCH),
        _insn(JEQ_K, arch, 1, 0),
        _insn(RET_K, RET_KILL_PROCESS),
        _insn(LD_W_ABS, OFF_NR),
    ]
    if machine == "x86_64":
        prog += [_insn(JGE_K, X32_SYSCALL_BIT, 0, 1), _insn(RET_K, eperm)]
    denied = [n for n in _ALWAYS if n in nr]
    if not network:
        denied.append("socket")
    if not ipc:
        denied += [n for n in _IPC if n in nr]
    if not processes:
        denied += [n for n in ("fork", "vfork", "execve", "execveat") if n in nr]
    for name in denied:
        prog += [_insn(JEQ_K, nr[name], 0, 1), _insn(RET_K, eperm)]
    if not processes:
        prog += [
            _insn(JEQ_K, nr["clone3"], 0, 1),
            _insn(RET_K, RET_ERRNO | errno.ENOSYS),
            _insn(JEQ_K, nr["clone"], 0, 4),
            _insn(LD_W_ABS, _arg_low(0)),
            _insn(JSET_K, CLONE_THREAD, 0, 1),
            _insn(RET_K, allow),
            _insn(RET_K, eperm),
            _insn(LD_W_ABS, OFF_NR),
        ]
    prog += [_insn(JEQ_K, nr["fallocate"], 0, 1), _insn(RET_K, RET_ERRNO | errno.EOPNOTSUPP)]
    prog += [
        _insn(JEQ_K, nr["flock"], 0, 1),
        _insn(RET_K, RET_ERRNO | 0),
    ]  # no lock is taken: nothing to observe
    prog += _fcntl_rules(nr["fcntl"])
    if network:
        prog += _only_args(nr["socket"], 0, (AF_INET, AF_INET6), eperm)
    prog += _only_args(nr["socketpair"], 1, (SOCK_STREAM, SOCK_SEQPACKET), eperm, SOCK_TYPE_MASK)
    prog += [
        _insn(JEQ_K, nr["ioctl"], 0, 5),
        _insn(LD_W_ABS, _arg_low(1)),
        _insn(JEQ_K, TIOCSTI, 2, 0),
        _insn(JEQ_K, TIOCLINUX, 1, 0),
        _insn(RET_K, allow),
        _insn(RET_K, eperm),
    ]
    prog.append(_insn(RET_K, allow))
    return b"".join(prog)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_LIBC = ctypes.CDLL(None, use_errno=True)


def available() -> bool:
    """Whether the kernel has seccomp filter mode (``CONFIG_SECCOMP_FILTER``) and this architecture a table."""
    if not sys.platform.startswith("linux") or os.uname().machine not in SYSCALLS:
        return False
    return _LIBC.prctl(PR_GET_SECCOMP, 0, 0, 0, 0) >= 0  # -1 (EINVAL) without CONFIG_SECCOMP


def install(*, network: bool, processes: bool, ipc: bool = False) -> dict:
    """Set ``no_new_privs`` and install the filter on this (single-threaded) process; irreversible.

    ``ipc=True`` lets SysV IPC and POSIX message queues through (only where a private IPC namespace
    holds them). Returns ``{"instructions": n, "network": network, "processes": processes, "ipc": ipc}``. Raises
    :class:`SeccompError` where the kernel refuses.
    """
    if not sys.platform.startswith("linux"):
        raise SeccompError(errno.ENOSYS, f"seccomp is Linux-only (this is {sys.platform})")
    prog = build_filter(network=network, processes=processes, ipc=ipc)
    buf = ctypes.create_string_buffer(prog, len(prog))
    fprog = _SockFprog(len=len(prog) // 8, filter=ctypes.cast(buf, ctypes.c_void_p))
    if _LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise SeccompError(err, f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(err)}")
    if _LIBC.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise SeccompError(err, f"prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER): {os.strerror(err)}")
    return {"instructions": len(prog) // 8, "network": network, "processes": processes, "ipc": ipc}
