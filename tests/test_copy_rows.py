"""``copy_rows``, the engine's row compaction: the same result as a gather then a dropping assignment,
every read before any write, and no whole-cache temporary in its compiled program."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from gymllm.inference.device_cache import copy_rows
from gymllm.models.cache import KVCache


def reference(c: np.ndarray, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    out = c.copy()
    rows = c[:, src]
    keep = dst < c.shape[1]
    out[:, dst[keep]] = rows[:, keep]
    return out


def cache(seed: int, layers: int = 2, width: int = 6, slots: int = 5) -> KVCache:
    rng = np.random.default_rng(seed)
    shape = (layers, width, slots, 2, 3)
    return KVCache(
        k=jnp.asarray(rng.normal(size=shape), jnp.float32),
        v=jnp.asarray(rng.normal(size=shape), jnp.float32),
    )


def test_rows_are_copied_as_a_gather_then_an_assignment_and_padding_copies_drop():
    c = cache(0)
    want_k, want_v = np.asarray(c.k), np.asarray(c.v)
    src = np.array([5, 4, 0, 0], np.int32)
    dst = np.array([1, 2, 6, 6], np.int32)  # the last two are padding: past the cache's 6 rows
    got = copy_rows(c, src, dst)
    np.testing.assert_array_equal(np.asarray(got.k), reference(want_k, src, dst))
    np.testing.assert_array_equal(np.asarray(got.v), reference(want_v, src, dst))
    np.testing.assert_array_equal(
        np.asarray(got.k)[:, 0], want_k[:, 0]
    )  # a dropped copy wrote nothing


def test_every_row_is_read_before_any_row_is_written():
    c = cache(1)
    want = np.asarray(c.k)
    src = np.array([0, 1], np.int32)
    dst = np.array(
        [1, 0], np.int32
    )  # a swap: a row-by-row copy that read after writing would repeat row 0
    got = np.asarray(copy_rows(c, src, dst).k)
    np.testing.assert_array_equal(got[:, 0], want[:, 1])
    np.testing.assert_array_equal(got[:, 1], want[:, 0])


def test_the_compiled_copy_holds_no_whole_cache_temporary():
    """Lowered from shapes alone (nothing allocated), at head dims a TPU tiles without padding."""
    spec = jax.ShapeDtypeStruct((4, 32, 64, 8, 128), jnp.float32)
    src = jax.ShapeDtypeStruct((4,), jnp.int32)
    mem = copy_rows.lower(KVCache(k=spec, v=spec), src, src).compile().memory_analysis()
    cache_bytes = 2 * 4 * 32 * 64 * 8 * 128 * 4
    assert mem.temp_size_in_bytes < cache_bytes / 4, (mem.temp_size_in_bytes, cache_bytes)
    assert mem.output_size_in_bytes - mem.alias_size_in_bytes < cache_bytes / 4  # written in place
