"""Sandbox escapes are tried for real and must be refused: writes outside the work dir, sockets,
fork bombs, memory bombs, infinite loops, output floods. Kernel-level checks (namespaces, pids
cgroup) are skipped where this machine cannot provide them; the Python audit-hook layer is always on."""

from __future__ import annotations

import os
import socket
import tempfile
import time

import pytest

from gymllm.errors import ConfigError
from gymllm.tools import Sandbox, SandboxConfig, make_shell_tool, python

CFG = SandboxConfig(timeout_s=3, memory_mb=256, max_processes=24, max_output_bytes=2000)


@pytest.fixture(scope="module")
def sb():
    with Sandbox(CFG, files={"data/input.txt": "hello"}) as box:
        yield box


@pytest.fixture(scope="module")
def outside():
    d = tempfile.mkdtemp(prefix="gymllm-outside-")
    yield d
    for name in os.listdir(d):
        os.remove(os.path.join(d, name))
    os.rmdir(d)


def test_runs_code_in_the_work_dir(sb):
    res = sb.run_python(
        "import os\nprint(open('data/input.txt').read(), 6 * 7)\nopen('out.txt', 'w').write('ok')"
    )
    assert res.ok and res.stdout == "hello 42\n" and not res.truncated
    assert sb.read_file("out.txt") == "ok"
    assert python(code="print(sum(range(10)))") == "45"
    err = sb.run_python("raise ValueError('bad value')")
    assert (
        err.exit_code == 1
        and "ValueError: bad value" in err.stderr
        and "_sandbox_child" not in err.stderr
    )
    assert sb.run_python("import sys; sys.exit(3)").exit_code == 3


@pytest.mark.parametrize(
    "code",
    [
        "open({p!r}, 'w').write('x')",
        "import os; os.rename('data/input.txt', {p!r})",
        "import os; fd = os.open({p!r}, os.O_WRONLY | os.O_CREAT); os.write(fd, b'x')",
        "import shutil; shutil.copyfile('data/input.txt', {p!r})",
        "import os; os.symlink('/etc/passwd', 'link'); open('link', 'a').write('x')",
    ],
)
def test_python_cannot_write_outside_the_work_dir(sb, outside, code):
    target = os.path.join(outside, "escaped.txt")
    res = sb.run_python(code.format(p=target))
    assert not res.ok and ("not allowed" in res.stderr or "Read-only" in res.stderr)
    assert not os.path.exists(target)
    assert sb.read_file("data/input.txt") == "hello"


def test_shell_cannot_write_outside_the_work_dir(sb, outside):
    res = sb.run_shell(
        f"echo hi > inside.txt; echo x > {outside}/escaped.txt; touch /dev/shm/gymllm-escape"
    )
    if not res.isolation.get("fs"):
        pytest.skip("no mount namespace here: the shell's file-system layer is unavailable")
    assert sb.read_file("inside.txt") == "hi\n"
    assert "Read-only file system" in res.stderr
    assert not os.path.exists(f"{outside}/escaped.txt") and not os.path.exists(
        "/dev/shm/gymllm-escape"
    )


def test_no_network():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        with Sandbox(CFG) as box:
            res = box.run_python(
                f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=1)"
            )
            assert not res.ok and "network access" in res.stderr
            sh = box.run_shell(
                f"python -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 1)\""
            )
            if sh.isolation.get("net") or sh.isolation.get(
                "seccomp"
            ):  # seccomp refuses socket() before the namespace
                assert not sh.ok and any(
                    m in sh.stderr for m in ("unreachable", "refused", "Operation not permitted")
                )
        server.settimeout(0.05)
        with pytest.raises(OSError):
            server.accept()  # nothing ever connected
    finally:
        server.close()


def test_fork_bomb_is_refused(sb):
    res = sb.run_python("import os\nwhile True:\n    os.fork()")
    assert not res.ok and "starting a process" in res.stderr
    loop = (
        "import os, time\nn = 0\nfor _ in range(500):\n    try:\n        pid = os.fork()\n    except OSError:\n"
        "        break\n    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n    n += 1\nprint(n)"
    )
    t0 = time.perf_counter()
    res = sb.run_shell(f"python - <<'EOF'\n{loop}\nEOF")
    if not (res.isolation.get("cgroup") or res.isolation.get("limits", {}).get("processes")):
        pytest.skip("no process limit available here (root without a writable pids cgroup)")
    assert (
        res.ok and int(res.stdout) < 2 * CFG.max_processes
    )  # bounded (the rlimit also counts other processes)
    bomb = sb.run_shell(":(){ :|:& };:", timeout_s=1.5)
    assert time.perf_counter() - t0 < 8 and bomb.duration_s < 3
    if res.isolation.get("pid") and res.isolation.get("fs"):
        # the PID namespace (with its own /proc) died with its init: none of the sleeping children survived
        assert sb.run_shell("ps -e | wc -l").stdout.strip() in ("3", "4", "5")


