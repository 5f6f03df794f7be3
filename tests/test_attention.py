"""``gymllm.models.attention.attention``: its hand-written backward against autodiff of the plain formula.

The reference is the ``[B, T, K, G]``-ordered grouped-query attention written directly (what the
model ran before the kv-head-major form), differentiated by JAX; values and the gradients of q, keys
and values must agree (float32: up to summation order), with GQA, soft-capping, a row whose keys
are all masked, low precision, and under ``jit``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gymllm.models.attention import attention
from gymllm.models.layers import NEG_INF

# float32 comparisons between code paths: full-precision matmuls on an accelerator too (tests/accel.py)
pytestmark = pytest.mark.highest_precision


def reference_attention(q, k, v, mask, *, scale, softcap=0.0):
    """Plain grouped-query attention, differentiated by autodiff."""
    b, t, h, d = q.shape
    kh = k.shape[2]
    qg = q.reshape(b, t, kh, h // kh, d)  # [B, T, K, G, D]
    scores = jnp.einsum("btkgd,bskd->bkgts", qg, k, preferred_element_type=jnp.float32) * scale
    if softcap:
        scores = softcap * jnp.tanh(scores / softcap)
    scores = jnp.where(mask[:, None, None, :, :], scores, NEG_INF)  # [B, K, G, T, S]
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgts,bskd->btkgd", probs, v, preferred_element_type=jnp.float32)
    return out.astype(v.dtype).reshape(b, t, h * d)


def _inputs(rng, b, t, s, h, k, d, dtype=jnp.float32):
    q, kk, vv = (
        jnp.asarray(rng.normal(size=shape), dtype)
        for shape in ((b, t, h, d), (b, s, k, d), (b, s, k, d))
    )
    mask = rng.random((b, t, s)) < 0.6
    mask[..., 0] = True
    return q, kk, vv, jnp.asarray(mask)


@pytest.mark.parametrize("h,k,softcap", [(4, 2, 0.0), (6, 3, 0.7), (2, 2, 0.0), (4, 1, 5.0)])
def test_values_and_gradients_match_autodiff_of_the_plain_formula(h, k, softcap):
    rng = np.random.default_rng(h * 10 + k)
    q, kk, vv, mask = _inputs(rng, 2, 5, 7, h, k, 8)
    w = jnp.asarray(rng.normal(size=(2, 5, h * 8)), jnp.float32)  # a generic cotangent

    def loss(fn):
        return lambda q, kk, vv: jnp.sum(fn(q, kk, vv, mask, scale=0.35, softcap=softcap) * w)

    ours, theirs = (
        jax.jit(jax.value_and_grad(loss(attention), argnums=(0, 1, 2))),
        jax.jit(jax.value_and_grad(loss(reference_attention), argnums=(0, 1, 2))),
    )
    (v1, g1), (v2, g2) = ours(q, kk, vv), theirs(q, kk, vv)
    np.testing.assert_allclose(float(v1), float(v2), rtol=1e-5)
    for a, b_, name in zip(g1, g2, ("q", "keys", "values")):
        assert float(jnp.max(jnp.abs(b_))) > 1e-3, (
            f"the {name} gradient is trivially zero: the test would not fail"
        )
        np.testing.assert_allclose(
            np.asarray(a), np.asarray(b_), atol=2e-5, rtol=2e-5, err_msg=name
        )


def test_a_fully_masked_row_gets_the_reference_gradient():
    """A query row that may attend no key (uniform over masked keys in both forms) passes no gradient
    to the keys through its masked scores, as the plain formula's ``where`` does."""
    rng = np.random.default_rng(3)
    q, kk, vv, mask = _inputs(rng, 1, 4, 6, 4, 2, 8)
    mask = mask.at[0, 2].set(False)  # row 2 sees nothing
    g = [
        jax.grad(lambda *a, f=f: jnp.sum(f(*a, mask, scale=0.5) ** 2), argnums=(0, 1, 2))(q, kk, vv)
        for f in (attention, reference_attention)
    ]
    for a, b_ in zip(*g):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b_), atol=2e-5, rtol=2e-5)


def test_low_precision_inputs_keep_their_dtype_and_track_float32():
    rng = np.random.default_rng(5)
    q, kk, vv, mask = _inputs(rng, 2, 6, 6, 4, 2, 16)
    lo = [x.astype(jnp.bfloat16) for x in (q, kk, vv)]
    out = attention(*lo, mask, scale=0.25)
    assert out.dtype == jnp.bfloat16 and out.shape == (2, 6, 64)
    grads = jax.grad(
        lambda *a: jnp.sum(attention(*a, mask, scale=0.25).astype(jnp.float32)), argnums=(0, 1, 2)
    )(*lo)
    ref = jax.grad(
        lambda *a: jnp.sum(reference_attention(*a, mask, scale=0.25)), argnums=(0, 1, 2)
    )(q, kk, vv)
    for a, b_ in zip(grads, ref):
        assert a.dtype == jnp.bfloat16
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b_), atol=0.1, rtol=0.1)
