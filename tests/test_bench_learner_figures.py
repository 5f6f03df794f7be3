"""Figures of issue 35's benchmarks: benchmarks/quickstart.py reads a run's own records, and
benchmarks/train.py's FLOP count for ``learner_vs_roofline`` counts what the shared-prefix layout runs
(each prompt once, continuations over the prompt's keys and their own), checked against the flat formula
by hand, with the learner's own layout for the Quickstart's rows."""

from __future__ import annotations

import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import train  # noqa: E402
from gymllm.algos.learner import StreamingLearner  # noqa: E402
from gymllm.algos.learner_config import LearnerConfig  # noqa: E402
from gymllm.models.tiny import make_tiny  # noqa: E402
from learner_profile import QS_GROUP, QS_PROMPT, quickstart_groups  # noqa: E402


def test_shared_prefix_flops_reduce_to_the_flat_formula_and_count_by_hand():
    cfg = make_tiny("llama", num_layers=2).config
    e, f, v, n_l = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.num_layers
    h, d, k = cfg.num_heads, cfg.resolved_head_dim, cfg.num_kv_heads
    proj = n_l * (2 * e * (h * d + 2 * k * d) + 2 * h * d * e + 6 * e * f)
    attn = n_l * 4 * h * d
    # one prompt of T positions and one empty continuation is one flat row of T positions
    assert train.step_flops(cfg, 1, 40, 8, shared=(1, 40, 1, 0)) == train.step_flops(cfg, 1, 40, 8)
    # 1 prompt of 128 over 128 keys + 6 continuations of 64 over 192 keys, head on 48 positions
    want = 3.0 * (128 * (proj + attn * 128) + 6 * 64 * (proj + attn * 192) + 2 * e * v * 48)
    assert np.isclose(train.step_flops(cfg, 6, 160, 48, shared=(1, 128, 6, 64)), want)
    assert train.step_flops(cfg, 6, 160, 48, shared=(1, 128, 6, 64)) < train.step_flops(
        cfg, 6, 160, 48
    )


def test_shared_layout_is_the_learners_for_the_quickstart_rows():
    lm = make_tiny("llama", num_layers=1)
    groups = quickstart_groups(seed=0, vocab=lm.config.vocab_size)
    on = StreamingLearner(
        lm.config, lm.model.flat_params(), config=LearnerConfig(max_len=256, shared_prefix=True)
    )
    off = StreamingLearner(
        lm.config, lm.model.flat_params(), config=LearnerConfig(max_len=256, shared_prefix=False)
    )
    gp, tp, s, ts = train.shared_layout(on, groups, QS_GROUP, 160)
    assert (
        (gp, s) == (1, QS_GROUP)
        and tp >= QS_PROMPT + 1
        and tp in on.prefix_table
        and ts in on.prefix_table
    )
    assert train.shared_layout(off, groups, QS_GROUP, 160) is None


def test_quickstart_summary_reads_the_runs_own_records(tmp_path):
    import json

    import pytest

    import quickstart

    rows = [
        {
            "step": i + 1,
            "rollout_reward_mean": r,
            "step_wall_s": w,
            "pipeline/engine_busy_fraction": b,
            "pipeline/trainer_idle_fraction": 1 - b,
        }
        for i, (r, w, b) in enumerate(
            zip(
                [0.2, 0.3, 0.4, 0.5, 0.7, 0.8],
                [10, 20, 10, 10, 10, 20],
                [1.0, 0.5, 1.0, 1.0, 1.0, 0.5],
            )
        )
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (tmp_path / "summary.txt").write_text(
        "run: x\nbiggest stall: trainer idle (10%) -> more envs\n"
    )
    out = quickstart.summarize(tmp_path, "...\ntrained 6 steps in 81.5s; reward ...\n")
    assert out["quickstart_train_s"] == 81.5 and out["steps"] == 6
    assert out["reward_first3"] == pytest.approx(0.3) and out["reward_last3"] == pytest.approx(
        2.0 / 3
    )
    assert out["engine_busy"] == pytest.approx(
        (10 + 10 + 10 + 10 + 10 + 10) / 80
    )  # step-wall weighted
    assert out["biggest_stall"].startswith("biggest stall: trainer idle")
    with pytest.raises(RuntimeError, match="trained N steps"):
        quickstart.summarize(tmp_path, "no summary line")
