"""Start JAX's backend (an accelerator's runtime) in a background thread while the host works.

On a TPU v5e the runtime's start took about 10.5 s of the Quickstart's run on the chip, at the first
JAX call of the model load; until then the process only parses its config and reads files. Starting
it at the top of a run lets the host read the checkpoint, build the tokenizer and the envs meanwhile:
the first JAX call on the main thread then waits only for what is left (JAX's backend set-up holds a
lock, so the two threads never set it up twice). On the CPU the start takes milliseconds and this
changes nothing.

The thread never raises: a backend that fails to start fails again, with its full message, at the
main thread's first JAX call (JAX re-raises a failed platform's error there); :func:`start_backend`
keeps the exception on ``StartedBackend.error`` for logs.
"""

from __future__ import annotations

import dataclasses
import threading

_lock = threading.Lock()
_started: StartedBackend | None = None


@dataclasses.dataclass
class StartedBackend:
    """The background start: its ``thread``, and the exception it met (None: none, or not done)."""

    thread: threading.Thread
    error: BaseException | None = None

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the start is done (True) or ``timeout`` seconds passed (False)."""
        self.thread.join(timeout)
        return not self.thread.is_alive()


def start_backend() -> StartedBackend:
    """Start ``jax.devices()`` in a daemon thread, once per process (later calls return the first)."""
    global _started
    with _lock:
        if _started is not None:
            return _started

        def run() -> None:
            try:
                import jax

                jax.devices()
            except BaseException as e:  # noqa: BLE001 - re-raised by the main thread's first JAX call
                started.error = e

        started = StartedBackend(
            threading.Thread(target=run, name="gymllm-backend-start", daemon=True)
        )
        started.thread.start()
        _started = started
        return started
