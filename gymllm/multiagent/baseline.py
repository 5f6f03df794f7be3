"""The role-conditioned baseline of multi-agent self-play (SPIRAL's RAE): a pure function, used by the
seat source (:mod:`gymllm.rollout.seat_source`, ``multiagent.baseline="role_ema"``) and re-exported by
:mod:`gymllm.algos.advantages`."""

from __future__ import annotations

import numpy as np

__all__ = ["role_ema_advantages"]


def role_ema_advantages(rewards, roles, baselines, *, decay: float = 0.95):
    """SPIRAL's role-conditioned advantage (RAE): ``A_i = R_i - b[role_i]`` with ``b`` an exponential
    moving average of the rewards per role (a role is any hashable key, e.g. ``(game, seat)``), read
    before it is updated with ``R_i`` (``b <- decay * b + (1 - decay) * R_i``; an unseen role starts at 0),
    in the order given. No normalization; a group of one works. Pure: returns ``(advantages [N] float32,
    new baselines)`` and leaves ``baselines`` untouched."""
    out, b = np.zeros(len(rewards), np.float32), dict(baselines)
    for i, (r, role) in enumerate(zip(rewards, roles)):
        prev = b.get(role, 0.0)
        out[i] = float(r) - prev
        b[role] = decay * prev + (1.0 - decay) * float(r)
    return out, b
