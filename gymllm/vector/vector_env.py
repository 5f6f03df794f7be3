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
- Sync sub-envs run on daemon worker threads (``backend="thread"``) or each in its own process
  (``backend="process"``); sub-envs with native ``async`` hooks run as tasks on one event-loop
  thread. At most ``max_concurrency`` operations run at once.
- A sub-env that raises, or exceeds ``step_timeout`` (``EnvTimeoutError``), is reported with its
  env id (``infos["error"]``; obs None, truncated True) or raised (``on_error="raise"``); the
  others keep running. A timed-out sub-env is abandoned (its process killed) and rebuilt from its
  factory on its next reset. ``close()`` always returns and may be called twice.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from gymllm.core import TextEnv, _overrides
from gymllm.errors import EnvError, EnvTimeoutError, GymLLMError, InvalidActionError, ResetNeededError, explain
from gymllm.telemetry import counter, span
from gymllm.vector.config import VectorEnvConfig
from gymllm.vector.infos import batch_infos
from gymllm.vector.process import ProcessEnv
from gymllm.vector.workers import LoopThread, WorkerPool

__all__ = ["VectorEnv", "EnvIdError", "VectorStateError"]

_INF = math.inf


class EnvIdError(GymLLMError, IndexError):
    """An env id that is not in ``range(num_envs)``, or listed twice in one call."""


class VectorStateError(GymLLMError, RuntimeError):
    """A call that the vector env's state does not allow (env already in flight, nothing to recv, closed)."""


class _Result:
    """One sub-env's outcome (a light record: built once per sub-env step)."""

    __slots__ = ("env_id", "obs", "reward", "terminated", "truncated", "info", "error")

    def __init__(self, env_id: int, obs: Any = None, reward: float = 0.0, terminated: bool = False,
                 truncated: bool = False, info: dict | None = None, error: EnvError | None = None):
        self.env_id, self.obs, self.reward = env_id, obs, reward
        self.terminated, self.truncated, self.info, self.error = terminated, truncated, info, error


class _Sink:
    """Collects results; wakes sync waiters (the condition) and async waiters once ``need`` are in."""

    def __init__(self, cond: threading.Condition, need: int = 1):
        self.items: collections.deque[_Result] = collections.deque()
        self.need = need
        self._cond = cond
        self._events: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()

    def deliver(self, res: _Result) -> None:  # called with the lock held
        self.items.append(res)
        if len(self.items) >= self.need:
            self.wake()

    def wake(self) -> None:
        self._cond.notify_all()
        for loop, ev in tuple(self._events):
            _call_soon(loop, ev.set)


class _FutureSink:
    """Delivers one result to an asyncio future on the caller's loop."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.future: asyncio.Future[_Result] = self.loop.create_future()

    def deliver(self, res: _Result) -> None:
        def _set() -> None:
            if not self.future.done():
                self.future.set_result(res)

        _call_soon(self.loop, _set)


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[[], None]) -> None:
    """``loop.call_soon_threadsafe(fn)``, ignoring a loop that has already closed (its waiter is gone)."""
    try:
        loop.call_soon_threadsafe(fn)
    except RuntimeError:
        pass


@dataclasses.dataclass(eq=False)
class _Slot:
    env_id: int
    make: Callable[[], Any]  # builds the instance (a gym.Env, or a ProcessEnv proxy)
    env: Any = None
    kind: str = "sync"  # "sync": worker thread; "async": task on the loop thread
    state: str = "new"  # "new" | "running" | "done"
    pending: bool = False  # an operation is running
    busy: bool = False  # sent and its result not yet handed to the caller (pending, or waiting in a sink)
    gen: int = 0  # bumped per operation and on timeout: stale completions are dropped
    deadline: float = _INF
    sink: Any = None
    handle: Any = None  # concurrent.futures.Future of an async op
    lost: bool = False  # abandoned after a timeout; rebuilt by the next reset
    last_obs: Any = None
    inline: bool = False  # run its ops on the calling thread (see VectorEnv._note_cost)
    check: Callable[[Any], str | None] = lambda action: None  # action validator (see _validator)
    step: Callable[[Any], tuple] | None = None  # the env's step function (see _step_fn)
    streak: int = 0  # consecutive step times on the other side of the inline threshold


def _is_async_native(env: Any) -> bool:
    u = getattr(env, "unwrapped", env)
    return callable(getattr(env, "astep", None)) and isinstance(u, TextEnv) and _overrides(u, "_astep")


def _validator(space: gym.Space) -> Callable[[Any], str | None]:
    """``action -> reason it is not in space (or None)``: gymllm spaces' ``why_not``, else ``contains``."""
    why = getattr(space, "why_not", None)
    if why is not None:
        return why
    return lambda action: None if space.contains(action) else f"{action!r} not in {space!r}"


