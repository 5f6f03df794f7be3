"""The viewer's HTTP server: a FastAPI app over :class:`~gymllm.viewer.runs.ViewedRun` objects, the
page and its assets served from the package (``gymllm/viewer/static``), nothing fetched from outside.

Routes (all GET; ``run`` is a run's name as ``/api/runs`` lists it):

* ``/``: the page. Deep link: ``/?run=<run>&trajectory=<id>`` opens that trajectory.
* ``/static/<file>``: the page's script, style and licence files, from the package.
* ``/api/runs``: every run's overview (kind, config, summary, plots, trace file, logs, problems).
* ``/api/metrics?run=&offset=``: ``metrics.jsonl`` records from a byte offset (the live poll).
* ``/api/trajectories?run=&page=&size=&env=&seat=&reward_min=&reward_max=&step_min=&step_max=&version=&error=&text=``:
  one page of the trajectory table, from the index (:mod:`gymllm.viewer.index`).
* ``/api/trajectory?run=&id=``: one trajectory (:func:`gymllm.viewer.detail.trajectory_detail`).
* ``/api/suite?run=``: a suite summary or ``gymllm eval env --out`` table.
* ``/files/<run>/<name>``: a file of the run directory itself (trace.json, the PNGs, config.json);
  only names the directory listing holds, never a path.

:class:`ViewerServer` runs the app with uvicorn on 127.0.0.1 (by default) in a thread, on a socket it
binds itself (``port=0``: a free port).
"""

from __future__ import annotations

import dataclasses
import pathlib
import socket
import threading
import time
from typing import Any

from gymllm.errors import ConfigError, explain
from gymllm.validation import require
from gymllm.viewer.index import Filters
from gymllm.viewer.runs import ViewedRun, load_runs

__all__ = ["ViewerConfig", "create_app", "ViewerServer", "STATIC_DIR", "trajectory_page"]

STATIC_DIR = pathlib.Path(__file__).resolve().parent / "static"
MAX_PAGE_SIZE = 500


@dataclasses.dataclass(frozen=True, kw_only=True)
class ViewerConfig:
    """What ``gymllm view`` serves and where.

    runs: run directories (``gymllm train --run-dir``), suite directories or summary/eval JSON files.
    host: the interface to bind (127.0.0.1: this machine only).
    port: the TCP port (0: a free one).
    index_in_background: start indexing every trajectory log when the server starts.
    """

    runs: tuple[str, ...]
    host: str = "127.0.0.1"
    port: int = 8765
    index_in_background: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "runs", tuple(str(r) for r in self.runs))
        require(
            bool(self.runs),
            "gymllm view",
            expected="at least one run directory",
            received="none",
            fix="gymllm view runs/my-run",
        )
        require(
            isinstance(self.port, int) and 0 <= self.port < 65536,
            "ViewerConfig.port",
            expected="an int in [0, 65535] (0: a free port)",
            received=self.port,
            fix="use --port 8765",
        )
        require(
            isinstance(self.host, str) and bool(self.host),
            "ViewerConfig.host",
            expected="an interface address",
            received=self.host,
            fix="use --host 127.0.0.1",
        )


def trajectory_page(run: ViewedRun, filters: Filters, page: int, size: int) -> dict[str, Any]:
    """One page of ``run``'s trajectory table. Without filters only the rows up to the page are
    indexed first (the rest is indexed on in the background), so the first page of a huge log is
    quick; with filters every log is indexed to the end first."""
    logs = list(run.logs().values())
    skip, need = page * size, (page + 1) * size
    rows: list[dict[str, Any]] = []
    if filters.empty:
        before = 0
        for ix in logs:
            ix.refresh(until=lambda ix=ix, before=before: before + ix.count_ready() >= need)
            have = ix.count_ready()
            lo, hi = max(0, skip - before), max(0, need - before)
            rows += ix.rows[lo : min(hi, have)]
            before += have
            if before >= need:
                break
    else:
        matched = 0
        for ix in logs:
            ix.refresh()
            for row in ix.select(filters):
                if skip <= matched < need:
                    rows.append(row)
                matched += 1
    complete = all(ix.at_end() for ix in logs)
    counted = sum(ix.count_ready() for ix in logs) if filters.empty else matched
    errors = [e for ix in logs for e in ix.errors[:20]]
    torn = [ix.path.name for ix in logs if ix.torn_tail]
    facets: dict[str, list[Any]] = {"env": [], "seat": [], "version": []}
    for ix in logs:
        for k, v in ix.facets().items():
            facets[k] = sorted(set(facets[k]) | set(v))
    return {
        "rows": [{k: v for k, v in r.items() if k != "ranges"} for r in rows],
        "page": page,
        "size": size,
        "total": counted,
        "complete": complete,
        "errors": errors,
        "error_count": sum(len(ix.errors) for ix in logs),
        "torn": torn,
        "facets": facets,
        "logs": [ix.path.name for ix in logs],
    }


