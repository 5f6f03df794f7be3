"""``from_pettingzoo``: any PettingZoo AEC or Parallel env as a text multi-agent env.

    from pettingzoo.classic import connect_four_v3
    env = from_pettingzoo(connect_four_v3.env(), invalid_action="retry")   # a TextAECEnv
    env.reset(seed=0); obs, reward, term, trunc, info = env.last()         # obs["observation"] is text
    env.step("4")

Keyword arguments are :class:`gymllm.multiagent.MultiAgentConfig` fields. The result is
still a PettingZoo env (``TextAECEnv`` or ``TextParallelEnv``); for one seat as a Gymnasium text env
use :class:`~gymllm.multiagent.SingleAgentView`, for vectorized self-play
:class:`~gymllm.multiagent.AgentVectorEnv`.
"""

from __future__ import annotations

from typing import Any

from gymllm.validation import require_instance


def from_pettingzoo(env: Any, **config: Any):
    """Wrap a PettingZoo AEC env (-> ``TextAECEnv``) or Parallel env (-> ``TextParallelEnv``).

    ``env`` may also be a zero-argument factory returning one of them.
    """
    from pettingzoo import AECEnv, ParallelEnv

    from gymllm.multiagent import MultiAgentConfig, TextAECEnv, TextParallelEnv

    if callable(env) and not isinstance(env, (AECEnv, ParallelEnv)):
        env = env()
    cfg = MultiAgentConfig(**config)
    require_instance(
        env,
        (AECEnv, ParallelEnv),
        "from_pettingzoo(env)",
        expected="a pettingzoo AECEnv or ParallelEnv (or a factory)",
        fix="pass e.g. tictactoe_v3.env()",
    )
    return (TextAECEnv if isinstance(env, AECEnv) else TextParallelEnv)(env, cfg)


__all__ = ["from_pettingzoo"]
