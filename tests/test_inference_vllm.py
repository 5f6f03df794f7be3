"""VllmEngine: the import is lazy, a missing vLLM gives a clear MissingExtraError, JAX weights convert
to torch; the engine itself runs only where vLLM and a GPU are present (skipped otherwise)."""

from __future__ import annotations

import importlib.util
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from gymllm.errors import MissingExtraError
from gymllm.inference import SamplingParams

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def test_module_import_does_not_import_vllm():
    import gymllm.inference.vllm_engine  # noqa: F401

    assert HAS_VLLM or "vllm" not in sys.modules


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed")
def test_missing_vllm_names_the_extra():
    from gymllm.inference import VllmEngine

    with pytest.raises(MissingExtraError, match=r"pip install 'gymllm\[vllm\]'"):
        VllmEngine("any-model")


def test_jax_weights_convert_to_torch_exactly():
    torch = pytest.importorskip("torch")
    from gymllm.inference.vllm_engine import to_torch

    x = jnp.arange(12, dtype=jnp.float32).reshape(3, 4) / 7
    t = to_torch(x)
    assert isinstance(t, torch.Tensor) and tuple(t.shape) == (3, 4)
    np.testing.assert_array_equal(t.numpy(), np.asarray(x))


def _gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_VLLM and _gpu()), reason="needs vLLM and a GPU")
def test_vllm_engine_generates_token_ids_and_logprobs(tmp_path):  # pragma: no cover - GPU only
    import asyncio

    from gymllm.inference import VllmEngine
    from gymllm.models import make_tiny
    from gymllm.models.hf_io import save_hf_dir

    save_hf_dir(make_tiny("llama"), tmp_path)  # a real Hugging Face directory vLLM can load
    eng = VllmEngine(str(tmp_path), gpu_memory_utilization=0.2)

    async def main():
        c = await eng.generate([1, 2, 3], SamplingParams(temperature=0.0, max_tokens=5))
        await eng.close()
        return c

    c = asyncio.run(main())
    assert c.num_tokens == 5 and np.all(np.isfinite(c.logprobs)) and set(c.versions.tolist()) == {0}