def _step_fn(env: Any) -> Callable[[Any], tuple]:
    """``env.step``, or for a bare TextEnv that keeps the base ``step`` its ``_step_checked`` (the
    vector env has already checked the action against the same space: no second check)."""
    if isinstance(env, TextEnv) and type(env).step is TextEnv.step:
        return env._step_checked
    return env.step


def _sync_op(env: Any, op: str, action: Any, seed: int | None, options: dict | None,
             step: Callable[[Any], tuple] | None = None) -> tuple:
    if op == "reset":
        obs, info = env.reset(seed=seed, options=options)
        return obs, 0.0, False, False, info
    obs, reward, terminated, truncated, info = (step or env.step)(action)
    if op == "step_same" and (terminated or truncated):
        final_obs, final_info = obs, info
        obs, info = env.reset()
        info = {**info, "final_obs": final_obs, "final_info": final_info}
    return obs, reward, terminated, truncated, info


async def _async_op(env: Any, op: str, action: Any, seed: int | None, options: dict | None) -> tuple:
    if op == "reset":
        obs, info = await env.areset(seed=seed, options=options)
        return obs, 0.0, False, False, info
    obs, reward, terminated, truncated, info = await env.astep(action)
    if op == "step_same" and (terminated or truncated):
        final_obs, final_info = obs, info
        obs, info = await env.areset()
        info = {**info, "final_obs": final_obs, "final_info": final_info}
    return obs, reward, terminated, truncated, info


