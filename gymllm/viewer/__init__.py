"""``gymllm view``: a local web viewer for training runs, trajectories and suite results.

    from gymllm.viewer import ViewerConfig, ViewerServer
    with ViewerServer(ViewerConfig(runs=("runs/my-run",), port=0)) as url:
        print(url)                      # http://127.0.0.1:<port>/

The page and every script and style it uses ship in ``gymllm/viewer/static``; the server binds
127.0.0.1 by default and the page requests nothing from anywhere else. Modules:
:mod:`~gymllm.viewer.server` (the FastAPI app and its uvicorn thread), :mod:`~gymllm.viewer.runs`
(what a run directory holds), :mod:`~gymllm.viewer.index` (the paged, incremental trajectory index),
:mod:`~gymllm.viewer.detail` (one trajectory, turn by turn and token by token).
"""

from gymllm.viewer.server import STATIC_DIR, ViewerConfig, ViewerServer, create_app

__all__ = ["ViewerConfig", "ViewerServer", "create_app", "STATIC_DIR"]
