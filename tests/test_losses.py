"""The GRPO loss family against NumPy references of the same math (hypothesis on random inputs)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from accel import on_accelerator
from hypothesis import given, settings
from hypothesis import strategies as st

from gymllm.algos import advantages as adv_mod
from gymllm.algos import aggregation as agg
from gymllm.algos import config as C
from gymllm.algos import kl as kl_mod
from gymllm.algos import loss as L
from gymllm.algos import shaping
from gymllm.algos.corrections import compose
from gymllm.algos.policy_loss import cispo_loss, ppo_clip_loss, sequence_log_ratio
from gymllm.errors import ConfigError

SETTINGS = settings(max_examples=25, deadline=None)

# ----------------------------------------------------------------------------- NumPy references


def np_advantages(r, est, ddof, eps, place):
    r = np.asarray(r, np.float64)
    c = r - r.mean(-1, keepdims=True)
    const = r.max(-1, keepdims=True) == r.min(-1, keepdims=True)
    g = r.shape[-1]
    if est == "dr_grpo":
        out = c
    elif est == "rloo":
        out = np.stack(
            [[r[n, i] - np.mean(np.delete(r[n], i)) for i in range(g)] for n in range(r.shape[0])]
        )
    elif est == "grpo":
        var = (c**2).sum(-1, keepdims=True) / (g - ddof)
        out = c / (np.sqrt(var + eps) if place == "var" else np.sqrt(var) + eps)
    else:  # batch_std
        c = np.where(const, 0.0, c)
        var = (c**2).sum() / (c.size - ddof)
        out = c / (np.sqrt(var + eps) if place == "var" else np.sqrt(var) + eps)
    return np.where(const, 0.0, out)


def np_token_loss(cfg, logp, mu, ref, mask, adv):
    """The whole per-token pipeline of gymllm.algos.loss in float64 NumPy."""
    p = cfg.policy
    old = logp if p.ratio_against == "proximal" else mu
    lr = np.where(mask > 0, logp - old, 0.0)
    if p.ratio_level == "sequence":
        lr = (
            (lr * mask).sum(-1, keepdims=True)
            / np.maximum(mask.sum(-1, keepdims=True), 1)
            * (mask > 0)
        )
    r = np.exp(lr)
    a = np.broadcast_to(adv[:, None], r.shape)
    if p.objective == "cispo":
        loss = -np.clip(r, 1 - p.eps_low, 1 + p.eps_high) * a * logp
    else:
        obj = np.minimum(r * a, np.clip(r, 1 - p.eps_low, 1 + p.eps_high) * a)
        if p.dual_clip is not None:
            obj = np.where(a < 0, np.maximum(obj, p.dual_clip * a), obj)
        loss = -obj
    log_rho = np.where(mask > 0, logp - mu, 0.0)
    rho = np.exp(log_rho)
    c = cfg.correction
    w = np.ones_like(loss)
    for k in c.kinds:
        if k == "tis":
            w = w * np.minimum(rho, c.tis_cap)
        elif k == "mis":
            w = w * np.where((rho >= c.mis_low) & (rho <= c.mis_high), rho, 0.0)
        else:
            g = np.exp((log_rho * mask).sum(-1) / np.maximum(mask.sum(-1), 1))
            w = w * ((g >= c.geo_low) & (g <= c.geo_high))[:, None]
    loss = loss * w
    if cfg.kl.beta > 0 and cfg.kl.placement == "loss":
        lx = ref - logp
        kl = {"k1": -lx, "k2": 0.5 * lx**2, "k3": np.exp(lx) - 1 - lx}[cfg.kl.estimator]
        loss = loss + cfg.kl.beta * kl
    return loss


def np_aggregate(mode, v, mask, group_of_row, max_len):
    m = mask.astype(np.float64)
    tok = (v * m).sum(-1)
    lens = m.sum(-1)
    if mode in ("token_mean", "micro_token_mean"):
        return tok.sum() / max(m.sum(), 1)
    if mode == "seq_mean_token_mean":
        return np.mean(tok / np.maximum(lens, 1))
    if mode == "seq_mean_token_sum":
        return np.mean(tok)
    if mode == "constant":
        return tok.sum() / (len(tok) * max_len)
    groups = sorted(set(group_of_row))
    per_group = [
        sum(tok[i] for i in range(len(tok)) if group_of_row[i] == g)
        / max(sum(lens[i] for i in range(len(tok)) if group_of_row[i] == g), 1)
        for g in groups
    ]
    return np.mean(per_group)


# ----------------------------------------------------------------------------- strategies


def _rewards(draw, n, g):
    kind = draw(st.sampled_from(["random", "binary", "equal"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    if kind == "equal":
        return np.repeat(rng.normal(size=(n, 1)), g, axis=1).astype(np.float32)
    if kind == "binary":
        return rng.integers(0, 2, size=(n, g)).astype(np.float32)
    return rng.normal(size=(n, g)).astype(np.float32)


@st.composite
def reward_groups(draw):
    n, g = (
        draw(st.sampled_from([1, 3])),
        draw(st.sampled_from([2, 5])),
    )  # few shapes: fast JAX op caches
    return _rewards(draw, n, g)


@SETTINGS
@given(
    r=reward_groups(),
    est=st.sampled_from(sorted(adv_mod.ESTIMATORS)),
    ddof=st.sampled_from([0, 1]),
    eps=st.sampled_from([1e-6, 1e-4, 0.1]),
    place=st.sampled_from(["std", "var"]),
)
def test_advantages_match_numpy(r, est, ddof, eps, place):
    got = np.asarray(adv_mod.ESTIMATORS[est](r, ddof=ddof, eps=eps, eps_placement=place))
    want = np_advantages(r, est, ddof, eps, place)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)
    equal = r.max(-1) == r.min(-1)
    assert np.all(got[equal] == 0.0), "an all-equal group must get advantage exactly 0"


def test_advantages_g2_and_rloo_identity():
    r = np.array([[1.0, 0.0], [0.3, 0.3]], np.float32)
    # G = 2, population std = 0.5: z-scores are +-1 (up to eps)
    np.testing.assert_allclose(adv_mod.grpo(r, eps=0.0), [[1.0, -1.0], [0.0, 0.0]])
    np.testing.assert_allclose(
        adv_mod.grpo(r, ddof=1, eps=0.0), [[1 / np.sqrt(2), -1 / np.sqrt(2)], [0, 0]], rtol=1e-6
    )
    np.testing.assert_allclose(adv_mod.rloo(r), [[1.0, -1.0], [0.0, 0.0]])


# ----------------------------------------------------------------------------- PPO clip / CISPO


@pytest.mark.parametrize("dual", [None, 3.0])
def test_ppo_clip_grid_values_and_zero_gradients(dual):
    r = np.linspace(0.0, 5.0, 101, dtype=np.float32)
    for a in (-1.0, 0.0, 1.0):
        adv = np.full_like(r, a)
        loss, clipped = ppo_clip_loss(
            jnp.asarray(r), jnp.asarray(adv), eps_low=0.2, eps_high=0.28, dual_clip=dual
        )
        want = -np.minimum(r * a, np.clip(r, 0.8, 1.28) * a)
        if dual is not None and a < 0:
            want = np.where(a < 0, -np.maximum(-want, dual * a), want)
        np.testing.assert_allclose(loss, want, rtol=1e-6, atol=1e-7)
        g = jax.vmap(
            jax.grad(
                lambda x, y: ppo_clip_loss(x, y, eps_low=0.2, eps_high=0.28, dual_clip=dual)[0]
            )
        )(jnp.asarray(r), jnp.asarray(adv))
        g = np.asarray(g)
        assert np.all(g[np.asarray(clipped)] == 0.0), "gradient must be exactly zero where clipped"
        inside = ~np.asarray(clipped)
        np.testing.assert_allclose(g[inside], -a, atol=0)
        if a > 0:
            assert (
                np.asarray(clipped)[r > 1.28 + 1e-6].all()
                and not np.asarray(clipped)[r < 1.28 - 1e-6].any()
            )
        if a < 0:
            assert np.asarray(clipped)[r < 0.8 - 1e-6].all()
            if dual is not None:
                assert np.asarray(clipped)[r > dual + 1e-6].all()


def test_cispo_keeps_every_token_gradient_and_detaches_weight():
    r_log = jnp.asarray(np.linspace(-2, 2, 9), jnp.float32)
    mu = jnp.zeros(9)
    adv = jnp.ones(9)

    def f(logp):
        loss, _ = cispo_loss(jnp.exp(logp - mu), adv, logp, eps_low=1.0, eps_high=2.0)
        return jnp.sum(loss)

    g = np.asarray(jax.grad(f)(r_log))
    w = np.clip(np.exp(np.asarray(r_log)), 0.0, 3.0)
    # d/dlogp of -sg(w) A logp = -w A; an accelerator's exp agrees with NumPy's to about 2e-6 (TPU v5e)
    np.testing.assert_allclose(g, -w, rtol=1e-5 if on_accelerator() else 1e-6)
    assert np.all(g != 0)


# ----------------------------------------------------------------------------- corrections + full pipeline


@st.composite
def loss_inputs(draw):
    b, t = 4, 6  # fixed shapes: JAX's per-shape op caches keep the examples fast
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    mask = (rng.random((b, t)) < 0.7).astype(np.float32)
    if draw(st.booleans()):
        mask[0] = 0.0  # a fully masked row
    logp = -rng.exponential(1.0, (b, t)).astype(np.float32)
    mu = (logp + rng.normal(0, draw(st.sampled_from([0.0, 0.005, 0.3])), (b, t))).astype(np.float32)
    ref = (logp + rng.normal(0, 0.3, (b, t))).astype(np.float32)
    adv = rng.normal(size=b).astype(np.float32) * draw(st.sampled_from([0.0, 1.0]))
    return logp, mu, ref, mask, adv


@st.composite
def loss_configs(draw):
    base = C.loss_preset(draw(st.sampled_from(sorted(C.PRESETS))))
    policy = C.PolicyLossConfig(
        objective=draw(st.sampled_from(["ppo", "cispo"])),
        ratio_level=draw(st.sampled_from(["token", "sequence"])),
        ratio_against=draw(st.sampled_from(["behaviour", "proximal"])),
        eps_low=draw(st.sampled_from([0.2, 3e-4, 1.0])),
        eps_high=draw(st.sampled_from([0.28, 4e-4, 5.0])),
        dual_clip=draw(st.sampled_from([None, 3.0])),
    )
    kinds = tuple(
        draw(st.lists(st.sampled_from(["tis", "mis", "geo_mask"]), unique=True, max_size=3))
    )
    return dataclasses.replace(
        base,
        policy=policy,
        correction=C.CorrectionConfig(kinds=kinds, tis_cap=2.0, mis_low=0.8, mis_high=1.25),
        kl=C.KLConfig(
            beta=draw(st.sampled_from([0.0, 0.04, 0.5])),
            estimator=draw(st.sampled_from(["k1", "k2", "k3"])),
        ),
        aggregation=draw(st.sampled_from(C.AGGREGATION_MODES)),
    )


@SETTINGS
@given(x=loss_inputs(), cfg=loss_configs())
def test_full_loss_matches_numpy(x, cfg):
    logp, mu, ref, mask, adv = x
    b = len(adv)
    group_of_row = [i // 2 for i in range(b)]
    group_tokens = np.array(
        [
            sum(mask[j].sum() for j in range(b) if group_of_row[j] == group_of_row[i])
            for i in range(b)
        ],
        np.float32,
    )
    batch = L.LossBatch(
        mask=jnp.asarray(mask),
        behaviour_logp=jnp.asarray(mu),
        advantages=jnp.asarray(adv),
        group_tokens=jnp.asarray(group_tokens),
        ref_logp=jnp.asarray(ref) if cfg.kl.beta > 0 else None,
    )
    total, metrics = L.micro_batch_loss(cfg, jnp.asarray(logp), batch)
    step = agg.StepStats(
        num_tokens=float(mask.sum()),
        num_seqs=float(b),
        num_groups=float(len(set(group_of_row))),
        max_len=float(mask.shape[1]),
    )
    got = float(total / L.step_denominator(cfg, step))
    want_tok = np_token_loss(
        cfg, logp.astype(np.float64), mu.astype(np.float64), ref.astype(np.float64), mask, adv
    )
    want = np_aggregate(cfg.aggregation, want_tok, mask, group_of_row, mask.shape[1])
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)
    assert np.isfinite(got)
    assert float(metrics["tokens"]) == mask.sum()


@settings(max_examples=15, deadline=None)
@given(x=loss_inputs(), cfg=loss_configs(), shift=st.floats(-0.5, 0.5))
def test_detached_quantities_do_not_change_gradients(x, cfg, shift):
    """Perturbing what must be detached (the correction weights' input mu when nothing else reads mu,
    the proximal policy) leaves the gradient unchanged; and the gradient equals w * grad(base loss)."""
    logp, mu, ref, mask, adv = x
    # token-level ratio: there a token's gradient is its own weight times its own base gradient
    cfg = dataclasses.replace(
        cfg,
        policy=dataclasses.replace(cfg.policy, ratio_against="proximal", ratio_level="token"),
        kl=C.KLConfig(beta=0.0),
        aggregation="token_mean",
    )

    def bt(m):
        return L.LossBatch(
            mask=jnp.asarray(mask),
            behaviour_logp=jnp.asarray(m),
            advantages=jnp.asarray(adv),
            group_tokens=jnp.ones(len(adv)),
        )

    base = dataclasses.replace(cfg, correction=C.CorrectionConfig())

    def grad(c, m):
        return np.asarray(
            jax.grad(lambda lp: L.micro_batch_loss(c, lp, bt(m))[0])(jnp.asarray(logp))
        )

    w = np.asarray(
        compose(
            cfg.correction.kinds,
            jnp.where(mask > 0, logp - mu, 0.0),
            jnp.asarray(mask),
            **cfg.correction.params(),
        )
    )
    np.testing.assert_allclose(grad(cfg, mu), w * grad(base, mu), rtol=1e-5, atol=1e-6)
    # mu only enters through the detached weights: with no corrections, moving mu changes nothing.
    np.testing.assert_array_equal(grad(base, mu), grad(base, mu + shift))


def test_sequence_ratio_is_geometric_mean_of_token_ratios():
    rng = np.random.default_rng(3)
    logp, old = rng.normal(size=(3, 4)), rng.normal(size=(3, 4))
    mask = np.array([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], np.float32)
    got = np.asarray(sequence_log_ratio(jnp.asarray(logp), jnp.asarray(old), jnp.asarray(mask)))
    for i in range(3):
        n = mask[i].sum()
        want = ((logp[i] - old[i]) * mask[i]).sum() / max(n, 1)
        np.testing.assert_allclose(got[i][mask[i] > 0], want, rtol=1e-5)
        assert np.all(got[i][mask[i] == 0] == 0)


# ----------------------------------------------------------------------------- aggregation


@SETTINGS
@given(
    x=loss_inputs(),
    mode=st.sampled_from([m for m in C.AGGREGATION_MODES if m != "micro_token_mean"]),
    split=st.integers(1, 5),
)
def test_aggregation_split_invariance(x, mode, split):
    """sum of micro-batch weighted sums / step denominator == the loss of the whole step."""
    _, _, _, mask, _ = x
    rng = np.random.default_rng(0)
    v = rng.normal(size=mask.shape).astype(np.float32)
    b = mask.shape[0]
    rows = agg.RowStats(group_tokens=jnp.asarray(np.full(b, mask.sum(), np.float32)))
    step = agg.StepStats(
        num_tokens=float(mask.sum()),
        num_seqs=float(b),
        num_groups=1.0,
        max_len=float(mask.shape[1]),
    )
    whole = float(agg.aggregate(mode, jnp.asarray(v), jnp.asarray(mask), rows, step))
    parts = sum(
        float(
            agg.weighted_sum(
                mode,
                jnp.asarray(v[i : i + split]),
                jnp.asarray(mask[i : i + split]),
                agg.RowStats(rows.group_tokens[i : i + split]),
            )
        )
        for i in range(0, b, split)
    )
    np.testing.assert_allclose(
        parts / float(agg.AGGREGATIONS[mode].denominator(step)), whole, rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
        whole, np_aggregate(mode, v, mask, [0] * b, mask.shape[1]), rtol=1e-5, atol=1e-6
    )


# ----------------------------------------------------------------------------- KL


@pytest.mark.parametrize("seed", [0, 1])
def test_kl_estimator_gradients_vs_exact_enumeration(seed):
    """E_{y~pi}[grad k(y)] over a small categorical: k1 -> 0, k2 -> grad KL(pi||ref), k3 -> grad KL(ref||pi)."""
    rng = np.random.default_rng(seed)
    theta = jnp.asarray(rng.normal(size=6), jnp.float32)
    ref = jax.nn.log_softmax(jnp.asarray(rng.normal(size=6), jnp.float32))

    def expected_grad(est):
        def f(th):
            logp = jax.nn.log_softmax(th)
            p = jax.lax.stop_gradient(
                jnp.exp(logp)
            )  # samples are fixed: the weights carry no gradient
            return jnp.sum(p * kl_mod.ESTIMATORS[est](logp, ref))

        return np.asarray(jax.grad(f)(theta))

    reverse = jax.grad(
        lambda th: jnp.sum(jnp.exp(jax.nn.log_softmax(th)) * (jax.nn.log_softmax(th) - ref))
    )(theta)
    forward = jax.grad(lambda th: jnp.sum(jnp.exp(ref) * (ref - jax.nn.log_softmax(th))))(theta)
    np.testing.assert_allclose(expected_grad("k1"), 0.0, atol=1e-6)
    np.testing.assert_allclose(expected_grad("k2"), reverse, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(expected_grad("k3"), forward, rtol=1e-4, atol=1e-6)
    # values: k1 and k3 are unbiased for KL(pi||ref)
    logp = jax.nn.log_softmax(theta)
    p = np.exp(np.asarray(logp))
    exact = float(np.sum(p * (np.asarray(logp) - np.asarray(ref))))
    for est in ("k1", "k3"):
        np.testing.assert_allclose(
            np.sum(p * np.asarray(kl_mod.ESTIMATORS[est](logp, ref))), exact, rtol=1e-4
        )


def test_kl_in_reward_penalty_is_detached_sum():
    logp = jnp.asarray([[-1.0, -2.0, -0.5]])
    ref = jnp.asarray([[-1.5, -1.0, -0.5]])
    mask = jnp.asarray([[1.0, 1.0, 0.0]])
    pen = kl_mod.kl_reward_penalty(logp, ref, mask, beta=0.1)
    np.testing.assert_allclose(pen, [0.1 * (0.5 - 1.0)], rtol=1e-6)
    assert np.all(
        np.asarray(jax.grad(lambda x: kl_mod.kl_reward_penalty(x, ref, mask, beta=0.1).sum())(logp))
        == 0
    )


# ----------------------------------------------------------------------------- shaping + configs


@SETTINGS
@given(lengths=st.lists(st.integers(0, 40), min_size=8, max_size=8), buf=st.integers(1, 10))
def test_overlong_penalty_matches_numpy(lengths, buf):
    lmax = 32
    y = np.asarray(lengths, np.float64)
    want = np.where(y <= lmax - buf, 0.0, np.where(y <= lmax, ((lmax - buf) - y) / buf, -1.0))
    np.testing.assert_allclose(
        shaping.overlong_penalty(y, max_len=lmax, buffer=buf), want, rtol=1e-6, atol=1e-7
    )


@SETTINGS
@given(r=reward_groups())
def test_zero_variance_filter(r):
    np.testing.assert_array_equal(shaping.nonzero_variance(r), r.max(-1) != r.min(-1))


@pytest.mark.parametrize(
    "make,field",
    [
        (lambda: C.AdvantageConfig(estimator="ppo"), "estimator"),
        (lambda: C.AdvantageConfig(ddof=2), "ddof"),
        (lambda: C.PolicyLossConfig(eps_low=-0.1), "eps_low"),
        (lambda: C.PolicyLossConfig(dual_clip=0.5), "dual_clip"),
        (lambda: C.CorrectionConfig(kinds=("tis", "bogus")), "kinds"),
        (lambda: C.KLConfig(estimator="k4"), "estimator"),
        (lambda: C.LossConfig(aggregation="mean"), "aggregation"),
        (lambda: C.loss_preset("ppo2"), "name"),
    ],
)
def test_config_errors_name_field_and_allowed(make, field):
    with pytest.raises(ConfigError, match=field) as e:
        make()
    assert "expected" in str(e.value) and "Fix" in str(e.value)


def test_presets_are_frozen_and_distinct():
    cfgs = {n: C.loss_preset(n) for n in C.PRESETS}
    assert cfgs["grpo"].kl.beta == 0.04 and cfgs["dapo"].kl.beta == 0.0
    assert (
        cfgs["gspo"].policy.ratio_level == "sequence" and cfgs["dr_grpo"].aggregation == "constant"
    )
    assert cfgs["async_agentic"].correction.kinds == ("tis",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfgs["grpo"].aggregation = "token_mean"
