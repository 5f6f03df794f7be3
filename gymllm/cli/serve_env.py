"""``gymllm serve-env ENV_ID|module:factory``: a gymllm or Gymnasium env as an OpenEnv server."""

from __future__ import annotations

from typing import Annotated

import tyro


def serve_env(
    env: Annotated[str, tyro.conf.Positional],
    /,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_sessions: int = 16,
    session_timeout_s: float | None = 600.0,
    token: str | None = None,
    env_kwargs: str | None = None,
    max_message_mb: float = 16.0,
    compress: bool = False,
    send_info: tuple[str, ...] = (),
) -> int:
    """Serve an env over OpenEnv's HTTP + WebSocket protocol (any OpenEnv client can reset, step, read state).

    Args:
        env: A registered env id (gymllm/Arithmetic-v0, FrozenLake-v1, ...) or module:factory.
        host: Bind address; loopback by default (anything else requires --token).
        port: TCP port (0: a free port; the address is printed).
        max_sessions: Concurrent sessions (one env instance each).
        session_timeout_s: Sessions idle this long are reaped (None: never).
        token: Clients must send 'Authorization: Bearer TOKEN' (default: $GYMLLM_ENV_TOKEN).
        env_kwargs: The env's keyword arguments as JSON, e.g. '{"digits": 1}'.
        max_message_mb: Largest WebSocket message accepted (a bigger one closes that connection).
        compress: Offer WebSocket compression (permessage-deflate): for big observations over slow links.
        send_info: info keys to send although they name a gold answer (by default "answer", "solution",
            ... are withheld from clients: an agent must not read what it is graded against).
    """
    from gymllm.cli.json_args import json_object
    from gymllm.envs.openenv_server import GOLD_INFO_KEYS, ServeEnvConfig, serve

    kwargs = json_object(env_kwargs) if env_kwargs else {}
    config = ServeEnvConfig(
        env=env,
        env_kwargs=kwargs,
        host=host,
        port=port,
        max_sessions=max_sessions,
        session_timeout_s=session_timeout_s,
        token=token,
        max_message_mb=max_message_mb,
        compress=compress,
        withhold_info=tuple(k for k in GOLD_INFO_KEYS if k not in send_info),
    )

    def ready(url: str) -> None:
        ws = url.replace("http://", "ws://", 1)
        print(
            f"serving {env} on {url} (OpenEnv; WebSocket {ws}/ws, schema {url}/schema)", flush=True
        )

    serve(config, on_ready=ready)
    return 0
