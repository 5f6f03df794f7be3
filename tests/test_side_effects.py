"""Process-wide side effects only on request (issue 20 part 7): glibc's malloc settings are opt-in
(GYMLLM_KEEP_FREED_MEMORY=1), TensorBoard events are written without editing ``sys.modules`` (and
without importing tensorboardX, torch or TensorFlow), and no gymllm module assigns into ``sys.modules``."""

from __future__ import annotations

import ast
import json
import math
import os
import pathlib
import subprocess
import sys
import textwrap

import gymllm
from gymllm.telemetry.sinks import ScalarEventWriter

ROOT = pathlib.Path(gymllm.__file__).resolve().parent


def _run(code: str, **env: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_malloc_settings_change_only_on_request():
    code = """
        import json
        from gymllm.utils import host_memory
        print(json.dumps([host_memory.keep_freed_memory(), host_memory.keep_freed_memory(enabled=False)]))
    """
    env = {k: v for k, v in os.environ.items() if k != "GYMLLM_KEEP_FREED_MEMORY"}
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [False, False], out.stderr
    assert _run(code, GYMLLM_KEEP_FREED_MEMORY="0") == [False, False]
    assert _run(code, GYMLLM_KEEP_FREED_MEMORY="1") == [
        True,
        True,
    ]  # applied once: it stays for the process


def test_tensorboard_sink_touches_no_sys_modules_and_imports_no_torch_or_tensorflow(tmp_path):
    """torch is installed here; TensorFlow is not, so a stand-in ``tensorflow`` package (an empty one on
    PYTHONPATH) shows whether anything would import it (``tensorboard.compat.tf`` does when it exists)."""
    fake = tmp_path / "fake_site" / "tensorflow"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    logdir = tmp_path / "run"
    got = _run(
        f"""
        import json, sys
        before = {{k: v for k, v in sys.modules.items() if v is None}}
        from gymllm.telemetry.sinks import MetricsLogger
        with MetricsLogger({str(logdir)!r}, console=False, pipeline=False, trace=False) as lg:
            lg.log(1, {{"loss": 0.5, "reward/mean": 1.0}})
        blocked = sorted(k for k, v in sys.modules.items() if v is None and k not in before)
        print(json.dumps({{"blocked": blocked, "torch": "torch" in sys.modules, "tbx": "tensorboardX" in sys.modules,
                          "tf": "tensorflow" in sys.modules}}))
    """,
        PYTHONPATH=os.pathsep.join([str(fake.parent), os.environ.get("PYTHONPATH", "")]),
    )
    assert got == {"blocked": [], "torch": False, "tbx": False, "tf": False}
    assert list((logdir / "tensorboard").glob("events.out.tfevents.*"))


def test_event_file_reads_back_with_tensorboards_own_loader(tmp_path):
    """TensorBoard's own loader (record framing and CRC checks included) reads every event back."""
    from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader

    w = ScalarEventWriter(tmp_path)
    w.add_scalars({"loss": 0.25, "huge": 1e300, "neg": -3.0}, step=7)
    w.add_scalar("late", 2.0, global_step=-1)
    w.close()
    events = list(LegacyEventFileLoader(str(w.path)).Load())  # the Event protos as written
    assert events[0].file_version == "brain.Event:2"
    assert events[1].step == 7 and [(v.tag, v.simple_value) for v in events[1].summary.value] == [
        ("loss", 0.25),
        ("huge", math.inf),
        ("neg", -3.0),
    ]  # past float32's range: inf, as a NumPy cast gives
    assert events[2].step == -1 and [(v.tag, v.simple_value) for v in events[2].summary.value] == [
        ("late", 2.0)
    ]
    assert len(events) == 3


# The one module that edits sys.modules: the sandbox's child process (never the user's process) drops the
# launcher's ctypes so the sandboxed code's own ``import ctypes`` reaches the audit hook and is refused.
KNOWN = {"tools/_sandbox_child.py"}


def _edits_sys_modules(tree: ast.AST) -> bool:
    def is_sys_modules(node: ast.AST) -> bool:
        return (
            isinstance(node, ast.Attribute)
            and node.attr == "modules"
            and isinstance(node.value, ast.Name)
            and node.value.id == "sys"
        )

    for node in ast.walk(tree):
        targets = (
            node.targets
            if isinstance(node, (ast.Assign, ast.Delete))
            else ([node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        )
        for t in targets:
            if isinstance(t, ast.Subscript) and is_sys_modules(t.value):
                return True
            if (
                isinstance(t, ast.Attribute)
                and isinstance(t.value, ast.Subscript)
                and is_sys_modules(t.value.value)
            ):
                return True  # sys.modules[name].__class__ = ...
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and is_sys_modules(node.func.value)
            and node.func.attr in ("pop", "setdefault", "update", "clear", "popitem")
        ):
            return True
    return False


def test_no_other_module_edits_sys_modules():
    offenders = {
        str(p.relative_to(ROOT))
        for p in ROOT.rglob("*.py")
        if _edits_sys_modules(ast.parse(p.read_text()))
    }
    assert offenders <= KNOWN, f"modules that edit sys.modules: {sorted(offenders - KNOWN)}"
    assert "telemetry/sinks.py" not in offenders
