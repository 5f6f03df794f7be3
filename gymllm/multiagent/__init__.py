"""Multi-agent text envs over PettingZoo: AEC and Parallel wrappers, single-seat and per-agent vector views.

* :class:`TextAECEnv` wraps any PettingZoo AEC env. Each agent observes
  ``{"observation": <text>, "action_mask": int8[n]}`` (the PettingZoo classic convention, so masks
  reach tools that read them) and acts with a ``str``: a move name or index from the move list
  (``move_names=`` or indices), or numbers / JSON for non-Discrete action spaces (the same parser as
  :func:`gymllm.envs.from_gymnasium`). The text shows the agent's seat, the rendered observation and
  the legal moves.
* Illegal or unparsable moves follow the declared policy (:class:`MultiAgentConfig`):
  ``"retry"``: the mover gets ``invalid_penalty``, stays selected and its next observation explains
  the mistake; after ``max_invalid`` consecutive invalid moves it forfeits. ``"forfeit"``: the game
  ends at once, the mover gets ``forfeit_reward`` and everyone else 0 (as PettingZoo's classic games
  do for an illegal move). The inner env never sees an illegal move.
* :class:`TextParallelEnv` does the same for Parallel envs; an invalid action there is replaced by
  the first legal move (``"retry"``: penalty, the step goes on) or ends the episode (``"forfeit"``).
* The text action space is :class:`MoveText`, a :class:`gymllm.spaces.Text` whose ``sample(mask)``
  draws a legal move name from its own RNG, so PettingZoo's ``api_test`` / ``seed_test`` play real
  games through the text layer.
* :class:`SingleAgentView` is a :class:`~gymllm.core.TextEnv` for one seat against scripted or
  frozen opponents (a policy is ``f(observation: dict, rng) -> str``); :class:`AgentVectorEnv` runs
  many games with one slot per (game, learning seat), barrier-free ``send`` / ``recv`` with
  ``env_ids`` like :class:`gymllm.vector.VectorEnv`: self-play gives one trajectory per seat.

PettingZoo's ``api_test`` reads ``observation.dtype`` of every leaf, which a ``str`` does not have
(``'str' object has no attribute 'dtype'``). :func:`text_api_test` runs PettingZoo's own ``api_test``
with exactly that check adapted: a text leaf must be a ``str`` inside its ``Text`` space (numeric
leaves keep the original dtype check). Everything else in ``api_test`` runs unchanged; its
``test_action_flexibility`` is a no-op for text action spaces (it only acts on Discrete/Box
spaces), and it warns that observations are not NumPy arrays, which is expected for text.

The pieces live in their own modules: :mod:`~gymllm.multiagent.codec` (config, move space,
text codec), :mod:`~gymllm.multiagent.aec`, :mod:`~gymllm.multiagent.parallel`,
:mod:`~gymllm.multiagent.policies`, :mod:`~gymllm.multiagent.seat`,
:mod:`~gymllm.multiagent.vector`, :mod:`~gymllm.multiagent.check`, :mod:`~gymllm.multiagent.factory`
(which ``env.id`` names a game) and :mod:`~gymllm.multiagent.baseline` (the role EMA baseline); this module
gathers their public names.
"""

from __future__ import annotations

from gymllm.multiagent.aec import TextAECEnv
from gymllm.multiagent.baseline import role_ema_advantages
from gymllm.multiagent.check import text_api_test
from gymllm.multiagent.codec import MoveText, MultiAgentConfig, TextCodec
from gymllm.multiagent.factory import GAMES, GameFactory, game_factory
from gymllm.multiagent.parallel import TextParallelEnv
from gymllm.multiagent.policies import Policy, random_legal_policy
from gymllm.multiagent.seat import SingleAgentView
from gymllm.multiagent.vector import AgentVectorEnv

__all__ = [
    "TextAECEnv",
    "TextParallelEnv",
    "MultiAgentConfig",
    "MoveText",
    "SingleAgentView",
    "AgentVectorEnv",
    "random_legal_policy",
    "text_api_test",
    "TextCodec",
    "Policy",
    "GAMES",
    "GameFactory",
    "game_factory",
    "role_ema_advantages",
]
