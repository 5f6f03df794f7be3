"""The escape corpus, third pass: host objects no file-system rule covers, and what a run leaves behind.

Each attempt runs for real against the public API (``Sandbox``, ``SandboxConfig``), in Python mode and in
shell mode (``python -I -S -c`` exec'd through ``run_argv``: no audit hook, only the kernel layers), and
its effect is checked from outside: the parent's SysV objects unread, no IPC object left after ``close()``,
no datagram or file descriptor arriving at a host socket, the disk cap holding, the parent never blocked.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import socket
import tempfile
import threading

import pytest

from gymllm.tools import Sandbox, SandboxConfig

CFG = SandboxConfig(timeout_s=8, memory_mb=256, max_processes=24, max_output_bytes=4000)
LIBC = ctypes.CDLL(None, use_errno=True)
IPC_CREAT, IPC_RMID = 0o1000, 0
SECRET = b"ipc-secret-Qm4"

NATIVE = """
import ctypes, errno, os, sys
lib = ctypes.CDLL(None, use_errno=True)
def err():
    return errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
"""


def _run(box: Sandbox, mode: str, code: str):
    code = NATIVE + code
    res = (
        box.run_python(code)
        if mode == "python"
        else box.run_argv(["python", "-I", "-S", "-c", code])
    )
    lines = [ln[len("RESULT ") :] for ln in res.stdout.splitlines() if ln.startswith("RESULT ")]
    return res, lines


def _sysv_keys(kind: str) -> set[int]:
    with open(f"/proc/sysvipc/{kind}") as f:
        next(f)
        return {int(line.split()[0]) for line in f if line.strip()}


@pytest.fixture
def box():
    with Sandbox(CFG) as b:
        yield b


@pytest.mark.parametrize("mode,namespaces", [("python", True), ("shell", True), ("shell", False)])
def test_host_sysv_shared_memory_and_message_queue_are_unreachable(mode, namespaces):
    """With namespaces: the sandbox's own IPC namespace; without (``namespaces=False``): seccomp refuses the calls."""
    with Sandbox(dataclasses.replace(CFG, namespaces=namespaces)) as box:
        _sysv_attempt(box, mode)


def _sysv_attempt(box, mode):
    key_shm, key_msg = 0x6A11_0000 + os.getpid() % 0xFFFF, 0x6A12_0000 + os.getpid() % 0xFFFF
    shmid = LIBC.shmget(key_shm, 4096, IPC_CREAT | 0o666)
    msqid = LIBC.msgget(key_msg, IPC_CREAT | 0o666)
    assert shmid >= 0 and msqid >= 0
    LIBC.shmat.restype = ctypes.c_void_p
    addr = LIBC.shmat(shmid, None, 0)
    ctypes.memmove(addr, SECRET, len(SECRET))

    class Msg(ctypes.Structure):
        _fields_ = [("mtype", ctypes.c_long), ("mtext", ctypes.c_char * 64)]

    msg = Msg(1, SECRET)
    assert LIBC.msgsnd(msqid, ctypes.byref(msg), len(SECRET), 0) == 0
    try:
        res, lines = _run(
            box,
            mode,
            f"""
shm = lib.shmget({key_shm}, 0, 0)
if shm < 0:
    print("RESULT shm", err())
else:
    lib.shmat.restype = ctypes.c_void_p
    a = lib.shmat(shm, None, 0)
    print("RESULT shm", "ESCAPED" if a in (None, 2**64 - 1) else ctypes.string_at(a, 14))
q = lib.msgget({key_msg}, 0)
if q < 0:
    print("RESULT msg", err())
else:
    buf = ctypes.create_string_buffer(80)
    n = lib.msgrcv(q, buf, 64, 0, 0o4000)
    print("RESULT msg", err() if n < 0 else buf.raw[8:8 + n])
""",
        )
        assert len(lines) == 2, res.stderr
        for line in lines:
            assert "Qm4" not in line and "ESCAPED" not in line, line
            assert line.split()[1] in ("ENOENT", "EPERM"), line
        assert ctypes.string_at(addr, len(SECRET)) == SECRET
        got = Msg()
        assert LIBC.msgrcv(msqid, ctypes.byref(got), 64, 0, 0o4000) == len(
            SECRET
        )  # still queued: never received
    finally:
        LIBC.shmdt(ctypes.c_void_p(addr))
        LIBC.shmctl(shmid, IPC_RMID, None)
        LIBC.msgctl(msqid, IPC_RMID, None)


