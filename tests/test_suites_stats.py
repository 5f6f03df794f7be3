"""The suite statistics against direct computations: pass@j for every j, bootstrap interval coverage on
synthetic data with a known mean, paired comparisons, and the summary built from rows."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from gymllm.suites.results import summarize
from gymllm.suites.spec import parse_suite
from gymllm.suites.stats import bootstrap_ci, paired_comparison, pass_at_curve, pass_at_k


@pytest.mark.parametrize("n,c", [(1, 0), (1, 1), (4, 0), (4, 1), (4, 3), (5, 5), (8, 2), (10, 7)])
def test_pass_at_k_is_the_share_of_k_subsets_with_a_success(n, c):
    outcomes = [True] * c + [False] * (n - c)
    for k in range(1, n + 1):
        subsets = list(itertools.combinations(range(n), k))
        direct = sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)
        assert pass_at_k(n, c, k) == pytest.approx(direct, abs=1e-12)
        assert pass_at_k(n, c, k) == pytest.approx(
            1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12
        )


def test_pass_at_k_rejects_k_above_n():
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(3, 1, 4)


def test_pass_at_curve_averages_over_seeds_for_every_j():
    rng = np.random.default_rng(0)
    seeds = [rng.random(6) < p for p in (0.1, 0.5, 0.9, 0.0)]
    curve = pass_at_curve(seeds, 6)
    assert sorted(curve) == [1, 2, 3, 4, 5, 6]
    for j, v in curve.items():
        assert v == pytest.approx(
            np.mean([1 - math.comb(6 - int(s.sum()), j) / math.comb(6, j) for s in seeds])
        )
    assert curve[1] == pytest.approx(
        np.mean([s.mean() for s in seeds])
    )  # pass@1 is the mean success rate
    assert all(curve[j] <= curve[j + 1] + 1e-12 for j in range(1, 6))
    # an unfinished seed (2 samples) counts only for j <= 2
    partial = pass_at_curve([[True, False, False], [True, True]], 3)
    assert partial[3] == pytest.approx(1.0) and partial[2] == pytest.approx((1 - 1 / 3 + 1.0) / 2)


def test_bootstrap_interval_covers_the_known_mean_at_about_its_level():
    """Synthetic seeds (per-seed mean rewards ~ a skewed distribution of known mean), many seeded
    repetitions: the 95% interval holds the true mean in a wide band around 95%."""
    data_rng = np.random.default_rng(1234)
    true_mean, hits, reps = 0.3, 0, 300
    for r in range(reps):
        per_seed = data_rng.beta(1.5, 3.5, size=40)  # mean 1.5 / 5 = 0.3
        lo, hi = bootstrap_ci([per_seed], rng=np.random.default_rng(r), num_resamples=1000)
        hits += lo <= true_mean <= hi
    assert 0.88 <= hits / reps <= 0.99, hits / reps


def test_weighted_bootstrap_interval_covers_the_weighted_mean():
    data_rng = np.random.default_rng(7)
    weights, means = [3.0, 1.0], [0.2, 0.8]
    target = (3 * 0.2 + 1 * 0.8) / 4
    hits, reps = 0, 200
    for r in range(reps):
        strata = [data_rng.normal(means[0], 0.3, 30), data_rng.normal(means[1], 0.3, 10)]
        lo, hi = bootstrap_ci(strata, weights, rng=np.random.default_rng(r), num_resamples=800)
        hits += lo <= target <= hi
    assert 0.85 <= hits / reps <= 0.99, hits / reps


def test_the_same_seed_gives_the_same_interval():
    x = np.linspace(0, 1, 17)
    assert bootstrap_ci([x], rng=np.random.default_rng(5)) == bootstrap_ci(
        [x], rng=np.random.default_rng(5)
    )


def test_paired_comparison_of_equal_policies_and_of_a_clear_difference():
    rng = np.random.default_rng(0)
    a = [[rng.random(4).tolist() for _ in range(30)]]
    same = paired_comparison(a, a, rng=np.random.default_rng(1))
    assert same["diff"] == 0 and same["p_value"] == 1.0 and same["ci"] == [0.0, 0.0]
    b = [[[v - 0.2 + 0.05 * rng.standard_normal() for v in unit] for unit in a[0]]]
    better = paired_comparison(a, b, rng=np.random.default_rng(1))
    assert better["diff"] == pytest.approx(np.mean(np.array(a) - np.array(b)))
    assert better["ci"][0] > 0 and better["p_value"] < 0.01
    noise = [[(np.array(u) + rng.normal(0, 0.3, 4)).tolist() for u in a[0]]]
    null = paired_comparison(a, noise, rng=np.random.default_rng(1))
    assert null["ci"][0] < 0 < null["ci"][1] or null["p_value"] > 0.05


def test_paired_comparison_false_positive_rate_under_the_null():
    data_rng = np.random.default_rng(99)
    rejections = 0
    for r in range(200):
        base = data_rng.random((20, 2))
        a = [(base + data_rng.normal(0, 0.2, base.shape)).tolist()]
        b = [(base + data_rng.normal(0, 0.2, base.shape)).tolist()]
        rejections += (
            paired_comparison(a, b, rng=np.random.default_rng(r), num_resamples=500)["p_value"]
            < 0.05
        )
    assert rejections / 200 <= 0.12


def test_paired_comparison_requires_the_same_samples():
    with pytest.raises(ValueError, match="same non-zero number of samples"):
        paired_comparison([[[1.0, 0.0]]], [[[1.0]]], rng=np.random.default_rng(0))


def _suite(**env2):
    return parse_suite(
        {
            "name": "s",
            "k": 3,
            "env": [
                {"id": "gymllm/Echo-v0", "name": "e1", "num_seeds": 4},
                {"id": "gymllm/Echo-v0", "name": "e2", "num_seeds": 4, **env2},
            ],
        },
        resolve=False,
    )


def _rows(policy, env, outcomes, rewards=None, errors=()):
    rows = []
    for s, samples in enumerate(outcomes):
        for m, ok in enumerate(samples):
            err = "RuntimeError: boom" if (s, m) in errors else None
            rows.append(
                {
                    "policy": policy,
                    "env": env,
                    "seed": 100 + s,
                    "sample": m,
                    "reward": None if err else (rewards[s][m] if rewards else float(ok)),
                    "success": bool(ok) and err is None,
                    "turns": 1,
                    "tokens": 3,
                    "error": err,
                }
            )
    return rows


def test_summary_pass_at_matches_a_direct_computation_on_rows():
    suite = _suite(weight=3.0)
    rng = np.random.default_rng(3)
    outcomes = {
        (p, e): (rng.random((4, 3)) < q).tolist()
        for p, q in (("a", 0.6), ("b", 0.3))
        for e in ("e1", "e2")
    }
    rows = [r for (p, e), o in outcomes.items() for r in _rows(p, e, o)]
    rows += _rows("a", "e1", [[True]])[:0]
    s = summarize(rows, suite, ["a", "b"], seed=0, num_resamples=500)
    by = {(r["policy"], r["env"]): r for r in s["results"]}
    for (p, e), o in outcomes.items():
        entry = by[(p, e)]
        assert entry["num_seeds"] == 4 and entry["k"] == 3 and entry["errors"] == 0
        for j in (1, 2, 3):
            direct = np.mean([1 - math.comb(3 - sum(x), j) / math.comb(3, j) for x in o])
            assert entry["pass_at"][str(j)] == pytest.approx(direct)
        assert entry["mean_reward"] == pytest.approx(np.mean(o))
        lo, hi = entry["mean_reward_ci"]
        assert lo <= entry["mean_reward"] <= hi
    for p in ("a", "b"):
        star = by[(p, "*")]
        assert star["mean_reward"] == pytest.approx(
            0.25 * by[(p, "e1")]["mean_reward"] + 0.75 * by[(p, "e2")]["mean_reward"]
        )
        assert star["pass_at"]["2"] == pytest.approx(
            0.25 * by[(p, "e1")]["pass_at"]["2"] + 0.75 * by[(p, "e2")]["pass_at"]["2"]
        )
    comps = {(c["env"], c["metric"]): c for c in s["comparisons"]}
    assert set(comps) == {(e, m) for e in ("e1", "e2", "*") for m in ("mean_reward", "pass@1")}
    d1 = np.mean(np.array(outcomes[("a", "e1")], float) - np.array(outcomes[("b", "e1")], float))
    assert (
        comps[("e1", "pass@1")]["diff"] == pytest.approx(d1) and comps[("e1", "pass@1")]["a"] == "a"
    )
    d2 = np.mean(np.array(outcomes[("a", "e2")], float) - np.array(outcomes[("b", "e2")], float))
    assert comps[("*", "mean_reward")]["diff"] == pytest.approx(0.25 * d1 + 0.75 * d2)
    assert (
        summarize(rows, suite, ["a", "b"], seed=0, num_resamples=500) == s
    )  # seeded: reproducible


def test_summary_counts_error_rows_apart_as_failures():
    suite = _suite()
    rows = _rows("a", "e1", [[True, True, True]] * 4, errors={(0, 0), (2, 1)})
    entry = summarize(rows, suite, ["a"], num_resamples=100)["results"][0]
    assert entry["errors"] == 2 and entry["samples"] == 12
    assert entry["pass_at"]["1"] == pytest.approx(10 / 12) and entry[
        "mean_reward"
    ] == pytest.approx(10 / 12)
