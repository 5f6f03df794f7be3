"""A sandboxed shell tool: ``bash -c`` command lines in a persistent sandbox work dir.

    with Sandbox(SandboxConfig(timeout_s=10)) as sb:
        shell = make_shell_tool(sb)
        shell(command="ls && cat README.md")

Each command runs in a new ``bash`` (state such as ``cd`` or variables does not carry over; files do)
with no network, a read-only file system outside the work dir, and the sandbox's limits.
"""

from __future__ import annotations

from gymllm.tools.sandbox import Sandbox
from gymllm.tools.tool import Tool, tool

__all__ = ["make_shell_tool"]


def make_shell_tool(
    sandbox: Sandbox, *, name: str = "shell", timeout_s: float | None = None
) -> Tool:
    """A ``shell(command)`` tool bound to ``sandbox``'s work dir."""

    def run(command: str) -> str:
        """Run a bash command line in the repository's working directory and return its output.

        Each command starts a fresh shell in the working directory (files persist, `cd` does not).
        There is no network. Use e.g. `cat FILE`, `ls`, `python -m unittest`, or
        `python - <<'EOF' ... EOF` scripts that edit files.

        Args:
            command: the bash command line to run.
        """
        return sandbox.run_shell(command, timeout_s=timeout_s).as_text()

    return tool(run, name=name)
