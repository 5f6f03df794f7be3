"""VllmEngine: the import is lazy, a missing vLLM gives a clear MissingExtraError, JAX weights convert
to torch exactly. The adapter's logic runs on CPU against ``tests/vllm_standin.py``, a STAND-IN for
the part of vLLM's API it uses (the real vLLM needs a CUDA GPU). The API was checked against vLLM's
source and docs (V1 engine, v0.10-v0.3x):

- ``vllm/v1/engine/async_llm.py``: ``AsyncLLM.from_engine_args(engine_args)``; ``generate(prompt,
  sampling_params, request_id, *, ...)`` an async generator of RequestOutput that aborts the request
  itself when cancelled; ``abort(request_id, internal=False)``; ``pause_generation(*, mode="abort",
  clear_cache=True)`` with modes abort / wait / keep (older: ``wait_for_inflight_requests``);
  ``resume_generation()``; ``collective_rpc(method: str, timeout, args, kwargs)``;
  ``reset_prefix_cache()``; ``shutdown()``. ``vllm/engine/async_llm_engine.py``: ``AsyncLLMEngine =
  AsyncLLM``.
- ``vllm/v1/serial_utils.py`` + ``EngineCoreProc._convert_msgspec_args``: RPC arguments are msgpack;
  functions need ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` and tensors in untyped arguments arrive as
  lists, hence weights go by file path to a ``worker_extension_cls`` method (``vllm/config/parallel.py``).
- ``vllm/sampling_params.py``: temperature (0 = greedy), top_p, top_k (0 or -1 = off; -1 only in
  older versions), max_tokens, stop, stop_token_ids, seed, ``logprobs=0`` (the sampled token only),
  ``output_kind=RequestOutputKind.DELTA``. ``vllm/outputs.py``: ``outputs[0].token_ids``,
  ``.logprobs`` (list of ``{token_id: Logprob}``), ``.finish_reason`` ("stop", "length", "abort"),
  ``.stop_reason``, ``num_cached_tokens``.
- ``vllm/v1/sample/sampler.py`` + docs.vllm.ai training/async_rl: ``logprobs_mode``
  ``"processed_logprobs"`` = after temperature (greedy rows at T = 1); the default
  ``"raw_logprobs"`` is before it. ``pause_generation(mode="keep", clear_cache=True)`` is the
  documented way to update weights mid-flight.

Only a GPU run (the ``gpu`` test at the end) can show that the real vLLM behaves as the stand-in does.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from gymllm.errors import EngineError, MissingExtraError
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
    assert isinstance(t, torch.Tensor) and tuple(t.shape) == (3, 4) and t.device.type == "cpu"
    np.testing.assert_array_equal(t.numpy(), np.asarray(x))
    b = (jnp.arange(6, dtype=jnp.float32) / 3 - 1).astype(jnp.bfloat16)
    tb = to_torch(b)
    assert (
        tb.dtype == torch.bfloat16
    )  # bf16 stays bf16: same bits, half the bytes of a float32 copy
    np.testing.assert_array_equal(tb.float().numpy(), np.asarray(b, dtype=np.float32))


# ------------------------------------------------------------------ against the stand-in vLLM
import vllm_standin  # noqa: E402  (tests/ is on sys.path, as for synthetic_groups)


@pytest.fixture
def standin(monkeypatch):
    """The stand-in ``vllm`` package in sys.modules for one test (see tests/vllm_standin.py)."""
    pytest.importorskip("torch")
    return vllm_standin.install(monkeypatch)


def _engine(tmp_path, **kw):
    from gymllm.inference.vllm_engine import VllmEngine

    eng = VllmEngine("toy-model", weight_dir=str(tmp_path), **kw)
    return eng, eng._engine


def _script(prompt, n, w=0):
    """The stand-in's toy model: the ids step k samples, and their processed logprobs at T."""
    return [(sum(prompt) + k) % 50 + 100 * w for k in range(n)]


def _new_weights(w: float, dtype=jnp.float32):
    return {
        "lm_head.weight": jnp.full((8, 4), w, dtype),
        "model.norm.weight": (jnp.arange(4) / 3).astype(jnp.bfloat16),
    }


