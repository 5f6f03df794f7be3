"""Chat templates: rendering with Hugging Face semantics, and the ChatML template of tiny models.

:func:`render_chat_template` renders a Jinja2 chat template the way ``transformers``'
``apply_chat_template`` does: a sandboxed environment with ``trim_blocks`` and ``lstrip_blocks``,
the ``loopcontrols`` extension, a ``tojson`` filter that keeps Unicode (``ensure_ascii=False``),
and the ``raise_exception`` / ``strftime_now`` globals.

:data:`CHATML_TOOLS_TEMPLATE` is Qwen2.5's ChatML template (tools in the system prompt, calls as
``<tool_call>{json}</tool_call>``, results as ``<tool_response>`` inside a user turn). Tiny test
models use it; SmolLM2 ships a tool-less ChatML template and Qwen models their own.

:func:`tools_system_prompt` writes the same tools block for templates that ignore ``tools``.
"""

from __future__ import annotations

import datetime
import functools
import json
from typing import Any, Sequence

CHATML_TOOLS_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {%- if tool_call.arguments is string %}
                {{- tool_call.arguments }}
            {%- else %}
                {{- tool_call.arguments | tojson }}
            {%- endif %}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators=None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise(message: str) -> None:
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=32)
def compile_template(source: str):
    """Compile once per template source (HF's environment settings)."""
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def render_chat_template(
    source: str,
    messages: Sequence[dict],
    *,
    tools: Sequence[dict] | None = None,
    add_generation_prompt: bool = False,
    **context: Any,
) -> str:
    """Render ``source`` for ``messages`` exactly as transformers' ``apply_chat_template`` would."""
    return compile_template(source).render(
        messages=list(messages),
        tools=list(tools) if tools else None,
        add_generation_prompt=add_generation_prompt,
        **context,
    )


def template_supports_tools(source: str) -> bool:
    """Whether the template reads the ``tools`` variable at all."""
    return "tools" in source


def tools_system_prompt(tools: Sequence[dict], system: str = "") -> str:
    """The Hermes/Qwen tools block (same text as :data:`CHATML_TOOLS_TEMPLATE` writes)."""
    head = system or "You are a helpful assistant."
    listing = "".join("\n" + _tojson(t) for t in tools)
    return (
        f"{head}\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>{listing}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )
