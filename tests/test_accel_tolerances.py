"""The device-aware tolerances of ``tests/accel.py`` still catch real bugs.

Each check is run twice: as the code is (within :func:`accel.tolerance` of its reference), and with a
deliberate one-line bug injected with monkeypatch (an attention scale 1% off, the PPO clip's upper
bound ignored, a wrong loss sign, a decode step fed the position after its own, a sampling
temperature 1% off), which must put it outside the same tolerance. Meant for the chip
(``GYMLLM_TEST_DEVICE=accelerator``, where the tolerances are the wide ones and the module runs at
the highest matmul precision); cheap enough to run on the CPU in the default tier too.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import gymllm.algos.loss as loss_mod
from gymllm.algos.policy_loss import ppo_clip_loss
import gymllm.models.attention as attn_mod
from gymllm.algos import config as C
from gymllm.algos.aggregation import StepStats
from gymllm.models import make_tiny, token_logprobs

from accel import tolerance

pytestmark = [pytest.mark.accelerator, pytest.mark.highest_precision]


def attention_vs_numpy() -> tuple[np.ndarray, np.ndarray]:
    """models.attention (GQA, a mask, soft-capping) and its float64 NumPy reference."""
    rng = np.random.default_rng(0)
    b, t, s, h, k, d, cap, scale = 2, 3, 5, 4, 2, 8, 0.7, 0.3
    q, kk, vv = (
        rng.normal(size=(b, t, h, d)),
        rng.normal(size=(b, s, k, d)),
        rng.normal(size=(b, s, k, d)),
    )
    mask = rng.random((b, t, s)) < 0.7
    mask[..., 0] = True
    got = attn_mod.attention(
        *(jnp.asarray(x, jnp.float32) for x in (q, kk, vv)),
        jnp.asarray(mask),
        scale=scale,
        softcap=cap,
    )
    krep, vrep = np.repeat(kk, h // k, axis=2), np.repeat(vv, h // k, axis=2)
    scores = np.einsum("bthd,bshd->bhts", q, krep) * scale
    scores = np.where(mask[:, None], cap * np.tanh(scores / cap), -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return np.asarray(got), np.einsum("bhts,bshd->bthd", probs, vrep).reshape(b, t, h * d)


def test_attention_scale_one_percent_off_is_caught(monkeypatch):
    got, ref = attention_vs_numpy()
    np.testing.assert_allclose(got, ref, **tolerance("reference"))
    forward = attn_mod._forward
    monkeypatch.setattr(
        attn_mod, "_forward", lambda q, k, v, m, scale, cap: forward(q, k, v, m, scale * 1.01, cap)
    )  # the bug
    got, ref = attention_vs_numpy()
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(got, ref, **tolerance("reference"))


# ------------------------------------------------------------------ the loss
LOSS_TOL = {
    "rtol": 2e-4,
    "atol": 2e-5,
}  # tests/test_losses.py's full-loss tolerance (elementwise math)


def ppo_loss_vs_numpy() -> tuple[float, float]:
    """The token-mean PPO-clip loss of gymllm.algos.loss on ratios across both clip bounds, and NumPy's."""
    rng = np.random.default_rng(1)
    b, t = 4, 8
    mu = -rng.exponential(1.0, (b, t))
    logp = mu + rng.normal(0, 0.3, (b, t))  # ratios e^N(0, 0.3): many past 1 - 0.2 and 1 + 0.28
    mask, adv = (rng.random((b, t)) < 0.8).astype(np.float32), rng.normal(size=b)
    cfg = C.LossConfig(
        policy=C.PolicyLossConfig(
            objective="ppo",
            ratio_level="token",
            ratio_against="behaviour",
            eps_low=0.2,
            eps_high=0.28,
            dual_clip=None,
        ),
        correction=C.CorrectionConfig(kinds=()),
        kl=C.KLConfig(beta=0.0),
        aggregation="token_mean",
    )
    batch = loss_mod.LossBatch(
        mask=jnp.asarray(mask),
        behaviour_logp=jnp.asarray(mu, jnp.float32),
        advantages=jnp.asarray(adv, jnp.float32),
        group_tokens=jnp.full((b,), mask.sum() / 2, jnp.float32),
        ref_logp=None,
    )
    total, _ = loss_mod.micro_batch_loss(cfg, jnp.asarray(logp, jnp.float32), batch)
    step = StepStats(
        num_tokens=float(mask.sum()), num_seqs=float(b), num_groups=2.0, max_len=float(t)
    )
    got = float(total / loss_mod.step_denominator(cfg, step))
    r, a = np.exp(logp - mu), adv[:, None]
    tok = -np.minimum(r * a, np.clip(r, 1 - 0.2, 1 + 0.28) * a)
    return got, float((tok * mask).sum() / mask.sum())


