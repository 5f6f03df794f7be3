"""The ``gymllm`` command's entry point: the process starts again with malloc on transparent huge pages
(:func:`gymllm.utils.host_memory.restart_with_hugepages`; ``GYMLLM_HUGEPAGES=0``: as it is), before the
heavy imports, then runs :func:`gymllm.cli.main.main`. ``python -m gymllm.cli.entry ARGS`` is the
command ``gymllm ARGS``."""

from __future__ import annotations

import sys


def run() -> int:
    """``gymllm``: :func:`gymllm.cli.main.main` on the command line's arguments, in a process whose
    malloc asks for huge pages where the host offers them."""
    from gymllm.utils.host_memory import restart_with_hugepages

    restart_with_hugepages()
    from gymllm.cli.main import main

    return main()


if __name__ == "__main__":
    sys.exit(run())