def test_engine_args_request_processed_logprobs_and_the_weight_loader(standin, tmp_path):
    from gymllm.inference.vllm_engine import WORKER_EXTENSION, WeightLoaderExtension

    _, core = _engine(tmp_path, gpu_memory_utilization=0.3)
    assert core.args.logprobs_mode == "processed_logprobs" and core.args.model == "toy-model"
    assert (
        core.args.worker_extension_cls == WORKER_EXTENSION
        and core.args.gpu_memory_utilization == 0.3
    )
    assert isinstance(core.workers[0], WeightLoaderExtension)  # mixed into the worker class
    _, raw = _engine(tmp_path, logprobs_mode="raw_logprobs")  # an explicit choice is kept
    assert raw.args.logprobs_mode == "raw_logprobs"


def test_unknown_engine_arg_is_a_clear_error(standin, tmp_path):
    with pytest.raises(
        EngineError, match=r"AsyncEngineArgs.*no_such_arg.*Fix: pip install -U 'vllm>=0.11'"
    ):
        _engine(tmp_path, no_such_arg=1)


def test_sampling_params_mapping(standin, tmp_path):
    eng, core = _engine(tmp_path)

    async def main():
        await eng.generate([5, 6, 7], SamplingParams(temperature=0.0, max_tokens=3))
        await eng.generate(
            [1, 2],
            SamplingParams(
                temperature=0.7,
                top_p=0.9,
                top_k=5,
                max_tokens=4,
                stop_token_ids=(2, 9),
                stop=("</a>",),
                seed=11,
            ),
        )

    asyncio.run(main())
    (p0, sp0, rid0), (p1, sp1, rid1) = core.received
    assert p0 == {"prompt_token_ids": [5, 6, 7]} and p1 == {
        "prompt_token_ids": [1, 2]
    }  # ids verbatim
    assert all(type(t) is int for t in p0["prompt_token_ids"]) and rid0 != rid1
    assert (sp0.temperature, sp0.top_k, sp0.top_p, sp0.seed, sp0.stop, sp0.stop_token_ids) == (
        0.0,
        -1,
        1.0,
        None,
        None,
        None,
    )
    assert (sp1.temperature, sp1.top_p, sp1.top_k, sp1.max_tokens, sp1.seed) == (0.7, 0.9, 5, 4, 11)
    assert sp1.stop_token_ids == [2, 9] and sp1.stop == ["</a>"]
    for sp in (sp0, sp1):
        assert (
            sp.n == 1
            and sp.logprobs == 0
            and sp.output_kind is vllm_standin.RequestOutputKind.DELTA
        )


@pytest.mark.parametrize("temperature", [0.0, 0.6, 1.0, 1.2])
def test_completion_has_sampled_ids_and_processed_float32_logprobs(standin, tmp_path, temperature):
    eng, _ = _engine(tmp_path)
    prompt = [3, 4, 5]
    c = asyncio.run(eng.generate(prompt, SamplingParams(temperature=temperature, max_tokens=6)))
    t = temperature or 1.0  # greedy logprobs are at T = 1, as the trainer's
    assert c.token_ids.tolist() == _script(prompt, 6) and c.finish_reason == "length"
    assert c.logprobs.dtype == np.float32
    np.testing.assert_allclose(c.logprobs, [-0.25 * (k + 1) / t for k in range(6)], rtol=1e-6)
    assert (
        c.versions.tolist() == [0] * 6
        and c.prompt_len == 3
        and c.ttft_s >= 0
        and c.latency_s >= c.ttft_s
    )
    assert c.text == "".join(f"<{i}>" for i in _script(prompt, 6))


def test_finish_reasons_and_stop_reasons(standin, tmp_path):
    eng, core = _engine(tmp_path)
    prompt = [10]
    ids = _script(prompt, 8)

    async def main():
        by_id = await eng.generate(prompt, SamplingParams(max_tokens=8, stop_token_ids=(ids[2],)))
        by_str = await eng.generate(prompt, SamplingParams(max_tokens=8, stop=(f"<{ids[3]}>",)))
        core.finish_override = "error"
        with pytest.raises(
            EngineError,
            match=r"vLLM finish_reason: expected stop / length / abort, received 'error'",
        ):
            await eng.generate(prompt, SamplingParams(max_tokens=8))
        return by_id, by_str

    by_id, by_str = asyncio.run(main())
    assert (
        by_id.finish_reason == "stop"
        and by_id.stop_reason == ids[2]
        and by_id.token_ids.tolist() == ids[:3]
    )
    assert (
        by_str.finish_reason == "stop"
        and by_str.stop_reason == f"<{ids[3]}>"
        and by_str.num_tokens == 4
    )


