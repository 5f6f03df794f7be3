"""The sandbox's escape corpus: each attempt runs for real in a short sandbox and must be refused with its
expected error (an errno name, or ``sandbox`` for the audit hook's readable refusal), with its side effect
checked from outside (the secret never printed, no file created outside, the victim process alive, no
connection accepted). Native attempts go through ``ctypes`` (libc or raw syscalls) around every Python-level
check, in Python mode (the namespace init with its audit hook) and again in shell mode (``python -I -S -c``
exec'd through ``run_argv``, the shell's path, with no audit hook at all): there only the kernel layers
(Landlock, seccomp, namespaces, cgroups) stand. Control runs prove ordinary work still runs.
"""

from __future__ import annotations

import errno
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile

import pytest

from gymllm.errors import ConfigError, ToolError
from gymllm.tools import Sandbox, SandboxConfig, make_python_tool, make_shell_tool
from gymllm.tools import landlock, seccomp
from gymllm.tools.sandbox_config import SandboxUnavailableError

CFG = SandboxConfig(timeout_s=5, memory_mb=256, max_processes=24, max_output_bytes=4000)
SECRET = "s3cr3t-trainer-token-Zq9"
ENV_SECRET = "hunter2-env-token-Xy7"
NR = seccomp.SYSCALLS.get(platform.machine(), (0, {}))[1]

PRELUDE = """
import errno, os, sys

def libc():
    import ctypes
    lib = ctypes.CDLL(None, use_errno=True)
    lib.syscall.restype = ctypes.c_long
    return lib

def outcome(fn):
    try:
        r = fn()
    except ImportError as e:
        return "ctypes-refused" if "importing ctypes" in str(e) else "ImportError"
    except OSError as e:
        if e.errno is None and "sandbox:" in str(e):
            return "sandbox"
        return errno.errorcode.get(e.errno, str(e.errno))
    if r in ("absent", "bounded"):
        return r
    if isinstance(r, int) and r == -1:
        import ctypes
        return errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
    return "ESCAPED " + repr(r)[:200]
"""

DENIED_READ = {"EACCES"}
GONE_OR_DENIED = {"ENOENT", "ESRCH", "EACCES", "EPERM"}  # another PID namespace, or Landlock
NO_WRITE = {"EROFS", "EACCES"}  # the read-only mount, or Landlock
EPERM = {"EPERM"}
HOOK = {
    "python": {"sandbox"},
    "shell": {"EPERM"},
}  # the audit hook speaks first; without it, seccomp

# machine code "mov eax, 20 (i386 getpid); int 0x80; ret" run from an executable mapping (x86_64 only)
INT80 = (
    "import ctypes, mmap\n    m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
    "    m.write(bytes([0xb8, 20, 0, 0, 0, 0xcd, 0x80, 0xc3]))\n"
    "    f = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))\n"
    "    return 'ESCAPED: i386 getpid() = %d' % f()"
)

