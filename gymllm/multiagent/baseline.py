"""The role-conditioned baseline of multi-agent self-play (SPIRAL's RAE): a pure function, used by the
seat source (:mod:`gymllm.rollout.seat_source`, ``multiagent.baseline="role_ema"``) and re-exported by
:mod:`gymllm.algos.advantages`."""

from __future__ import annotations

import numpy as np

__all__ = ["SCALE_SUFFIX", "group_role_advantages", "role_ema_advantages"]

SCALE_SUFFIX = "#spread2"  # a key's running squared spread, kept beside its baseline (scaled=True)


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


def group_role_advantages(
    rewards, keys, baselines, *, decay: float = 0.95, scaled: bool = False, floor: float = 0.25
):
    """``role_ema`` over one group: ``A_i = R_i - b[key_i]`` with every ``b`` read before the group, then each
    key's EMA takes the mean reward of the group's members with that key (``b <- decay * b + (1 - decay) *
    mean``; an unseen key starts at 0). With one key for the whole group (its seat) this is SPIRAL's RAE as
    the learner applies it a group at a time; with a key per member (the seat and its private card, a
    ``multiagent.baseline_key``) it is a state-conditioned baseline.

    ``scaled``: each advantage is also divided by its key's running spread ``max(sqrt(s2[key]), floor)``,
    ``s2`` an EMA (same decay) of the squared deviation ``(R - b[key])**2`` from the baseline as it was read,
    updated with the mean over the key's members after the group; an unseen key's ``s2`` is 1. A key whose
    payoffs spread little (a J in Kuhn poker: fold -1 or call -2) then teaches as loudly as one whose spread
    is large (a K: +2 or -1). ``s2`` is kept in the same dict under ``key + SCALE_SUFFIX``.

    Pure: returns ``(advantages [N] float32, new baselines)``."""
    rewards = np.asarray(rewards, np.float32)
    keys = list(keys)
    read = np.asarray([baselines.get(k, 0.0) for k in keys], np.float32)
    out = rewards - read
    if scaled:
        s2 = np.asarray([baselines.get(k + SCALE_SUFFIX, 1.0) for k in keys], np.float32)
        out = out / np.maximum(np.sqrt(s2), np.float32(floor))
    b = dict(baselines)
    for key in dict.fromkeys(keys):  # first-seen order
        members = np.asarray([k == key for k in keys])
        b = role_ema_advantages([float(np.mean(rewards[members]))], [key], b, decay=decay)[1]
        if scaled:
            dev2 = float(np.mean((rewards[members] - read[members]) ** 2))
            prev = baselines.get(key + SCALE_SUFFIX, 1.0)
            b[key + SCALE_SUFFIX] = decay * prev + (1.0 - decay) * dev2
    return out.astype(np.float32), b
