"""The built-in ``python`` tool: run code in the subprocess sandbox and return its output.

    from gymllm.tools import python
    python(code="print(sum(range(10)))")        # "45"

``python`` runs each call in a fresh sandbox (a new temporary work dir, default
:class:`~gymllm.tools.sandbox.SandboxConfig`). :func:`make_python_tool` builds one bound to your
own :class:`~gymllm.tools.sandbox.Sandbox` (files persist across calls) or config.
"""

from __future__ import annotations

from gymllm.tools.sandbox import Sandbox
from gymllm.tools.sandbox_config import SandboxConfig
from gymllm.tools.tool import Tool, tool

__all__ = ["python", "make_python_tool"]

_DOC = """Run Python 3 code in a sandbox and return what it prints (stdout, then stderr).

    Each call starts a fresh interpreter with the standard library only; there is no network and
    only the working directory is writable. Print the values you want to see.

    Args:
        code: the Python source to run, e.g. "print(2 ** 100)".
    """


def make_python_tool(
    sandbox: Sandbox | None = None, *, config: SandboxConfig | None = None, name: str = "python"
) -> Tool:
    """A ``python(code)`` tool running in ``sandbox`` (persistent files) or a fresh one per call."""

    def run(code: str) -> str:
        if sandbox is not None:
            return sandbox.run_python(code).as_text()
        with Sandbox(config) as sb:
            return sb.run_python(code).as_text()

    run.__doc__ = _DOC
    return tool(run, name=name)


python = make_python_tool()
