"""``gymllm/ArithmeticTool-v0``: arithmetic with a calculator tool and a second attempt (multi-turn).

The embedded default task of ``gymllm train``: small enough for a 135M model to start weak but not
hopeless, so GRPO shows a reward rise on a CPU within minutes. Each episode is one
:class:`~gymllm.envs.arithmetic.ArithmeticEnv` problem (two ``digits``-digit operands by default)
behind the :class:`~gymllm.wrappers.ToolUse` wrapper with the calculator: the model may call the
calculator (its result comes back as a ``tool`` message), and a wrong final answer earns one more
attempt ("Incorrect. Try again."). The reset observation is a short system message that shows the
call syntax in the chosen format (kept short on purpose: a full JSON schema would multiply the
prompt length, and with it the cost of every step on a CPU) plus the problem.

The raw task's observations are message lists throughout (reset: ``[system, user]``; step: one
``user`` message with the feedback), so its ``observation_space`` is :class:`~gymllm.spaces.Chat`
and ``gymnasium.utils.env_checker.check_env(env.unwrapped)`` passes; the wrapped env returns the
same messages.
"""

from __future__ import annotations

from typing import Any

from gymllm.envs.arithmetic import ArithmeticEnv
from gymllm.registration import register
from gymllm.spaces import Chat
from gymllm.tools.parsers import format_tool_calls
from gymllm.types import ToolCall

__all__ = ["ArithmeticToolTask", "make_arithmetic_tool"]

_SYSTEM = (
    "You are a careful math assistant. You may use a calculator by writing\n{example}\n"
    "Give the final answer as an integer inside \\boxed{{}}."
)


class ArithmeticToolTask(ArithmeticEnv):
    """ArithmeticEnv in messages: reset gives ``[system (how to call the calculator), user]``, step ``[user]``."""

    def __init__(self, *, parser: str = "hermes", **kwargs: Any):
        super().__init__(**kwargs)
        self.observation_space = Chat()
        example = format_tool_calls([ToolCall("calculator", {"expression": "12 * 34"})], parser)
        self._system = _SYSTEM.format(example=example)

    def _reset(self, *, seed, options):
        prompt, info = super()._reset(seed=seed, options=options)
        return [
            {"role": "system", "content": self._system},
            {"role": "user", "content": prompt},
        ], info

    def _step(self, action: str):
        feedback, reward, terminated, info = super()._step(action)
        return [{"role": "user", "content": feedback}], reward, terminated, info


def make_arithmetic_tool(
    *,
    digits: int = 2,
    num_operands: int = 2,
    ops: str = "+-",
    max_attempts: int = 2,
    parser: str = "hermes",
    max_tool_calls: int = 2,
    timeout_s: float = 5.0,
    max_turns: int | None = None,
    render_mode: str | None = None,
):
    """``ToolUse(ArithmeticToolTask(...), tools=[calculator])``: the registered ``gymllm/ArithmeticTool-v0``."""
    from gymllm.tools import calculator
    from gymllm.wrappers.tool_use import ToolUse

    task = ArithmeticToolTask(
        digits=digits,
        num_operands=num_operands,
        ops=ops,
        max_attempts=max_attempts,
        parser=parser,
        max_turns=max_turns,
        render_mode=render_mode,
    )
    return ToolUse(
        task, tools=[calculator], parser=parser, max_tool_calls=max_tool_calls, timeout_s=timeout_s
    )


register("ArithmeticTool-v0", "gymllm.envs.arithmetic_tool:make_arithmetic_tool")
