"""SamplingParams validation and the jitted sampling functions against NumPy references."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gymllm.errors import ConfigError
from gymllm.inference import SamplingParams
from gymllm.inference.sampling import (
    fast_argmax,
    filter_top_k_top_p,
    inverse_cdf_sample,
    request_key,
    sample,
    step_keys,
)

B, V = 4, 16


# ------------------------------------------------------------------ SamplingParams
def test_params_defaults_and_normalisation():
    p = SamplingParams(stop="</a>", stop_token_ids=[2, 3], temperature=1)
    assert p.stop == ("</a>",) and p.stop_token_ids == (2, 3) and isinstance(p.temperature, float)
    assert SamplingParams(temperature=0).greedy and not p.greedy
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.temperature = 2.0  # type: ignore[misc]


@pytest.mark.parametrize(
    "field,value",
    [
        ("temperature", -0.1),
        ("temperature", float("nan")),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_k", -1),
        ("max_tokens", 0),
        ("n", 0),
        ("seed", 1.5),
        ("stop", [""]),
        ("stop_token_ids", [-1]),
        ("stop_token_ids", "x"),
    ],
)
def test_params_reject_bad_fields_by_name(field, value):
    with pytest.raises(ConfigError, match=f"SamplingParams.{field}") as info:
        SamplingParams(**{field: value})
    assert "expected" in str(info.value) and "Fix:" in str(info.value)


def test_params_keyword_only():
    with pytest.raises(TypeError):
        SamplingParams(1.0)  # type: ignore[misc]


# ------------------------------------------------------------------ reference math
def ref_filter(x: np.ndarray, k: int, p: float) -> tuple[np.ndarray, np.ndarray]:
    """NumPy (float64) top-k then nucleus on one row of scaled logits: (may be drawn, undecidable),
    where undecidable marks tokens whose nucleus decision sits within float32 rounding of top_p."""
    order = np.argsort(-x, kind="stable")
    s = x[order].astype(np.float64)
    kk = len(x) if k == 0 else min(k, len(x))
    s_k = np.where(np.arange(len(x)) < kk, s, -np.inf)
    probs = np.exp(s_k - s_k.max())
    probs /= probs.sum()
    before = np.cumsum(probs) - probs
    keep = ((before < p) | (p >= 1.0)) & (np.arange(len(x)) < kk)
    threshold = s_k[keep].min()
    near = np.zeros(len(x), bool)
    if p < 1.0:
        edge = s_k[(np.abs(before - p) < 1e-5) & (np.arange(len(x)) < kk)]
        near = np.isin(x, edge.astype(np.float32))
    return x >= threshold, near


_filter = jax.jit(filter_top_k_top_p)
_sample = jax.jit(sample)


@settings(max_examples=40, deadline=None)
@given(
    # no subnormals: XLA:CPU flushes them to zero (a -1.4e-45 logit ties with 0 there, not in numpy)
    logits=st.lists(
        st.floats(-6, 6, allow_nan=False, allow_subnormal=False, width=32),
        min_size=B * V,
        max_size=B * V,
    ),
    ks=st.lists(st.integers(0, V + 2), min_size=B, max_size=B),
    ps=st.lists(st.floats(0.05, 1.0), min_size=B, max_size=B),
)
def test_filter_matches_numpy(logits, ks, ps):
    x = np.asarray(logits, np.float32).reshape(B, V)
    got = np.asarray(_filter(x, np.asarray(ks, np.int32), np.asarray(ps, np.float32)))
    for b in range(B):
        want, near = ref_filter(x[b], ks[b], ps[b])
        np.testing.assert_array_equal(np.isfinite(got[b])[~near], want[~near])
        np.testing.assert_array_equal(got[b][np.isfinite(got[b])], x[b][np.isfinite(got[b])])


def test_filter_keeps_exactly_k_for_the_nucleus_when_the_kth_value_ties():
    # one 1.0 among fifteen 0.0: top-k 2 renormalises over the 1.0 and ONE of the zeros (0.73 / 0.27),
    # so top-p 0.5 keeps the 1.0 alone; weighting all fifteen tied zeros would keep every token
    x = np.zeros((1, V), np.float32)
    x[0, 5] = 1.0
    got = np.asarray(_filter(x, np.array([2], np.int32), np.array([0.5], np.float32)))
    assert (
        np.isfinite(got[0]).tolist()
        == ref_filter(x[0], 2, 0.5)[0].tolist()
        == [i == 5 for i in range(V)]
    )
    # top-k alone keeps every token tied at the k-th value (as the reference's threshold does)
    got = np.asarray(_filter(x, np.array([2], np.int32), np.array([1.0], np.float32)))
    assert np.isfinite(got[0]).all()


def test_filter_matches_numpy_on_a_real_vocabulary():
    # SmolLM2's 49,152-token vocabulary: thresholds found by bisection over the values, not a sort
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((4, 49152)) * 3).astype(np.float32)
    ks, ps = np.array([0, 40, 1000, 0], np.int32), np.array([0.9, 0.95, 1.0, 0.3], np.float32)
    got = np.asarray(_filter(x, ks, ps))
    for b in range(4):
        want, near = ref_filter(x[b], int(ks[b]), float(ps[b]))
        np.testing.assert_array_equal(np.isfinite(got[b])[~near], want[~near])


@settings(max_examples=25, deadline=None)
@given(
    logits=st.lists(st.floats(-5, 5, allow_nan=False, width=32), min_size=B * V, max_size=B * V),
    temps=st.lists(st.sampled_from([0.0, 0.6, 1.0, 1.2]), min_size=B, max_size=B),
    seed=st.integers(0, 2**31 - 1),
)
def test_sample_logprobs_are_of_the_temperature_processed_distribution(logits, temps, seed):
    x = np.asarray(logits, np.float32).reshape(B, V)
    t = np.asarray(temps, np.float32)
    keys = np.stack([request_key(seed, i) for i in range(B)])
    tok, lp = _sample(x, keys, t, np.zeros(B, np.int32), np.ones(B, np.float32))
    tok, lp = np.asarray(tok), np.asarray(lp)
    for b in range(B):
        teff = t[b] if t[b] > 0 else 1.0
        z = x[b].astype(np.float64) / teff
        ref = z - (np.log(np.exp(z - z.max()).sum()) + z.max())
        assert abs(lp[b] - ref[tok[b]]) < 1e-5
        if t[b] == 0:
            assert x[b, tok[b]] == x[b].max()  # greedy


def test_sampling_follows_the_distribution_and_respects_filters():
    # 4000 draws of one row with distinct keys: frequencies match softmax(x / T) within 4 sigma,
    # and with top-k = 3 every draw is among the 3 largest logits.
    n = 4000
    x = np.tile(np.linspace(-1.0, 1.5, V, dtype=np.float32), (n, 1))
    keys = np.stack([request_key(7, i) for i in range(n)])
    t = np.full(n, 0.8, np.float32)
    tok, _ = jax.jit(sample)(x, keys, t, np.zeros(n, np.int32), np.ones(n, np.float32))
    probs = np.exp(x[0] / 0.8) / np.exp(x[0] / 0.8).sum()
    freq = np.bincount(np.asarray(tok), minlength=V) / n
    assert np.all(np.abs(freq - probs) < 4 * np.sqrt(probs * (1 - probs) / n) + 1e-3)
    tok_k, _ = jax.jit(sample)(x, keys, t, np.full(n, 3, np.int32), np.ones(n, np.float32))
    assert set(np.unique(np.asarray(tok_k))) <= {V - 1, V - 2, V - 3}


def test_keys_are_per_request_and_reproducible():
    assert np.array_equal(request_key(5, 0), request_key(5, 0))
    assert not np.array_equal(request_key(5, 0), request_key(5, 1))
    assert not np.array_equal(request_key(5, 0), request_key(6, 0))
    base = np.stack([request_key(5, 0), request_key(5, 0)])
    k = np.asarray(jax.jit(step_keys)(base, np.array([0, 1], np.int32)))
    assert not np.array_equal(k[0], k[1])  # token j of a request gets its own key


_icdf = jax.jit(inverse_cdf_sample)


@settings(max_examples=30, deadline=None)
@given(
    weights=st.lists(st.sampled_from([0.0, 0.0, 1e-3, 0.5, 1.0, 3.0]), min_size=600, max_size=600),
)
def test_inverse_cdf_sampling_is_exact_on_a_grid_and_never_draws_zero_weights(weights):
    # 600 tokens = two full blocks of 256 and a padded one; a stratified grid of u must reproduce the
    # weights exactly (each index's count within 1 of weight / total * N), never a zero weight.
    n = len(weights)
    w = np.asarray(weights, np.float32)
    if w.sum() == 0:
        w[n // 2] = 1.0
    grid = 1000
    u = (np.arange(grid, dtype=np.float32) + 0.5) / grid
    idx = np.asarray(_icdf(np.tile(w, (grid, 1)), u))
    assert np.all(w[idx] > 0)
    counts = np.bincount(idx, minlength=n)
    assert np.all(np.abs(counts - w / w.sum() * grid) <= 1.0 + 1e-3 * grid)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(-3, 3), min_size=B * V, max_size=B * V))
def test_fast_argmax_matches_numpy_first_index(values):
    x = np.asarray(values, np.float32).reshape(B, V)  # many ties: the first maximum wins
    np.testing.assert_array_equal(np.asarray(jax.jit(fast_argmax)(x)), np.argmax(x, axis=-1))
