"""``gymllm view``: serve the local run viewer (:mod:`gymllm.viewer`)."""

from __future__ import annotations

import sys
import time
from typing import Annotated

import tyro


def view(
    runs: Annotated[tuple[str, ...], tyro.conf.Positional],
    /,
    host: str = "127.0.0.1",
    port: int = 8765,
    open: bool = False,  # noqa: A002 - the flag is --open
) -> int:
    """Serve a local web viewer for runs, trajectories and suite results (prints its URL).

    Args:
        runs: Run directories written by `gymllm train --run-dir` (several are overlaid), suite
            directories, or `summary.json` / `gymllm eval env --out` files.
        host: The interface to bind; 127.0.0.1 keeps the viewer on this machine.
        port: The port (0: a free one).
        open: Also open the page in the default browser.
    """
    from gymllm.viewer import ViewerConfig, ViewerServer

    server = ViewerServer(ViewerConfig(runs=runs, host=host, port=port))
    url = server.start()
    if host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"gymllm view: warning: bound to {host}, so other machines can read these runs' files "
            "(there is no authentication); --host 127.0.0.1 keeps them local",
            file=sys.stderr,
            flush=True,
        )
    print(f"gymllm view: serving {len(runs)} run(s) at {url} (Ctrl-C stops)", flush=True)
    if open:
        import webbrowser

        webbrowser.open(url)
    try:
        while server.thread is not None and server.thread.is_alive():
            time.sleep(0.5)
    finally:
        server.stop()
    return 0
