"""Any OpenEnv server as a gymllm ``TextEnv``: :func:`from_openenv` (and the id ``gymllm/OpenEnv-v0``).

    env = gymllm.envs.from_openenv("http://127.0.0.1:8000")      # a server started by `gymllm serve-env`
    obs, info = env.reset(seed=0)                                 # or any other OpenEnv server
    obs, reward, terminated, truncated, info = env.step("my answer")
    vec = gymllm.make_vec([lambda u=u: gymllm.envs.from_openenv(u) for u in urls])   # barrier-free

The env talks OpenEnv's WebSocket protocol through OpenEnv's own ``GenericEnvClient``:

- **One session per episode.** ``reset`` closes the previous episode's session and opens a new one
  (the server builds a fresh env instance for it); ``step`` goes to that session.
- **Async-native.** ``_areset`` / ``_astep`` are coroutines, so the vector env runs remote envs as
  tasks on its event loop, not on threads, and ``recv(min_ready=1)`` returns whichever answers first.
  The WebSocket I/O of every remote env in the process runs on one shared I/O loop thread, so an env
  can be used from any event loop (sync calls, ``asyncio.run`` in checkers, the trainer's loop).
- **Timeouts and failures.** Every call has a deadline (``timeout_s``; :class:`~gymllm.errors.EnvTimeoutError`).
  Opening a session is tried twice (one reconnect), then
  :class:`~gymllm.envs.openenv_config.OpenEnvError` says the server is unreachable. A connection lost
  mid-episode fails that episode only (``OpenEnvError``; the next ``reset`` opens a new session). An
  error the server reports (``{"type": "error"}``) raises ``OpenEnvError`` with its code and
  message; the session stays open.
- **Schemas.** The action JSON is built from the action schema the server publishes at ``/schema``:
  an action with one text field takes the action string; otherwise name it (``action_field``) or
  pass ``action_fn(text) -> dict``. The observation's text likewise (``observation_field`` /
  ``observation_fn(observation_dict) -> str | list[message]``); a ``gymllm serve-env`` server also
  says whether its env answers with text or chat messages. ``info`` is the observation's metadata
  (for a gymllm server: the served env's own ``info``) plus, for other servers, the observation's
  other fields under ``info["observation"]``.
- **Spaces.** ``action_space`` is :class:`~gymllm.spaces.Text` with the action field's
  ``minLength`` / ``maxLength``; ``observation_space`` is ``Text()`` or ``Chat()``.

The config and error are :mod:`gymllm.envs.openenv_config`; reading the schemas is
:mod:`gymllm.envs.openenv_mapping`. Importing this module does not import ``openenv`` (the
``openenv`` extra); building an env does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import re
import threading
from typing import Any, Coroutine, TypeVar

from gymllm.core import TextEnv
from gymllm.envs.openenv_config import OpenEnvConfig, OpenEnvError, import_openenv
from gymllm.envs.openenv_mapping import SchemaMapping, openenv_schema
from gymllm.errors import ConfigError, EnvTimeoutError, explain
from gymllm.registration import register

__all__ = ["from_openenv", "OpenEnvTextEnv"]

_T = TypeVar("_T")
_SERVER_CODE = re.compile(r"^Server error: (?P<msg>.*) \(code: (?P<code>[A-Za-z_.]+)\)$", re.S)


# ---------------------------------------------------------------------------------------------- I/O loop
class _IoLoop:
    """One daemon thread per process running the event loop that owns every remote env's WebSocket
    (a forked child, which inherits the object but not the thread, starts its own)."""

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None
    _pid = -1

    @classmethod
    def get(cls) -> asyncio.AbstractEventLoop:
        with cls._lock:
            if cls._loop is None or cls._loop.is_closed() or cls._pid != os.getpid():
                loop = asyncio.new_event_loop()
                threading.Thread(
                    target=loop.run_forever, name="gymllm-openenv-io", daemon=True
                ).start()
                cls._loop, cls._pid = loop, os.getpid()
            return cls._loop


def _submit(coro: Coroutine[Any, Any, _T]) -> concurrent.futures.Future[_T]:
    return asyncio.run_coroutine_threadsafe(coro, _IoLoop.get())


# ---------------------------------------------------------------------------------------------- env
class OpenEnvTextEnv(TextEnv):
    """A remote OpenEnv env as a ``TextEnv`` (see the module docstring). Build with :func:`from_openenv`.

    Constructed without ``base_url`` (the registered id's default), it only says how to pass one.
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        max_turns: int | None = None,
        render_mode: str | None = None,
        **config: Any,
    ):
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        self._session: Any = (
            None  # the GenericEnvClient of the current episode (lives on the I/O loop)
        )
        self._mapping: SchemaMapping | None = None
        self.config: OpenEnvConfig | None = None
        if base_url is None:
            self.metadata = {
                **type(self).metadata,
                "gymllm_skip_check": "needs a running OpenEnv server: "
                "pass base_url=... (tested in tests/test_openenv.py)",
            }
            return
        self.config = OpenEnvConfig(base_url=base_url, **config)
        schema = openenv_schema(
            base_url, headers=self.config.headers, timeout_s=self.config.connect_timeout_s
        )
        self._mapping = SchemaMapping(self.config, schema)
        self.action_space = self._mapping.action_space
        self.observation_space = self._mapping.observation_space

    # ------------------------------------------------------------------ hooks
    # The sync hooks wait on the I/O loop directly (one thread hop); the async ones await it from any loop.
    def _reset(self, *, seed: int | None, options: dict | None) -> tuple[Any, dict]:
        return self._reset_result(self._io_wait(self._reset_coro(seed, options), "reset"))

    def _step(self, action: str) -> tuple:
        return self._configured()[1].observation(self._io_wait(self._step_coro(action), "step"))

    async def _areset(self, *, seed: int | None, options: dict | None) -> tuple[Any, dict]:
        return self._reset_result(await self._io_await(self._reset_coro(seed, options), "reset"))

    async def _astep(self, action: str) -> tuple:
        return self._configured()[1].observation(
            await self._io_await(self._step_coro(action), "step")
        )

    def _reset_coro(self, seed: int | None, options: dict | None) -> Coroutine[Any, Any, dict]:
        cfg = self._configured()[0]
        data = dict(cfg.reset_kwargs)
        data.update(options or {})
        if seed is not None:
            data["seed"] = int(seed)
        return self._open_and_reset(data)

    def _reset_result(self, payload: dict) -> tuple[Any, dict]:
        obs, _r, _term, _trunc, info = self._configured()[1].observation(payload)
        return obs, info

    def _step_coro(self, action: str) -> Coroutine[Any, Any, dict]:
        cfg, mapping = self._configured()
        if self._session is None:
            raise OpenEnvError(
                explain(
                    f"{type(self).__name__}.step() to {cfg.base_url}",
                    expected="the episode's open session",
                    received="a session lost earlier in this episode (closed or timed out)",
                    fix="call reset() to start a new episode in a new session",
                )
            )
        return self._send_step(self._session, mapping.action(action))

    # ------------------------------------------------------------------ I/O (coroutines run on the I/O loop)
    async def _open_and_reset(self, data: dict) -> dict:
        """Close the previous session, open a new one (one reconnect on a connection failure), reset it."""
        old, self._session = self._session, None
        if old is not None:
            await _close_quietly(old)
        last: BaseException | None = None
        for _attempt in range(2):
            client = self._new_client()
            try:
                await client.connect()
                result = await client.reset(**data)
            except ConnectionError as e:  # refused / closed while opening: reconnect once
                await _close_quietly(client)
                last = e
                continue
            except BaseException:
                await _close_quietly(client)
                raise
            self._session = client
            return _as_payload(result)
        raise OpenEnvError(
            explain(
                f"{type(self).__name__}.reset() to {self._configured()[0].base_url}",
                expected="an OpenEnv server accepting a session",
                received=f"2 failed attempts ({type(last).__name__}: {last})",
                fix="start the server (`gymllm serve-env ENV_ID --port P`) or check base_url",
            ),
            cause=last,
        )

    async def _send_step(self, client: Any, action: dict) -> dict:
        return _as_payload(await client.step(action))

    def _new_client(self) -> Any:
        cfg = self._configured()[0]
        generic = import_openenv("openenv.core.generic_client")
        return generic.GenericEnvClient(
            base_url=cfg.http_url,
            connect_timeout_s=cfg.connect_timeout_s,
            message_timeout_s=cfg.timeout_s,
            max_message_size_mb=cfg.max_message_mb,
            headers=cfg.headers,
        )

    def _io_future(self, coro: Coroutine[Any, Any, _T], op: str) -> concurrent.futures.Future[_T]:
        cfg = self._configured()[0]
        return _submit(
            asyncio.wait_for(
                coro, timeout=cfg.timeout_s + (cfg.connect_timeout_s if op == "reset" else 0)
            )
        )

    def _io_wait(self, coro: Coroutine[Any, Any, _T], op: str) -> _T:
        """Run ``coro`` on the I/O loop within ``timeout_s`` and wait here (gymllm errors on failure)."""
        try:
            cfg = self._configured()[
                0
            ]  # the I/O coroutine has its own deadline; this one is a backstop
            return self._io_future(coro, op).result(
                timeout=cfg.timeout_s + cfg.connect_timeout_s + 5.0
            )
        except BaseException as e:
            err = self._translate(e, op)
            if err is e:
                raise
            raise err from e

    async def _io_await(self, coro: Coroutine[Any, Any, _T], op: str) -> _T:
        """Run ``coro`` on the I/O loop within ``timeout_s`` and await it from the caller's loop."""
        try:
            return await asyncio.wrap_future(self._io_future(coro, op))
        except BaseException as e:
            err = self._translate(e, op)
            if err is e:
                raise
            raise err from e

    def _translate(self, e: BaseException, op: str) -> BaseException:
        """The gymllm error for a failure of the I/O coroutine (``e`` itself when it is not one of ours)."""
        cfg = self._configured()[0]
        if isinstance(e, OpenEnvError):
            return e
        if isinstance(e, (asyncio.TimeoutError, TimeoutError, concurrent.futures.TimeoutError)):
            self._drop_session()
            return EnvTimeoutError(
                explain(
                    f"{type(self).__name__}.{op}() to {cfg.base_url}",
                    expected=f"an answer within timeout_s={cfg.timeout_s}",
                    received="no answer",
                    fix="raise timeout_s, or check the server (its env may hang)",
                ),
                cause=e,
            )
        if isinstance(e, RuntimeError) and (m := _SERVER_CODE.match(str(e))) is not None:
            return OpenEnvError(
                f"OpenEnv server {cfg.base_url} failed {op}() [{m['code']}]: {m['msg']}",
                code=m["code"],
                cause=e,
            )
        if isinstance(e, (ConnectionError, OSError, EOFError)) or type(e).__module__.startswith(
            "websockets"
        ):
            self._drop_session()  # ConnectionClosed and friends: this episode's session is gone
            return OpenEnvError(self._lost(op, e), cause=e)
        return e

    def _lost(self, op: str, e: BaseException) -> str:
        return explain(
            f"{type(self).__name__}.{op}() to {self._configured()[0].base_url}",
            expected="the episode's session to stay open",
            received=f"{type(e).__name__}: {e}",
            fix="this episode is lost (the server closed or died); reset() opens a new session",
        )

    def _drop_session(self) -> None:
        old, self._session = self._session, None
        if old is not None:
            _submit(_close_quietly(old))

    def _configured(self) -> tuple[OpenEnvConfig, SchemaMapping]:
        if self.config is None or self._mapping is None:
            raise ConfigError(
                explain(
                    "gymllm/OpenEnv-v0",
                    expected="base_url=<the server's URL>",
                    received=None,
                    fix="gymllm.make('gymllm/OpenEnv-v0', base_url='http://127.0.0.1:8000') or "
                    "gymllm train --env.id gymllm/OpenEnv-v0 --env-kwargs "
                    '\'{"base_url": "http://127.0.0.1:8000"}\'',
                )
            )
        return self.config, self._mapping

    def close(self) -> None:
        old, self._session = self._session, None
        if old is not None:
            try:
                _submit(_close_quietly(old)).result(timeout=5.0)
            except Exception:  # noqa: BLE001 - closing is best effort; the server reaps the session anyway
                pass
        super().close()


async def _close_quietly(client: Any) -> None:
    try:
        await asyncio.wait_for(client.close(), timeout=5.0)
    except BaseException:  # noqa: BLE001 - best effort close of a session that may already be gone
        pass


def _as_payload(result: Any) -> dict:
    """A ``StepResult`` of GenericEnvClient -> the wire payload dict."""
    return {
        "observation": result.observation,
        "reward": result.reward,
        "done": result.done,
        "metadata": result.metadata,
    }


def from_openenv(base_url: str, **config: Any) -> OpenEnvTextEnv:
    """Wrap the OpenEnv server at ``base_url`` as a text env; ``config``:
    :class:`~gymllm.envs.openenv_config.OpenEnvConfig` fields (``action_field``, ``action_fn``,
    ``observation_field``, ``observation_fn``, ``timeout_s``, ``connect_timeout_s``, ``token``,
    ``reset_kwargs``, ``max_message_mb``) and ``max_turns``."""
    return OpenEnvTextEnv(base_url, **config)


register("OpenEnv-v0", "gymllm.envs.openenv_adapter:OpenEnvTextEnv")