@pytest.mark.parametrize("bug", ["eps_high ignored", "sign flipped"])
def test_ppo_clip_bugs_are_caught(monkeypatch, bug):
    got, want = ppo_loss_vs_numpy()
    np.testing.assert_allclose(got, want, **LOSS_TOL)
    ppo = ppo_clip_loss  # what gymllm.algos.loss calls

    def buggy(ratio, adv, *, eps_low, eps_high, dual_clip=None):
        if bug == "eps_high ignored":  # clip(r, 1 - eps_low, 1 + eps_low)
            return ppo(ratio, adv, eps_low=eps_low, eps_high=eps_low, dual_clip=dual_clip)
        loss, clipped = ppo(ratio, adv, eps_low=eps_low, eps_high=eps_high, dual_clip=dual_clip)
        return -loss, clipped

    monkeypatch.setattr(loss_mod, "ppo_clip_loss", buggy)
    got, want = ppo_loss_vs_numpy()
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(got, want, **LOSS_TOL)


# ------------------------------------------------------------------ the model's cache and log-probs
@pytest.fixture(scope="module")
def lm():
    return make_tiny("llama", num_layers=2)


def decode_vs_full(lm, shift: int) -> tuple[np.ndarray, np.ndarray]:
    """Prefill 5 tokens, decode 3 one at a time (each fed position ``n + shift``: 0 is right), and the
    full forward's logits at the same positions."""
    T, n = 8, 5
    toks = jnp.asarray(
        np.random.default_rng(2).integers(0, lm.config.vocab_size, (1, T)), jnp.int32
    )
    full, _ = lm.model(toks, jnp.arange(T, dtype=jnp.int32)[None])
    cache = lm.model.init_cache(1, 16)
    _, cache = lm.model(toks[:, :n], jnp.arange(n, dtype=jnp.int32)[None], cache=cache)
    got = []
    for p in range(n, T):
        out, cache = lm.model(
            toks[:, p : p + 1], jnp.asarray([[p + shift]], jnp.int32), cache=cache
        )
        got.append(np.asarray(out[0, 0]))
    return np.stack(got), np.asarray(full[0, n:T])


def test_decode_position_off_by_one_is_caught(lm):
    got, want = decode_vs_full(lm, 0)
    np.testing.assert_allclose(got, want, **tolerance("logits"))
    got, want = decode_vs_full(lm, 1)  # the bug: the step's position one past its cache slot
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(got, want, **tolerance("logits"))


def test_temperature_one_percent_off_is_caught(lm):
    toks = jnp.asarray(
        np.random.default_rng(3).integers(0, lm.config.vocab_size, (2, 8)), jnp.int32
    )
    logits, _ = lm.model(toks, jnp.broadcast_to(jnp.arange(8, dtype=jnp.int32), (2, 8)))
    z = np.asarray(logits[:, :-1], np.float64) / 0.7
    z = z - z.max(-1, keepdims=True)
    ref = np.take_along_axis(
        z - np.log(np.exp(z).sum(-1, keepdims=True)), np.asarray(toks[:, 1:])[..., None], -1
    )[..., 0]
    good = np.asarray(token_logprobs(logits[:, :-1], toks[:, 1:], 0.7))
    assert np.abs(good - ref).max() < tolerance("logprob")["atol"]
    bad = np.asarray(token_logprobs(logits[:, :-1], toks[:, 1:], 0.7 * 1.01))  # the bug: T 1% off
    assert np.abs(bad - ref).max() > tolerance("logprob")["atol"]


@pytest.mark.tpu
def test_the_module_runs_at_the_highest_matmul_precision_on_the_chip():
    """On a TPU the mark is in force: a float32 matmul is float32-accurate (at the default precision
    its bf16 passes give about 3 digits)."""
    import jax

    assert jax.config.jax_default_matmul_precision == "highest"
    rng = np.random.default_rng(4)
    a, b = rng.normal(size=(64, 256)), rng.normal(size=(256, 64))
    got = np.asarray(jnp.asarray(a, jnp.float32) @ jnp.asarray(b, jnp.float32))
    assert np.abs(got - a @ b).max() < 1e-4 * np.abs(a @ b).max()
