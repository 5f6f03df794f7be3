"""The role-conditioned baseline of multi-agent self-play (SPIRAL's RAE): a pure function, used by the
seat source (:mod:`gymllm.rollout.seat_source`, ``multiagent.baseline="role_ema"``) and re-exported by
:mod:`gymllm.algos.advantages`."""

from __future__ import annotations

import numpy as np

__all__ = ["group_role_advantages", "role_ema_advantages"]


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


def group_role_advantages(rewards, keys, baselines, *, decay: float = 0.95):
    """``role_ema`` over one group: ``A_i = R_i - b[key_i]`` with every ``b`` read before the group, then each
    key's EMA takes the mean reward of the group's members with that key (``b <- decay * b + (1 - decay) *
    mean``; an unseen key starts at 0). With one key for the whole group (its seat) this is SPIRAL's RAE as
    the learner applies it a group at a time; with a key per member (the seat and its private card, a
    ``multiagent.baseline_key``) it is a state-conditioned baseline. Pure: returns ``(advantages [N]
    float32, new baselines)``."""
    rewards = np.asarray(rewards, np.float32)
    out = rewards - np.asarray([baselines.get(k, 0.0) for k in keys], np.float32)
    b = dict(baselines)
    for key in dict.fromkeys(keys):  # first-seen order
        mean = float(np.mean([float(r) for r, k in zip(rewards, keys) if k == key]))
        b = role_ema_advantages([mean], [key], b, decay=decay)[1]
    return out.astype(np.float32), b