class VectorEnv(gym.vector.VectorEnv):
    """Barrier-free Gymnasium ``VectorEnv`` over text sub-envs (see the module docstring).

    Args:
        env_fns: one zero-argument factory per sub-env (different envs may be mixed).
        config: a :class:`VectorEnvConfig`; or pass its fields as keyword arguments.
    """

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], *, config: VectorEnvConfig | None = None,
                 **config_kwargs: Any):
        if config is None:
            config = VectorEnvConfig(**config_kwargs)
        elif config_kwargs:
            config = dataclasses.replace(config, **config_kwargs)
        env_fns = list(env_fns)
        if not env_fns or not all(callable(f) for f in env_fns):
            raise InvalidActionError(explain("VectorEnv(env_fns)", expected="a non-empty list of env factories",
                                             received=env_fns, fix="pass [lambda: gymllm.make('gymllm/Echo-v0')] * n"))
        self.config = config
        self.env_fns = env_fns
        self.num_envs = len(env_fns)
        self.closed = False
        self._cond = threading.Condition(threading.Lock())
        self._ready = _Sink(self._cond)
        self._pool: WorkerPool | None = None
        self._loop: LoopThread | None = None
        self._slots = [_Slot(i, self._maker(fn)) for i, fn in enumerate(env_fns)]
        self._build_all()
        self._setup_spaces()
        self.metadata = {"autoreset_mode": config.autoreset_mode, "render_modes": []}
        self._autoreset = config.autoreset_mode != AutoresetMode.DISABLED
        self._step_op = "step_same" if config.autoreset_mode == AutoresetMode.SAME_STEP else "step"
        self.render_mode = None
        self.spec = None

    # ------------------------------------------------------------------ construction
    def _maker(self, fn: Callable[[], gym.Env]) -> Callable[[], Any]:
        if self.config.backend == "process":
            ctx = self.config.mp_context
            return lambda: ProcessEnv(fn, ctx).wait_ready()
        return fn

    def _build_all(self) -> None:
        building = 0
        try:
            if self.config.backend == "process":  # start every child first, then wait for them together
                for slot, fn in zip(self._slots, self.env_fns):
                    building = slot.env_id
                    slot.env = ProcessEnv(fn, self.config.mp_context)
                for slot in self._slots:
                    building = slot.env_id
                    slot.env.wait_ready()
            else:
                for slot in self._slots:
                    building = slot.env_id
                    slot.env = slot.make()
        except Exception as e:
            self._close_instances(self._slots, [s for s in self._slots if isinstance(s.env, ProcessEnv)])
            raise EnvError(explain(f"VectorEnv: creating sub-env {building}", expected="its factory to return an env",
                                   received=f"{type(e).__name__}: {e}", fix="check that env id / factory and its "
                                   "kwargs on their own, e.g. gymllm.make(id, **kwargs)"), env_id=building, cause=e) from e
        for slot in self._slots:
            slot.kind = "async" if _is_async_native(slot.env) else "sync"
            slot.check = _validator(slot.env.action_space)
            slot.step = _step_fn(slot.env)
        limit = self.config.max_concurrency or self.num_envs
        n_sync = sum(s.kind == "sync" for s in self._slots)
        if n_sync:
            self._pool = WorkerPool(min(limit, n_sync))
        if n_sync < self.num_envs:
            self._loop = LoopThread()
            self._async_limit = asyncio.Semaphore(limit)

    def _setup_spaces(self) -> None:
        obs_spaces = [s.env.observation_space for s in self._slots]
        act_spaces = [s.env.action_space for s in self._slots]
        self.single_observation_spaces, self.single_action_spaces = obs_spaces, act_spaces
        self.single_observation_space = obs_spaces[0]
        self.single_action_space = act_spaces[0]
        self.observation_space = gym.spaces.Tuple(obs_spaces) if any(
            s != obs_spaces[0] for s in obs_spaces) else batch_space(obs_spaces[0], self.num_envs)
        self.action_space = gym.spaces.Tuple(act_spaces) if any(
            s != act_spaces[0] for s in act_spaces) else batch_space(act_spaces[0], self.num_envs)

    @property
    def envs(self) -> list[Any]:
        """The current sub-env instances (``ProcessEnv`` proxies with the process backend)."""
        return [s.env for s in self._slots]

    @property
    def ended(self) -> np.ndarray:
        """[num_envs] bool: sub-envs whose episode ended (or failed) and that have not been reset since."""
        return np.array([s.state != "running" for s in self._slots], dtype=bool)

    @property
    def in_flight(self) -> list[int]:
        """Env ids with an operation sent but not yet received."""
        with self._cond:
            return [s.env_id for s in self._slots if s.pending] + [r.env_id for r in self._ready.items]

    # ------------------------------------------------------------------ submission
    def _check_open(self) -> None:
        if self.closed:
            raise VectorStateError(explain("VectorEnv", expected="an open vector env", received="closed",
                                           fix="create a new vector env with gymllm.make_vec(...)"))

    def _slot(self, env_id: Any) -> _Slot:
        if isinstance(env_id, (bool, np.bool_)) or not isinstance(env_id, (int, np.integer)) \
                or not 0 <= env_id < self.num_envs:
            raise EnvIdError(explain("env id", expected=f"an int in [0, {self.num_envs})", received=env_id,
                                     fix="use the env_ids that recv() returned"))
        return self._slots[int(env_id)]

    def _ids(self, env_ids: Any) -> list[int]:
        if env_ids is None:
            return list(range(self.num_envs))
        ids = [int(self._slot(i).env_id) for i in np.asarray(env_ids, dtype=object).reshape(-1)]
        if len(set(ids)) != len(ids):
            raise EnvIdError(explain("env_ids", expected="distinct env ids", received=ids,
                                     fix="send at most one action per env id per call"))
        return ids

    def _submit(self, slot: _Slot, op: str, sink: Any, action: Any = None, seed: int | None = None,
                options: dict | None = None) -> tuple | None:
        """Start one operation on ``slot`` (lock held). A sync op is returned as a work item
        ``(slot, gen, op, action, seed, options, rebuild, inline)`` for the caller to run or hand to
        the pool after releasing the lock (so workers never queue on it)."""
        slot.gen += 1
        slot.pending = slot.busy = True
        slot.sink = sink
        timeout = self.config.step_timeout
        if timeout is not None:
            slot.deadline = time.monotonic() + timeout
        rebuild = slot.lost
        slot.lost = False
        if slot.kind == "async":
            slot.handle = self._loop.submit(self._run_async(slot, slot.gen, op, action, seed, options, rebuild))
            return None
        inline = slot.inline and not rebuild and timeout is None
        return slot, slot.gen, op, action, seed, options, rebuild, inline

    def _note_cost(self, slot: _Slot, dt: float) -> None:
        """Decide whether this sub-env's ops run on the calling thread (``slot.inline``).

        Only thread-backed sync sub-envs measured to take under ``inline_below_s`` per step, and
        only without a ``step_timeout`` (an inline op cannot be timed out). Such steps are CPU-bound Python, which
        gains nothing from threads under the GIL; skipping the hand-off saves its switching cost.
        With hysteresis: 3 steps in a row under the limit move a sub-env inline, 3 in a row above
        10x the limit move it back to the pool (one preempted step does not flip it).
        """
        limit = self.config.inline_below_s
        if self.config.backend == "process":
            return  # a proxy's step time is a blocking round trip, not GIL-bound work: keep it pooled
        if slot.inline:
            slot.streak = slot.streak + 1 if dt > 10 * limit else 0
        else:
            slot.streak = slot.streak + 1 if dt < limit else 0
        if slot.streak >= 3:
            slot.inline, slot.streak = not slot.inline, 0

    def _dispatch(self, items: list[tuple | None]) -> None:
        """Hand pooled work items to the workers, then run the inline ones here (one lock round-trip)."""
        inline = []
        for item in items:
            if item is None:
                continue
            if item[7]:
                inline.append(item)
            else:
                self._pool.submit(functools.partial(self._run_sync, *item[:7]))
        if not inline:
            return
        done = []
        perf = time.perf_counter
        slow = 10 * self.config.inline_below_s
        for slot, gen, op, action, seed, options, _rebuild, _ in inline:
            t0 = perf()
            try:
                if op == "step":  # the hot path, spelled out
                    res = _Result(slot.env_id, *slot.step(action))
                else:
                    res = _Result(slot.env_id, *_sync_op(slot.env, op, action, seed, options, slot.step))
            except BaseException as e:  # noqa: BLE001 - isolate the sub-env, report it
                res = self._error_result(slot.env_id, op, e)
            else:
                dt = perf() - t0
                if (dt > slow or slot.streak) and op != "reset":
                    self._note_cost(slot, dt)
            done.append((slot, gen, op, res))
        self._finish_many(done)

    def _rebuild(self, slot: _Slot, gen: int) -> Any:
        env = slot.make()
        with self._cond:
            if slot.gen == gen:
                slot.env, slot.step = env, _step_fn(env)
        return env

    def _exec_sync(self, slot: _Slot, gen: int, op: str, action: Any, seed: Any, options: Any, rebuild: bool) -> _Result:
        try:
            env = self._rebuild(slot, gen) if rebuild else slot.env
            t0 = time.perf_counter()
            res = _Result(slot.env_id, *_sync_op(env, op, action, seed, options, _step_fn(env)))
            if op != "reset":  # steps decide inlining (a reset's cost says little about a step's)
                self._note_cost(slot, time.perf_counter() - t0)
            return res
        except BaseException as e:  # noqa: BLE001 - isolate the sub-env, report it
            return self._error_result(slot.env_id, op, e)

    def _run_sync(self, *args: Any) -> None:
        # Pooled ops take >= inline_below_s, so a span per op (on the sub-env's track) is affordable.
        with span(f"env.{args[2]}", track=f"env/{args[0].env_id}"):
            res = self._exec_sync(*args)
        self._finish(args[0], args[1], args[2], res)

    async def _run_async(self, slot: _Slot, gen: int, op: str, action: Any, seed: Any, options: Any,
                         rebuild: bool) -> None:
        try:
            async with self._async_limit:
                env = self._rebuild(slot, gen) if rebuild else slot.env
                with span(f"env.{op}", track=f"env/{slot.env_id}"):
                    res = _Result(slot.env_id, *await _async_op(env, op, action, seed, options))
        except asyncio.CancelledError:
            return  # timed out or closed: the canceller reports it
        except BaseException as e:  # noqa: BLE001
            res = self._error_result(slot.env_id, op, e)
        self._finish(slot, gen, op, res)

    def _error_result(self, env_id: int, op: str, e: BaseException) -> _Result:
        err = EnvError(f"sub-env {env_id} raised {type(e).__name__} in {op.split('_')[0]}: {e}. Fix: see its "
                       f"cause (err.cause); the vector env keeps the other sub-envs running and resets this one "
                       f"on its next send.", env_id=env_id, cause=e)
        return _Result(env_id, None, 0.0, False, True, {"error": err}, err)

    def _finish(self, slot: _Slot, gen: int, op: str, res: _Result) -> None:
        with self._cond:
            self._finish_locked(slot, gen, op, res)

    def _finish_many(self, done: list[tuple[_Slot, int, str, _Result]]) -> None:
        with self._cond:
            for slot, gen, op, res in done:
                if slot.gen != gen or self.closed or res.error is not None or not isinstance(slot.sink, _Sink):
                    self._finish_locked(slot, gen, op, res)
                    continue
                slot.pending = False  # the common case, inlined: a step or reset that returned
                slot.state = "done" if op == "step" and (res.terminated or res.truncated) else "running"
                slot.last_obs = res.obs
                sink = slot.sink
                slot.sink = None
                sink.items.append(res)
                if len(sink.items) >= sink.need:
                    sink.wake()

    def _finish_locked(self, slot: _Slot, gen: int, op: str, res: _Result) -> None:
        if slot.gen != gen or self.closed:
            return  # stale (timed out, or the vector env closed meanwhile)
        slot.pending, slot.handle, slot.deadline = False, None, _INF
        if res.error is not None:
            slot.state = "done"
        elif op == "step":
            slot.state = "done" if (res.terminated or res.truncated) else "running"
        else:
            slot.state = "running"
        if res.error is None:
            slot.last_obs = res.obs
        sink, slot.sink = slot.sink, None
        if not isinstance(sink, _Sink):
            slot.busy = False  # a future sink hands the result over directly
        sink.deliver(res)

    def _expire_overdue(self, now: float) -> float:
        """Report every pending op past its deadline as timed out (lock held); returns the next deadline."""
        nxt = _INF
        for slot in self._slots:
            if slot.pending:
                if slot.deadline <= now:
                    self._expire(slot)
                else:
                    nxt = min(nxt, slot.deadline)
        return nxt

    def _expire(self, slot: _Slot) -> None:
        slot.gen += 1
        slot.pending, slot.state, slot.lost, slot.deadline = False, "done", True, _INF
        if slot.handle is not None:
            slot.handle.cancel()
        elif isinstance(slot.env, ProcessEnv):
            slot.env.kill()
        elif self._pool is not None:
            self._pool.add_worker(replacement=True)  # the stuck worker is gone for good; keep the pool's capacity
        slot.handle = None
        err = EnvTimeoutError(
            explain(f"sub-env {slot.env_id}", expected=f"a reply within step_timeout={self.config.step_timeout}s",
                    received="no reply", fix="raise step_timeout, or fix the env; it is rebuilt on its next reset"),
            env_id=slot.env_id)
        counter("env_timeouts", 1, track=f"env/{slot.env_id}")
        sink, slot.sink = slot.sink, None
        if not isinstance(sink, _Sink):
            slot.busy = False
        sink.deliver(_Result(slot.env_id, None, 0.0, False, True, {"error": err}, err))

    # ------------------------------------------------------------------ waiting
    def _wait(self, sink: _Sink, need: int, timeout: float | None) -> list[_Result]:
        end = _INF if timeout is None else time.monotonic() + timeout
        with self._cond:
            sink.need = need
            try:
                while True:
                    self._check_open()
                    now = time.monotonic()
                    nxt = self._expire_overdue(now)
                    if len(sink.items) >= need or now >= end:
                        return self._take(sink)
                    wake = min(nxt, end)
                    self._cond.wait(None if wake == _INF else max(wake - now, 0.0))
            finally:
                sink.need = 1

    def _take(self, sink: _Sink) -> list[_Result]:
        """Hand every result in ``sink`` to the caller (lock held)."""
        out = list(sink.items)
        sink.items.clear()
        for r in out:
            self._slots[r.env_id].busy = False
        return out

    async def _await(self, sink: _Sink, need: int, timeout: float | None) -> list[_Result]:
        loop = asyncio.get_running_loop()
        event = asyncio.Event()
        end = _INF if timeout is None else time.monotonic() + timeout
        waiter = (loop, event)
        try:
            while True:
                with self._cond:
                    self._check_open()
                    now = time.monotonic()
                    nxt = self._expire_overdue(now)
                    if len(sink.items) >= need or now >= end:
                        return self._take(sink)
                    sink.need = need
                    sink._events.add(waiter)
                    event.clear()
                    wake = min(nxt, end)
                try:
                    await asyncio.wait_for(event.wait(), None if wake == _INF else max(wake - now, 0.0))
                except asyncio.TimeoutError:
                    pass
        finally:
            with self._cond:
                sink._events.discard(waiter)
                sink.need = 1

    # ------------------------------------------------------------------ batching
    def _batch(self, results: list[_Result], n: int, by_env_id: bool):
        """Arrays of length ``n``; result k goes to index ``env_id`` (``by_env_id``) or ``k``."""
        obs = np.empty(n, dtype=object)
        rewards = np.zeros(n, dtype=np.float64)
        terms = np.zeros(n, dtype=np.bool_)
        truncs = np.zeros(n, dtype=np.bool_)
        pairs = []
        for k, r in enumerate(results):
            j = r.env_id if by_env_id else k
            obs[j] = r.obs
            rewards[j] = r.reward
            terms[j] = r.terminated
            truncs[j] = r.truncated
            if r.info:
                pairs.append((j, r.info))
        return obs, rewards, terms, truncs, batch_infos(pairs, n)

    def _raise_first_error(self, results: list[_Result], batch: tuple) -> None:
        errors = [r.error for r in results if r.error is not None]
        if errors and self.config.on_error == "raise":
            err = errors[0]
            err.results = batch  # the whole batch stays available on the exception
            err.errors = errors
            raise err

    # ------------------------------------------------------------------ barrier-free API
    def send(self, actions: Sequence[Any], env_ids: Sequence[int] | np.ndarray | None = None) -> None:
        """Start one step per env id (all sub-envs when ``env_ids`` is None); returns at once."""
        ids = self._ids(env_ids)
        actions = self._actions(actions, len(ids))
        with self._cond:
            self._check_open()
            ops = [self._op_for(self._slots[i], a) for i, a in zip(ids, actions)]
            thunks = [self._submit(self._slots[i], op, self._ready, action=a) for i, a, op in zip(ids, actions, ops)]
        self._dispatch(thunks)

    async def asend(self, actions: Sequence[Any], env_ids: Sequence[int] | np.ndarray | None = None) -> None:
        """``send`` for asyncio callers (it never blocks)."""
        self.send(actions, env_ids)

    def recv(self, min_ready: int = 1, timeout: float | None = None):
        """Results of at least ``min_ready`` sub-envs (fewer on ``timeout``), in completion order.

        Returns ``(obs, rewards, terminations, truncations, infos, env_ids)``.
        """
        with span("vector.recv", track="env/vector", min_ready=min_ready):
            results = self._wait(self._ready, self._need(min_ready), timeout)
        return self._emit(results)

    async def arecv(self, min_ready: int = 1, timeout: float | None = None):
        """``recv`` for asyncio callers: awaits without blocking the event loop."""
        return self._emit(await self._await(self._ready, self._need(min_ready), timeout))

    def _need(self, min_ready: int) -> int:
        if isinstance(min_ready, bool) or not isinstance(min_ready, (int, np.integer)) or min_ready < 1:
            raise InvalidActionError(explain("recv(min_ready)", expected="an int >= 1", received=min_ready,
                                             fix="pass min_ready=1"))
        with self._cond:
            self._check_open()
            in_flight = sum(s.pending and s.sink is self._ready for s in self._slots) + len(self._ready.items)
        if in_flight == 0:
            raise VectorStateError(explain("recv()", expected="at least one env in flight", received="none",
                                           fix="call send(actions, env_ids) before recv()"))
        return min(int(min_ready), in_flight)

    def _emit(self, results: list[_Result]):
        batch = self._batch(results, len(results), by_env_id=False)
        env_ids = np.array([r.env_id for r in results], dtype=np.int64)
        self._raise_first_error(results, (*batch, env_ids))
        return (*batch, env_ids)

    def _actions(self, actions: Any, n: int) -> list[Any]:
        if isinstance(actions, (str, bytes)) or not hasattr(actions, "__len__"):
            raise InvalidActionError(explain("actions", expected=f"a sequence of {n} actions", received=actions,
                                             fix="pass a list with one str per env id"))
        if len(actions) != n:
            raise InvalidActionError(explain("actions", expected=f"{n} actions (one per env id)",
                                             received=f"{len(actions)} actions", fix="pass one action per env id"))
        return list(actions)

    def _op_for(self, slot: _Slot, action: Any) -> str:
        """The operation a send starts on ``slot`` (lock held); raises on caller errors, before anything starts.

        An ended (or failed) episode is reset by this send under NEXT_STEP and SAME_STEP (under
        SAME_STEP only a failed sub-env can be left ended), and refused under DISABLED.
        """
        if slot.busy:
            raise VectorStateError(explain(f"send to env {slot.env_id}", expected="an env whose last result was received",
                                           received="an env still in flight", fix="recv() its result first"))
        state = slot.state
        if state != "running":
            if state == "new":
                raise ResetNeededError(explain(f"send to env {slot.env_id}", expected="a reset env",
                                               received="an env never reset", fix="call reset() or reset_env(id) first"))
            if self._autoreset:
                return "reset"
            raise ResetNeededError(explain(f"send to env {slot.env_id}", expected="a running episode",
                                           received="an ended episode (autoreset_mode=DISABLED)",
                                           fix="reset it: reset(options={'reset_mask': vec.ended}) or reset_env(id)"))
        why = slot.check(action)
        if why is not None:
            raise InvalidActionError(explain(f"action for env {slot.env_id}", expected=f"an action in "
                                             f"{slot.env.action_space!r}", received=why, fix="pass one str per env"))
        return self._step_op

    # ------------------------------------------------------------------ synchronous API
    def step(self, actions: Sequence[Any]):
        """Send to every sub-env and receive every result, ordered by env id (Gymnasium's ``step``)."""
        actions = self._actions(actions, self.num_envs)
        sink = _Sink(self._cond, self.num_envs)
        with span("vector.step", track="env/vector", num_envs=self.num_envs):
            with self._cond:
                self._check_open()
                slots, op_for, submit = self._slots, self._op_for, self._submit
                ops = [op_for(slot, a) for slot, a in zip(slots, actions)]
                if self.config.step_timeout is None and all(s.inline and not s.lost for s in slots):
                    gens = []
                    for slot in slots:  # all CPU-cheap sync sub-envs: run the whole step right here
                        slot.gen += 1
                        slot.pending = slot.busy = True
                        gens.append(slot.gen)
                    fast = True
                else:
                    items = [submit(slot, op, sink, a) for slot, a, op in zip(slots, actions, ops)]
                    fast = False
            if fast:
                return self._step_inline(actions, ops, gens)
            self._dispatch(items)
            results = self._wait(sink, self.num_envs, None)
        batch = self._batch(results, self.num_envs, by_env_id=True)
        self._raise_first_error(results, batch)
        return batch

    def _step_inline(self, actions: list[Any], ops: list[str], gens: list[int]):
        """``step()`` when every sub-env runs inline: one pass, straight into the output arrays."""
        n = self.num_envs
        obs = np.empty(n, dtype=object)
        rewards = np.zeros(n, dtype=np.float64)
        terms = np.zeros(n, dtype=np.bool_)
        truncs = np.zeros(n, dtype=np.bool_)
        pairs, errors = [], []
        perf, slow = time.perf_counter, 10 * self.config.inline_below_s
        for i, (slot, action, op) in enumerate(zip(self._slots, actions, ops)):
            t0 = perf()
            try:
                if op == "step":
                    o, r, te, tr, info = slot.step(action)
                else:
                    o, r, te, tr, info = _sync_op(slot.env, op, action, None, None, slot.step)
            except BaseException as e:  # noqa: BLE001 - isolate the sub-env, report it
                res = self._error_result(i, op, e)
                errors.append(res)
                o, r, te, tr, info = res.obs, res.reward, res.terminated, res.truncated, res.info
            else:
                dt = perf() - t0
                if (dt > slow or slot.streak) and op != "reset":
                    self._note_cost(slot, dt)
            obs[i] = o
            rewards[i] = r
            terms[i] = te
            truncs[i] = tr
            if info:
                pairs.append((i, info))
        failed = {res.env_id for res in errors}
        with self._cond:
            for i, (slot, op, gen) in enumerate(zip(self._slots, ops, gens)):
                if slot.gen != gen:
                    continue  # the vector env was closed meanwhile
                slot.pending = slot.busy = False
                if i in failed:
                    slot.state = "done"
                    continue
                slot.state = "done" if op == "step" and (terms[i] or truncs[i]) else "running"
                slot.last_obs = obs[i]
        batch = (obs, rewards, terms, truncs, batch_infos(pairs, n))
        self._raise_first_error(errors, batch)
        return batch

    def reset(self, *, seed: int | Sequence[int | None] | None = None, options: dict | None = None):
        """Reset every sub-env (or those in ``options["reset_mask"]``); ``seed`` int -> seeds ``seed + i``.

        Returns ``(obs, infos)``; sub-envs left out by the mask keep their last observation.
        """
        seeds = self._seeds(seed)
        options = dict(options or {})
        mask = options.pop("reset_mask", None)
        ids = list(range(self.num_envs)) if mask is None else [int(i) for i in np.flatnonzero(np.asarray(mask))]
        sink = _Sink(self._cond, len(ids))
        with span("vector.reset", track="env/vector", num_envs=len(ids)):
            with self._cond:
                self._check_open()
                busy = [i for i in ids if self._slots[i].busy]
                if busy:
                    raise VectorStateError(explain("reset()", expected="no env in flight", received=f"env ids {busy} in flight",
                                                   fix="recv() their results before reset()"))
                thunks = [self._submit(self._slots[i], "reset", sink, seed=seeds[i], options=options or None)
                          for i in ids]
            self._dispatch(thunks)
            results = self._wait(sink, len(ids), None)
        obs, _, _, _, infos = self._batch(results, self.num_envs, by_env_id=True)
        for i, slot in enumerate(self._slots):
            if mask is not None and i not in ids:
                obs[i] = slot.last_obs
        self._raise_first_error(results, (obs, infos))
        return obs, infos

    def _seeds(self, seed: Any) -> list[int | None]:
        if seed is None:
            return [None] * self.num_envs
        if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
            return [int(seed) + i for i in range(self.num_envs)]
        seeds = list(seed)
        if len(seeds) != self.num_envs:
            raise InvalidActionError(explain("reset(seed=[...])", expected=f"{self.num_envs} seeds",
                                             received=f"{len(seeds)} seeds", fix="pass an int or one seed per env"))
        return seeds

    # ------------------------------------------------------------------ per-env API
    def reset_env(self, env_id: int, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        """Reset one sub-env; returns ``(obs, info)``; raises ``EnvError`` (with ``env_id``) on failure."""
        sink = _Sink(self._cond, 1)
        with self._cond:
            self._check_open()
            slot = self._idle_slot(env_id)
            thunk = self._submit(slot, "reset", sink, seed=seed, options=options)
        self._dispatch([thunk])
        (res,) = self._wait(sink, 1, None)
        return self._unwrap(res)[::4]

    async def areset_env(self, env_id: int, *, seed: int | None = None, options: dict | None = None):
        """Async per-env reset (no autoreset); returns ``(obs, info)``; raises ``EnvError`` with ``env_id``."""
        res = await self._one(env_id, "reset", seed=seed, options=options)
        return self._unwrap(res)[::4]

    async def astep_env(self, env_id: int, action: Any):
        """Async per-env step (no autoreset): ``(obs, reward, terminated, truncated, info)``.

        Raises ``ResetNeededError`` when the episode ended, ``EnvTimeoutError`` past ``step_timeout``
        and ``EnvError`` (``.env_id``, ``.cause``) when the sub-env raised.
        """
        return self._unwrap(await self._one(env_id, "step", action=action))

    async def _one(self, env_id: int, op: str, **kw: Any) -> _Result:
        sink = _FutureSink()
        with self._cond:
            self._check_open()
            slot = self._idle_slot(env_id)
            if op == "step":
                if slot.state != "running":
                    raise ResetNeededError(explain(f"astep_env({env_id})", expected="a running episode",
                                                   received=f"an env in state {slot.state!r}",
                                                   fix="await vec.areset_env(env_id) first"))
                why = slot.check(kw["action"])
                if why is not None:
                    raise InvalidActionError(explain(f"astep_env({env_id}, action)", expected="an action in "
                                                     f"{slot.env.action_space!r}", received=why, fix="pass one str"))
            thunk = self._submit(slot, op, sink, **kw)
            gen = slot.gen
        self._dispatch([thunk])
        timeout = self.config.step_timeout
        try:
            return await asyncio.wait_for(asyncio.shield(sink.future), timeout)
        except asyncio.TimeoutError:
            with self._cond:
                if slot.gen == gen and slot.pending:
                    self._expire(slot)  # delivers the timeout result to sink.future
            return await sink.future
        except asyncio.CancelledError:
            with self._cond:  # the caller gave up: abandon the op like a timeout, silently
                if slot.gen == gen and slot.pending:
                    self._expire(slot)
            raise

    def _idle_slot(self, env_id: int) -> _Slot:
        slot = self._slot(env_id)
        if slot.busy:
            raise VectorStateError(explain(f"env {slot.env_id}", expected="an env not in flight",
                                           received="an env with an unreceived operation", fix="recv() it first"))
        return slot

    @staticmethod
    def _unwrap(res: _Result) -> tuple:
        if res.error is not None:
            raise res.error
        return res.obs, res.reward, res.terminated, res.truncated, res.info

    # ------------------------------------------------------------------ closing
    def close(self, **kwargs: Any) -> None:
        """Stop everything and close the sub-envs; always returns, idempotent, never waits on a hung env."""
        with self._cond:
            if self.closed:
                return
            self.closed = True
            busy = [s for s in self._slots if s.pending]
            for s in busy:
                s.gen += 1
                if s.handle is not None:
                    s.handle.cancel()
                if isinstance(s.sink, _FutureSink):  # an awaiting astep_env/areset_env gets an answer
                    err = VectorStateError(f"sub-env {s.env_id}: the vector env was closed during this call. Fix: "
                                           "do not close it while coroutines still use it")
                    s.sink.deliver(_Result(s.env_id, None, 0.0, False, True, {"error": err}, err))
            self._ready.wake()
            self._cond.notify_all()
        idle = [s for s in self._slots if s not in busy]
        closer = threading.Thread(target=self._close_instances, args=(idle, busy), daemon=True, name="gymllm-vec-close")
        closer.start()
        closer.join(timeout=5.0)
        if self._pool is not None:
            self._pool.shutdown()
        if self._loop is not None:
            self._loop.stop()

    @staticmethod
    def _close_instances(idle: list[_Slot], busy: Sequence[_Slot] = ()) -> None:
        for s in busy:
            if isinstance(s.env, ProcessEnv):
                s.env.kill()
        for s in idle:
            try:
                if s.env is not None:
                    s.env.close()
            except Exception:  # noqa: BLE001 - close() must always return
                pass

    def __repr__(self) -> str:
        return f"gymllm.VectorEnv(num_envs={self.num_envs}, backend={self.config.backend!r})"
