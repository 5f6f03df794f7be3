"""Serve any gymllm or Gymnasium env as an OpenEnv server (``gymllm serve-env``), built with OpenEnv's own server.

    gymllm serve-env gymllm/Arithmetic-v0 --port 8000          # or  my_pkg.envs:make_env
    # any OpenEnv client:  GenericEnvClient(base_url="http://127.0.0.1:8000")  reset / step / state

The app is ``openenv.core.create_fastapi_app`` (OpenEnv's HTTP + WebSocket server, its session
handling and its ``/ws`` protocol) around :class:`GymllmEnvironment`, an OpenEnv ``Environment``
that holds one gymllm env per session:

- **Actions** are ``{"text": str}`` (``maxLength``: the env's ``Text.max_length``; a longer one is a
  ``VALIDATION_ERROR``). **Observations** are ``{"text": str, "messages": [message, ...] | null}``: a
  ``str`` observation fills ``text``, a message list fills ``messages``; their schema carries
  ``"x-gymllm-observation": "text" | "chat"`` (the env's observation space). ``reward`` and ``done``
  (terminated or truncated) are OpenEnv's own fields; ``metadata`` holds ``terminated``,
  ``truncated`` and the env's ``info`` (made JSON-safe). Reset data ``seed`` seeds the env; any other
  reset fields become ``options`` (``{"options": {...}}`` works too). ``state`` reports
  ``episode_id``, ``step_count``, ``env_id``, ``turn`` and ``episode_done``.
- **Async envs.** An env with native ``async`` hooks is awaited on the server's event loop
  (:class:`AsyncGymllmEnvironment`); other envs run in OpenEnv's per-session worker thread.
- **Sessions.** Each WebSocket connection is one OpenEnv session with its own env instance (gymllm's
  client opens one per episode); at most ``max_sessions`` at once (``CAPACITY_REACHED`` beyond),
  sessions idle for ``session_timeout_s`` are reaped by OpenEnv's reaper (their env closed; a late
  message gets a clear error).
- **Errors.** An env that raises answers with OpenEnv's ``EXECUTION_ERROR`` carrying the exception's
  type and message; the session and the server stay up. Frames over ``max_message_mb`` close that
  connection with code 1009; the server keeps serving.
- **Network.** Binds 127.0.0.1 by default. Any other address needs a token (``token=`` or
  ``GYMLLM_ENV_TOKEN``), then required on every request as ``Authorization: Bearer <token>``.
  OpenEnv's Gradio web interface stays off (Gradio is not even imported), ``HF_HUB_OFFLINE=1`` and
  ``GRADIO_ANALYTICS_ENABLED=False`` are set before the server starts.

Gymnasium envs whose actions are not text are wrapped with :func:`gymllm.envs.from_gymnasium`.
:class:`ServerThread` runs an app on a free loopback port in this process (tests, benchmarks).
The served envs are built by :mod:`gymllm.envs.openenv_factory`; the token and JSON-body checks in
front of the app are :mod:`gymllm.envs.openenv_gates`.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import os
import uuid
from typing import Any, Callable

import gymnasium as gym
import numpy as np

from gymllm.core import areset_env, astep_env
from gymllm.envs.openenv_config import TOKEN_ENV, import_openenv
from gymllm.envs.openenv_factory import is_async_native, make_env_factory
from gymllm.envs.openenv_gates import JsonBodyGuard, TokenGate
from gymllm.envs.openenv_mapping import OBSERVATION_HINT
from gymllm.errors import InvalidActionError, ResetNeededError
from gymllm.spaces import Chat
from gymllm.utils import serving
from gymllm.utils.serving import is_loopback
from gymllm.validation import check_range, is_int, require

_core = import_openenv("openenv.core")
_types = import_openenv("openenv.core.env_server.types")

__all__ = [
    "ServeEnvConfig",
    "GymllmEnvironment",
    "AsyncGymllmEnvironment",
    "ServedEnvError",
    "build_app",
    "serve",
    "ServerThread",
    "offline_environ",
    "GOLD_INFO_KEYS",
    "withhold",
]

GOLD_INFO_KEYS = (
    "answer",
    "answers",
    "gold",
    "gold_answer",
    "solution",
    "solutions",
    "ground_truth",
    "reference_answer",
    "expected_answer",
    "correct_answer",
    "target_answer",
)
"""``info`` keys that hold an env's gold answer: never sent to clients unless the operator says so."""

OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "GRADIO_ANALYTICS_ENABLED": "False",
    "ENABLE_WEB_INTERFACE": "false",
}


