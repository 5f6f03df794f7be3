"""The child side of the sandbox: run as a script (``python -I -S -B _sandbox_child.py``), stdlib only.

It reads a JSON spec from ``argv[1]``, then, in this order:

1. joins the ``pids`` and ``memory`` cgroups the parent made (if any): a fork bomb hits ``pids.max``
   and all processes together stay under the memory limit;
2. sets rlimits: CPU seconds, address space, file size, open files, core dumps, and (for a non-root
   user) process count;
3. joins the user and mount namespaces that hold the work dir's tmpfs (``setns`` on the descriptors the
   parent passed; ``_sandbox_keeper.py`` made them; where that fails nothing runs), then enters new mount,
   network, PID and IPC namespaces (``unshare``; a new user namespace too where the work dir is a plain
   directory): no network interface but a
   down loopback, the whole file system re-mounted read-only except the work dir, no view of the
   host's processes, and SysV IPC / POSIX message queues of its own that die with the run (best
   effort: reported, not required; without the IPC namespace seccomp refuses those calls);
4. forks the namespace's init process (which dies with this launcher: ``PR_SET_PDEATHSIG``), which
   applies the two **required** kernel layers, both unprivileged and irreversible, inherited by
   everything it starts:

   - **Landlock** (``landlock.py``): files may be opened only in the work dir (read-write) and, read-only,
     in what the interpreter and the shell need (the Python installs, ``/usr``, the libraries, a few
     ``/etc`` files, ``/proc`` only when it shows the sandbox's own PID namespace); no TCP; no signals,
     ``ptrace`` or abstract UNIX sockets reaching processes outside the sandbox;
   - **seccomp** (``seccomp.py``): no ``socket()`` of any family (with ``network``: inet only), no
     datagram ``socketpair`` (host pathname UNIX sockets unreachable), ``fallocate`` refused, no
     ``ptrace``, mounts, namespaces,
     ``io_uring``, ``bpf`` ..., and in Python mode without ``allow_subprocess`` no ``fork``/``clone``
     (threads stay) and no ``execve``: the process-count limit that holds for ``ctypes`` too;

   then empties its capability sets (``capset``) and checks the guarantees (``landlock``, ``seccomp``,
   ``process_limit``, ``signals``): one that no mechanism provides, and that the spec's ``allow_missing``
   does not name, makes it refuse to run anything (``"refused"`` in the status; the parent raises). Then
   it either execs a program (``mode == "exec"``) or runs Python code in-process under an audit hook
   (``mode == "python"``) that refuses writes outside the work dir, sockets and process creation with
   readable messages (a further layer; where the mount and network namespaces are missing it also
   refuses ``ctypes``).

What took effect is written as JSON to the status fd (closed before any untrusted code runs).
"""

from __future__ import annotations

import json
import os
import sys
import time

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
CLONE_NEWPID = 0x20000000
CLONE_NEWIPC = 0x08000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
_KEEP_FLAGS = {
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
}
PR_SET_PDEATHSIG = 1


def _libc():
    import ctypes

    return ctypes, ctypes.CDLL(None, use_errno=True)


def join_cgroup(path: str | None) -> bool:
    try:
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        return True
    except OSError:
        return False


def _count_user_processes(uid: int) -> int:
    n = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    n += 1
            except OSError:
                pass
    return n


def set_limits(limits: dict) -> dict:
    import resource

    done = {}
    table = {
        "cpu_s": resource.RLIMIT_CPU,
        "address_space_bytes": resource.RLIMIT_AS,
        "file_size_bytes": resource.RLIMIT_FSIZE,
        "open_files": resource.RLIMIT_NOFILE,
        "core_bytes": resource.RLIMIT_CORE,
    }
    for key, res in table.items():
        if limits.get(key) is not None:
            try:
                value = int(limits[key])
                resource.setrlimit(res, (value, value))
                done[key] = True
            except (ValueError, OSError):
                done[key] = False
    if limits.get("processes") is not None and os.getuid() != 0:
        # RLIMIT_NPROC counts every process of this user, and root is exempt from it.
        n = int(limits["processes"]) + _count_user_processes(os.getuid())
        try:
            resource.setrlimit(resource.RLIMIT_NPROC, (n, n))
            done["processes"] = True
        except (ValueError, OSError):
            done["processes"] = False
    return done


