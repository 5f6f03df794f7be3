"""The persistent compilation cache: compiled XLA programs kept on disk, so a rerun loads them.

A run compiles one program per engine and learner shape (prefill buckets, decode widths and cache
lengths, the mixed step, every learner length bucket); on 2 CPU cores that is most of a short run's
wall. JAX can keep compiled executables on disk (its persistent compilation cache, keyed by the
program, the compile options, the JAX version and the device), so a second run with the same model,
shapes and settings loads them instead of compiling again. Measured with ``benchmarks/compile_cache.py``.

:func:`persistent_compile_cache` points JAX's cache at a directory for the length of a ``with``
block and puts the process's previous setting back afterwards (JAX's config is process-wide, and a
library should not leave it changed). What the directory is:

* ``"auto"`` (``RunSection.compile_cache``'s default): ``$GYMLLM_COMPILE_CACHE`` when set, else
  ``~/.cache/gymllm/xla``; ``GYMLLM_COMPILE_CACHE=off`` (or empty) turns it off;
* ``"off"`` or ``""``: no cache (every run compiles);
* any other string: that directory (``~`` expanded; created when missing).

A directory the process already set for JAX (``JAX_COMPILATION_CACHE_DIR`` or
``jax.config.update("jax_compilation_cache_dir", ...)``) wins over ``"auto"``: the user's choice is
kept. Every program is stored: within the block JAX's thresholds are lowered to store a program
whatever its compile time (``jax_persistent_cache_min_compile_time_secs`` 0; JAX's default, 1 s,
leaves a run's many sub-second programs, on a TPU most of them, to compile again in every run) and
whatever its size (``jax_persistent_cache_min_entry_size_bytes`` -1), so an identical second run
compiles nothing (``tests/test_compile_cache_rerun.py``; counted with
:class:`gymllm.telemetry.compiles.CompileLog`). A threshold the process set to anything but JAX's
default is kept, and both are put back on exit. JAX's cache key is the lowered program (so every
shape, dtype and constant the config bakes in), the compile options, the devices and the JAX /
jaxlib versions: a changed config compiles what it changed and loads the rest. The cache is
trusted code: keep it in a directory only you can write (JAX's own warning). It lives in the
process that calls ``train``; Ray actors (engine replicas, env workers, learner hosts) compile on
their own.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

from gymllm.validation import require

ENV_VAR = "GYMLLM_COMPILE_CACHE"
DEFAULT_DIR = "~/.cache/gymllm/xla"
OFF = ("", "off", "none", "0", "false", "no")
#: JAX's thresholds for storing a compiled program, as :func:`persistent_compile_cache` sets them
STORE_EVERY_PROGRAM = {
    "jax_persistent_cache_min_compile_time_secs": 0.0,
    "jax_persistent_cache_min_entry_size_bytes": -1,
}
#: their JAX defaults (a value other than these was the process's choice and is kept)
JAX_DEFAULTS = {
    "jax_persistent_cache_min_compile_time_secs": 1.0,
    "jax_persistent_cache_min_entry_size_bytes": 0,
}


def check_setting(value: object, where: str = "RunSection.compile_cache") -> str:
    """``value`` if it is a valid setting (a string), else a :class:`~gymllm.errors.ConfigError` naming ``where``."""
    require(
        isinstance(value, str),
        where,
        expected='"auto", "off" or a directory path (a str)',
        received=value,
        fix='use "auto" (the default), "off", or a path such as "~/.cache/gymllm/xla"',
    )
    return value


def resolve_cache_dir(value: str = "auto") -> str | None:
    """The directory a setting names (absolute, ``~`` expanded), or None when the cache is off."""
    check_setting(value)
    v = value.strip()
    if v.lower() == "auto":
        v = os.environ.get(ENV_VAR, DEFAULT_DIR).strip()
    if v.lower() in OFF:
        return None
    return os.path.abspath(os.path.expanduser(v))


@contextlib.contextmanager
def persistent_compile_cache(value: str = "auto") -> Iterator[str | None]:
    """Within the block, JAX stores and loads compiled programs in the directory ``value`` names
    (module docstring); yields the directory in use (None: off). A directory the process set for
    JAX before is kept when ``value`` is ``"auto"``; an explicit path or ``"off"`` applies for the
    block. Within the block JAX stores every program (:data:`STORE_EVERY_PROGRAM`, unless the process
    changed those thresholds itself). The previous settings are restored on exit."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache as cc

    previous = jax.config.jax_compilation_cache_dir
    wanted = resolve_cache_dir(value)
    if value.strip().lower() == "auto" and previous:
        wanted = previous
    if wanted is not None:
        os.makedirs(wanted, exist_ok=True)
    changed = wanted != previous
    thresholds = {
        k: v
        for k, v in STORE_EVERY_PROGRAM.items()
        if wanted is not None and getattr(jax.config, k) == JAX_DEFAULTS[k]
    }
    saved = {k: getattr(jax.config, k) for k in thresholds}
    for k, v in thresholds.items():
        jax.config.update(k, v)
    if changed:
        jax.config.update("jax_compilation_cache_dir", wanted)
        cc.reset_cache()  # the cache object is built lazily from the directory: rebuild it for the new one
    try:
        yield wanted
    finally:
        for k, v in saved.items():
            jax.config.update(k, v)
        if changed:
            jax.config.update("jax_compilation_cache_dir", previous)
            cc.reset_cache()