# (id, body of go(), expected outcome(s), modes): {secret} {outside} {home_key} {pid} {victim} {port} {project}
ATTEMPTS = [
    # -- reading what is not the sandbox's
    ("read-secret-file", "return open({secret!r}).read()", DENIED_READ, "ps"),
    (
        "read-secret-libc-open",
        "return libc().open({secret!r}.encode(), os.O_RDONLY)",
        DENIED_READ,
        "ps",
    ),
    ("read-other-users-file", "return open({other_user!r}).read()", DENIED_READ, "ps"),
    ("read-etc-shadow", "return open('/etc/shadow').read()", DENIED_READ, "ps"),
    ("read-ssh-key-in-home", "return open({home_key!r}).read()", DENIED_READ, "ps"),
    ("read-trainer-source", "return open({project!r}).read()", DENIED_READ, "ps"),
    (
        "list-outside-dir-libc",
        "return libc().open({outside!r}.encode(), os.O_RDONLY | os.O_DIRECTORY)",
        DENIED_READ,
        "ps",
    ),
    (
        "opath-dirfd-openat",
        "L = libc()\n    d = L.open({outside!r}.encode(), os.O_PATH)\n"
        "    return L.openat(d, b'secret.txt', os.O_RDONLY) if d >= 0 else 'ESCAPED: no O_PATH fd'",
        DENIED_READ,
        "ps",
    ),
    (
        "proc-self-root-secret",
        "return open('/proc/self/root' + {secret!r}).read()",
        DENIED_READ,
        "ps",
    ),
    (
        "proc-parent-environ",
        "return open('/proc/{pid}/environ', 'rb').read()",
        GONE_OR_DENIED,
        "ps",
    ),
    (
        "proc-parent-mem",
        "f = open('/proc/{pid}/mem', 'rb')\n    f.seek(0x400000)\n    return f.read(16)",
        GONE_OR_DENIED,
        "ps",
    ),
    ("proc-parent-root", "return os.listdir('/proc/{pid}/root/')", GONE_OR_DENIED, "ps"),
    (
        "proc-parent-cmdline",
        "return open('/proc/{pid}/cmdline', 'rb').read()",
        GONE_OR_DENIED,
        "ps",
    ),
    (
        "symlink-to-secret",
        "os.symlink({secret!r}, 'ln')\n    return open('ln').read()",
        DENIED_READ,
        "ps",
    ),
    (
        "symlink-to-shadow-libc",
        "os.symlink('/etc/shadow', 'ln2')\n    return libc().open(b'ln2', os.O_RDONLY)",
        DENIED_READ,
        "ps",
    ),
    (
        "hardlink-secret",
        "os.link({secret!r}, 'hl')\n    return open('hl').read()",
        {"EXDEV", "EACCES", "EPERM"},
        "ps",
    ),
    (
        "open-by-handle",
        "return libc().syscall({nr[open_by_handle_at]}, -100, None, 0)",
        EPERM,
        "ps",
    ),
    # -- writing outside the work dir
    (
        "write-tmp-python",
        "return open('/tmp/gymllm-escape-{pid}', 'w').write('x')",
        {"python": {"sandbox"}, "shell": NO_WRITE},
        "ps",
    ),
    (
        "write-tmp-libc",
        "return libc().open(b'/tmp/gymllm-escape-{pid}', os.O_WRONLY | os.O_CREAT, 0o644)",
        NO_WRITE,
        "ps",
    ),
    (
        "write-dev-shm-libc",
        "return libc().open(b'/dev/shm/gymllm-escape-{pid}', os.O_WRONLY | os.O_CREAT, 0o644)",
        NO_WRITE,
        "ps",
    ),
    (
        "write-outside-dir-libc",
        "return libc().open(({outside!r} + '/escaped').encode(), os.O_WRONLY | os.O_CREAT, 0o644)",
        NO_WRITE,
        "ps",
    ),
    (
        "cgroup-escape-libc",
        "return libc().open(b'/sys/fs/cgroup/pids/cgroup.procs', os.O_WRONLY)",
        NO_WRITE,
        "ps",
    ),
    (
        "mkdir-tmp-libc",
        "return libc().mkdir(b'/tmp/gymllm-escape-dir-{pid}', 0o755)",
        NO_WRITE,
        "ps",
    ),
    (
        "rename-out-libc",
        "open('own.txt', 'w').write('x')\n    return libc().rename(b'own.txt', "
        "({outside!r} + '/moved').encode())",
        {"EXDEV", "EROFS", "EACCES"},
        "ps",
    ),
    (
        "remount-root-rw",
        "import ctypes\n    return libc().mount(None, b'/', None, ctypes.c_ulong(32 | 4096), None)",
        EPERM,
        "ps",
    ),
    # -- network, every family
    (
        "socket-inet-python",
        "import socket\n    return socket.socket(socket.AF_INET, socket.SOCK_STREAM)",
        HOOK,
        "ps",
    ),
    (
        "connect-loopback-python",
        "import socket\n    return socket.create_connection(('127.0.0.1', {port}), 1)",
        HOOK,
        "ps",
    ),
    ("socket-inet-libc", "return libc().socket(2, 1, 0)", EPERM, "ps"),
    ("socket-inet6-libc", "return libc().socket(10, 1, 0)", EPERM, "ps"),
    ("socket-unix-libc", "return libc().socket(1, 1, 0)", EPERM, "ps"),
    ("socket-netlink-libc", "return libc().socket(16, 3, 0)", EPERM, "ps"),
    ("socket-packet-libc", "return libc().socket(17, 3, 0)", EPERM, "ps"),
    ("socket-raw-syscall", "return libc().syscall({nr[socket]}, 2, 3, 1)", EPERM, "ps"),
    (
        "io-uring-setup",
        "import ctypes\n    return libc().syscall(425, 4, ctypes.create_string_buffer(120))",
        EPERM,
        "ps",
    ),
    # -- processes
    ("fork-bomb-python", "while True:\n        os.fork()", {"sandbox"}, "p"),
    ("subprocess-run", "import subprocess\n    return subprocess.run(['id'])", {"sandbox"}, "p"),
    ("os-system", "return os.system('id')", {"sandbox"}, "p"),
    (
        "fork-bomb-libc",
        "L = libc()\n    while True:\n        if L.fork() == -1:\n            return -1",
        EPERM,
        "p",
    ),
    ("clone-syscall", "return libc().syscall({nr[clone]}, 17, 0, 0, 0, 0)", EPERM, "p"),
    (
        "clone3-syscall",
        "import ctypes\n    return libc().syscall({nr[clone3]}, ctypes.create_string_buffer(88), 88)",
        {"ENOSYS"},
        "p",
    ),
    (
        "vfork-syscall",
        "return libc().syscall({nr[vfork]})" if "vfork" in NR else "return libc().syscall(-1)",
        EPERM if "vfork" in NR else {"ENOSYS"},
        "p",
    ),
    (
        "thread-bomb",
        "import threading, time\n    n = 0\n    try:\n        for n in range(2000):\n"
        "            threading.Thread(target=time.sleep, args=(20,), daemon=True).start()\n"
        "    except RuntimeError:\n        return 'bounded' if n < 200 else 'ESCAPED: %d threads' % n\n"
        "    return 'ESCAPED: 2000 threads'",
        {"bounded"},
        "p",
    ),
    (
        "execve-libc",
        "import ctypes\n    argv = (ctypes.c_char_p * 2)(b'/bin/true', None)\n"
        "    return libc().execv(b'/bin/true', argv)",
        EPERM,
        "p",
    ),
    *(
        [
            (
                "x32-abi-syscall",
                "return libc().syscall(0x40000000 | 39)",
                EPERM,
                "ps",
            ),  # getpid through the x32 ABI
            ("int80-i386-syscall", INT80, {"SIGSYS"}, "ps"),
        ]  # the 32-bit ABI from machine code: killed
        if platform.machine() == "x86_64"
        else []
    ),
    (
        "memory-bomb-libc",
        "import ctypes\n    L = libc()\n    L.malloc.restype = ctypes.c_void_p\n"
        "    return L.malloc(ctypes.c_size_t(8 << 30)) or -1",
        {"ENOMEM"},
        "ps",
    ),
    # -- other processes: ptrace, signals
    ("ptrace-attach-parent", "return libc().ptrace(16, {pid}, None, None)", EPERM, "ps"),
    (
        "process-vm-readv",
        "return libc().syscall({nr[process_vm_readv]}, {pid}, None, 0, None, 0, 0)",
        EPERM,
        "ps",
    ),
    ("kill-victim", "return os.kill({victim}, 9)", {"ESRCH", "EPERM"}, "ps"),
    ("kill-victim-libc", "return libc().kill({victim}, 9)", {"ESRCH", "EPERM"}, "ps"),
    (
        "signal-trainer-usr2",
        "return os.kill({pid}, 12)",
        {"ESRCH", "EPERM"},
        "ps",
    ),  # counted by a handler
    ("kill-all-probe", "return os.kill(-1, 0)", {"ESRCH", "EPERM"}, "ps"),
    ("kill-trainer-probe", "return os.kill({pid}, 0)", {"ESRCH", "EPERM"}, "ps"),
    (
        "tiocsti",
        "import ctypes\n    return libc().ioctl(1, 0x5412, ctypes.c_char_p(b'x'))",
        EPERM,
        "ps",
    ),
    # -- privileges and namespaces
    (
        "raise-rlimits",
        "import resource\n    try:\n        resource.setrlimit(resource.RLIMIT_AS, (-1, -1))\n"
        "    except ValueError as e:  # how Python reports setrlimit's EPERM\n"
        "        if 'not allowed to raise' in str(e):\n            raise PermissionError(errno.EPERM, str(e))\n"
        "        raise\n    return 'ESCAPED: RLIMIT_AS raised'",
        EPERM,
        "ps",
    ),
    ("unshare-user", "return libc().unshare(0x10000000)", EPERM, "ps"),
    ("unshare-net-mount", "return libc().unshare(0x40000000 | 0x00020000)", EPERM, "ps"),
    ("chroot", "return libc().chroot(b'.')", EPERM, "ps"),
    ("bpf", "return libc().syscall({nr[bpf]}, 0, None, 0)", EPERM, "ps"),
    ("userfaultfd", "return libc().syscall({nr[userfaultfd]}, 0)", EPERM, "ps"),
    ("keyctl", "return libc().syscall({nr[keyctl]}, 0, 0, 0)", EPERM, "ps"),
    (
        "perf-event-open",
        "return libc().syscall({nr[perf_event_open]}, None, 0, -1, -1, 0)",
        EPERM,
        "ps",
    ),
    # -- the trainer's environment
    (
        "env-secret",
        "return 'absent' if not any({env_secret!r} in v for v in os.environ.values()) else 'ESCAPED'",
        {"absent"},
        "ps",
    ),
]