def _mountinfo() -> list[tuple[str, list[str]]]:
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape")
            out.append((point, fields[5].split(",")))
    return out


def join_workdir(ns_fds: dict) -> str | None:
    """Enter the user and mount namespaces holding the work dir's tmpfs (``setns``); None, or why not.

    The keeper (``_sandbox_keeper.py``) made them; its user namespace maps one unprivileged uid to the
    caller's, so this process has every capability there (needed for the namespaces made next) and
    none on the host.
    """
    try:
        ctypes, libc = _libc()
    except (ImportError, OSError) as e:
        return f"ctypes: {e}"
    for name, flag in (("user", CLONE_NEWUSER), ("mnt", CLONE_NEWNS)):
        fd = ns_fds.get(name)
        if fd is None or libc.setns(int(fd), flag) != 0:
            return f"setns({name}): {os.strerror(ctypes.get_errno())}"
        os.close(int(fd))
    return None


def drop_capabilities() -> bool:
    """Empty this process's capability sets (``capset``): the code keeps none, even in its own namespaces."""
    try:
        ctypes, libc = _libc()
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
        data = (ctypes.c_uint32 * 6)()
        return libc.capset(header, data) == 0
    except (ImportError, OSError, AttributeError):
        return False


def isolate(
    workdir: str, *, net: bool, fs: bool, pid: bool, ipc: bool = False, new_user: bool = True
) -> dict:
    """Enter new namespaces (a new user namespace too unless ``new_user=False``: already in the keeper's);
    return which isolation layers took effect."""
    status = {"net": False, "fs": False, "pid": False, "ipc": False}
    flags = (
        (CLONE_NEWNET if net else 0)
        | (CLONE_NEWNS if fs else 0)
        | (CLONE_NEWPID if pid else 0)
        | (CLONE_NEWIPC if ipc else 0)
    )
    if not flags:
        return status
    flags |= CLONE_NEWUSER if new_user else 0
    try:
        ctypes, libc = _libc()
    except (ImportError, OSError):
        return status
    if libc.unshare(flags) != 0:
        return status
    status["net"], status["pid"], status["ipc"] = net, pid, ipc
    if not fs:
        return status

    def mount(src, tgt, flags):
        return (
            libc.mount(src and src.encode(), tgt.encode(), None, ctypes.c_ulong(flags), None) == 0
        )

    # Only ever touch mounts after unshare(CLONE_NEWNS) succeeded: these are private copies.
    if not mount(None, "/", MS_REC | MS_PRIVATE) or not mount(workdir, workdir, MS_BIND | MS_REC):
        return status
    root_ok = False
    for point, opts in _mountinfo():
        if point == workdir or point.startswith(workdir.rstrip("/") + "/"):
            continue
        keep = 0
        for o in opts:
            keep |= _KEEP_FLAGS.get(o, 0)
        ok = mount(None, point, MS_REMOUNT | MS_BIND | MS_RDONLY | keep)
        if point == "/":
            root_ok = ok
    status["fs"] = root_ok
    return status


def _mount_proc() -> bool:
    """In the new PID namespace, show only its own processes under /proc (best effort)."""
    try:
        ctypes, libc = _libc()
        flags = ctypes.c_ulong(MS_NOSUID | MS_NODEV | MS_NOEXEC)
        return libc.mount(b"proc", b"/proc", b"proc", flags, None) == 0
    except (ImportError, OSError):
        return False


