"""The ``gymllm`` command: train, eval, serve, envs, check, replay, report, bench, serve-env, sft, demos, view.

Each sub-command is a typed function; its help is generated from the signature and docstring by
tyro. Errors are printed as one line plus a hint, never a bare traceback (``GYMLLM_DEBUG=1`` shows
the traceback).
"""

from __future__ import annotations

import sys
from typing import Callable, Sequence

from gymllm.cli import commands, demos, eval_args, serve_env, sft, suite_cli, view
from gymllm.cli.guard import guarded

COMMANDS: dict[str, Callable[..., object]] = {
    "train": commands.train,
    "eval": eval_args.eval_main,
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
    lines = [
        "usage: gymllm COMMAND [ARGS] (gymllm COMMAND --help for its options)",
        "",
        "commands:",
    ]
    for name, fn in COMMANDS.items():
        summary = (fn.__doc__ or "").strip().splitlines()[0]
        lines.append(f"  {name:<8} {summary}")
    return "\n".join(lines)


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
        print(
            f"error: unknown command {name!r}; expected one of {', '.join(COMMANDS)}.",
            file=sys.stderr,
        )
        print("hint: gymllm --help", file=sys.stderr)
        return 2
    return guarded(lambda: commands.dispatch(name, COMMANDS[name], rest))


if (
    __name__ == "__main__"
):  # no restart here: this module's imports ran already (gymllm.cli.entry restarts first)
    sys.exit(main())