def offline_environ() -> None:
    """Set the variables that keep an OpenEnv server off the network (no Hub, no Gradio, no web UI)."""
    os.environ.update(OFFLINE_ENV)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServeEnvConfig:
    """env: a registered id (gymllm or Gymnasium) or ``module:factory``; env_kwargs: its keyword
    arguments; host/port: bind address (port 0: a free port); max_sessions: concurrent sessions;
    session_timeout_s: reap sessions idle this long (None: never); token: required from clients
    (mandatory off loopback; default ``$GYMLLM_ENV_TOKEN``); max_message_mb: largest WebSocket frame;
    compress: offer permessage-deflate (off: on loopback compressing costs more CPU than it saves);
    withhold_info: ``info`` keys (at any depth) never sent to clients, by default the gold-answer keys
    :data:`GOLD_INFO_KEYS` (an agent must not read the answer it is graded against); ``()`` sends all."""

    env: str
    env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int = 8000
    max_sessions: int = 16
    session_timeout_s: float | None = 600.0
    token: str | None = None
    max_message_mb: float = 16.0
    compress: bool = False
    withhold_info: tuple[str, ...] = GOLD_INFO_KEYS

    def __post_init__(self) -> None:
        require(
            isinstance(self.withhold_info, (tuple, list))
            and all(isinstance(k, str) for k in self.withhold_info),
            "ServeEnvConfig.withhold_info",
            expected="a tuple of info keys",
            received=self.withhold_info,
            fix='pass e.g. ("answer",) or () to send everything',
        )
        require(
            isinstance(self.env, str) and self.env,
            "ServeEnvConfig.env",
            expected="an env id or 'module:factory'",
            received=self.env,
            fix="pass e.g. gymllm/Arithmetic-v0",
        )
        require(
            is_int(self.port) and 0 <= self.port <= 65535,
            "ServeEnvConfig.port",
            expected="an int in 0..65535",
            received=self.port,
            fix="pass --port 8000 (0: any free port)",
        )
        check_range(
            "ServeEnvConfig",
            "max_sessions",
            self.max_sessions,
            lo=1,
            integer=True,
            fix="pass --max-sessions 16",
        )
        for name in ("session_timeout_s", "max_message_mb"):
            v = getattr(self, name)
            if v is None and name == "session_timeout_s":
                continue
            require(
                not isinstance(v, bool) and isinstance(v, (int, float)) and v > 0,
                f"ServeEnvConfig.{name}",
                expected="a number > 0",
                received=v,
                fix=f"pass a positive {name}",
            )
        require(
            is_loopback(self.host) or self.resolved_token,
            "gymllm serve-env --host",
            expected="a loopback address (127.0.0.1, ::1, localhost), or a token when "
            "binding anything else",
            received=self.host,
            fix=f"pass --token SECRET (or set {TOKEN_ENV}); clients send it as "
            "'Authorization: Bearer SECRET' (from_openenv(token=...))",
        )

    @property
    def resolved_token(self) -> str | None:
        return self.token or os.environ.get(TOKEN_ENV) or None


def jsonable(x: Any) -> Any:
    """``x`` with NumPy values, tuples and unknown objects turned into JSON values (``str`` as a last resort)."""
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in x]
    try:
        json.dumps(x)
        return x
    except (TypeError, ValueError):
        return str(x)


class ServedEnvError(RuntimeError):
    """The served env raised (message: its type and message); OpenEnv sends it as ``EXECUTION_ERROR``."""


class EpisodeOrderError(ServedEnvError):
    """A step before reset (or after the episode ended): the client's order of calls; HTTP answers 409."""


class ServedActionError(ServedEnvError):
    """The env refused the action (an ``InvalidActionError``); HTTP answers 400."""


class GymllmObservation(_types.Observation):
    """A text env's observation: ``text`` (a ``str`` observation) or ``messages`` (a message list)."""

    text: str = ""
    messages: list[dict[str, Any]] | None = None


class GymllmState(_types.State):
    """OpenEnv's state plus the served env's id, turn count and whether the episode ended."""

    env_id: str = ""
    turn: int = 0
    episode_done: bool = False