def test_cached_prompt_len_comes_from_vllm_prefix_cache(standin, tmp_path):
    eng, _ = _engine(tmp_path)

    async def main():
        await eng.generate([1, 2, 3], SamplingParams(max_tokens=2))
        return await eng.generate(
            [1, 2, 3, 4, 5], SamplingParams(max_tokens=2), session_id="traj-1"
        )

    assert asyncio.run(main()).cached_prompt_len == 3


def test_generate_n_seeds_each_sample(standin, tmp_path):
    eng, core = _engine(tmp_path)
    cs = asyncio.run(eng.generate_n([1, 2], SamplingParams(n=3, seed=7, max_tokens=2)))
    assert len(cs) == 3 and sorted(sp.seed for _, sp, _ in core.received) == [7, 8, 9]
    assert all(sp.n == 1 for _, sp, _ in core.received)


def test_weight_update_mid_request_versions_follow_the_weights(standin, tmp_path):
    eng, core = _engine(tmp_path)
    prompt = [2, 3]

    async def main():
        # ends at the first token of the new weights (the toy's ids 100..149), however slow the machine
        params = SamplingParams(max_tokens=100_000, stop_token_ids=tuple(range(100, 150)))
        gen = asyncio.create_task(eng.generate(prompt, params))
        await asyncio.sleep(20 * vllm_standin.STEP_S)
        await eng.update_weights(_new_weights(1.0), version=1)  # same thread: a task on the loop
        return await gen

    c = asyncio.run(main())
    v = c.versions.tolist()
    assert c.finish_reason == "stop" and c.num_tokens > 1  # kept through the swap, not aborted
    assert v == sorted(v) and v[0] == 0 and v[-1] == 1 and eng.version == 1
    # each token's version is that of the weights that produced it (the toy adds 100 * w to its ids)
    assert [int(t >= 100) for t in c.token_ids] == v
    methods = [m for m, _ in core.calls]
    assert methods == ["pause_generation", "collective_rpc", "resume_generation"]
    assert core.calls[0][1] == {"mode": "keep", "clear_cache": True}
    assert core.calls[1][1]["method"] == "gymllm_load_weights"
    assert os.listdir(tmp_path) == []  # the transient weight file is removed


def test_weights_reach_every_worker_exactly(standin, tmp_path):
    import torch

    eng, core = _engine(tmp_path, tensor_parallel_size=2)
    new = _new_weights(3.0)

    async def main():
        await eng.generate([1], SamplingParams(max_tokens=1))
        await eng.aupdate_weights(new, version=4)

    asyncio.run(main())
    for worker in core.workers:
        (got,) = worker.model_runner.model.received
        assert set(got) == set(new)
        for name, arr in new.items():
            assert (
                got[name].dtype
                == {jnp.float32: torch.float32, jnp.bfloat16: torch.bfloat16}[arr.dtype.type]
            )
            np.testing.assert_array_equal(
                got[name].float().numpy(), np.asarray(arr, dtype=np.float32)
            )
    assert eng.version == 4


def test_weight_update_from_another_thread(standin, tmp_path):
    eng, core = _engine(tmp_path)

    async def main():
        gen = asyncio.create_task(
            eng.generate(
                [4], SamplingParams(max_tokens=100_000, stop_token_ids=tuple(range(200, 250)))
            )
        )
        await asyncio.sleep(10 * vllm_standin.STEP_S)
        loop = asyncio.get_running_loop()
        fut = await loop.run_in_executor(None, lambda: eng.update_weights(_new_weights(2.0), 7))
        await asyncio.wrap_future(fut)  # a concurrent future when called off the loop's thread
        return await gen

    c = asyncio.run(main())
    assert eng.version == 7 and c.versions.tolist()[-1] == 7 and c.token_ids[-1] >= 200


def test_older_pause_api_drains_instead_of_aborting(monkeypatch, tmp_path):
    pytest.importorskip("torch")
    vllm_standin.install(monkeypatch, vllm_standin.LegacyAsyncLLM)
    eng, core = _engine(tmp_path)

    async def main():
        gen = asyncio.create_task(eng.generate([1], SamplingParams(max_tokens=15)))
        await asyncio.sleep(3 * vllm_standin.STEP_S)
        await eng.update_weights(_new_weights(1.0), version=1)
        return await gen

    c = asyncio.run(main())
    assert (
        c.finish_reason == "length" and c.versions.tolist() == [0] * 15
    )  # drained under the old weights
    assert [m for m, _ in core.calls] == [
        "pause_generation",
        "collective_rpc",
        "reset_prefix_cache",
        "resume_generation",
    ]
    assert core.calls[0][1]["mode"] == "wait"