OUTSIDE = ["home", "other-user.txt", "secret.txt"]
CASES = [
    pytest.param(mode, body, expected, id=f"{name}-{'python' if mode == 'p' else 'shell'}")
    for name, body, expected, modes in ATTEMPTS
    for mode in modes
]


@pytest.fixture(scope="module")
def world():
    """Things outside the sandbox to reach for: a secret file, a planted SSH key, a victim process, a server."""
    outside = tempfile.mkdtemp(prefix="gymllm-outside-")
    secret = os.path.join(outside, "secret.txt")
    with open(secret, "w") as f:
        f.write(SECRET)
    home = os.path.join(outside, "home")
    os.makedirs(os.path.join(home, ".ssh"))
    home_key = os.path.join(home, ".ssh", "id_rsa")
    with open(home_key, "w") as f:
        f.write(SECRET)
    other_user = os.path.join(outside, "other-user.txt")
    with open(other_user, "w") as f:
        f.write(SECRET)
    os.chmod(other_user, 0o600)
    if os.getuid() == 0:
        os.chown(other_user, 12345, 12345)  # another user's private file
    usr2 = []
    old_handler = signal.signal(signal.SIGUSR2, lambda *_: usr2.append(1))
    victim = subprocess.Popen(["sleep", "120"])
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.setblocking(False)
    old_env = {k: os.environ.get(k) for k in ("HOME", "GYMLLM_SECRET_TOKEN")}
    os.environ["HOME"], os.environ["GYMLLM_SECRET_TOKEN"] = home, ENV_SECRET
    box = Sandbox(CFG, files={"data/input.txt": "hello"})
    try:
        yield {
            "box": box,
            "outside": outside,
            "secret": secret,
            "home_key": home_key,
            "victim": victim,
            "server": server,
            "usr2": usr2,
            "fmt": dict(
                secret=secret,
                other_user=other_user,
                outside=outside,
                home_key=home_key,
                pid=os.getpid(),
                victim=victim.pid,
                port=server.getsockname()[1],
                nr=NR,
                project=os.path.abspath(__file__),
                env_secret=ENV_SECRET,
            ),
        }
    finally:
        box.close()
        signal.signal(signal.SIGUSR2, old_handler)
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        victim.kill()
        victim.wait()
        server.close()
        subprocess.run(["rm", "-rf", outside], check=True)


