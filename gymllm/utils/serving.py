"""Running an ASGI app under uvicorn: the one helper behind ``gymllm serve`` and ``gymllm serve-env``.

    sock = bind_socket("127.0.0.1", 0)                      # SO_REUSEADDR, listening, a free port
    with ServerThread(app) as s: httpx.get(s.url + "/health")   # a daemon thread, loopback, a free port
    run_server(app, "127.0.0.1", 8000, watchdog=check)       # blocks until interrupted or check() says why not

Both servers bind loopback unless told otherwise (:func:`is_loopback`, :func:`require_secret_off_loopback`).
:func:`run_server` takes a ``watchdog``: a callable polled while serving that returns ``None`` while
all is well and a reason (text) once the process should stop (e.g. the engine thread died); the
server then shuts down and :class:`ServerStopped` is raised, so the process exits non-zero and a
supervisor can restart it. Imports nothing of gymllm above its errors; uvicorn is imported on use.
"""

from __future__ import annotations

import asyncio
import ipaddress
import signal
import socket
import subprocess
import threading
import time
from typing import Any, Callable

from gymllm.errors import ConfigError, GymLLMError, explain

__all__ = [
    "ServerStopped",
    "ServerThread",
    "bind_socket",
    "is_loopback",
    "read_body",
    "replaying",
    "require_secret_off_loopback",
    "run_server",
    "stop_process",
    "uvicorn_server",
    "wait_until_healthy",
    "TOO_LARGE",
]

TOO_LARGE = object()
""":func:`read_body`'s answer for a body past its limit."""


class ServerStopped(GymLLMError, RuntimeError):
    """The server did not start, or its watchdog stopped it (the message says why)."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (``localhost``, ``127.0.0.0/8``, ``::1``, ``[::1]``)."""
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def require_secret_off_loopback(
    host: str, secret: str | None, *, field: str, expected: str, fix: str
) -> None:
    """Refuse to bind a non-loopback ``host`` without a ``secret`` (API key, token): a clear error at startup."""
    if not is_loopback(host) and not secret:
        raise ConfigError(
            explain(field, expected=expected, received=f"{host!r} without one", fix=fix)
        )


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``(host, port)`` (port 0: a free one), inheritable, ``SO_REUSEADDR`` set."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(2048)
        sock.set_inheritable(True)
    except OSError:
        sock.close()
        raise
    return sock


def url_of(host: str, sock: socket.socket) -> str:
    """``http://HOST:PORT`` of a bound socket (an IPv6 host in brackets)."""
    host = host.strip("[]")
    return f"http://{f'[{host}]' if ':' in host else host}:{sock.getsockname()[1]}"


async def read_body(receive: Callable, max_bytes: int) -> Any:
    """Read an ASGI HTTP request body: the bytes, :data:`TOO_LARGE` once more than ``max_bytes`` arrived
    (no more is read), or None when the client went away."""
    chunks, seen, more = [], 0, True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        seen += len(chunks[-1])
        more = message.get("more_body", False)
        if seen > max_bytes:
            return TOO_LARGE
    return b"".join(chunks)


def replaying(body: bytes, receive: Callable) -> Callable:
    """An ASGI ``receive`` that hands the app ``body`` (already read) once, then the connection's own messages."""
    replayed = False

    async def replay() -> dict:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


def uvicorn_server(
    app: Any, *, log_level: str = "warning", lifespan: str = "off", **config: Any
) -> Any:
    """A ``uvicorn.Server`` for ``app`` (``config``: further ``uvicorn.Config`` fields, e.g. ``ws_max_size``)."""
    import uvicorn

    return uvicorn.Server(uvicorn.Config(app, log_level=log_level, lifespan=lifespan, **config))


