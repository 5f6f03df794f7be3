"""examples/custom_algorithm.py: a user's REINFORCE written against the public API learns."""

import asyncio
import importlib.util
import pathlib

import numpy as np

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "custom_algorithm.py"


def test_custom_algorithm_is_short_and_learns():
    assert len(EXAMPLE.read_text().splitlines()) < 100
    spec = importlib.util.spec_from_file_location("custom_algorithm", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    curve = asyncio.run(mod.main(steps=26, num_envs=16, seed=0))
    first, last = np.mean(curve[:6]), np.mean(curve[-6:])
    # chance is about 1/50 per character; a policy drifting towards the target letter doubles it
    assert last > 2 * first and last > 0.06, curve
