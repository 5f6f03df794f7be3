"""Pipeline metrics on a synthetic schedule with known answers, NumPy references, learner helpers."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gymllm.telemetry import Tracer
from gymllm.telemetry.export import load_chrome_trace, write_chrome_trace
from gymllm.telemetry.metrics import (
    aggregate,
    biggest_stall,
    learner_step_metrics,
    logprob_gap,
    pipeline_metrics,
    staleness_histogram,
    union_length,
)

S = 1e6  # µs per second


def X(name, track, start_s, end_s, /, **args):
    return {
        "name": name,
        "ph": "X",
        "ts": start_s * S,
        "dur": (end_s - start_s) * S,
        "track": track,
        "args": args,
    }


def C(name, t_s, value, /, track="rollout"):
    return {"name": name, "ph": "C", "ts": t_s * S, "track": track, "args": {name: value}}


def schedule():
    """10 s of pipeline with hand-computed figures (see test_known_schedule)."""
    return [
        # engine: [0,4] with nested decodes, [6,8] and a concurrent [7,9] -> union 4 + 3 = 7 s
        X("prefill", "engine", 0, 4),
        X("decode", "engine", 0, 2, tokens=100),
        X("decode", "engine", 2, 4, tokens=100),
        X("decode", "engine", 6, 8, tokens=100),
        X("decode", "engine/1", 7, 9, tokens=0),
        # trainer: step [2,5] with micro-batches, sync [5,6], checkpoint [9,10] -> busy 5 s
        X("train_step", "trainer", 2, 5, step=0, tokens=500, staleness={0: 300, 2: 200}),
        X("micro_batch", "trainer", 2, 3),
        X("micro_batch", "trainer", 3, 5),
        X("weight_sync", "trainer", 5, 6, version=1),
        X("checkpoint", "trainer", 9, 10),
        # two trajectories, 10 s of rollout time; tools 2.5 s; env 1 s; queue wait 0.5 s
        X("rollout", "rollout", 0, 5, trajectory=0),
        X("rollout", "rollout", 1, 6, trajectory=1),
        X("tool", "tool", 1, 2, name="calc"),
        X("tool", "tool", 3, 4.5, name="python"),
        X("env_step", "env/0", 0, 0.5),
        X("env_step", "env/1", 5, 5.5),
        X("queue_wait", "rollout", 6, 6.5),
        # queue depth 2 on [0,4), 4 on [4,8), 0 on [8,10] -> mean 2.4
        C("queue_depth", 0, 2),
        C("queue_depth", 4, 4),
        C("queue_depth", 8, 0),
        # running totals
        C("groups_filtered", 1, 1),
        C("groups_filtered", 3, 2),
        C("groups_filtered", 7, 3),
        C("groups_dropped", 6, 1),
    ]


def test_known_schedule():
    m = pipeline_metrics(schedule(), window=(0, 10 * S))
    expected = {
        "window_s": 10.0,
        "engine_busy_fraction": 0.7,
        "engine_idle_fraction": 0.3,
        "trainer_busy_fraction": 0.5,
        "trainer_idle_fraction": 0.5,
        "weight_sync_fraction": 0.1,
        "checkpoint_fraction": 0.1,
        "tokens_generated": 300.0,
        "tokens_per_s_generated": 30.0,
        "tokens_trained": 500.0,
        "tokens_per_s_trained": 50.0,
        "staleness_mean": 0.8,
        "staleness_max": 2,
        "queue_depth_mean": 2.4,
        "queue_depth_max": 4.0,
        "queue_depth_last": 0.0,
        "tool_latency_share": 0.25,
        "env_latency_share": 0.1,
        "queue_wait_s": 0.5,
        "rollouts_completed": 2,
        "rollout_latency_mean_s": 5.0,
        "groups_filtered": 3.0,
        "groups_dropped": 1.0,
    }
    for k, v in expected.items():
        assert m[k] == pytest.approx(v), k
    assert m["staleness_hist"] == {0: 300.0, 2: 200.0}
    name, frac, advice = biggest_stall(m)
    assert name.startswith("trainer idle") and frac == pytest.approx(0.5) and advice


def test_window_clips_spans_and_counts_increases_inside():
    # window [3, 7]: engine busy [3,4] + [6,7] = 2 s of 4; trainer [3,6] = 3 s of 4
    m = pipeline_metrics(schedule(), window=(3 * S, 7 * S))
    assert m["engine_busy_fraction"] == pytest.approx(0.5)
    assert m["trainer_busy_fraction"] == pytest.approx(0.75)
    assert m["weight_sync_fraction"] == pytest.approx(0.25)
    # decode [2,4] is half inside, [6,8] half inside -> 100 tokens in 4 s
    assert m["tokens_generated"] == pytest.approx(100.0) and m[
        "tokens_per_s_generated"
    ] == pytest.approx(25.0)
    # the train step ends inside the window -> its staleness counts; tokens prorated 2/3
    assert m["staleness_hist"] == {0: 300.0, 2: 200.0}
    assert m["tokens_trained"] == pytest.approx(500 * 2 / 3)
    # queue: level 2 on [3,4), 4 on [4,7] -> (2 + 12) / 4
    assert m["queue_depth_mean"] == pytest.approx(3.5)
    assert m["groups_filtered"] == pytest.approx(
        1.0
    )  # total 2 at the window start (t <= lo), 3 at 7 s
    assert m["groups_dropped"] == pytest.approx(1.0)
    assert m["rollouts_completed"] == 2  # they end at 5 s and 6 s


def test_metrics_from_exported_trace_equal_in_memory(tmp_path):
    path = write_chrome_trace(tmp_path / "trace.json", schedule())
    a = pipeline_metrics(schedule(), window=(0, 10 * S))
    b = pipeline_metrics(load_chrome_trace(path), window=(0, 10 * S))
    assert a.keys() == b.keys()
    for k in a:
        assert b[k] == pytest.approx(a[k]), k


def test_untraced_families_are_none_and_bad_window_is_explained():
    m = pipeline_metrics([X("rollout", "rollout", 0, 1)])
    assert m["engine_busy_fraction"] is None and m["trainer_idle_fraction"] is None
    assert m["tool_latency_share"] == 0.0 and m["queue_depth_mean"] is None
    with pytest.raises(ValueError, match="end > start"):
        pipeline_metrics(schedule(), window=(5, 5))
    assert pipeline_metrics([]) == {"window_s": 0.0}


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 99), st.integers(0, 30)), max_size=20),
    st.tuples(st.integers(0, 60), st.integers(1, 60)),
)
def test_busy_fraction_matches_numpy_grid(intervals, win):
    """Union of spans clipped to a window vs a boolean time grid (1 cell = 1 s)."""
    lo, hi = win[0], win[0] + win[1]
    events = [X("decode", "engine", s, min(s + d, 120)) for s, d in intervals] + [
        X("marker", "engine", 0, 0)
    ]  # zero-length: traced, never busy
    grid = np.zeros(130, bool)
    for s, d in intervals:
        grid[s : min(s + d, 120)] = True
    m = pipeline_metrics(events, window=(lo * S, hi * S))
    assert m["engine_busy_fraction"] == pytest.approx(grid[lo:hi].mean())
    assert union_length([(s, s + d) for s, d in intervals]) == pytest.approx(_grid_len(intervals))


def _grid_len(intervals):
    g = np.zeros(200, bool)
    for s, d in intervals:
        g[s : s + d] = True
    return float(g.sum())


def test_metrics_from_real_tracer_spans():
    tr = Tracer()
    for step in range(3):
        with tr.span("train_step", track="trainer", step=step, tokens=10, staleness={step: 10}):
            pass
    m = pipeline_metrics(tr.events())
    assert m["tokens_trained"] == pytest.approx(30.0)
    assert m["staleness_hist"] == {0: 10.0, 1: 10.0, 2: 10.0}
    assert m["trainer_busy_fraction"] <= 1.0


# ------------------------------------------------------------------------------ learner helpers


def test_staleness_histogram_matches_counter():
    rng = np.random.default_rng(0)
    versions = rng.integers(0, 5, size=(4, 16))
    mask = rng.integers(0, 2, size=(4, 16))
    hist = staleness_histogram(versions, mask, current_version=6)
    ref = collections.Counter(int(6 - v) for v, m in zip(versions.ravel(), mask.ravel()) if m)
    assert hist == dict(ref)
    with pytest.raises(ValueError, match="same shape"):
        staleness_histogram(versions, mask[:, :3], 1)


def test_logprob_gap_and_step_metrics_against_numpy():
    rng = np.random.default_rng(1)
    mu = -rng.random((3, 8))
    pi = mu + 0.01 * rng.standard_normal((3, 8))
    mask = rng.random((3, 8)) > 0.3
    g = logprob_gap(mu, pi, mask)
    d = (pi - mu)[mask]
    assert g["logprob_gap/mean_abs"] == pytest.approx(np.abs(d).mean())
    assert g["logprob_gap/kl"] == pytest.approx(np.mean(np.exp(d) - 1 - d))
    assert g["logprob_gap/kl"] >= 0
    assert logprob_gap(mu, mu, mask)["logprob_gap/max_abs"] == 0.0
    rewards, lengths = rng.random(8), rng.integers(5, 50, 8)
    m = learner_step_metrics(
        rewards=rewards,
        lengths=lengths,
        sampler_logprobs=mu,
        trainer_logprobs=pi,
        mask=mask,
        clip_fraction=np.float32(0.125),
        kl=0.01,
        entropy=1.5,
        grad_norm=None,
    )
    assert m["reward/mean"] == pytest.approx(rewards.mean()) and m["reward/std"] == pytest.approx(
        rewards.std()
    )
    assert m["length/max"] == lengths.max() and m["clip_fraction"] == 0.125 and m["entropy"] == 1.5
    assert "grad_norm" not in m and m["logprob_gap/mean"] == pytest.approx(d.mean())


def test_aggregate_weighted_means_and_extrema():
    recs = [
        {"loss": 1.0, "reward/max": 2.0, "length/min": 3.0},
        {"loss": 3.0, "reward/max": 5.0, "length/min": 1.0, "kl": 0.5},
    ]
    out = aggregate(recs, weights=[1, 3])
    assert out == {"kl": 0.5, "length/min": 1.0, "loss": pytest.approx(2.5), "reward/max": 5.0}
    with pytest.raises(ValueError, match="one weight per record"):
        aggregate(recs, weights=[1])


def test_tags_and_counter_names_other_layers_record():
    """The engine tags decode steps with `active`, the learner may tag micro-batches, counters have aliases."""
    events = [
        X("decode", "engine", 0, 1, active=8),
        X("decode", "engine", 1, 2, active=4),
        X(
            "train_step", "trainer", 2, 4, tokens=999, staleness={5: 999}
        ),  # ignored: micro-batches are tagged
        X("micro_batch", "trainer", 2, 3, tokens=30, staleness={0: 20, 1: 10}),
        X("micro_batch", "trainer", 3, 4, tokens=10, staleness={1: 10}),
        C("groups_stale_dropped", 1, 2),
        C("stale_groups", 2, 2),  # the same 2 groups seen by two layers
        C("filtered_groups", 3, 4, track="trainer"),
    ]
    m = pipeline_metrics(events, window=(0, 4 * S))
    assert m["tokens_generated"] == 12.0
    assert m["tokens_trained"] == 40.0 and m["staleness_hist"] == {0: 20.0, 1: 20.0}
    assert m["groups_dropped"] == 2.0 and m["groups_filtered"] == 4.0


def test_work_time_counts_concurrent_spans_each_and_nested_spans_once_without_ids():
    events = [
        X("rollout", "rollout", 0, 10),
        X("rollout", "rollout", 1, 11),  # 20 s of trajectories
        X("tool", "tool", 1, 3),
        X("tool", "tool", 2, 4),  # two concurrent calls: 4 s
        X("env_step", "env/0", 5, 7),
        X("env.step", "env/0", 5.5, 6.5),  # nested: 2 s
        X("vector.recv", "env/vector", 0, 10),  # waiting, not env work
    ]
    m = pipeline_metrics(events, window=(0, 12 * S))
    assert m["tool_latency_share"] == pytest.approx(4 / 20)
    assert m["env_latency_share"] == pytest.approx(2 / 20)


def test_work_time_uses_span_ids_from_the_tracer_and_the_trace_file(tmp_path):
    """Concurrent trajectories that contain one another in time still count each (ids, not geometry)."""
    import asyncio

    from gymllm.telemetry import set_tracer, span

    async def rollout(i, dt):
        with span("rollout", track="rollout", trajectory=i):
            with span("env_step", track="env/0"):
                with span("env.step", track="env/0"):  # the vector env's span inside the rollout's
                    await asyncio.sleep(0.004)
            with span("tool", track="tool", name="calc"):
                await asyncio.sleep(dt)

    async def main():
        await asyncio.gather(rollout(0, 0.02), rollout(1, 0.005))  # rollout 1 lies inside rollout 0

    tr = Tracer()
    previous = set_tracer(tr)
    try:
        asyncio.run(main())
    finally:
        set_tracer(previous)
    ev = tr.events()
    dur = lambda name: sum(e["dur"] for e in ev if e["name"] == name)  # noqa: E731
    loaded = load_chrome_trace(write_chrome_trace(tmp_path / "t.json", ev))
    assert {e["id"]: e["parent"] for e in loaded if e["ph"] == "X"} == {
        e["id"]: e["parent"] for e in ev
    }
    for events in (ev, loaded):
        m = pipeline_metrics(events)
        assert m["tool_latency_share"] == pytest.approx(dur("tool") / dur("rollout"))
        assert m["env_latency_share"] == pytest.approx(dur("env_step") / dur("rollout"))
