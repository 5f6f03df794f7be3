"""Random GRPO groups for learner tests that run in child processes (sharding, multi-host):
4 members per group, a 4-token prompt, behaviour logprobs near log(1/300)."""

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
            trajs.append(Trajectory(token_ids=ids, loss_mask=mask, behaviour_logprobs=mu,
                                    versions=np.where(mask > 0, 0, -1).astype(np.int32), reward=float(r.random()),
                                    trajectory_id=f"{seed}/{k}/{m}"))
        out.append(Group(group_id=f"{seed}/{k}", task_id="t", trajectories=trajs))
    return out
