"""gymllm.utils.backend_start: the backend starts in a background thread, once per process, and a
failure there is kept for the main thread's own first JAX call to raise."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from gymllm.utils import backend_start


def test_start_backend_runs_once_and_leaves_jax_usable():
    first = backend_start.start_backend()
    assert backend_start.start_backend() is first  # once per process
    assert first.wait(timeout=120) and first.error is None
    import jax

    assert jax.devices()  # the main thread sees the started backend


def test_a_backend_that_cannot_start_fails_at_the_main_threads_first_jax_call():
    """In a fresh process asked for a platform that does not exist, the thread keeps the error and
    the main thread's own JAX call raises it (nothing is swallowed)."""
    code = textwrap.dedent(
        """
        from gymllm.utils.backend_start import start_backend
        s = start_backend()
        assert s.wait(timeout=120)
        assert s.error is not None, "expected the background start to record the failure"
        import jax
        try:
            jax.devices()
        except RuntimeError as e:
            print("MAIN RAISED:", type(e).__name__)
        """
    )
    env = {"JAX_PLATFORMS": "no_such_platform", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "MAIN RAISED: RuntimeError" in proc.stdout
