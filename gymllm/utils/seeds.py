"""The seed ranges training and held-out evaluation share out.

:data:`HELD_OUT_SEED_BASE` is the first env seed of held-out evaluation everywhere: the in-run
evaluation's default (``EvalSection.seed_base``), ``gymllm eval``'s, :class:`~gymllm.rollout.evaluation.EvalConfig`'s,
and the bound demonstrations stay below (:mod:`gymllm.envs.demos`). Training seeds start at
``run.seed`` (0 by default) and count up by one per group, so a run below a million groups never
meets a held-out seed; the run checks this (``eval.seed_base``) before it starts.
"""

from __future__ import annotations

__all__ = ["HELD_OUT_SEED_BASE"]

#: first env seed of held-out evaluation (seeds ``HELD_OUT_SEED_BASE .. + n - 1``); training and demos stay below it
HELD_OUT_SEED_BASE = 1_000_000