@pytest.mark.parametrize("mode", ["python", "shell"])
def test_ipc_objects_made_inside_do_not_outlive_the_sandbox(mode):
    key = 0x6A13_0000 + os.getpid() % 0xFFFF
    before = {k: _sysv_keys(k) for k in ("shm", "msg", "sem")}
    with Sandbox(CFG) as b:
        res, lines = _run(
            b,
            mode,
            f"""
print("RESULT", lib.shmget({key}, 4096, 0o1000 | 0o666), lib.msgget({key}, 0o1000 | 0o666),
      lib.semget({key}, 1, 0o1000 | 0o666))
""",
        )
    after = {k: _sysv_keys(k) for k in ("shm", "msg", "sem")}
    for get, rm in (
        (lambda: LIBC.shmget(key, 0, 0), LIBC.shmctl),
        (lambda: LIBC.msgget(key, 0), LIBC.msgctl),
        (lambda: LIBC.semget(key, 0, 0), LIBC.semctl),
    ):
        if (ident := get()) >= 0:
            rm(ident, IPC_RMID, None)  # tidy up what leaked, so the next case starts clean
    assert lines, res.stderr
    for kind in after:
        assert key not in after[kind] - before[kind], (
            f"a SysV {kind} object outlived close(): {lines}"
        )


@pytest.mark.parametrize("mode", ["python", "shell"])
def test_posix_message_queue_made_inside_does_not_outlive_the_sandbox(mode):
    name = f"/gymllm-mq-{os.getpid()}"
    with Sandbox(CFG) as b:
        res, lines = _run(
            b,
            mode,
            f"""
lib.mq_open.restype = ctypes.c_int
q = lib.mq_open({name.encode()!r}, os.O_CREAT | os.O_RDWR, 0o666, None)
print("RESULT", q if q >= 0 else err())
""",
        )
    assert lines, res.stderr
    rt = ctypes.CDLL("librt.so.1", use_errno=True)
    q = rt.mq_open(name.encode(), os.O_RDONLY)
    if q >= 0:
        os.close(q)
        rt.mq_unlink(name.encode())
    assert q < 0, f"a POSIX message queue made in the sandbox outlived close(): {lines}"