def _index_all(runs: dict[str, ViewedRun]) -> None:
    for run in runs.values():
        for ix in run.logs().values():
            ix.refresh(pause_s=0.001)


def create_app(config: ViewerConfig) -> Any:
    """The FastAPI app serving ``config.runs`` (see module doc)."""
    from fastapi import Depends, FastAPI, HTTPException, Query
    from fastapi.responses import FileResponse, JSONResponse
    from fastapi.staticfiles import StaticFiles
    from starlette.exceptions import HTTPException as StarletteHTTPException

    runs = load_runs(list(config.runs))
    app = FastAPI(title="gymllm view", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.runs = runs
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    def get_run(name: str) -> ViewedRun:
        if name not in runs:
            raise HTTPException(404, f"run {name!r}: expected one of {sorted(runs)}")
        return runs[name]

    @app.exception_handler(StarletteHTTPException)  # unmatched routes too
    async def _error(
        request: Any, exc: StarletteHTTPException
    ) -> JSONResponse:  # errors as {"error": text} for the page
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code)

    @app.get("/")
    def index() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", media_type="text/html")

    @app.get("/api/runs")
    def api_runs() -> list[dict[str, Any]]:
        return [run.overview() for run in runs.values()]

    @app.get("/api/metrics")
    def api_metrics(run: str, offset: int = Query(0, ge=0)) -> dict[str, Any]:
        return get_run(run).metrics(offset)

    @app.get("/api/trajectories")
    def api_trajectories(
        run: str,
        page: int = Query(0, ge=0),
        size: int = Query(50, ge=1, le=MAX_PAGE_SIZE),
        filters: Filters = Depends(Filters),  # the query parameters Filters.__init__ names
    ) -> dict[str, Any]:
        return trajectory_page(get_run(run), filters, page, size)

    @app.get("/api/trajectory")
    def api_trajectory(run: str, id: str) -> dict[str, Any]:  # noqa: A002 - the query parameter's name
        from gymllm.viewer.detail import trajectory_detail

        try:
            return trajectory_detail(get_run(run), id)
        except KeyError as e:
            raise HTTPException(404, str(e.args[0])) from e
        except (ValueError, OSError) as e:
            raise HTTPException(
                422, f"trajectory {id!r} of run {run!r} could not be read: {e}"
            ) from e

    @app.get("/api/suite")
    def api_suite(run: str) -> dict[str, Any]:
        return get_run(run).suite()

    @app.get("/files/{run}/{name}")
    def files(run: str, name: str) -> FileResponse:
        r = get_run(run)
        if name not in r.files():
            raise HTTPException(
                404, f"{name!r}: expected a file of run {run!r} ({', '.join(r.files())})"
            )
        media = "application/json" if name.endswith(".json") else None
        return FileResponse(r.root / name, media_type=media)

    if config.index_in_background:
        threading.Thread(
            target=_index_all, args=(runs,), name="gymllm-view-index", daemon=True
        ).start()
    return app


class ViewerServer:
    """The viewer app served by uvicorn in a thread: ``with ViewerServer(config) as url: ...``.

    Binds ``config.host:config.port`` itself (so ``port=0`` gets a free port with no race) and
    returns once uvicorn accepts connections (watchdog: ``start_timeout_s``).
    """

    def __init__(self, config: ViewerConfig, *, start_timeout_s: float = 30.0):
        import uvicorn

        self.config = config
        self.app = create_app(config)
        self.sock = socket.socket(
            socket.AF_INET6 if ":" in config.host else socket.AF_INET, socket.SOCK_STREAM
        )
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((config.host, config.port))
        except OSError as e:
            self.sock.close()
            raise ConfigError(
                explain(
                    "gymllm view",
                    expected=f"a free port on {config.host}",
                    received=f"port {config.port}: {e.strerror}",
                    fix="pass --port 0 for a free port, or another --port",
                )
            ) from e
        host, port = self.sock.getsockname()[:2]
        self.url = f"http://{'[' + host + ']' if ':' in host else host}:{port}/"
        self.server = uvicorn.Server(
            uvicorn.Config(self.app, log_level="warning", access_log=False)
        )
        self.thread: threading.Thread | None = None
        self.start_timeout_s = start_timeout_s

    def start(self) -> str:
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, name="gymllm-view", daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + self.start_timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(
                    f"gymllm view: the server did not start within {self.start_timeout_s} s"
                )
            time.sleep(0.02)
        return self.url

    def stop(self) -> None:
        self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout=10)
        self.sock.close()

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
