"""The ``gymllm`` command: train, eval, serve, envs, check, replay, report, bench, serve-env, sft, demos, view.

Each sub-command is a typed function; its help is generated from the signature and docstring by
tyro. Errors are printed as one line plus a hint, never a bare traceback (``GYMLLM_DEBUG=1`` shows
the traceback).
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Callable, Sequence

from gymllm.cli import commands, demos, serve_env, sft, suite_cli, view

COMMANDS: dict[str, Callable[..., object]] = {
    "train": commands.train,
    "eval": commands.eval,
    "serve": commands.serve,
    "envs": commands.envs,
    "check": commands.check,
    "replay": commands.replay,
    "report": commands.report,
    "bench": commands.bench,
    "serve-env": serve_env.serve_env,
    "sft": sft.sft,
    "demos": demos.demos,
    "view": view.view,
    "compare": suite_cli.compare_main,
}


def _usage() -> str:
    lines = ["usage: gymllm COMMAND [ARGS] (gymllm COMMAND --help for its options)", "", "commands:"]
    for name, fn in COMMANDS.items():
        summary = (fn.__doc__ or "").strip().splitlines()[0]
        lines.append(f"  {name:<8} {summary}")
    return "\n".join(lines)


def _hint(exc: BaseException) -> str:
    from gymllm.errors import MissingExtraError

    if isinstance(exc, MissingExtraError):
        return f"pip install 'gymllm[{exc.extra}]'"
    if isinstance(exc, ModuleNotFoundError):
        return f"pip install {exc.name} (or reinstall gymllm: pip install -e .)"
    if type(exc).__name__ in ("NameNotFound", "NamespaceNotFound", "VersionNotFound", "UnregisteredEnv") or (
        "registered env id" in str(exc)
    ):
        return "`gymllm envs` lists the registered env ids"
    if isinstance(exc, FileNotFoundError):
        return "check the path; run directories are written by `gymllm train --run-dir DIR`"
    return "run with GYMLLM_DEBUG=1 for the full traceback"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from gymllm import __version__

        print(f"gymllm {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"error: unknown command {name!r}; expected one of {', '.join(COMMANDS)}.", file=sys.stderr)
        print("hint: gymllm --help", file=sys.stderr)
        return 2
    return guarded(lambda: commands.dispatch(name, COMMANDS[name], rest))


def guarded(call: Callable[[], object]) -> int:
    """Run a command and return its exit status: a usage error or ``--help`` (tyro's SystemExit) as its
    code, any other error as one line plus a hint on stderr and status 2 (``GYMLLM_DEBUG=1``: the
    traceback too). The one place the command line turns errors into a line (``python -m
    gymllm.cli.suite_cli`` and ``gymllm.cli.game_cli`` use it as well)."""
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
        print(f"hint: {_hint(e)}", file=sys.stderr)
        return 2
    return int(result) if isinstance(result, int) else 0

if __name__ == "__main__":
    sys.exit(main())
