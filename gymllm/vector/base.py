"""``SubEnvVector``: the base class of the barrier-free vector env, the sub-envs and their invariants.

It owns what every operation relies on and no operation itself (Gymnasium's style: the base owns
the invariants, :class:`gymllm.vector.VectorEnv` adds the operations on top):

- building: the config (a :class:`VectorEnvConfig` or its fields as keywords), one
  :class:`~gymllm.vector.ledger.Slot` per env factory, the send/recv
  :class:`~gymllm.vector.ledger.Ledger` and the runner that hosts the sub-envs (threads, processes
  or Ray actors), then the spaces (a ``Tuple`` when the sub-envs' spaces differ);
- state: ``closed``, ``runner``, ``envs``, ``ended``, ``in_flight``;
- argument checks: env ids, an env not in flight, ``min_ready`` against what is in flight;
- results: batches in completion order, ``on_error="raise"`` raising the first error with the
  whole batch on it, one result unwrapped or raised;
- closing: ``close()`` always returns, never waits on a hung sub-env, and may be called twice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import batch_space

from gymllm.errors import InvalidActionError
from gymllm.validation import require
from gymllm.vector.args import check_env_id, check_min_ready
from gymllm.vector.autoreset import AutoresetPolicy
from gymllm.vector.config import VectorEnvConfig
from gymllm.vector.errors import VectorStateError
from gymllm.vector.infos import batch_results
from gymllm.vector.ledger import Ledger, Result, Slot
from gymllm.vector.runners import ProcessRunner, SubEnvRunner, ThreadRunner

__all__ = ["SubEnvVector", "make_runner"]


def make_runner(config: VectorEnvConfig, ledger: Ledger) -> SubEnvRunner:
    """The runner of ``config.backend`` over ``ledger``'s slots (Ray is imported only for ``"ray"``)."""
    if config.backend == "process":
        return ProcessRunner(config, ledger)
    if config.backend == "ray":
        from gymllm.vector.ray_backend import RayRunner  # imports Ray lazily (the ray extra)

        return RayRunner(config, ledger)
    return ThreadRunner(config, ledger)


class SubEnvVector(gym.vector.VectorEnv):
    """The sub-envs of a barrier-free vector env and their invariants (see the module docstring);
    :class:`gymllm.vector.VectorEnv` is the class to use, and its docstring describes the
    constructor's arguments (``env_fns``, ``config`` or its fields as keywords)."""

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        *,
        config: VectorEnvConfig | None = None,
        **config_kwargs: Any,
    ):
        if config is None:
            config = VectorEnvConfig(**config_kwargs)
        elif config_kwargs:
            config = dataclasses.replace(config, **config_kwargs)
        env_fns = list(env_fns)
        require(
            env_fns and all(callable(f) for f in env_fns),
            "VectorEnv(env_fns)",
            expected="a non-empty list of env factories",
            received=env_fns,
            fix="pass [lambda: gymllm.make('gymllm/Echo-v0')] * n",
            error=InvalidActionError,
        )
        self.config = config
        self.env_fns = env_fns
        self.num_envs = len(env_fns)
        self._slots = [Slot(i, fn) for i, fn in enumerate(env_fns)]
        self._ledger = Ledger(
            self._slots, config.step_timeout, abandon=lambda slot: self._runner.abandon(slot)
        )
        self._runner = make_runner(config, self._ledger)
        self._runner.build()
        self._autoreset = AutoresetPolicy(config.autoreset_mode)
        self._setup_spaces()
        self.metadata = {"autoreset_mode": config.autoreset_mode, "render_modes": []}
        self.render_mode = None
        self.spec = None

    def _setup_spaces(self) -> None:
        obs_spaces = [s.env.observation_space for s in self._slots]
        act_spaces = [s.env.action_space for s in self._slots]
        self.single_observation_spaces, self.single_action_spaces = obs_spaces, act_spaces
        self.single_observation_space = obs_spaces[0]
        self.single_action_space = act_spaces[0]
        self.observation_space = (
            gym.spaces.Tuple(obs_spaces)
            if any(s != obs_spaces[0] for s in obs_spaces)
            else batch_space(obs_spaces[0], self.num_envs)
        )
        self.action_space = (
            gym.spaces.Tuple(act_spaces)
            if any(s != act_spaces[0] for s in act_spaces)
            else batch_space(act_spaces[0], self.num_envs)
        )

    # ------------------------------------------------------------------ state
    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        ledger = self.__dict__.get("_ledger")
        return True if ledger is None else ledger.closed

    @closed.setter
    def closed(self, value: bool) -> None:  # Gymnasium's base class assigns it
        ledger = self.__dict__.get("_ledger")
        if ledger is not None and value:
            ledger.closed = True

    @property
    def runner(self) -> SubEnvRunner:
        """Where the sub-envs run: a :class:`~gymllm.vector.runners.SubEnvRunner` (``RayRunner`` with Ray)."""
        return self._runner

    @property
    def envs(self) -> list[Any]:
        """The current sub-env instances (``ProcessEnv`` proxies with the process backend, ``RayEnvHandle``
        records with the Ray backend)."""
        return [s.env for s in self._slots]

    @property
    def ended(self) -> np.ndarray:
        """[num_envs] bool: sub-envs whose episode ended (or failed) and that have not been reset since."""
        return np.array([s.state != "running" for s in self._slots], dtype=bool)

    @property
    def in_flight(self) -> list[int]:
        """Env ids with an operation sent but not yet received."""
        return self._ledger.in_flight_ids()

    # ------------------------------------------------------------------ argument checks
    def _slot(self, env_id: Any) -> Slot:
        return self._slots[check_env_id(env_id, self.num_envs)]

    def _idle_slot(self, env_id: int) -> Slot:
        slot = self._slot(env_id)
        require(
            not slot.busy,
            f"env {slot.env_id}",
            expected="an env not in flight",
            received="an env with an unreceived operation",
            fix="recv() it first",
            error=VectorStateError,
        )
        return slot

    def _need(self, min_ready: int) -> int:
        check_min_ready(min_ready)
        with self._ledger.cond:
            self._ledger.check_open()
            in_flight = self._ledger.count_for_recv()
        require(
            in_flight != 0,
            "recv()",
            expected="at least one env in flight",
            received="none",
            fix="call send(actions, env_ids) before recv()",
            error=VectorStateError,
        )
        return min(int(min_ready), in_flight)

    # ------------------------------------------------------------------ results
    def _raise_first_error(self, results: list[Result], batch: tuple) -> None:
        errors = [r.error for r in results if r.error is not None]
        if errors and self.config.on_error == "raise":
            err = errors[0]
            err.results = batch  # the whole batch stays available on the exception
            err.errors = errors
            raise err

    def _emit(self, results: list[Result]):
        batch = batch_results(results, len(results), by_env_id=False)
        env_ids = np.array([r.env_id for r in results], dtype=np.int64)
        self._raise_first_error(results, (*batch, env_ids))
        return (*batch, env_ids)

    @staticmethod
    def _unwrap(res: Result) -> tuple:
        if res.error is not None:
            raise res.error
        return res.obs, res.reward, res.terminated, res.truncated, res.info

    # ------------------------------------------------------------------ closing
    def close(self, **kwargs: Any) -> None:
        """Stop everything and close the sub-envs; always returns, idempotent, never waits on a hung env."""
        if self._ledger.closed:
            return
        busy = self._ledger.close()
        idle = [s for s in self._slots if s not in busy]
        self._runner.close(idle, busy)

    def __repr__(self) -> str:
        return f"gymllm.VectorEnv(num_envs={self.num_envs}, backend={self.config.backend!r})"
