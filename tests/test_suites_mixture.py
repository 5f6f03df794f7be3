"""Training on a suite's mixture, the pure pieces: draw proportions over many draws, the learnability
curriculum, per-env metric names and their aggregation."""

from __future__ import annotations

import numpy as np
import pytest

from gymllm.errors import ConfigError
from gymllm.suites.mixture import EnvMetrics, MixtureSampler, env_metric_names, learnability_weights
from gymllm.suites.spec import load_suite, parse_suite


def test_groups_are_drawn_in_proportion_to_weight():
    suite = parse_suite(
        {
            "env": [
                {"id": "gymllm/Echo-v0", "name": "a", "weight": 1.0},
                {"id": "gymllm/Echo-v0", "name": "b", "weight": 3.0},
                {"id": "gymllm/Echo-v0", "name": "c", "weight": 6.0},
            ]
        },
        resolve=False,
    )
    sampler = MixtureSampler.from_suite(suite, seed=0)
    draws = sampler.draws(20_000)
    counts = {n: sum(d[0] == n for d in draws) / len(draws) for n in "abc"}
    assert counts == pytest.approx({"a": 0.1, "b": 0.3, "c": 0.6}, abs=0.015)
    seeds = np.array([d[1] for d in draws])
    assert (
        seeds.min() >= 0 and seeds.max() < 1_000_000 and len(set(seeds.tolist())) > 19_000
    )  # below held-out
    assert MixtureSampler.from_suite(suite, seed=0).draws(50) == draws[:50]  # seeded
    assert MixtureSampler.from_suite(suite, seed=1).draws(50) != draws[:50]


def test_set_weights_changes_the_proportions_and_checks_its_input():
    sampler = MixtureSampler({"a": 1.0, "b": 1.0}, seed=3)
    sampler.set_weights({"a": 0.0, "b": 2.0})
    assert {d[0] for d in sampler.draws(500)} == {"b"}
    with pytest.raises(ConfigError, match="a weight for each"):
        sampler.set_weights({"a": 1.0})
    with pytest.raises(ConfigError, match="weights >= 0"):
        MixtureSampler({"a": -1.0})


def test_the_shipped_core_suite_mixes_its_five_envs_evenly():
    sampler = MixtureSampler.from_suite(load_suite("core", resolve=False), seed=0)
    names = [d[0] for d in sampler.draws(10_000)]
    for n in sampler.names:
        assert names.count(n) / len(names) == pytest.approx(0.2, abs=0.02)


def test_learnability_weights_favour_envs_near_half_success():
    w = learnability_weights(
        {"solved": 1.0, "half": 0.5, "hard": 0.1, "never": 0.0, "new": None}, floor=0.01
    )
    assert sum(w.values()) == pytest.approx(1.0)
    assert w["half"] == pytest.approx(w["new"]) and w["half"] > w["hard"] > w[
        "solved"
    ] == pytest.approx(w["never"])
    raw = {"solved": 0.01, "half": 0.25, "hard": 0.09, "never": 0.01, "new": 0.25}
    assert w == pytest.approx({k: v / sum(raw.values()) for k, v in raw.items()})
    based = learnability_weights({"a": 0.5, "b": 0.5}, base={"a": 3.0, "b": 1.0})
    assert based == pytest.approx({"a": 0.75, "b": 0.25})
    assert learnability_weights({"a": 1.0, "b": 0.0}, floor=0.0) == pytest.approx(
        {"a": 0.5, "b": 0.5}
    )
    with pytest.raises(ConfigError, match="success rate in"):
        learnability_weights({"a": 1.5})


def test_env_metrics_aggregate_per_env():
    assert env_metric_names("core") == ("env/core/reward", "env/core/success", "env/core/groups")
    m = EnvMetrics({"a": 1.0, "b": 0.5})
    m.add("a", [1.0, 0.0, 1.0, 1.0])
    m.add("a", [0.0, 0.0, 0.0, 0.0])
    m.add("b", [0.6, 0.4])
    out = m.flush()
    assert out == pytest.approx(
        {
            "env/a/reward": 0.375,
            "env/a/success": 0.375,
            "env/a/groups": 2.0,
            "env/b/reward": 0.5,
            "env/b/success": 0.5,
            "env/b/groups": 1.0,
        }
    )
    assert m.recent_success(["a", "b", "c"]) == {"a": 0.375, "b": 0.5, "c": None}
    m.add("b", [1.0, 1.0])
    assert m.flush() == pytest.approx(
        {"env/b/reward": 1.0, "env/b/success": 1.0, "env/a/groups": 2.0, "env/b/groups": 2.0}
    )
