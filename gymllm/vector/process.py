"""``ProcessEnv``: one sub-env hosted in its own process, driven over a pipe.

Used by the vector env's ``backend="process"`` for CPU-heavy sync envs. Commands and results are
pickled through a ``multiprocessing`` pipe (the env factory with cloudpickle), so text observations
never pass through shared memory. An exception raised in the child comes back as itself (or as a
``RuntimeError`` with its traceback when it cannot be pickled). ``kill()`` ends a hung child.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import traceback
from typing import Any, Callable

import gymnasium as gym
from gymnasium.vector.utils import CloudpickleWrapper

__all__ = ["ProcessEnv", "picklable_error"]


def _child(conn, env_fn: CloudpickleWrapper) -> None:
    env = None
    try:
        env = env_fn()
        conn.send(
            ("ok", (env.observation_space, env.action_space, dict(getattr(env, "metadata", {}))))
        )
        while True:
            cmd, args, kwargs = conn.recv()
            if cmd == "close":
                env.close()
                conn.send(("ok", None))
                return
            try:
                conn.send(("ok", getattr(env, cmd)(*args, **kwargs)))
            except Exception as e:  # noqa: BLE001 - shipped back to the parent
                conn.send(("err", picklable_error(e)))
    except (EOFError, KeyboardInterrupt, BrokenPipeError):
        return
    except Exception as e:  # noqa: BLE001 - construction failed
        try:
            conn.send(("err", picklable_error(e)))
        except Exception:  # noqa: BLE001
            pass


def picklable_error(e: BaseException) -> BaseException:
    """``e`` itself when it survives pickling, else a ``RuntimeError`` holding its text and traceback."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:  # noqa: BLE001
        return RuntimeError(f"{type(e).__name__}: {e}\n{traceback.format_exc()}")


class ProcessEnv:
    """Proxy with ``reset`` / ``step`` / ``close`` for an env built by ``env_fn`` in a child process.

    The constructor starts the child and returns at once; :meth:`wait_ready` receives the child's
    spaces (call it before first use; the vector env starts all children, then waits for them).
    """

    def __init__(self, env_fn: Callable[[], gym.Env], context: str = "forkserver"):
        ctx = mp.get_context(context)
        if context == "forkserver":
            ctx.set_forkserver_preload(["gymllm.registration"])
        self._conn, child = ctx.Pipe()
        self.process = ctx.Process(
            target=_child,
            args=(child, CloudpickleWrapper(env_fn)),
            daemon=True,
            name="gymllm-subenv",
        )
        self.process.start()
        child.close()
        self.observation_space: gym.Space | None = None
        self.action_space: gym.Space | None = None
        self.metadata: dict[str, Any] = {}
        self.closed = False

    def wait_ready(self) -> "ProcessEnv":
        if self.observation_space is None:
            self.observation_space, self.action_space, self.metadata = self._result()
        return self

    @property
    def unwrapped(self) -> "ProcessEnv":
        return self

    def _result(self) -> Any:
        try:
            status, payload = self._conn.recv()
        except (EOFError, OSError) as e:
            raise RuntimeError(
                f"sub-env process {self.process.pid} exited (code {self.process.exitcode})"
            ) from e
        if status == "err":
            raise payload
        return payload

    def _call(self, cmd: str, *args: Any, **kwargs: Any) -> Any:
        self.wait_ready()
        self._conn.send((cmd, args, kwargs))
        return self._result()

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        return self._call("reset", seed=seed, options=options)

    def step(self, action: Any):
        return self._call("step", action)

    def close(self, timeout: float = 1.0) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            if self.process.is_alive():
                self._conn.send(("close", (), {}))
                if self._conn.poll(timeout):
                    self._conn.recv()
                self.process.join(timeout)
        except (OSError, EOFError, BrokenPipeError):
            pass
        finally:
            self.kill()

    def kill(self) -> None:
        """End the child now (used when it hangs past its timeout); never raises."""
        self.closed = True
        try:
            if self.process.is_alive():
                self.process.kill()
                self.process.join(1.0)
            self._conn.close()
        except Exception:  # noqa: BLE001
            pass
