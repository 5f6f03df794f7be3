"""The ASGI gates in front of ``gymllm serve-env``'s app (:func:`gymllm.envs.openenv_server.build_app`).

:class:`TokenGate` requires ``Authorization: Bearer <token>`` on every HTTP request and WebSocket
(a server bound off loopback); :class:`JsonBodyGuard` answers an oversized or non-finite JSON body
with a 4xx JSON error before OpenEnv parses it (:func:`first_bad_number`). Neither imports
``openenv``.
"""

from __future__ import annotations

import hmac
import json
import math
from typing import Any

from gymllm.utils import serving

__all__ = ["TokenGate", "JsonBodyGuard", "first_bad_number"]

_INT64 = 2**63


class TokenGate:
    """ASGI middleware: every HTTP request and WebSocket handshake must carry ``Authorization: Bearer <token>``."""

    def __init__(self, app: Any, token: str):
        self.app = app
        self._want = f"Bearer {token}".encode()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            got = dict(scope.get("headers") or ()).get(b"authorization", b"")
            if not hmac.compare_digest(got, self._want):
                if scope["type"] == "websocket":
                    await send(
                        {
                            "type": "websocket.close",
                            "code": 1008,
                            "reason": "missing or wrong token",
                        }
                    )
                    return
                body = json.dumps(
                    {"detail": "missing or wrong token: send 'Authorization: Bearer <token>'"}
                ).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [(b"content-type", b"application/json")],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)

    def __getattr__(self, name: str) -> Any:  # app.state, app.routes ... of the wrapped app
        return getattr(self.app, name)


class _NonFinite(float):
    """A JSON ``NaN`` / ``Infinity`` / ``-Infinity`` literal, kept apart from ordinary floats while checking."""


def _nonfinite_literal(name: str) -> float:
    return _NonFinite(float(name.replace("Infinity", "inf")))


def first_bad_number(body: bytes) -> tuple[str, str] | None:
    """``(field path, what it holds)`` of the first non-finite number (``NaN``, ``Infinity``, ``1e999``) or
    integer outside 64 bits in a JSON ``body``, or None (also for a body that is not JSON: FastAPI answers that)."""
    try:
        doc = json.loads(body, parse_constant=_nonfinite_literal)
    except (ValueError, RecursionError):
        return None
    stack: list[tuple[str, Any]] = [("", doc)]
    while stack:
        path, x = stack.pop()
        if isinstance(x, dict):
            stack.extend(
                (f"{path}.{k}" if path else str(k), v) for k, v in reversed(list(x.items()))
            )
        elif isinstance(x, list):
            stack.extend((f"{path}[{i}]", v) for i, v in reversed(list(enumerate(x))))
        elif isinstance(x, float) and not math.isfinite(x):
            return (
                path or "body",
                "a non-finite number (NaN or Infinity, or one too large for a double)",
            )
        elif isinstance(x, int) and not isinstance(x, bool) and not -_INT64 <= x < _INT64:
            return path or "body", f"an integer outside the signed 64-bit range ({str(x)[:30]}...)"
    return None


class JsonBodyGuard:
    """ASGI middleware for the HTTP routes: a body over ``max_bytes`` gets a 413, and a JSON body holding a
    non-finite number or an integer past 64 bits anywhere a 400, each with a JSON ``{"detail", "code",
    "field"}`` body, before OpenEnv's handlers (whose validation errors would echo the number and fail to
    render as JSON)."""

    def __init__(self, app: Any, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        body = await serving.read_body(receive, self.max_bytes)
        if body is None:
            return  # the client went away
        if body is serving.TOO_LARGE:
            return await _json_error(
                send,
                413,
                f"body: expected at most {self.max_bytes} bytes, received more. "
                "Fix: send less (or start the server with a larger --max-message-mb)",
                "REQUEST_TOO_LARGE",
                "body",
            )
        bad = first_bad_number(body) if body else None
        if bad is not None:
            field, what = bad
            return await _json_error(
                send,
                400,
                f"{field}: expected a finite number within 64 bits, received {what}. "
                "Fix: send finite JSON numbers (no NaN, Infinity or 1e999)",
                "VALIDATION_ERROR",
                field,
            )
        await self.app(scope, serving.replaying(body, receive), send)


async def _json_error(send: Any, status: int, detail: str, code: str, field: str) -> None:
    body = json.dumps({"detail": detail, "code": code, "field": field}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
