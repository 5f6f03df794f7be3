"""A learning test that can fail: the tiny preset (random tiny model, TinyRepeat-v0) must raise its
reward well above chance within a fixed, seeded run in CI time.

Chance: a random tiny model writes random byte-level BPE pieces, so the fraction of target letters
in its replies is about 0.03. The test asks for the mean reward of the last 3 steps to exceed 0.2
and 4x the first 2 steps' mean. eta = 0 makes the run deterministic (synchronous schedule)."""

from __future__ import annotations

import dataclasses

import numpy as np

from gymllm.train.trainer import train
from gymllm.train.train_config import preset


def test_tiny_preset_learns_well_above_chance(tmp_path):
    cfg = preset("tiny")
    cfg = dataclasses.replace(
        cfg,
        rollout=dataclasses.replace(cfg.rollout, max_staleness=0),
        learner=dataclasses.replace(cfg.learner, num_steps=14),
        run=dataclasses.replace(
            cfg.run, run_dir=str(tmp_path / "tiny"), console=False, report=False
        ),
    )
    res = train(cfg)
    r = res.rewards()
    assert len(r) == 14
    chance = float(np.mean(r[:2]))
    final = float(np.mean(r[-3:]))
    assert chance < 0.1, f"the untrained model should be near chance, got {r[:2]}"
    assert final > 0.2 and final > 4 * chance, f"no learning: rewards {np.round(r, 3).tolist()}"