class GymllmEnvironment(_core.Environment):
    """An OpenEnv ``Environment`` over one gymllm text env (one per session)."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # every session builds its own env instance

    def __init__(
        self,
        make_env: Callable[[], gym.Env],
        *,
        env_name: str = "",
        observation_cls: type = GymllmObservation,
        withhold_info: tuple[str, ...] = GOLD_INFO_KEYS,
    ):
        super().__init__()
        self._withhold = frozenset(withhold_info)
        self._env = make_env()
        self._env_name = env_name
        self._obs_cls = observation_cls
        self._episode_id: str | None = None
        self._steps = 0
        self._done = False
        self._closed = False

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Any:
        self._check_open("reset")
        try:
            result = self._env.reset(seed=seed, options=_options(kwargs))
        except Exception as e:  # noqa: BLE001 - reported to the client as OpenEnv's EXECUTION_ERROR
            raise _served_error(e) from e
        return self._after_reset(result, episode_id)

    def step(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Any:
        self._check_open("step")
        try:
            result = self._env.step(action.text)
        except Exception as e:  # noqa: BLE001 - reported to the client as OpenEnv's EXECUTION_ERROR
            raise _served_error(e) from e
        return self._after_step(result)

    def _after_reset(self, result: tuple, episode_id: str | None) -> Any:
        obs, info = result
        self._episode_id, self._steps, self._done = episode_id or uuid.uuid4().hex, 0, False
        return self._observation(
            obs, None, False, {"terminated": False, "truncated": False, "info": info}
        )

    def _after_step(self, result: tuple) -> Any:
        obs, reward, terminated, truncated, info = result
        self._steps += 1
        self._done = bool(terminated or truncated)
        return self._observation(
            obs,
            float(reward),
            self._done,
            {"terminated": bool(terminated), "truncated": bool(truncated), "info": info},
        )

    @property
    def state(self) -> GymllmState:
        unwrapped = getattr(self._env, "unwrapped", self._env)
        return GymllmState(
            episode_id=self._episode_id,
            step_count=self._steps,
            env_id=self._env_name,
            turn=int(getattr(unwrapped, "turn", self._steps)),
            episode_done=self._done,
        )

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._env.close()

    def _observation(self, obs: Any, reward: float | None, done: bool, metadata: dict) -> Any:
        metadata = withhold(jsonable(metadata), self._withhold)
        if isinstance(obs, str):
            return self._obs_cls(text=obs, done=done, reward=reward, metadata=metadata)
        if isinstance(obs, list):
            return self._obs_cls(
                messages=jsonable(obs), done=done, reward=reward, metadata=metadata
            )
        return self._obs_cls(text=str(obs), done=done, reward=reward, metadata=metadata)

    def _check_open(self, op: str) -> None:
        require(
            not self._closed,
            f"{op} on a closed session",
            expected="an open session",
            received="a session reaped after being idle (or closed by the server)",
            fix="open a new session (reconnect) and reset",
            error=ServedEnvError,
        )


class AsyncGymllmEnvironment(GymllmEnvironment):
    """For envs with native ``async`` hooks: reset and step are awaited on the server's event loop
    (OpenEnv calls ``reset_async`` / ``step_async``), so a waiting env holds no thread."""

    async def reset_async(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> Any:
        self._check_open("reset")
        try:
            result = await areset_env(self._env, seed=seed, options=_options(kwargs))
        except Exception as e:  # noqa: BLE001 - reported to the client as OpenEnv's EXECUTION_ERROR
            raise _served_error(e) from e
        return self._after_reset(result, episode_id)

    async def step_async(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Any:
        self._check_open("step")
        try:
            result = await astep_env(self._env, action.text)
        except Exception as e:  # noqa: BLE001 - reported to the client as OpenEnv's EXECUTION_ERROR
            raise _served_error(e) from e
        return self._after_step(result)


def _options(kwargs: dict) -> dict | None:
    """Reset fields other than seed / episode_id -> the env's ``options`` (``{"options": {...}}`` too)."""
    options = dict(kwargs.pop("options", None) or {})
    options.update(kwargs)
    return options or None


def _served_error(e: BaseException) -> ServedEnvError:
    kind = (
        EpisodeOrderError
        if isinstance(e, ResetNeededError)
        else (ServedActionError if isinstance(e, InvalidActionError) else ServedEnvError)
    )
    return kind(f"{type(e).__name__}: {e}")


def withhold(x: Any, keys: frozenset[str]) -> Any:
    """``x`` (JSON values) without the dict entries named in ``keys``, at any depth (iterative)."""
    if not keys or not isinstance(x, (dict, list)):
        return x
    root: list[Any] = [None]
    stack: list[tuple[Any, Any, Any]] = [(x, root, 0)]
    while stack:
        src, parent, slot = stack.pop()
        if isinstance(src, dict):
            out: Any = {}
            for k, v in src.items():
                if k not in keys:
                    out[k] = None
                    stack.append((v, out, k))
        elif isinstance(src, list):
            out = [None] * len(src)
            stack.extend((v, out, i) for i, v in enumerate(src))
        else:
            out = src
        parent[slot] = out
    return root[0]