class ServerThread:
    """Serve ``app`` under uvicorn in a daemon thread on ``host:port`` (default: loopback, a free port).

    ``with ServerThread(app) as s: ...s.url...`` starts it and stops it; :meth:`start` waits until it
    accepts connections (at most ``ready_timeout_s``). ``config``: further ``uvicorn.Config`` fields.
    """

    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        log_level: str = "warning",
        lifespan: str = "off",
        ready_timeout_s: float = 30.0,
        name: str = "gymllm-server",
        **config: Any,
    ):
        self._sock = bind_socket(host, port)
        self.host, self.port = host, self._sock.getsockname()[1]
        self.url = url_of(host, self._sock)
        self.ready_timeout_s = ready_timeout_s
        self._server = uvicorn_server(app, log_level=log_level, lifespan=lifespan, **config)
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._server.serve(sockets=[self._sock])),
            name=name,
            daemon=True,
        )

    def start(self, timeout: float | None = None) -> "ServerThread":
        """Start serving (idempotent); raises :class:`ServerStopped` if it is not up within the timeout."""
        if not self._thread.is_alive() and not self._server.started:
            self._thread.start()
        timeout = self.ready_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise ServerStopped(
                    explain(
                        "ServerThread",
                        expected=f"the server on {self.url} started within {timeout} s",
                        received="not started",
                        fix="see the server's log above",
                    )
                )
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Shut the server down and release its port (idempotent)."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        self._sock.close()

    close = stop

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def run_server(
    app: Any,
    host: str,
    port: int,
    *,
    on_ready: Callable[[str], None] | None = None,
    watchdog: Callable[[], str | None] | None = None,
    watch_interval_s: float = 0.5,
    log_level: str = "info",
    lifespan: str = "off",
    **config: Any,
) -> None:
    """Serve ``app`` on ``host:port`` until interrupted (blocking).

    ``on_ready(url)`` is called once connections are accepted. ``watchdog()`` is polled every
    ``watch_interval_s`` while serving; when it returns a reason the server shuts down and
    :class:`ServerStopped` is raised with that reason (the process should exit non-zero).
    """
    sock = bind_socket(host, port)
    server = uvicorn_server(app, log_level=log_level, lifespan=lifespan, **config)
    url = url_of(host, sock)
    stopped: list[str] = []

    async def main() -> None:
        task = asyncio.ensure_future(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if server.started and on_ready is not None:
            on_ready(url)
        while watchdog is not None and not task.done():
            await asyncio.wait({task}, timeout=watch_interval_s)
            reason = None if task.done() else watchdog()
            if reason:
                stopped.append(reason)
                server.should_exit = True
        await task

    try:
        asyncio.run(main())
    finally:
        sock.close()
    if stopped:
        raise ServerStopped(
            f"the server on {url} stopped: {stopped[0]}. Fix: see the log above; restart it "
            "(a supervisor restarts a process that exits non-zero)"
        )


def wait_until_healthy(
    url: str,
    *,
    proc: subprocess.Popen | None = None,
    timeout_s: float = 180.0,
    path: str = "/health",
) -> None:
    """Poll ``GET url + path`` until it answers 200 (a server process starting up).

    Raises :class:`ServerStopped` when ``proc`` exits first (with the tail of its captured output) or
    after ``timeout_s`` (a watchdog, then ``proc`` is killed).
    """
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            out = proc.stdout or proc.stderr
            tail = out.read()[-2000:] if out is not None else ""
            raise ServerStopped(
                f"the server process exited {proc.returncode} before {url}{path} answered: "
                f"{tail.decode(errors='replace') if isinstance(tail, bytes) else tail}"
            )
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    if proc is not None:
        proc.kill()
        proc.wait()
    raise ServerStopped(f"{url}{path} did not answer 200 within {timeout_s} s")


def stop_process(
    proc: subprocess.Popen, *, sig: int = signal.SIGTERM, timeout_s: float = 30.0
) -> None:
    """Ask a server process to stop (``sig``), then kill it if it has not exited within ``timeout_s``."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