def test_bad_weights_are_a_clear_error_and_generation_resumes(standin, tmp_path):
    eng, core = _engine(tmp_path)

    async def main():
        with pytest.raises(
            EngineError, match=r"update_weights: expected weights every vLLM worker loads.*KeyError"
        ):
            await eng.aupdate_weights({"no.such.weight": jnp.zeros(2)}, version=1)
        with pytest.raises(
            EngineError, match=r"update_weights\(state\): expected a non-empty mapping"
        ):
            await eng.aupdate_weights({}, version=1)
        return await eng.generate([1], SamplingParams(max_tokens=2))

    c = asyncio.run(main())
    assert c.num_tokens == 2 and eng.version == 0 and core.calls[-1][0] == "resume_generation"
    assert os.listdir(tmp_path) == []


def test_cancellation_aborts_the_request(standin, tmp_path):
    eng, core = _engine(tmp_path)

    async def main():
        gen = asyncio.create_task(eng.generate([1, 2], SamplingParams(max_tokens=10_000)))
        await asyncio.sleep(5 * vllm_standin.STEP_S)
        gen.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gen
        await asyncio.sleep(3 * vllm_standin.STEP_S)

    asyncio.run(main())
    ((_, _, rid),) = core.received
    assert rid in core.aborted and core.requests == {}  # the engine stopped decoding it


def test_request_errors_are_clear(standin, tmp_path):
    eng, _ = _engine(tmp_path)

    async def main():
        with pytest.raises(EngineError, match=r"prompt_ids: expected at least one token id"):
            await eng.generate([], SamplingParams())
        with pytest.raises(
            EngineError, match=r"SamplingParams.n: expected 1 for generate.*generate_n"
        ):
            await eng.generate([1], SamplingParams(n=2))
        await eng.close()
        with pytest.raises(EngineError, match=r"generate: expected an open engine"):
            await eng.generate([1], SamplingParams())

    asyncio.run(main())
    assert ("shutdown", {}) in eng._engine.calls


def test_missing_logprobs_are_a_clear_error():
    from gymllm.inference.vllm_engine import _sampled_logprobs

    lp = vllm_standin.Logprob
    assert _sampled_logprobs([4, 9], [{7: lp(-0.1), 4: lp(-1.5)}, {9: lp(-0.2)}]) == [-1.5, -0.2]
    with pytest.raises(
        EngineError, match=r"vLLM output logprobs: expected one \{token_id: Logprob\}"
    ):
        _sampled_logprobs([4, 9], None)
    with pytest.raises(EngineError, match=r"holding that token"):
        _sampled_logprobs([4], [{7: lp(-0.1)}])


# ------------------------------------------------------------------ the real vLLM (GPU only)
def _gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def _real_vllm() -> bool:
    return HAS_VLLM and not getattr(sys.modules.get("vllm"), "__standin__", False)


@pytest.mark.gpu
@pytest.mark.skipif(not (_real_vllm() and _gpu()), reason="needs vLLM and a GPU")
def test_vllm_engine_generates_token_ids_and_logprobs(tmp_path):  # pragma: no cover - GPU only
    from gymllm.inference import VllmEngine
    from gymllm.inference.vllm_engine import hf_weights
    from gymllm.models import make_tiny
    from gymllm.models.hf_io import save_hf_dir

    tiny = make_tiny("llama")
    save_hf_dir(tiny, tmp_path / "model")  # a real Hugging Face directory vLLM can load
    eng = VllmEngine(
        str(tmp_path / "model"),
        gpu_memory_utilization=0.2,
        enforce_eager=True,
        weight_dir=str(tmp_path),
    )

    async def main():
        c = await eng.generate([1, 2, 3], SamplingParams(temperature=0.0, max_tokens=5))
        gen = asyncio.create_task(
            eng.generate([1, 2, 3], SamplingParams(temperature=1.0, max_tokens=64))
        )
        await asyncio.sleep(0.05)
        await eng.update_weights(hf_weights(tiny), version=1)
        mid = await gen
        await eng.close()
        return c, mid

    c, mid = asyncio.run(main())
    assert c.num_tokens == 5 and np.all(np.isfinite(c.logprobs)) and set(c.versions.tolist()) == {0}
    assert mid.num_tokens == 64 and mid.finish_reason == "length"
    assert mid.versions.tolist() == sorted(mid.versions.tolist()) and mid.versions[-1] == 1
