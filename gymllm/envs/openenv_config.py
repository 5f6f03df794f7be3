"""How gymllm reaches an OpenEnv server: :class:`OpenEnvConfig`, :class:`OpenEnvError` and the
``openenv`` extra's import (:func:`import_openenv`).

Shared by the client (:mod:`gymllm.envs.openenv_adapter`, :mod:`gymllm.envs.openenv_mapping`) and the
server (:mod:`gymllm.envs.openenv_server`: ``TOKEN_ENV``). Importing this module does not import
``openenv``.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import re
from typing import Any, Callable

from gymllm.errors import EnvError, MissingExtraError
from gymllm.validation import check_fields, require, require_instance

__all__ = ["OpenEnvConfig", "OpenEnvError", "import_openenv", "TOKEN_ENV"]

TOKEN_ENV = "GYMLLM_ENV_TOKEN"  # the serve-env token, read by both sides when none is passed


class OpenEnvError(EnvError):
    """An OpenEnv server failed a call: unreachable, lost mid-episode, or answered with an error.

    ``code`` is OpenEnv's error code (``EXECUTION_ERROR``, ``CAPACITY_REACHED``, ...) when the server
    sent one, ``"CONNECTION"`` for a lost or refused connection.
    """

    def __init__(
        self, message: str, *, code: str = "CONNECTION", cause: BaseException | None = None
    ):
        super().__init__(message, cause=cause)
        self.code = code


def import_openenv(module: str = "openenv.core") -> Any:
    """Import an ``openenv`` module, or raise :class:`~gymllm.errors.MissingExtraError` without the extra.

    A plain import: ``openenv.core`` also imports Gradio for its optional web UI (about 4 s of import
    time on a 2-core machine, paid once per process that touches OpenEnv; the UI itself stays off, as
    ``gymllm serve-env`` never enables it). gymllm does not hide Gradio from the import system.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and e.name.split(".")[0] == "openenv":
            raise MissingExtraError("openenv", "openenv") from e
        raise


@dataclasses.dataclass(frozen=True, kw_only=True)
class OpenEnvConfig:
    """How to reach an OpenEnv server and map its JSON to text.

    base_url: ``http://host:port`` (or ``ws://``) of the server. action_field / action_fn: the
    action field that takes the text, or ``fn(text) -> action dict`` (default: the schema's one
    text field). observation_field / observation_fn likewise (``fn(observation dict) -> str |
    list[message]``). timeout_s: deadline of every reset/step (seconds); connect_timeout_s: of
    opening a session and of reading ``/schema``. token: sent as ``Authorization: Bearer`` (a
    ``gymllm serve-env --token`` server; default ``$GYMLLM_ENV_TOKEN``). reset_kwargs: extra reset
    fields sent at every reset
    (``options`` are added to them). max_message_mb: largest message accepted from the server.
    """

    base_url: str
    action_field: str | None = None
    action_fn: Callable[[str], dict] | None = None
    observation_field: str | None = None
    observation_fn: Callable[[dict], Any] | None = None
    timeout_s: float = 60.0
    connect_timeout_s: float = 10.0
    token: str | None = None
    reset_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    max_message_mb: float = 100.0

    def __post_init__(self) -> None:
        require(
            isinstance(self.base_url, str) and re.match(r"^(https?|wss?)://[^/\s]+", self.base_url),
            "OpenEnvConfig.base_url",
            expected="a URL such as 'http://127.0.0.1:8000'",
            received=self.base_url,
            fix="pass the address `gymllm serve-env` printed",
        )
        names = ("timeout_s", "connect_timeout_s", "max_message_mb")
        check_fields("OpenEnvConfig", self, names, lo=0, lo_open=True, fix="pass {field}=30")
        for side in ("action", "observation"):
            field, fn = getattr(self, f"{side}_field"), getattr(self, f"{side}_fn")
            require(
                field is None or fn is None,
                "OpenEnvConfig",
                expected=f"{side}_field or {side}_fn, not both",
                received=(field, fn),
                fix="drop one of them",
            )
        require_instance(
            self.reset_kwargs,
            dict,
            "OpenEnvConfig.reset_kwargs",
            expected="a dict",
            fix="pass reset_kwargs={'split': 'test'}",
        )

    @property
    def http_url(self) -> str:
        return re.sub(r"^ws", "http", self.base_url.rstrip("/"))

    @property
    def headers(self) -> dict[str, str] | None:
        token = self.token or os.environ.get(TOKEN_ENV)
        return {"Authorization": f"Bearer {token}"} if token else None
