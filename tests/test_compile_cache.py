"""The persistent compilation cache (``gymllm.utils.compile_cache``): what a setting names, the
process's JAX setting scoped to the block and put back, bad settings named, and a new process that
loads every program an earlier one stored (counted by JAX's own cache events). A whole run stored and
loaded again: ``tests/test_compile_cache_rerun.py``."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import jax
import pytest

from gymllm.train.sft import SFTConfig
from gymllm.train.train_config import RunSection
from gymllm.errors import ConfigError
from gymllm.utils.compile_cache import (
    DEFAULT_DIR,
    ENV_VAR,
    JAX_DEFAULTS,
    STORE_EVERY_PROGRAM,
    persistent_compile_cache,
    resolve_cache_dir,
)


def test_settings_name_a_directory_or_off(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert resolve_cache_dir("auto") == os.path.expanduser(DEFAULT_DIR)
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "env"))
    assert resolve_cache_dir("auto") == str(tmp_path / "env")
    monkeypatch.setenv(ENV_VAR, "off")
    assert resolve_cache_dir("auto") is None
    assert resolve_cache_dir("off") is None and resolve_cache_dir("") is None
    assert resolve_cache_dir("~/xla-here") == os.path.join(os.path.expanduser("~"), "xla-here")
    assert resolve_cache_dir(str(tmp_path / "p")) == str(tmp_path / "p")


@pytest.mark.parametrize(
    "make",
    [
        lambda v: RunSection(compile_cache=v),
        lambda v: SFTConfig(data="x.jsonl", run=RunSection(compile_cache=v)),
    ],
)
def test_bad_setting_is_named(make):
    with pytest.raises(ConfigError, match=r"compile_cache: expected .*a str.*received 3\. Fix"):
        make(3)


def _thresholds() -> dict:
    return {k: getattr(jax.config, k) for k in JAX_DEFAULTS}


def test_the_setting_is_scoped_and_put_back(tmp_path):
    before, limits = jax.config.jax_compilation_cache_dir, _thresholds()
    assert limits == JAX_DEFAULTS  # nothing in this process changed JAX's thresholds
    with persistent_compile_cache(str(tmp_path / "a")) as d:
        assert (
            d == str(tmp_path / "a")
            and jax.config.jax_compilation_cache_dir == d
            and os.path.isdir(d)
        )
        assert (
            _thresholds() == STORE_EVERY_PROGRAM
        )  # every program stored, however fast it compiled
    assert jax.config.jax_compilation_cache_dir == before and _thresholds() == limits
    with persistent_compile_cache("off") as d:
        assert (
            d is None and jax.config.jax_compilation_cache_dir is None and _thresholds() == limits
        )
    assert jax.config.jax_compilation_cache_dir == before
    jax.config.update(
        "jax_persistent_cache_min_compile_time_secs", 2.5
    )  # the process's own choice is kept
    try:
        with persistent_compile_cache(str(tmp_path / "a")):
            assert jax.config.jax_persistent_cache_min_compile_time_secs == 2.5
            assert jax.config.jax_persistent_cache_min_entry_size_bytes == -1
    finally:
        jax.config.update(
            "jax_persistent_cache_min_compile_time_secs",
            limits["jax_persistent_cache_min_compile_time_secs"],
        )
    assert _thresholds() == limits
    # "auto" keeps a directory the process chose itself
    with persistent_compile_cache(str(tmp_path / "mine")):
        with persistent_compile_cache("auto") as d:
            assert d == str(tmp_path / "mine")
    assert jax.config.jax_compilation_cache_dir == before


LOAD = """
import collections, json, sys
import jax, jax.numpy as jnp
from gymllm.utils.compile_cache import persistent_compile_cache

events = collections.Counter()
jax.monitoring.register_event_listener(lambda name, **kw: events.update([name]))
with persistent_compile_cache(sys.argv[1]):
    jax.block_until_ready(jax.jit(lambda x: jnp.tanh(x @ x.T).sum(axis=0))(jnp.ones((16, 16))))
print("COUNTS " + json.dumps({k.rsplit("/", 1)[-1]: v for k, v in events.items() if "compilation_cache" in k}))
"""


def _load(cache: pathlib.Path) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    proc = subprocess.run(
        [sys.executable, "-c", LOAD, str(cache)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("COUNTS "))
    return json.loads(line[len("COUNTS ") :])


def test_a_new_process_loads_what_an_earlier_one_stored(tmp_path):
    cache = tmp_path / "xla"
    first = _load(cache)
    stored = len(list(cache.glob("*-cache")))
    assert first.get("cache_hits", 0) == 0 and first["cache_misses"] > 0 and stored > 0, (
        first,
        stored,
    )
    second = _load(cache)  # the same program in a fresh process: loaded, not compiled
    assert (
        second.get("cache_hits", 0) == first["cache_misses"] and second.get("cache_misses", 0) == 0
    ), (first, second)