# ---------------------------------------------------------------- python mode: the audit hook

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PROCESS_EVENTS = {
    "os.fork",
    "os.forkpty",
    "os.system",
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "subprocess.Popen",
    "pty.spawn",
}
_NET_EVENTS = {
    "socket.__new__",
    "socket.connect",
    "socket.bind",
    "socket.getaddrinfo",
    "socket.sendto",
}
_PATH_EVENTS = {
    "os.remove": (0,),
    "os.rename": (0, 1),
    "os.mkdir": (0,),
    "os.rmdir": (0,),
    "os.symlink": (1,),
    "os.link": (1,),
    "os.chmod": (0,),
    "os.chown": (0,),
    "os.truncate": (0,),
    "os.utime": (0,),
    "shutil.rmtree": (0,),
    "shutil.copyfile": (1,),
    "shutil.move": (1,),
    "os.mkfifo": (0,),
    "os.mknod": (0,),
}


def install_audit_hook(
    workdir: str, *, allow_subprocess: bool, allow_network: bool, allow_ctypes: bool
) -> None:
    import threading

    root = os.path.realpath(workdir)
    state = threading.local()
    realpath, join, getcwd = os.path.realpath, os.path.join, os.getcwd

    def inside(path) -> bool:
        if isinstance(path, int):
            return True  # an already-open fd
        if isinstance(path, bytes):
            path = path.decode(errors="replace")
        if not isinstance(path, str):
            path = os.fspath(path)
        full = realpath(join(getcwd(), path))
        return full == root or full.startswith(root + os.sep)

    def refuse(what: str, exc=PermissionError):
        raise exc(
            f"sandbox: {what} is not allowed (only the work dir {root} is writable; no network; no new processes)"
        )

    def hook(event: str, args: tuple) -> None:
        if getattr(state, "busy", False):
            return
        state.busy = True
        try:
            if event == "open":
                path, mode, flags = (tuple(args) + (None, None))[:3]
                writing = (isinstance(flags, int) and flags & _WRITE_FLAGS) or (
                    isinstance(mode, str) and any(c in mode for c in "wax+")
                )
                if writing and not inside(path):
                    refuse(f"writing {path!r}")
                if not isinstance(path, int) and not inside(path) and os.path.isdir(path):
                    refuse(f"opening the directory {path!r}")  # a dir fd would allow dir_fd= writes
            elif event in _PATH_EVENTS:
                for i in _PATH_EVENTS[event]:
                    if i < len(args) and args[i] is not None and not inside(args[i]):
                        refuse(f"{event} on {args[i]!r}")
            elif event in _NET_EVENTS and not allow_network:
                refuse(f"network access ({event})", OSError)
            elif event in _PROCESS_EVENTS and not allow_subprocess:
                refuse(f"starting a process ({event})")
            elif (
                event == "import" and args and args[0] in ("ctypes", "_ctypes") and not allow_ctypes
            ):
                refuse("importing ctypes", ImportError)
            elif (
                event == "import"
                and args
                and args[0] == "_posixsubprocess"
                and not allow_subprocess
            ):
                refuse(
                    "starting a process (_posixsubprocess)", ImportError
                )  # a fresh copy of the real fork_exec
        finally:
            state.busy = False

    sys.addaudithook(hook)


def run_python(code: str, spec: dict) -> int:
    import traceback

    for p in spec.get("extra_paths", []):
        sys.path.append(p)
    if not spec.get("allow_subprocess", False):
        import _posixsubprocess  # subprocess's fork_exec raises no audit event: replace it (re-imports refused)

        def fork_exec(*args, **kwargs):
            raise PermissionError("sandbox: starting a process (fork_exec) is not allowed")

        _posixsubprocess.fork_exec = fork_exec
    for name in [m for m in sys.modules if m in ("ctypes", "_ctypes") or m.startswith("ctypes.")]:
        del sys.modules[
            name
        ]  # the launcher used ctypes; the code must import it afresh (and be refused)
    install_audit_hook(
        spec["workdir"],
        allow_subprocess=spec.get("allow_subprocess", False),
        allow_network=spec.get("network", False),
        allow_ctypes=spec.get("allow_ctypes", False),
    )
    sys.argv = ["main.py"]
    globs = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(compile(code, "main.py", "exec"), globs)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException as e:  # noqa: BLE001 - report every error as a traceback on stderr
        traceback.print_exception(type(e), e, e.__traceback__.tb_next)
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return 0


# ---------------------------------------------------------------- the required kernel layers

