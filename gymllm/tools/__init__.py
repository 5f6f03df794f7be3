"""Tools for LLM agents: the ``@tool`` decorator and registry, tool-call parsers, built-in tools, sandbox.

    from gymllm.tools import tool, ToolRegistry, calculator, python, parse_tool_calls

Everything here is standard-library only (no JAX), so importing it is cheap.
"""

from gymllm.tools.calculator import CalculatorError, calculator
from gymllm.tools.parsers import (
    FORMATS,
    ParsedCalls,
    ParseError,
    format_tool_calls,
    parse_tool_calls,
)
from gymllm.tools.python_tool import make_python_tool, python
from gymllm.tools.registry import ToolRegistry, ToolResult
from gymllm.tools.sandbox import Sandbox
from gymllm.tools.sandbox_config import SandboxConfig, SandboxResult
from gymllm.tools.shell import make_shell_tool
from gymllm.tools.tool import Tool, tool

__all__ = [
    "FORMATS",
    "CalculatorError",
    "ParseError",
    "ParsedCalls",
    "Sandbox",
    "SandboxConfig",
    "SandboxResult",
    "Tool",
    "ToolRegistry",
    "ToolResult",
    "calculator",
    "format_tool_calls",
    "make_python_tool",
    "make_shell_tool",
    "parse_tool_calls",
    "python",
    "tool",
]
