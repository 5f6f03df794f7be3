"""``import gymllm`` reaches every subpackage lazily (``gymllm.utils.check_env(...)``), as Gymnasium does,
and stays cheap: no JAX (nor torch, Ray, FastAPI...) until a JAX-backed name is used.

Import costs are checked in fresh interpreters (this test process has imported JAX already).
"""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
import textwrap

import pytest

import gymllm

HEAVY = (
    "jax",
    "jaxlib",
    "flax",
    "optax",
    "orbax",
    "torch",
    "transformers",
    "ray",
    "fastapi",
    "uvicorn",
    "pydantic",
    "tyro",
    "tensorboard",
    "tensorboardX",
    "matplotlib",
    "reasoning_gym",
    "textarena",
)


def _run(code: str) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON object on its last line."""
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_gymllm_loads_no_heavy_package():
    got = _run(f"""
        import json, sys
        import gymllm
        print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))
    """)
    assert got == [], (
        f"`import gymllm` imported {got}: expected none of them (keep heavy imports lazy)"
    )


def test_every_subpackage_is_an_attribute_after_a_bare_import_and_costs_no_jax():
    got = _run("""
        import json, sys, types
        import gymllm
        kinds = {name: type(getattr(gymllm, name)).__name__ for name in gymllm.SUBMODULES}
        same = all(getattr(gymllm, n) is sys.modules["gymllm." + n] for n in gymllm.SUBMODULES)
        print(json.dumps({"kinds": kinds, "same": same, "jax": "jax" in sys.modules}))
    """)
    assert set(got["kinds"].values()) == {"module"} and got["same"]
    assert not got["jax"], (
        "reaching gymllm.<subpackage> imported JAX: its __init__ must import lazily"
    )


def test_checkers_vector_wrappers_envs_work_from_a_bare_import():
    got = _run("""
        import json
        import gymllm

        env = gymllm.make("gymllm/Echo-v0")
        warnings = gymllm.utils.check_env(env, num_steps=2)          # the issue's failing call
        gymllm.utils.check_vector_env(lambda: gymllm.make_vec("gymllm/Echo-v0", 2), num_steps=2)
        vec = gymllm.vector.VectorEnv([lambda: gymllm.make("gymllm/Echo-v0")] * 2)
        obs, _ = vec.reset(seed=0)
        vec.close()
        wrapped = gymllm.wrappers.ToolUse(gymllm.make("gymllm/Arithmetic-v0"), tools=[gymllm.tools.calculator])
        first, _ = wrapped.reset(seed=0)
        game = gymllm.envs.from_gymnasium("FrozenLake-v1")
        print(json.dumps({"warnings": list(warnings), "n_obs": len(obs), "space": repr(wrapped.observation_space),
                          "chat": gymllm.spaces.Chat().contains(first), "textenv": isinstance(env, gymllm.TextEnv),
                          "game": type(game).__name__}))
    """)
    assert got["n_obs"] == 2 and got["chat"] and got["textenv"] and got["space"].startswith("Chat(")
    assert got["game"]


def test_jax_backed_subpackages_resolve_their_names():
    assert isinstance(gymllm.train.preset("tiny"), gymllm.train.TrainConfig)  # imports JAX on use
    assert gymllm.algos.StreamingLearner.__module__ == "gymllm.algos.learner"
    assert gymllm.inference.SamplingParams(temperature=0.5).temperature == 0.5
    assert gymllm.models.tiny_config("llama").vocab_size > 0
    assert gymllm.rollout.RolloutConfig().__class__.__module__.startswith("gymllm.rollout.")


def test_submodules_list_every_public_module_of_the_package():
    found = {m.name for m in pkgutil.iter_modules(gymllm.__path__) if not m.name.startswith("_")}
    missing = found - set(gymllm.SUBMODULES)
    assert not missing, (
        f"gymllm/{sorted(missing)} exist but are not in gymllm.SUBMODULES: add them there"
    )
    assert set(gymllm.SUBMODULES) <= found, "gymllm.SUBMODULES names a module that does not exist"
    assert set(gymllm.SUBMODULES) <= set(dir(gymllm)) and set(gymllm.__all__) <= set(dir(gymllm))


def test_unknown_attribute_names_the_public_ones():
    with pytest.raises(AttributeError, match=r"no attribute 'nope'.*utils"):
        gymllm.nope  # noqa: B018
    assert not hasattr(gymllm, "_registration_typo")