_HERE = os.path.dirname(os.path.abspath(__file__))
SYSTEM_READ_DIRS = (
    "/usr",
    "/lib",
    "/lib64",
    "/lib32",
    "/libx32",
    "/bin",
    "/sbin",
    "/sys/devices/system/cpu",
)
SYSTEM_READ_FILES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/host.conf",
    "/etc/os-release",
    "/etc/mime.types",
    "/etc/gitconfig",
    "/dev/urandom",
    "/dev/random",
)
NETWORK_READ_FILES = (
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/gai.conf",
    "/etc/services",
    "/etc/protocols",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/pki",
)  # only with SandboxConfig(network=True)
DEVICES_RW = ("/dev/null", "/dev/zero", "/dev/full")
GUARANTEES = ("landlock", "seccomp", "process_limit", "signals")


def _load(name: str):
    """Import a stdlib-only sibling module (``landlock.py``, ``seccomp.py``): gymllm is not importable here.

    A plain import from this directory reads the ``__pycache__`` the parent's own import wrote
    (compiling the source each run costs ~10-20 ms); the names leave ``sys.path`` and
    ``sys.modules`` at once, so the code's own ``import seccomp`` finds no stray module.
    """
    import importlib

    sys.path.insert(0, _HERE)
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(_HERE)
        sys.modules.pop(name, None)


def read_only_paths(spec: dict, *, own_proc: bool) -> list[str]:
    """What the interpreter and the shell need to read: the Python installs, system libraries, a few files."""
    python = {
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        sys.base_exec_prefix,
        os.path.dirname(os.path.realpath(sys.executable)),
        *spec.get("python_paths", []),
    }
    python.discard("/")  # an interpreter "installed" at / must not open the whole file system
    paths = python | set(SYSTEM_READ_DIRS) | set(SYSTEM_READ_FILES)
    paths.update(spec.get("extra_paths", []))
    paths.update(spec.get("read_paths", []))  # the caller's explicit choice
    if spec.get("network", False):
        paths.update(NETWORK_READ_FILES)
    if own_proc:
        paths.add("/proc")  # the sandbox's own PID namespace: only its own processes are listed
    return sorted(p for p in paths if p)


def apply_kernel_layers(spec: dict, status: dict) -> None:
    """Landlock, then seccomp (last: it forbids the mounts done before). Records each in ``status``."""
    workdir = spec["workdir"]
    python_mode = spec["mode"] == "python"
    no_processes = python_mode and not spec.get("allow_subprocess", False)
    try:
        ll, sc = (
            _load("landlock"),
            _load("seccomp"),
        )  # both loaded before Landlock hides this directory
    except OSError as e:
        ll = sc = None
        status["landlock_error"] = status["seccomp_error"] = f"cannot load the layer modules: {e}"
    try:
        if ll is None:
            raise OSError(status["landlock_error"])
        rules = [(workdir, ll.ALL_FS_ACCESS)]
        rules += [
            (p, ll.READ_ACCESS) for p in read_only_paths(spec, own_proc=bool(status.get("proc")))
        ]
        rules += [(p, ll.READ_FILE | ll.WRITE_FILE) for p in DEVICES_RW]
        status["landlock"] = ll.restrict(rules, deny_tcp=not spec.get("network", False), scope=True)
    except OSError as e:
        status["landlock"] = False
        status["landlock_error"] = str(e)
    try:
        if sc is None:
            raise OSError(status["seccomp_error"])
        # SysV IPC and POSIX message queues only inside a private IPC namespace (it dies with the run)
        status["seccomp"] = sc.install(
            network=spec.get("network", False),
            processes=not no_processes,
            ipc=bool(status.get("ipc")),
        )
    except OSError as e:
        status["seccomp"] = False
        status["seccomp_error"] = str(e)
    if no_processes and status["seccomp"]:
        status["process_limit"] = "seccomp (no fork, clone or exec)"
    elif (status.get("cgroups") or {}).get("pids"):
        status["process_limit"] = "pids cgroup"
    elif (status.get("limits") or {}).get("processes"):
        status["process_limit"] = "RLIMIT_NPROC"
    else:
        status["process_limit"] = False
    if status["landlock"] and status["landlock"].get("scoped"):
        status["signals"] = "landlock scope"
    elif status.get("pid"):
        status["signals"] = "pid namespace"
    else:
        status["signals"] = False


