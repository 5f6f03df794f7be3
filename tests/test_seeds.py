"""One held-out seed base: every default that picks held-out seeds uses HELD_OUT_SEED_BASE, and demos stay below it."""

from __future__ import annotations

from gymllm.train.train_config import EvalSection
from gymllm.rollout.evaluation import EvalConfig
from gymllm.utils.seeds import HELD_OUT_SEED_BASE


def test_every_held_out_default_is_the_one_base():
    assert HELD_OUT_SEED_BASE == 1_000_000
    assert EvalConfig().seed_base == EvalSection().seed_base == HELD_OUT_SEED_BASE
    assert EvalConfig(seeds=3).seed_range == range(HELD_OUT_SEED_BASE, HELD_OUT_SEED_BASE + 3)
