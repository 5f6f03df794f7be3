"""``LearnerConfig.fixed_shapes``: the learner runs a fixed program set decided when it is built
(``program_shapes``), ``warmup`` compiles exactly that set ahead of time, nothing is traced or compiled
after it whatever the rollouts bring, and every update equals today's (bucketed, first-use) path."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from gymllm.algos import config as C
from gymllm.algos.batching import (
    fixed_prefix_arrays,
    fixed_prefix_rows,
    fixed_prefix_slots,
    make_micro_batch,
    row_from_trajectory,
)
from gymllm.algos.learner import StreamingLearner
from gymllm.algos.learner_programs import FAST_COMPILE
from gymllm.algos.learner_config import LearnerConfig
from gymllm.algos.learner_programs import TRACES
from gymllm.algos.optim import OptimizerConfig
from gymllm.errors import ConfigError
from gymllm.models.lora import LoRAConfig
from gymllm.models.shared_prefix import shared_prefix_rows_hidden
from gymllm.models.transformer import hidden_states
from gymllm.types import Group
from test_learner import max_diff, tiny
from test_shared_prefix import LOSSES, MAX_LEN, groups_with

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
WEIGHT_PROGRAMS = ("jit(grad)", "jit(apply)", "jit(ref_logp)")


class Compiles:
    """The XLA programs compiled while the listener is on (``jax.monitoring``: the event's ``fun_name``)."""

    names: list[str] = []
    on = False

    @classmethod
    def listen(cls, event: str, duration: float, fun_name: str = "", **_) -> None:
        if cls.on and event == COMPILE_EVENT:
            cls.names.append(fun_name)

    @classmethod
    def during(cls, fn) -> list[str]:
        cls.names, cls.on = [], True
        try:
            fn()
        finally:
            cls.on = False
        return list(cls.names)


jax.monitoring.register_event_duration_secs_listener(Compiles.listen)


def rows_of(groups):
    return [
        row_from_trajectory(
            t, advantage=0.3 * (i % 3) - 0.3, group_tokens=30.0, sample_id=t.trajectory_id
        )
        for i, t in enumerate(t for g in groups for t in g.trajectories)
    ]


def test_slots_hold_every_row_and_their_shapes_never_change():
    """Two groups of 4 (prompts 20 and 17, multi-turn) and rows sharing nothing: every padded position
    reads its own input back through ``sp_gather``; the arrays' shapes are the same for any rows; a
    micro-batch needing more prompt slots than there are runs in more passes."""
    shared = rows_of(groups_with((20, 17), turns=True, seed=5))
    differ = rows_of(groups_with((20,), differ=True, seed=6))  # 4 rows, each its own prompt
    for rows, slots, passes in (
        (shared, 2, 1),
        (shared, 1, 2),
        (differ, 2, 2),
        (differ[:1], 2, 1),
        ([], 2, 1),
    ):
        layout = fixed_prefix_slots(rows, 8, MAX_LEN, 16, slots)
        assert len(layout) == passes
        seen = []
        for slot_rows in layout:
            assert len(slot_rows) <= slots and sum(len(m) for _, m in slot_rows) <= 8
            sp = fixed_prefix_arrays(rows, slot_rows, 8, MAX_LEN, 16, slots)
            assert {k: v.shape for k, v in sp.items()} == {
                "sp_prefix_tokens": (slots, 16),
                "sp_prefix_lens": (slots,),
                "sp_suffix_tokens": (8, 16),
                "sp_suffix_prefix": (8,),
                "sp_targets": (8, MAX_LEN),
                "sp_gather": (8, MAX_LEN),
            }
            flat = np.concatenate(
                [sp["sp_prefix_tokens"].reshape(-1), sp["sp_suffix_tokens"].reshape(-1)]
            )
            for b, r in enumerate(fixed_prefix_rows(rows, slot_rows)):
                np.testing.assert_array_equal(flat[sp["sp_gather"][b, : r.length]], r.inputs)
                np.testing.assert_array_equal(sp["sp_targets"][b, : r.length], r.targets)
                seen.append(r.sample_id)
        assert sorted(seen) == sorted(r.sample_id for r in rows)
    ((slot,),) = fixed_prefix_slots(differ[:1], 8, MAX_LEN, 16, 2)
    assert slot[0] == 16  # a row alone shares its own first prefix_len inputs (sampled ones too)


def test_rows_forward_equals_the_flat_forward():
    """float32: prompt slots of different lengths (one unused), rows naming their slot, a row whose slot
    holds part of its reply: every real position's hidden state == the flat forward's on the row."""
    lm = tiny()
    cfg, params = lm.config, lm.model.flat_params()
    rows = (
        rows_of(groups_with((20, 17), turns=True, seed=7))[:6]
        + rows_of(groups_with((9,), seed=8))[:1]
    )
    (slot_rows,) = fixed_prefix_slots(rows, 8, MAX_LEN, 16, 4)
    sp = fixed_prefix_arrays(rows, slot_rows, 8, MAX_LEN, 16, 4)
    assert sorted(int(n) for n in sp["sp_prefix_lens"]) == [0, 16, 16, 16]
    f = jax.jit(lambda p, *a: shared_prefix_rows_hidden(cfg, p, *a), compiler_options=FAST_COMPILE)
    hp, hs = f(
        params,
        sp["sp_prefix_tokens"],
        sp["sp_prefix_lens"],
        sp["sp_suffix_tokens"],
        sp["sp_suffix_prefix"],
    )
    h = np.concatenate(
        [np.asarray(hp).reshape(-1, hp.shape[-1]), np.asarray(hs).reshape(-1, hs.shape[-1])]
    )
    ordered = fixed_prefix_rows(rows, slot_rows)
    mb = make_micro_batch(ordered, 8, MAX_LEN)
    ref = np.asarray(
        jax.jit(lambda p, t, q: hidden_states(cfg, p, t, q), compiler_options=FAST_COMPILE)(
            params, mb.tokens, mb.positions
        )
    )
    assert np.abs(ref).max() > 0.1
    for b, r in enumerate(ordered):
        np.testing.assert_allclose(
            h[sp["sp_gather"][b, : r.length]], ref[b, : r.length], rtol=1e-5, atol=1e-5
        )


def make(fixed: bool, *, loss=LOSSES[1], lora=None, **kw):
    lm = tiny()
    cfg = dict(
        groups_per_step=3,
        micro_batch_size=8,
        num_steps=10,
        max_len=MAX_LEN,
        min_bucket=16,
        fast_compile=True,
        max_response_len=20,
        loss_positions_only=True,
        prefix_len=16,
        prefix_slots=2,
        fixed_shapes=fixed,
    )
    cfg.update(kw)
    return StreamingLearner(
        lm.config,
        lm.model.flat_params(),
        loss=loss,
        lora=lora,
        optimizer=OptimizerConfig(name="sgd", learning_rate=1e-2, max_grad_norm=0.0),
        config=LearnerConfig(**cfg),
    )


def steps_of(seed: int) -> list[list[Group]]:
    """Two steps of 3 groups: prompts of 20, 17 and 12 tokens, multi-turn samples (an observation inside
    the reply), micro-batches of 8 rows mixing two groups."""
    return [groups_with((20, 17, 12), turns=True, seed=seed + s) for s in range(2)]


def assert_same_run(a: StreamingLearner, b: StreamingLearner, steps: list[list[Group]]) -> None:
    start = {k: np.asarray(v) for k, v in a.trainable.items()}
    for groups in steps:
        ra, rb = a.submit(groups), b.submit(groups)
        assert len(ra) == len(rb) == 1
        for k, v in ra[0].metrics.items():
            if k != "train_busy_s":
                np.testing.assert_allclose(rb[0].metrics[k], v, rtol=1e-5, atol=1e-6, err_msg=k)
    assert max_diff(a.trainable, start) > 1e-4  # it trained
    assert max_diff(a.trainable, b.trainable) < 1e-6


@pytest.mark.parametrize(
    "shared_prefix,lora",
    [
        (True, False),
        (False, False),
        (True, True),
        pytest.param(False, True, marks=pytest.mark.slow),
    ],
    ids=["shared", "flat", "shared-lora", "flat-lora"],
)
def test_fixed_shapes_train_exactly_as_today(shared_prefix, lora):
    """float32, two SGD steps of mixed rows: loss, every metric and the weights == the bucketed path's
    (shared prefix on: today's first-use shapes; off: today's buckets), LoRA on and off."""
    lc = LoRAConfig(rank=2, targets=("wq", "wv", "w_up")) if lora else None
    a, b = (
        make(False, shared_prefix=shared_prefix, lora=lc),
        make(True, shared_prefix=shared_prefix, lora=lc),
    )
    assert_same_run(a, b, steps_of(10))
    if (
        shared_prefix
    ):  # 4 micro-batches a run; the 12-token prompts' longer rows take a slot of their own
        assert b.counts["shared_prefix_passes"] >= 4 and a.counts["shared_prefix_micro_batches"] > 0
    else:
        assert b.counts["fixed_micro_batches"] == 4


def test_more_prompts_than_slots_run_in_passes_with_the_same_update():
    """One prompt slot and micro-batches of two groups: every micro-batch runs as two or more passes of
    the one program, and the update is the flat path's."""
    a, b = make(False, shared_prefix=False), make(True, prefix_slots=1)
    assert_same_run(a, b, steps_of(20))
    assert (
        b.counts["shared_prefix_passes"] >= 2 * 3
    )  # a step: 8 rows of two prompts (2 passes), 4 of one


def test_a_prefix_len_past_the_prompts_costs_passes_says_so_and_trains_the_same():
    """prefix_len 24 over prompts of 20, 17 and 12 tokens: most rows do not fit their group's slot (a
    continuation of 8), so they run in extra passes (counted, one warning naming the fix); same update."""
    a, b = make(False, shared_prefix=False), make(True, prefix_len=24)
    with pytest.warns(UserWarning, match="prefix-len"):
        assert_same_run(a, b, steps_of(50)[:1])
    assert b.counts["shared_prefix_extra_passes"] > 0


def test_kl_reward_reference_forward_runs_the_fixed_program():
    loss = dataclasses.replace(
        C.grpo(), kl=dataclasses.replace(C.grpo().kl, placement="reward", beta=0.5)
    )
    group = groups_with((20,), turns=True, seed=3)[0]
    a, b = make(False, loss=loss, shared_prefix=False), make(True, loss=loss)
    assert [name for name, _ in b.program_shapes()] == ["grad", "apply", "ref_logp"]
    ra, rb = a.scorer.shaped_rewards(group), b.scorer.shaped_rewards(group)
    assert np.any(ra != group.rewards)
    np.testing.assert_allclose(rb, ra, rtol=1e-5, atol=1e-6)


def test_warmup_compiles_the_set_and_nothing_compiles_after():
    """A fresh configuration (its own programs): ``warmup`` traces and compiles exactly the programs of
    ``program_shapes`` (each once) and the advantage program; then four steps of prompts of several
    lengths, multi-turn rows, groups of 4 and of 3 and micro-batches of one or two groups trace nothing and
    compile nothing that takes the weights."""
    ln = make(
        True, num_steps=17, compute_entropy=False
    )  # num_steps and entropy key programs of their own
    assert [name for name, _ in ln.program_shapes()] == ["grad", "apply"]
    before = TRACES.copy()
    names = Compiles.during(lambda: ln.warmup(group_size=4))
    assert {k: TRACES[k] - before[k] for k in ("grad", "apply", "ref_logp")} == {
        "grad": 1,
        "apply": 1,
        "ref_logp": 0,
    }
    assert sorted(n for n in names if n in WEIGHT_PROGRAMS) == ["jit(apply)", "jit(grad)"]
    rng = np.random.default_rng(0)
    steps = [
        groups_with(tuple(int(x) for x in rng.integers(12, 22, 3)), turns=True, seed=30 + s)
        for s in range(4)
    ]
    steps[2:] = [
        [dataclasses.replace(g, trajectories=g.trajectories[:3]) for g in gs] for gs in steps[2:]
    ]
    before = TRACES.copy()
    assert (
        Compiles.during(lambda: [ln.submit(g) for g in steps[:2]]) == []
    )  # groups of 4: nothing at all
    names = Compiles.during(
        lambda: [ln.submit(g) for g in steps[2:]]
    )  # groups of 3: 8-row micro-batches of 3 groups
    assert ln.step == 4 and ln.counts["shared_prefix_passes"] > 6
    assert TRACES == before
    assert names == [
        "jit(<lambda>)"
    ]  # the advantage program (no weights) for groups of 3, not warmed up


def test_background_warmup_then_steps_match_a_foreground_one():
    a, b = make(True, num_steps=19), make(True, num_steps=19)
    a.warmup(group_size=4)
    b.warmup(group_size=4, background=True)
    assert_same_run(a, b, steps_of(40))


def test_config_errors():
    with pytest.raises(ConfigError, match="packing"):
        LearnerConfig(fixed_shapes=True, packing=True)
    with pytest.raises(ConfigError, match="prefix_len"):
        LearnerConfig(max_len=64, prefix_len=64)
    with pytest.raises(ConfigError, match="fixed_shapes"):
        make(False).program_shapes()
    ln = make(True)
    assert ln.buckets == (MAX_LEN,)
    (name, arrays), _ = ln.program_shapes()
    assert (
        name == "grad"
        and arrays["sp_prefix_tokens"] == ((2, 16), "int32")
        and arrays["mask"] == ((8, 20), "float32")
    )


def test_rows_over_the_response_budget_keep_its_first_sampled_tokens():
    ln = make(True, max_response_len=4)
    groups = groups_with((20,), seed=9)
    over = sum(max(int(np.sum(t.loss_mask[1:])) - 4, 0) for t in groups[0].trajectories)
    assert over > 0
    ln.submit(groups)
    assert ln.counts["sampled_tokens_over_budget"] == over
