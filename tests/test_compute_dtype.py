"""``compute_dtype="auto"``: bf16 where bf16 matmuls are native, float32 elsewhere, chosen where the
engine or learner runs (``gymllm.utils.host.resolve_compute_dtype``), and what each component then
really computes in."""

from __future__ import annotations

import glob
import tomllib

import pytest

from gymllm.errors import ConfigError
from gymllm.utils.host import native_bf16, resolve_compute_dtype


@pytest.mark.parametrize(
    "flags,backend,expected",
    [
        (
            {"avx2", "fma"},
            "cpu",
            "float32",
        ),  # no bf16 instructions: XLA:CPU converts element by element
        ({"avx2", "amx_bf16", "amx_tile"}, "cpu", "bfloat16"),
        ({"avx512f", "avx512_bf16"}, "cpu", "bfloat16"),
        (set(), "gpu", "bfloat16"),  # accelerators: native whatever the host CPU
        (set(), "tpu", "bfloat16"),
    ],
)
def test_auto_resolves_by_cpu_flags_and_backend(flags, backend, expected):
    assert native_bf16(flags=flags, backend=backend) == (expected == "bfloat16")
    assert resolve_compute_dtype("auto", flags=flags, backend=backend) == expected


@pytest.mark.parametrize("value", [None, "float32", "bfloat16", "float16"])
def test_explicit_dtypes_pass_through(value):
    assert resolve_compute_dtype(value, flags=set(), backend="cpu") == value


def test_engine_resolves_auto_on_its_host_and_computes_in_it():
    import asyncio

    from gymllm.inference import EngineConfig, JaxEngine, SamplingParams
    from gymllm.inference.weights import kv_cache_dtype
    from gymllm.models.tiny import make_tiny

    lm = make_tiny("qwen3")
    eng = JaxEngine.from_loaded(
        lm, config=EngineConfig(num_slots=2, max_len=32, compute_dtype="auto"), stop_token_ids=()
    )
    try:
        want = resolve_compute_dtype("auto")
        assert eng.config.compute_dtype == want  # the engine's config holds the choice, not "auto"
        assert kv_cache_dtype(eng.config, None) == (
            None
            if want == "float32"
            else kv_cache_dtype(EngineConfig(compute_dtype="bfloat16"), None)
        )
        out = asyncio.run(eng.generate([1, 2, 3], SamplingParams(max_tokens=3)))
        assert len(out.token_ids) == 3
    finally:
        eng.shutdown()


def test_learners_resolve_auto():
    from gymllm.algos.learner import StreamingLearner
    from gymllm.algos.learner_config import LearnerConfig
    from gymllm.algos.optim import OptimizerConfig
    from gymllm.train.sft_step import SFTLearner
    from gymllm.models.tiny import make_tiny

    lm = make_tiny("qwen3")
    want = resolve_compute_dtype("auto")
    learner = StreamingLearner(
        lm.config, lm.model.flat_params(), config=LearnerConfig(compute_dtype="auto")
    )
    assert learner.config.compute_dtype == want
    sft = SFTLearner(
        lm.config,
        lm.model.flat_params(),
        optimizer=OptimizerConfig(),
        num_steps=1,
        compute_dtype="auto",
    )
    assert sft.compute_dtype == want


def test_configs_accept_auto_and_name_it_in_the_error():
    from gymllm.algos.learner_config import LearnerConfig
    from gymllm.inference import EngineConfig

    assert EngineConfig(compute_dtype="auto").compute_dtype == "auto"
    with pytest.raises(ConfigError, match="auto"):
        EngineConfig(compute_dtype="bf16")
    with pytest.raises(ConfigError, match="auto"):
        LearnerConfig(compute_dtype="bf16")


def test_shipped_recipes_use_auto():
    """A recipe pins no dtype that is slow on the host: on a CPU without bf16 instructions float32 is
    2.6x faster at decode (``native_bf16``'s docstring)."""
    files = glob.glob(
        str(__import__("pathlib").Path(__import__("gymllm").__file__).parent / "recipes" / "*.toml")
    )
    assert files
    for f in files:
        with open(f, "rb") as fh:
            cfg = tomllib.load(fh)
        pinned = {
            cfg.get("rollout", {}).get("engine_compute_dtype"),
            cfg.get("learner", {}).get("compute_dtype"),
        }
        assert pinned <= {None, "auto"}, (
            f"{f}: {pinned}"
        )  # None: the model's own dtype (the tiny recipes' float32)