def _run(box: Sandbox, mode: str, body: str, fmt: dict):
    box.clear()  # a fresh work dir per attempt (the links and files of the last one gone)
    box.write_files({"data/input.txt": "hello"})
    code = PRELUDE + "\ndef go():\n    " + body.format(**fmt) + "\n\nprint('RESULT', outcome(go))\n"
    res = box.run_python(code) if mode == "p" else box.run_argv(["python", "-I", "-S", "-c", code])
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")]
    if (
        not lines and res.exit_code == 128 + signal.SIGSYS
    ):  # the launcher reports its init's death by SIGSYS
        return res, "SIGSYS"
    return res, (lines[-1][len("RESULT ") :] if lines else None)


@pytest.mark.parametrize("mode,body,expected", CASES)
def test_escape_attempt_is_refused(world, mode, body, expected):
    res, got = _run(world["box"], mode, body, world["fmt"])
    if isinstance(expected, dict):
        expected = expected["python" if mode == "p" else "shell"]
    iso = res.isolation
    assert iso["landlock"] and iso["seccomp"] and iso["process_limit"] and iso["signals"], iso
    if (
        got == "ctypes-refused"
    ):  # only where the mount and network namespaces are missing (the hook's own layer)
        assert mode == "p" and not (iso.get("fs") and iso.get("net"))
    else:
        assert got in expected, (got, res.stdout[-500:], res.stderr[-1500:])
    assert SECRET not in res.stdout + res.stderr and ENV_SECRET not in res.stdout + res.stderr
    # side effects, checked from outside
    assert world["victim"].poll() is None, "the victim process was killed from inside the sandbox"
    assert not world["usr2"], "a signal reached the trainer from inside the sandbox"
    with pytest.raises(BlockingIOError):
        world["server"].accept()
    assert sorted(os.listdir(world["outside"])) == OUTSIDE
    for leftover in (
        f"/tmp/gymllm-escape-{os.getpid()}",
        f"/dev/shm/gymllm-escape-{os.getpid()}",
        f"/tmp/gymllm-escape-dir-{os.getpid()}",
    ):
        assert not os.path.exists(leftover)
    assert world["box"].read_file("data/input.txt") == "hello"


