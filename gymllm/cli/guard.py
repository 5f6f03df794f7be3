"""How a command's errors reach the terminal: one line plus a hint, never a bare traceback
(``GYMLLM_DEBUG=1`` shows the traceback)."""

from __future__ import annotations

import os
import sys
import traceback
from typing import Callable

__all__ = ["guarded", "hint"]


def hint(exc: BaseException) -> str:
    """The next thing to try after ``exc``: an install, `gymllm envs`, a path check, or the debug switch."""
    from gymllm.errors import MissingExtraError

    if isinstance(exc, MissingExtraError):
        return f"pip install 'gymllm[{exc.extra}]'"
    if isinstance(exc, ModuleNotFoundError):
        return f"pip install {exc.name} (or reinstall gymllm: pip install -e .)"
    if type(exc).__name__ in (
        "NameNotFound",
        "NamespaceNotFound",
        "VersionNotFound",
        "UnregisteredEnv",
    ) or ("registered env id" in str(exc)):
        return "`gymllm envs` lists the registered env ids"
    if isinstance(exc, FileNotFoundError):
        return "check the path; run directories are written by `gymllm train --run-dir DIR`"
    return "run with GYMLLM_DEBUG=1 for the full traceback"


def guarded(call: Callable[[], object]) -> int:
    """Run a command and return its exit status: a usage error or ``--help`` (tyro's SystemExit) as its
    code, any other error as one line plus a hint on stderr and status 2 (``GYMLLM_DEBUG=1``: the
    traceback too). The one place the command line turns errors into a line (``gymllm``, ``python -m
    gymllm.cli.suite_cli`` and ``python -m gymllm.cli.game_cli``)."""
    try:
        result = call()
    except SystemExit as e:  # tyro's --help and argument errors
        return int(e.code or 0) if isinstance(e.code, int) else 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the CLI's one place that turns errors into a line + hint
        if os.environ.get("GYMLLM_DEBUG"):
            traceback.print_exc()
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"error: {type(e).__name__}: {msg}", file=sys.stderr)
        print(f"hint: {hint(e)}", file=sys.stderr)
        return 2
    return int(result) if isinstance(result, int) else 0