def test_memory_bomb_is_refused(sb):
    res = sb.run_python("x = bytearray(2 * 1024 ** 3)")
    assert not res.ok and "MemoryError" in res.stderr
    res = sb.run_python("chunks = []\nwhile True:\n    chunks.append(b'x' * 2 ** 24)")
    assert not res.ok and "MemoryError" in res.stderr and not res.timed_out


def test_infinite_loop_times_out(sb):
    t0 = time.perf_counter()
    res = sb.run_python("while True:\n    pass", timeout_s=1.0)
    assert res.timed_out and not res.ok and time.perf_counter() - t0 < 3
    assert "timed out" in res.as_text()
    res = sb.run_shell("sleep 100 & sleep 100; echo never", timeout_s=0.5)
    assert res.timed_out and "never" not in res.stdout


def test_output_flood_is_truncated(sb):
    res = sb.run_python("import sys\nfor _ in range(10000):\n    sys.stdout.write('y' * 1000)")
    assert res.ok and res.truncated and len(res.stdout) < CFG.max_output_bytes + 100
    assert "truncated: " in res.stdout


def test_other_refusals(sb, outside):
    target = os.path.join(outside, "ctypes.txt")
    libc_write = (
        f"import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        f"fd = libc.open({target.encode()!r}, 0o101, 0o644)\nprint(fd, ctypes.get_errno())"
    )
    res = sb.run_python(libc_write)
    if res.isolation.get(
        "fs"
    ):  # ctypes goes around the audit hook, but the kernel's read-only mount holds
        assert res.stdout.split() == ["-1", "30"]  # EROFS
    else:
        assert "importing ctypes" in res.stderr
    assert not os.path.exists(target)
    assert "starting a process" in sb.run_python("import subprocess; subprocess.run(['ls'])").stderr
    res = sb.run_python("import os; print(os.getpid())")
    if res.isolation.get("pid"):
        assert (
            res.stdout.strip() == "1"
        )  # its own PID namespace: the host's processes are invisible


def test_shell_tool_and_config_validation(sb):
    sh = make_shell_tool(sb)
    assert sh.schema["function"]["name"] == "shell"
    assert sh(command="cat data/input.txt && echo ' world'") == "hello world"
    assert "[exit code 3]" in sh(command="exit 3")
    with pytest.raises(ConfigError, match="timeout_s"):
        SandboxConfig(timeout_s=0)
    with pytest.raises(ConfigError, match="memory_mb"):
        SandboxConfig(memory_mb=1)


def test_audit_hook_alone_refuses_python_escapes(outside):
    """Without namespaces (as on hosts that forbid them) the in-child audit hook still refuses escapes."""
    target = os.path.join(outside, "no-ns.txt")
    with Sandbox(SandboxConfig(timeout_s=3, namespaces=False)) as box:
        res = box.run_python(f"open({target!r}, 'w').write('x')")
        assert res.isolation["fs"] is False and "not allowed" in res.stderr
        assert "network access" in box.run_python("import socket; socket.socket()").stderr
        assert "starting a process" in box.run_python("import os; os.system('true')").stderr
        fork_exec = "import _posixsubprocess as p; p.fork_exec([b'/bin/true'], [b'/bin/true'], *[None] * 21)"
        assert (
            "starting a process" in box.run_python(fork_exec).stderr
        )  # fork_exec raises no audit event
        fresh = "import sys; del sys.modules['_posixsubprocess']; import _posixsubprocess"
        assert "starting a process" in box.run_python(fresh).stderr
        assert (
            "importing ctypes" in box.run_python("import ctypes").stderr
        )  # it could call libc around the hook
        dir_fd = f"import os; fd = os.open({outside!r}, os.O_RDONLY); os.open('x', os.O_CREAT | os.O_WRONLY, dir_fd=fd)"
        assert "opening the directory" in box.run_python(dir_fd).stderr
        assert (
            box.run_python("open('inside.txt', 'w').write('ok'); print('fine')").stdout == "fine\n"
        )
    assert not os.path.exists(target)


def test_memory_limit_holds_across_processes():
    """Three processes of 80 MB each under a 128 MB sandbox: the memory cgroup kills the excess."""
    with Sandbox(SandboxConfig(timeout_s=8, memory_mb=128)) as box:
        cmd = (
            "for i in 1 2 3; do python -c \"import time; x = b'x' * (80 * 2**20); time.sleep(1); print('alive')\""
            " & done; wait"
        )
        res = box.run_shell(cmd)
        if not res.isolation["cgroups"].get("memory"):
            pytest.skip("no writable memory cgroup here")
        assert res.stdout.count("alive") < 3 and "Killed" in res.stderr