def test_the_corpus_is_large():
    assert len(ATTEMPTS) >= 30 and len(CASES) >= 60


@pytest.mark.parametrize(
    "command,expected",
    [
        ("cat {secret}", "Permission denied"),
        ("cat /etc/shadow", "Permission denied"),
        ("ls {outside}", "Permission denied"),
        ("echo x > /tmp/gymllm-escape-sh-{pid}", "Read-only file system"),
        ("exec 3<>/dev/tcp/127.0.0.1/{port}", "Operation not permitted"),
        ("cat /proc/{pid}/environ", "No such file or directory"),
        ("env | grep -c GYMLLM_SECRET_TOKEN || echo not-in-env", "not-in-env"),
    ],
)
def test_shell_escape_attempt_is_refused(world, command, expected):
    res = world["box"].run_shell(command.format(**world["fmt"]))
    assert (
        expected in res.stdout + res.stderr
        and SECRET not in res.stdout
        and ENV_SECRET not in res.stdout
    )
    assert not os.path.exists(f"/tmp/gymllm-escape-sh-{os.getpid()}")
    with pytest.raises(BlockingIOError):
        world["server"].accept()


def test_native_fork_bomb_in_a_shell_is_bounded(world):
    """In shell mode processes may be started: a libc fork loop stops at the pids cgroup (or RLIMIT_NPROC)."""
    loop = (
        "import ctypes, os, time\nL = ctypes.CDLL(None, use_errno=True)\nn = 0\nfor _ in range(500):\n"
        "    pid = L.fork()\n    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n    if pid < 0:\n"
        "        break\n    n += 1\nprint(n, ctypes.get_errno())"
    )
    res = world["box"].run_argv(["python", "-c", loop])
    n, err = res.stdout.split()
    assert int(n) < CFG.max_processes and int(err) == errno.EAGAIN, res


