"""Random GRPO groups for learner tests that run in child processes (sharding, multi-host):
4 members per group, a 4-token prompt, behaviour logprobs near log(1/300). :class:`StepCounter` is a
stand-in learner for tests of the training loop's bookkeeping (no model)."""

import collections
import types

import numpy as np

from gymllm.types import Group, Trajectory


def groups(n, seed):
    r = np.random.default_rng(seed)
    out = []
    for k in range(n):
        trajs = []
        for m in range(4):
            ids = r.integers(3, 290, int(r.integers(6, 15))).astype(np.int32)
            mask = np.r_[np.zeros(4), np.ones(len(ids) - 4)].astype(np.int8)
            mu = np.where(mask > 0, -5.7 + r.normal(0, 0.1, len(ids)), 0).astype(np.float32)
            trajs.append(
                Trajectory(
                    token_ids=ids,
                    loss_mask=mask,
                    behaviour_logprobs=mu,
                    versions=np.where(mask > 0, 0, -1).astype(np.int32),
                    reward=float(r.random()),
                    trajectory_id=f"{seed}/{k}/{m}",
                )
            )
        out.append(Group(group_id=f"{seed}/{k}", task_id="t", trajectories=trajs))
    return out


class StepCounter:
    """A stand-in for the learner's interface (no model, no update): an optimizer step every
    ``groups_per_step`` submitted groups; ``events`` gets ("train", group ids) for each submit."""

    def __init__(self, groups_per_step=2, events=None):
        self.groups_per_step, self.events = groups_per_step, events if events is not None else []
        self.version, self.groups_in_step = 0, 0
        self.consumed_groups: set = set()
        self.counts: collections.Counter = collections.Counter()

    def submit(self, groups):
        self.events.append(("train", [g.group_id for g in groups]))
        reps = []
        for g in groups:
            self.consumed_groups.add(g.group_id)
            self.groups_in_step += 1
            if self.groups_in_step == self.groups_per_step:
                self.version, self.groups_in_step = self.version + 1, 0
                reps.append(types.SimpleNamespace(step=self.version))
        return reps

    def policy_params(self):
        return {}
