"""Process-wide side effects only on request (issue 20 part 7): glibc's malloc settings are opt-in
(GYMLLM_KEEP_FREED_MEMORY=1), TensorBoard events are written without editing ``sys.modules`` (and
without importing tensorboardX or torch), and no gymllm module assigns into ``sys.modules``."""

from __future__ import annotations

import ast
import json
import math
import os
import pathlib
import struct
import subprocess
import sys
import textwrap

import gymllm
from gymllm.telemetry.sinks import ScalarEventWriter, event_bytes, masked_crc32c

ROOT = pathlib.Path(gymllm.__file__).resolve().parent


def _run(code: str, **env: str) -> dict:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, **env})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_malloc_settings_change_only_on_request():
    code = """
        import json
        from gymllm.utils import host_memory
        print(json.dumps([host_memory.keep_freed_memory(), host_memory.keep_freed_memory(enabled=False)]))
    """
    env = {k: v for k, v in os.environ.items() if k != "GYMLLM_KEEP_FREED_MEMORY"}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120, env=env)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [False, False], out.stderr
    assert _run(code, GYMLLM_KEEP_FREED_MEMORY="0") == [False, False]
    assert _run(code, GYMLLM_KEEP_FREED_MEMORY="1") == [True, True]  # applied once: it stays for the process


def test_tensorboard_sink_touches_no_sys_modules_and_imports_no_torch(tmp_path):
    got = _run(f"""
        import json, sys
        before = {{k: v for k, v in sys.modules.items() if v is None}}
        from gymllm.telemetry.sinks import MetricsLogger
        with MetricsLogger({str(tmp_path)!r}, console=False, pipeline=False, trace=False) as lg:
            lg.log(1, {{"loss": 0.5, "reward/mean": 1.0}})
        blocked = sorted(k for k, v in sys.modules.items() if v is None and k not in before)
        print(json.dumps({{"blocked": blocked, "torch": "torch" in sys.modules, "tbx": "tensorboardX" in sys.modules}}))
    """)
    assert got == {"blocked": [], "torch": False, "tbx": False}
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_event_file_matches_tensorboards_format(tmp_path):
    """Read back with tensorboardX's own Event proto and CRC-32C (the reference implementation)."""
    from tensorboardX.crc32c import crc32c
    from tensorboardX.proto import event_pb2

    w = ScalarEventWriter(tmp_path)
    w.add_scalars({"loss": 0.25, "huge": 1e300, "neg": -3.0}, step=7)
    w.add_scalar("late", 2.0, global_step=-1)
    w.close()
    data = w.path.read_bytes()
    events, pos = [], 0
    while pos < len(data):
        header = data[pos:pos + 8]
        (n,) = struct.unpack("<Q", header)
        (hcrc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        body = data[pos + 12:pos + 12 + n]
        (bcrc,) = struct.unpack("<I", data[pos + 12 + n:pos + 16 + n])
        masked = lambda b: (((crc32c(b) >> 15) | (crc32c(b) << 17)) + 0xA282EAD8) & 0xFFFFFFFF  # noqa: E731
        assert hcrc == masked(header) == masked_crc32c(header) and bcrc == masked(body) == masked_crc32c(body)
        events.append(event_pb2.Event.FromString(body))
        pos += 16 + n
    assert events[0].file_version == "brain.Event:2"
    assert events[1].step == 7 and [(v.tag, v.simple_value) for v in events[1].summary.value] == [
        ("loss", 0.25), ("huge", math.inf), ("neg", -3.0)]
    assert events[2].step == -1 and events[2].summary.value[0].tag == "late"
    ref = event_pb2.Event(wall_time=1.5, step=3)
    ref.summary.value.add(tag="x", simple_value=0.5)
    assert event_bytes(wall_time=1.5, step=3, scalars={"x": 0.5}) == ref.SerializeToString()


# The one module that edits sys.modules: the sandbox's child process (never the user's process) drops the
# launcher's ctypes so the sandboxed code's own ``import ctypes`` reaches the audit hook and is refused.
KNOWN = {"tools/_sandbox_child.py"}


def _edits_sys_modules(tree: ast.AST) -> bool:
    def is_sys_modules(node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "modules" and isinstance(node.value, ast.Name)
                and node.value.id == "sys")

    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else (
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        for t in targets:
            if isinstance(t, ast.Subscript) and is_sys_modules(t.value):
                return True
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Subscript) and is_sys_modules(t.value.value):
                return True  # sys.modules[name].__class__ = ...
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_sys_modules(node.func.value) \
                and node.func.attr in ("pop", "setdefault", "update", "clear", "popitem"):
            return True
    return False


def test_no_other_module_edits_sys_modules():
    offenders = {str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py") if _edits_sys_modules(ast.parse(p.read_text()))}
    assert offenders <= KNOWN, f"modules that edit sys.modules: {sorted(offenders - KNOWN)}"
    assert "telemetry/sinks.py" not in offenders