def test_control_ordinary_work_still_runs(world):
    box = world["box"]
    code = (
        "import json, math, decimal, fractions, collections, re, itertools, hashlib, sqlite3, threading\n"
        "import tempfile, os\n"
        "t = threading.Thread(target=lambda: None); t.start(); t.join()\n"
        "with tempfile.NamedTemporaryFile('w', dir='.', delete=False) as f: f.write('tmp')\n"
        "os.makedirs('sub/dir', exist_ok=True); open('sub/dir/x.txt', 'w').write('deep')\n"
        "os.rename('sub/dir/x.txt', 'sub/y.txt')\n"
        "db = sqlite3.connect('db.sqlite'); db.execute('create table t (x)'); db.commit()\n"
        "print(open('data/input.txt').read(), sum(range(10)), math.factorial(20),"
        " hashlib.sha256(b'x').hexdigest()[:8], sorted(os.listdir('sub')), json.dumps({'ok': True}))"
    )
    res = box.run_python(code)
    assert res.ok, res.stderr
    assert res.stdout == "hello 45 2432902008176640000 2d711642 ['dir', 'y.txt'] {\"ok\": true}\n"
    assert box.read_file("sub/y.txt") == "deep"
    sh = box.run_shell(
        "echo a > f.txt && cat f.txt data/input.txt | wc -c && ls sub && python -c 'print(6*7)' "
        "&& (sleep 0.1 & wait) && rm f.txt && echo done"
    )
    assert sh.ok and sh.stdout.split() == ["7", "dir", "y.txt", "42", "done"], sh
    # the real tool path: the python and shell tools, as ToolUse calls them
    assert make_python_tool(box)(code="print(open('data/input.txt').read().upper())") == "HELLO"
    assert make_shell_tool(box)(command="cat data/input.txt") == "hello"


def test_control_numpy_through_extra_paths():
    site = [
        p
        for p in sys.path
        if p.endswith("site-packages") and os.path.isdir(os.path.join(p, "numpy"))
    ]
    if not site:
        pytest.skip("numpy is not installed")
    with Sandbox(SandboxConfig(timeout_s=20, memory_mb=1024, extra_paths=(site[0],))) as box:
        res = box.run_python(
            "import numpy as np\n"
            "print(int((np.arange(10) ** 2).sum()), np.linalg.inv(np.eye(3))[1, 1])"
        )
        assert res.ok and res.stdout == "285 1.0\n", res.stderr


def test_control_network_and_subprocess_when_allowed(world):
    """The explicit switches open exactly their door: loopback TCP (network=True), processes (allow_subprocess)."""
    port = world["fmt"]["port"]
    with Sandbox(SandboxConfig(timeout_s=5, network=True)) as box:
        res = box.run_python(
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), 2).close()\n"
            "print('connected')"
        )
        assert res.stdout == "connected\n" and res.isolation["seccomp"]["network"] is True, (
            res.stderr
        )
        conn, _ = world["server"].accept()
        conn.close()
        assert (
            "EACCES"
            in box.run_python(
                PRELUDE + f"print(outcome(lambda: open({world['secret']!r}).read()))"
            ).stdout
        )
    with Sandbox(SandboxConfig(timeout_s=5, max_processes=16, allow_subprocess=True)) as box:
        res = box.run_python(
            "import subprocess\n"
            "print(subprocess.run(['echo', 'child'], capture_output=True, text=True).stdout)"
        )
        assert res.stdout == "child\n\n" and res.isolation["process_limit"] in (
            "pids cgroup",
            "RLIMIT_NPROC",
        ), res


def test_read_paths_grant_reads_only(world):
    with Sandbox(SandboxConfig(timeout_s=5, read_paths=(world["outside"],))) as box:
        res = box.run_python(
            PRELUDE + f"print(open({world['secret']!r}).read())\n"
            f"print('RESULT', outcome(lambda: libc().open(({world['outside']!r} + '/w').encode(), "
            f"os.O_WRONLY | os.O_CREAT, 0o644)))"
        )
        assert SECRET in res.stdout and res.stdout.split()[-1] in NO_WRITE
    assert sorted(os.listdir(world["outside"])) == OUTSIDE


def test_isolation_report_names_every_layer(world):
    iso = world["box"].run_python("pass").isolation
    assert iso["landlock"]["abi"] == landlock.abi_version() >= 1 and iso["landlock"]["rules"] > 5
    assert (
        iso["seccomp"]
        == {
            "instructions": iso["seccomp"]["instructions"],
            "network": False,
            "processes": False,
            "ipc": True,
        }
        and iso["ipc"] is True
    )  # SysV/mq calls only inside its own IPC namespace
    assert iso["process_limit"].startswith("seccomp")
    assert iso["signals"] in ("landlock scope", "pid namespace")
    sh = world["box"].run_shell("true").isolation
    assert sh["seccomp"]["processes"] is True and sh["process_limit"] in (
        "pids cgroup",
        "RLIMIT_NPROC",
    )