@pytest.fixture
def host_socket():
    d = tempfile.mkdtemp(prefix="gymllm-host-sock-")
    path = os.path.join(d, "host.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    os.chmod(path, 0o777)
    s.setblocking(False)
    try:
        yield s, path
    finally:
        s.close()
        os.unlink(path)
        os.rmdir(d)


@pytest.mark.parametrize("mode", ["python", "shell"])
def test_host_pathname_unix_socket_is_unreachable(box, host_socket, mode):
    server, path = host_socket
    box.write_files({"leak.txt": "a file descriptor passed out"})
    res, lines = _run(
        box,
        mode,
        f"""
import socket, array
out = []
try:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.sendto(b"datagram", {path!r})
    out.append("ESCAPED-sendto")
except OSError as e:
    out.append(errno.errorcode.get(e.errno, str(e)))
try:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    fd = os.open("leak.txt", os.O_RDONLY)
    a.sendmsg([b"fd"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))], 0, {path!r})
    out.append("ESCAPED-scm")
except OSError as e:
    out.append(errno.errorcode.get(e.errno, str(e)))
try:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.connect({path!r})
    a.send(b"connected")
    out.append("ESCAPED-connect")
except OSError as e:
    out.append(errno.errorcode.get(e.errno, str(e)))
try:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.sendto(b"socket", {path!r})
    out.append("ESCAPED-socket")
except OSError as e:
    out.append(errno.errorcode.get(e.errno, str(e)) if e.errno else "sandbox")
print("RESULT", *out)
""",
    )
    assert lines, res.stderr
    received = []
    while True:
        try:
            received.append(server.recvmsg(64, socket.CMSG_SPACE(16)))
        except BlockingIOError:
            break
    assert not received, f"the host socket received {received} ({lines})"
    assert "ESCAPED" not in lines[0], lines


@pytest.mark.parametrize("mode", ["python", "shell"])
def test_host_pathname_unix_socket_is_unreachable_with_network_on(host_socket, mode):
    server, path = host_socket
    with Sandbox(SandboxConfig(timeout_s=8, network=True)) as b:
        res, lines = _run(
            b,
            mode,
            f"""
import socket
try:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.sendto(b"net-on", {path!r})
    print("RESULT ESCAPED")
except OSError as e:
    print("RESULT", errno.errorcode.get(e.errno, str(e)) if e.errno else "sandbox")
""",
        )
    assert lines, res.stderr
    with pytest.raises(BlockingIOError):
        server.recv(64)
    assert "ESCAPED" not in lines[0]


@pytest.mark.parametrize("mode", ["python", "shell"])
def test_fallocate_cannot_reserve_past_the_file_cap(mode):
    with Sandbox(SandboxConfig(timeout_s=8, max_file_mb=4, max_disk_mb=16)) as b:
        res, lines = _run(
            b,
            mode,
            """
fd = os.open("big", os.O_CREAT | os.O_WRONLY, 0o644)
lib.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
r = lib.fallocate(fd, 1, 0, 256 << 20)   # FALLOC_FL_KEEP_SIZE
print("RESULT", "ESCAPED" if r == 0 else err())
""",
        )
        assert lines, res.stderr
        used = b.disk_usage()
        assert used < 16 << 20, f"{used} bytes reserved ({lines})"
        assert lines[0] in ("EOPNOTSUPP", "ENOTSUP", "EPERM", "EFBIG", "ENOSPC"), lines


def test_the_work_dir_total_size_is_capped_with_a_clear_error():
    cfg = SandboxConfig(timeout_s=20, max_file_mb=8, max_disk_mb=24)
    with Sandbox(cfg) as b:
        res = b.run_shell(
            "for i in $(seq 1 40); do head -c 8000000 /dev/zero > f$i || exit 3; done; echo done"
        )
        used = b.disk_usage()
        assert "done" not in res.stdout
        assert used < 160 << 20, used  # uncapped, the loop leaves 320 MB behind
        assert not res.ok and "max_disk_mb=24" in res.stderr, (res.stdout, res.stderr)


def test_the_timeout_covers_stdin_delivery(box):
    res = box.run_shell("sleep 30", stdin="x" * (1 << 20), timeout_s=1.0)
    assert res.timed_out, res
    assert res.duration_s < 8.0, res.duration_s


def test_a_fifo_in_the_work_dir_does_not_block_the_parent(box):
    res = box.run_shell("mkfifo pipe && echo made")
    assert "made" in res.stdout, res.stderr
    done = {}

    def attempt(name, fn):
        try:
            fn()
            done[name] = "ok"
        except Exception as e:  # noqa: BLE001 - recorded and asserted below
            done[name] = e

    threads = [
        threading.Thread(target=attempt, args=("read", lambda: box.read_file("pipe")), daemon=True),
        threading.Thread(
            target=attempt, args=("write", lambda: box.write_files({"pipe": "x"})), daemon=True
        ),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    stuck = [t for t in threads if t.is_alive()]
    assert not stuck, "read_file / write_files blocked on a FIFO"
    for name in ("read", "write"):
        assert isinstance(done[name], Exception) and "regular file" in str(done[name]), done
    assert box.run_shell("test -p pipe && echo still-a-fifo").stdout == "still-a-fifo\n"


def test_close_removes_a_very_deep_tree():
    b = Sandbox(CFG)
    res = b.run_argv(
        [
            "python",
            "-I",
            "-S",
            "-c",
            "import os\nfor i in range(1500):\n    os.mkdir('d')\n    os.chdir('d')\n"
            "open('x', 'w').write('x')\nos.chmod('.', 0)\nprint('deep')",
        ]
    )
    assert "deep" in res.stdout, res.stderr
    workdir = b.workdir
    b.close()  # must not raise
    assert b.closed and not os.path.exists(workdir)


def test_close_removes_an_unwritable_tree():
    b = Sandbox(CFG)
    res = b.run_shell("mkdir -p a/b && touch a/b/f && chmod 0 a/b && chmod 0 a && echo locked")
    assert "locked" in res.stdout, res.stderr
    workdir = b.workdir
    b.close()
    assert not os.path.exists(workdir)