# ---------------------------------------------------------------------------------------------- app
def build_app(config: ServeEnvConfig) -> Any:
    """The ASGI app: OpenEnv's FastAPI app for ``config.env``, behind the token check when a token is set."""
    offline_environ()
    make_env = make_env_factory(config.env, config.env_kwargs)
    probe = make_env()
    try:
        space = probe.action_space
        chat = isinstance(probe.observation_space, Chat)
        native = is_async_native(probe)
    finally:
        probe.close()
    pyd = importlib.import_module("pydantic")
    max_len = int(getattr(space, "max_length", 1 << 20))
    action_cls = pyd.create_model(
        "GymllmAction",
        __base__=_types.Action,
        text=(
            str,
            pyd.Field(
                ...,
                min_length=int(getattr(space, "min_length", 0)),
                max_length=max_len,
                description="the agent's reply (a text action)",
            ),
        ),
    )
    hint = "chat" if chat else "text"
    obs_cls = type(
        "GymllmObservation",
        (GymllmObservation,),
        {
            "__module__": __name__,
            "__doc__": GymllmObservation.__doc__,
            "model_config": pyd.ConfigDict(json_schema_extra={OBSERVATION_HINT: hint}),
        },
    )
    env_cls = AsyncGymllmEnvironment if native else GymllmEnvironment
    factory = functools.partial(
        env_cls,
        make_env,
        env_name=config.env,
        observation_cls=obs_cls,
        withhold_info=tuple(config.withhold_info),
    )
    app = _core.create_fastapi_app(
        factory,
        action_cls,
        obs_cls,
        concurrency_config=_types.ConcurrencyConfig(
            max_concurrent_envs=config.max_sessions, session_timeout=config.session_timeout_s
        ),
        env_name=config.env.replace("/", "_").replace(":", "_"),
        state_cls=GymllmState,
        mode="simulation",
    )

    from fastapi.responses import JSONResponse

    async def env_error(
        _request: Any, exc: Exception
    ) -> Any:  # OpenEnv's stateless HTTP /reset, /step
        return JSONResponse({"detail": str(exc), "code": "EXECUTION_ERROR"}, status_code=500)

    async def order_error(_request: Any, exc: Exception) -> Any:
        return JSONResponse(
            {
                "detail": f"{exc}. Over HTTP, /reset and /step are stateless (each call builds a fresh "
                "env, so a /step never follows a /reset): keep an episode on one WebSocket "
                "session (/ws, e.g. OpenEnv's GenericEnvClient or gymllm's from_openenv)",
                "code": "RESET_NEEDED",
            },
            status_code=409,
        )

    async def action_error(_request: Any, exc: Exception) -> Any:
        return JSONResponse(
            {"detail": str(exc), "code": "INVALID_ACTION", "field": "action"}, status_code=400
        )

    app.add_exception_handler(ServedEnvError, env_error)
    app.add_exception_handler(EpisodeOrderError, order_error)
    app.add_exception_handler(ServedActionError, action_error)
    app.add_middleware(JsonBodyGuard, max_bytes=int(config.max_message_mb * 2**20))
    token = config.resolved_token
    return TokenGate(app, token) if token else app


def _uvicorn_options(max_message_mb: float, compress: bool = False) -> dict[str, Any]:
    return {
        "lifespan": "on",
        "access_log": False,
        "ws_max_size": int(max_message_mb * 1024 * 1024),
        "ws_per_message_deflate": compress,
        "timeout_graceful_shutdown": 2,
    }


def serve(config: ServeEnvConfig, *, on_ready: Callable[[str], None] | None = None) -> None:
    """Serve until interrupted; ``on_ready(url)`` is called once the server accepts connections."""
    serving.run_server(
        build_app(config),
        config.host,
        config.port,
        on_ready=on_ready,
        log_level="warning",
        **_uvicorn_options(config.max_message_mb, config.compress),
    )


class ServerThread(serving.ServerThread):
    """An ASGI app served by uvicorn on a free 127.0.0.1 port in a daemon thread, started at once (``with``
    closes it).

    ``url`` is its ``http://127.0.0.1:PORT``. ``app`` may be an OpenEnv app built with
    ``openenv.core.create_app`` or :func:`build_app`.
    """

    def __init__(self, app: Any, *, max_message_mb: float = 16.0, ready_timeout_s: float = 30.0):
        offline_environ()
        super().__init__(
            app,
            "127.0.0.1",
            0,
            log_level="warning",
            ready_timeout_s=ready_timeout_s,
            name="gymllm-openenv-server",
            **_uvicorn_options(max_message_mb),
        )
        self.start()
