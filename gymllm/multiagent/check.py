""":func:`text_api_test`: PettingZoo's ``api_test`` with its one dtype check made text-aware.

PettingZoo's ``api_test`` reads ``observation.dtype`` of every leaf, which a ``str`` does not have.
While :func:`text_api_test` runs (and only then: it is a test helper, called on request), that one
check of ``pettingzoo.test.api_test`` is replaced by one that accepts a ``str`` inside its ``Text``
space (numeric leaves keep the original check); the original is restored afterwards.
"""

from __future__ import annotations

import contextlib

from gymnasium import spaces as gspaces
from pettingzoo import AECEnv

from gymllm.spaces import Text

__all__ = ["text_api_test"]


@contextlib.contextmanager
def _text_aware_api_checks():
    """Adapt api_test's one check that cannot handle ``str`` leaves (see module doc)."""
    import importlib

    mod = importlib.import_module("pettingzoo.test.api_test")
    original = mod._test_observation_space_compatibility

    def compat(expected, seen, recursed_keys):
        if isinstance(expected, Text):
            assert isinstance(seen, str) and expected.contains(seen), (
                f"text observation at {recursed_keys} invalid"
            )
            return
        if isinstance(expected, gspaces.Dict) and isinstance(seen, dict):
            for key in expected:
                if not recursed_keys and key != "observation":
                    continue
                compat(expected[key], seen[key], recursed_keys + [key])
            return
        original(expected, seen, recursed_keys)

    mod._test_observation_space_compatibility = compat
    try:
        yield
    finally:
        mod._test_observation_space_compatibility = original


def text_api_test(env: AECEnv, num_cycles: int = 1000) -> None:
    """PettingZoo's ``api_test`` with its dtype check made text-aware (module doc says what changes)."""
    from pettingzoo.test import api_test

    with _text_aware_api_checks():
        api_test(env, num_cycles=num_cycles)
