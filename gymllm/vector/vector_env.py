"""The barrier-free vector env: sub-envs advance independently; results come back as they finish.

    vec = gymllm.make_vec("gymllm/Latency-v0", num_envs=64)
    obs, infos = vec.reset(seed=0)
    vec.send(actions)                                     # all sub-envs start a step
    while True:
        obs, rew, term, trunc, infos, ids = vec.recv(min_ready=8)   # the first >= 8 to finish
        vec.send(policy(obs), env_ids=ids)                # only those start again

EnvPool's ``send`` / ``recv`` on Gymnasium's ``VectorEnv``:

- ``send(actions, env_ids=None)`` starts one operation per listed sub-env and returns at once.
  A sub-env whose episode ended is autoreset as ``metadata["autoreset_mode"]`` says: NEXT_STEP
  (the next send resets it and its action is ignored; reward 0), SAME_STEP (reset right after the
  ending step; the terminal observation and info go to ``infos["final_obs"]`` /
  ``infos["final_info"]``), DISABLED (sending to it raises ``ResetNeededError``: reset it first).
- ``recv(min_ready=1, timeout=None)`` waits until at least ``min_ready`` results (or all in
  flight, if fewer) are ready, or ``timeout`` passes, and returns every ready result in completion
  order: ``(obs, rewards, terminations, truncations, infos, env_ids)``; ``obs`` is a NumPy object
  array of ``str`` / message lists, ``infos`` holds arrays indexed like ``env_ids`` (Gymnasium's
  ``_key`` masks included). Every sent env id is received exactly once.
- ``step(actions)`` = send to all + receive all, ordered by env id; ``reset(seed, options)`` resets
  all (or ``options["reset_mask"]``). ``reset_env`` / ``areset_env`` / ``astep_env`` act on one
  sub-env (no autoreset, failures raised as :class:`~gymllm.errors.EnvError` with ``env_id``).
- Sync sub-envs run on daemon worker threads (``backend="thread"``), each in its own process
  (``backend="process"``) or in Ray actors (``backend="ray"``, ``ray_options``: see
  :class:`~gymllm.vector.config.RayOptions` and :mod:`gymllm.vector.ray_backend`); sub-envs with
  native ``async`` hooks run as tasks: on the caller's event loop when ``areset_env`` /
  ``astep_env`` await them (no thread hop), on one event-loop thread for the blocking API; each
  such sub-env stays on the loop of its first op while that loop runs. At most
  ``max_concurrency`` operations run at once (thread backend; async ones counted per loop).
- A sub-env that raises, or exceeds ``step_timeout`` (``EnvTimeoutError``), is reported with its
  env id (``infos["error"]``; obs None, truncated True) or raised (``on_error="raise"``); the
  others keep running. A timed-out sub-env is abandoned (its process killed) and rebuilt from its
  factory on its next reset. With the Ray backend a dead actor (killed process, lost node) is
  such a failure of each sub-env it hosts; the actor is recreated on their next reset.
  ``close()`` always returns and may be called twice.

Collaborators, one concern each: :class:`~gymllm.vector.base.SubEnvVector` (the base class: the
sub-envs, their spaces and state, argument checks, batch assembly, closing),
:mod:`gymllm.vector.runners` (where sub-envs run: the runner interface, threads/inline, processes;
:mod:`gymllm.vector.ray_backend` for Ray), :mod:`gymllm.vector.autoreset` (the three autoreset
modes) and :mod:`gymllm.vector.ledger` (the send/recv bookkeeping: slots, sinks, deadlines,
waiting). This class holds the operations: send/recv, step/reset and the per-env twins.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from gymllm.errors import InvalidActionError, ResetNeededError, explain
from gymllm.telemetry import span
from gymllm.vector.args import action_list, env_id_list, seed_list
from gymllm.vector.base import SubEnvVector
from gymllm.vector.errors import VectorStateError
from gymllm.vector.infos import batch_results
from gymllm.vector.ledger import FutureSink, Result, Sink

__all__ = ["VectorEnv"]


class VectorEnv(SubEnvVector):
    """Barrier-free Gymnasium ``VectorEnv`` over text sub-envs (see the module docstring).

    Args:
        env_fns: one zero-argument factory per sub-env (different envs may be mixed; picklable
            ones with ``backend="ray"``, e.g. those ``gymllm.make_vec`` builds from env ids).
        config: a :class:`VectorEnvConfig`; or pass its fields as keyword arguments
            (``backend="ray", ray_options={...}`` included).
    """

    # ------------------------------------------------------------------ barrier-free API
    def send(
        self, actions: Sequence[Any], env_ids: Sequence[int] | np.ndarray | None = None
    ) -> None:
        """Start one step per env id (all sub-envs when ``env_ids`` is None); returns at once."""
        ids = env_id_list(env_ids, self.num_envs)
        actions = action_list(actions, len(ids))
        ledger, slots, op_for = self._ledger, self._slots, self._autoreset.op_for
        with ledger.cond:
            ledger.check_open()
            ops = [op_for(slots[i], a) for i, a in zip(ids, actions)]
            items = [
                ledger.start(slots[i], op, ledger.ready, action=a)
                for i, a, op in zip(ids, actions, ops)
            ]
        self._runner.dispatch(items)

    async def asend(
        self, actions: Sequence[Any], env_ids: Sequence[int] | np.ndarray | None = None
    ) -> None:
        """``send`` for asyncio callers (it never blocks)."""
        self.send(actions, env_ids)

    def recv(self, min_ready: int = 1, timeout: float | None = None):
        """Results of at least ``min_ready`` sub-envs (fewer on ``timeout``), in completion order.

        Returns ``(obs, rewards, terminations, truncations, infos, env_ids)``.
        """
        with span("vector.recv", track="env/vector", min_ready=min_ready):
            results = self._ledger.wait(self._ledger.ready, self._need(min_ready), timeout)
        return self._emit(results)

    async def arecv(self, min_ready: int = 1, timeout: float | None = None):
        """``recv`` for asyncio callers: awaits without blocking the event loop."""
        return self._emit(
            await self._ledger.await_results(self._ledger.ready, self._need(min_ready), timeout)
        )

    # ------------------------------------------------------------------ synchronous API
    def step(self, actions: Sequence[Any]):
        """Send to every sub-env and receive every result, ordered by env id (Gymnasium's ``step``)."""
        actions = action_list(actions, self.num_envs)
        ledger, runner = self._ledger, self._runner
        sink = Sink(ledger.cond, self.num_envs)
        with span("vector.step", track="env/vector", num_envs=self.num_envs):
            with ledger.cond:
                ledger.check_open()
                slots, op_for = self._slots, self._autoreset.op_for
                ops = [op_for(slot, a) for slot, a in zip(slots, actions)]
                fast = runner.can_step_inline(slots)
                if fast:  # all CPU-cheap sync sub-envs: run the whole step right here
                    gens = []
                    for slot in slots:
                        slot.gen += 1
                        slot.pending = slot.busy = True
                        gens.append(slot.gen)
                else:
                    items = [
                        ledger.start(slot, op, sink, a) for slot, a, op in zip(slots, actions, ops)
                    ]
            if fast:
                batch, errors = runner.step_inline(actions, ops, gens)
                self._raise_first_error(errors, batch)
                return batch
            runner.dispatch(items)
            results = ledger.wait(sink, self.num_envs, None)
        batch = batch_results(results, self.num_envs, by_env_id=True)
        self._raise_first_error(results, batch)
        return batch

    def reset(self, *, seed: int | Sequence[int | None] | None = None, options: dict | None = None):
        """Reset every sub-env (or those in ``options["reset_mask"]``); ``seed`` int -> seeds ``seed + i``.

        Returns ``(obs, infos)``; sub-envs left out by the mask keep their last observation.
        """
        seeds = seed_list(seed, self.num_envs)
        options = dict(options or {})
        mask = options.pop("reset_mask", None)
        ids = (
            list(range(self.num_envs))
            if mask is None
            else [int(i) for i in np.flatnonzero(np.asarray(mask))]
        )
        ledger = self._ledger
        sink = Sink(ledger.cond, len(ids))
        with span("vector.reset", track="env/vector", num_envs=len(ids)):
            with ledger.cond:
                ledger.check_open()
                busy = [i for i in ids if self._slots[i].busy]
                if busy:
                    raise VectorStateError(
                        explain(
                            "reset()",
                            expected="no env in flight",
                            received=f"env ids {busy} in flight",
                            fix="recv() their results before reset()",
                        )
                    )
                items = [
                    ledger.start(
                        self._slots[i], "reset", sink, seed=seeds[i], options=options or None
                    )
                    for i in ids
                ]
            self._runner.dispatch(items)
            results = ledger.wait(sink, len(ids), None)
        obs, _, _, _, infos = batch_results(results, self.num_envs, by_env_id=True)
        for i, slot in enumerate(self._slots):
            if mask is not None and i not in ids:
                obs[i] = slot.last_obs
        self._raise_first_error(results, (obs, infos))
        return obs, infos

    # ------------------------------------------------------------------ per-env API
    def reset_env(
        self, env_id: int, *, seed: int | None = None, options: dict | None = None
    ) -> tuple[Any, dict]:
        """Reset one sub-env; returns ``(obs, info)``; raises ``EnvError`` (with ``env_id``) on failure."""
        ledger = self._ledger
        sink = Sink(ledger.cond, 1)
        with ledger.cond:
            ledger.check_open()
            item = ledger.start(self._idle_slot(env_id), "reset", sink, seed=seed, options=options)
        self._runner.dispatch([item])
        (res,) = ledger.wait(sink, 1, None)
        return self._unwrap(res)[::4]

    async def areset_env(
        self, env_id: int, *, seed: int | None = None, options: dict | None = None
    ):
        """Async per-env reset (no autoreset); returns ``(obs, info)``; raises ``EnvError`` with ``env_id``."""
        res = await self._one(env_id, "reset", seed=seed, options=options)
        return self._unwrap(res)[::4]

    async def astep_env(self, env_id: int, action: Any):
        """Async per-env step (no autoreset): ``(obs, reward, terminated, truncated, info)``.

        Raises ``ResetNeededError`` when the episode ended, ``EnvTimeoutError`` past ``step_timeout``
        and ``EnvError`` (``.env_id``, ``.cause``) when the sub-env raised.
        """
        return self._unwrap(await self._one(env_id, "step", action=action))

    async def _one(self, env_id: int, op: str, **kw: Any) -> Result:
        sink = FutureSink()
        ledger = self._ledger
        with ledger.cond:
            ledger.check_open()
            slot = self._idle_slot(env_id)
            if op == "step":
                if slot.state != "running":
                    raise ResetNeededError(
                        explain(
                            f"astep_env({env_id})",
                            expected="a running episode",
                            received=f"an env in state {slot.state!r}",
                            fix="await vec.areset_env(env_id) first",
                        )
                    )
                why = slot.check(kw["action"])
                if why is not None:
                    raise InvalidActionError(
                        explain(
                            f"astep_env({env_id}, action)",
                            expected=f"an action in {slot.env.action_space!r}",
                            received=why,
                            fix="pass one str",
                        )
                    )
            item = ledger.start(slot, op, sink, **kw)
        runner = self._runner
        if runner.can_run_here(
            slot, sink.loop
        ):  # an async-native sub-env: its coroutine runs in ours
            return await runner.run_here(item, sink)
        runner.dispatch([item], caller_loop=sink.loop)
        return await ledger.await_one(slot, item.gen, sink)