_WHY = {
    "landlock": "file-system confinement (Landlock: Linux >= 5.13 with landlock in the lsm= boot list)",
    "seccomp": "the syscall filter (seccomp: CONFIG_SECCOMP_FILTER, on x86_64 or aarch64)",
    "process_limit": "a process-count limit (a writable pids cgroup for root, or RLIMIT_NPROC as a non-root user)",
    "signals": "signal isolation (Landlock ABI >= 6, Linux >= 6.12, or a PID namespace)",
}


def missing_guarantees(status: dict, allow_missing) -> list[str]:
    return [g for g in GUARANTEES if not status.get(g) and g not in allow_missing]


def refusal(status: dict, missing: list[str]) -> str:
    parts = []
    for g in missing:
        detail = status.get(f"{g}_error")
        parts.append(f"{g}: {_WHY[g]} is unavailable" + (f" [{detail}]" if detail else ""))
    return "; ".join(parts)


def _write_status(fd, status: dict) -> None:
    if fd is not None:
        os.write(fd, json.dumps(status).encode())
        os.close(fd)


def main() -> None:
    spec = json.loads(sys.argv[1])
    workdir = spec["workdir"]
    status = {
        "cgroups": {name: join_cgroup(path) for name, path in (spec.get("cgroups") or {}).items()}
    }
    status["limits"] = set_limits(spec.get("limits", {}))
    fd = spec.get("status_fd")
    ns_fds = spec.get("ns_fds") or {}
    if ns_fds:
        why = join_workdir(ns_fds)
        if (
            why is not None
        ):  # the tmpfs would be missing: run nothing rather than in the empty host directory
            status["refused"] = f"workdir: cannot enter the work dir's namespaces ({why})"
            _write_status(fd, status)
            os._exit(126)
    iso = spec.get("isolate", {})
    status.update(
        isolate(
            workdir,
            net=iso.get("net", True),
            fs=iso.get("fs", True),
            pid=iso.get("pid", True),
            ipc=iso.get("ipc", True),
            new_user=not ns_fds,
        )
    )
    child = os.fork()
    if child == 0:
        try:
            ctypes, libc = _libc()
            libc.prctl(PR_SET_PDEATHSIG, 9)
        except (ImportError, OSError):
            pass
        status["proc"] = bool(status.get("pid") and status.get("fs") and _mount_proc())
        os.chdir(workdir)
        t0 = time.perf_counter()
        apply_kernel_layers(spec, status)
        status["layers_ms"] = round(
            (time.perf_counter() - t0) * 1000, 2
        )  # what Landlock + seccomp cost
        missing = missing_guarantees(status, spec.get("allow_missing", ()))
        if missing:
            status["refused"] = refusal(status, missing)
            _write_status(fd, status)
            os._exit(126)
        status["capabilities_dropped"] = drop_capabilities()
        _write_status(fd, status)  # closed: the code cannot forge the report
        if spec["mode"] == "python":
            # ctypes can call libc around the audit hook; allow it (sympy needs it) only where the kernel
            # already makes the file system read-only and the network absent.
            spec["allow_ctypes"] = bool(
                status.get("fs") and (status.get("net") or spec.get("network"))
            )
            os._exit(run_python(spec["code"], spec))
        env = spec.get("env") or {}
        try:
            os.execvpe(spec["argv"][0], spec["argv"], env)
        except OSError as e:
            sys.stderr.write(f"sandbox: cannot run {spec['argv'][0]!r}: {e}\n")
            os._exit(127)
    if fd is not None:
        os.close(fd)
    while True:
        pid, st = os.waitpid(child, 0)
        if pid == child:
            break
    os._exit(os.waitstatus_to_exitcode(st) if os.WIFEXITED(st) else 128 + os.WTERMSIG(st))


if __name__ == "__main__":
    main()