def test_config_validation():
    with pytest.raises(ConfigError, match="allow_missing"):
        SandboxConfig(allow_missing=("landlok",))
    with pytest.raises(ConfigError, match="read_paths"):
        SandboxConfig(read_paths=("relative/dir",))
    assert SandboxConfig(allow_missing=("landlock", "seccomp")).allow_missing == (
        "landlock",
        "seccomp",
    )


# -------------------------------------------------- a kernel without a layer (simulated)

_OLD_KERNEL = """
import ctypes, json, struct, sys
sys.path[:0] = {paths!r}
from gymllm.tools.sandbox import Sandbox
from gymllm.tools.sandbox_config import SandboxConfig, SandboxUnavailableError

def insn(code, k, jt=0, jf=0):
    return struct.pack("=HBBI", code, jt, jf, k)

# Stand-in for an older kernel: an outer seccomp filter answers ENOSYS for the given syscalls, as a
# kernel that lacks them does ("landlock": 444-446; "seccomp": prctl(PR_SET_SECCOMP) gets EINVAL).
prog = [insn(0x20, 0)]
for nr in {enosys!r}:
    prog += [insn(0x15, nr, 0, 1), insn(0x06, 0x00050000 | 38)]
if {no_seccomp!r}:
    prog += [insn(0x15, {prctl}, 0, 3), insn(0x20, 16), insn(0x15, 22, 0, 1), insn(0x06, 0x00050000 | 22)]
prog.append(insn(0x06, 0x7FFF0000))
buf = b"".join(prog)
class Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(38, 1, 0, 0, 0) == 0
assert libc.prctl(22, 2, ctypes.byref(Fprog(len(buf) // 8, buf)), 0, 0) == 0, ctypes.get_errno()
out = {{}}
try:
    Sandbox(SandboxConfig(timeout_s=5)).run_python("print('ran')")
    out["strict"] = "ran"
except SandboxUnavailableError as e:
    out["strict"] = str(e)
res = Sandbox(SandboxConfig(timeout_s=5, allow_missing={allow!r})).run_python("print('ran')")
out["allowed"] = [res.stdout, res.isolation.get("landlock"), res.isolation.get("seccomp")]
print(json.dumps(out))
"""


@pytest.mark.parametrize("layer", ["landlock", "seccomp"])
def test_a_missing_layer_is_a_clear_error_never_a_silent_downgrade(layer):
    prctl = {"x86_64": 157, "aarch64": 167}[platform.machine()]
    script = _OLD_KERNEL.format(
        paths=[p for p in sys.path if p],
        enosys=[444, 445, 446] if layer == "landlock" else [],
        no_seccomp=layer == "seccomp",
        prctl=prctl,
        allow=(layer,),
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert f"missing {layer}:" in out["strict"] and "allow_missing" in out["strict"], out
    stdout, ll, sc = out["allowed"]
    assert (
        stdout == "ran\n"
        and (ll is False) == (layer == "landlock")
        and (sc is False) == (layer == "seccomp")
    )


def test_seccomp_table_matches_libseccomp():
    """The hand-written syscall numbers against libseccomp's own table (a system library, where installed)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("seccomp")
    if not name:
        pytest.skip("libseccomp is not installed")
    lib = ctypes.CDLL(name)
    lib.seccomp_syscall_resolve_name_arch.argtypes = [ctypes.c_uint32, ctypes.c_char_p]
    for machine, (arch, table) in seccomp.SYSCALLS.items():
        for syscall, number in table.items():
            assert lib.seccomp_syscall_resolve_name_arch(arch, syscall.encode()) == number, (
                machine,
                syscall,
            )


def test_seccomp_filter_refuses_unknown_architecture():
    with pytest.raises(seccomp.SeccompError, match="architecture"):
        seccomp.build_filter(network=False, processes=False, machine="sparc64")
    assert issubclass(SandboxUnavailableError, ToolError)
