"""Multi-LoRA serving: one :class:`~gymllm.inference.jax_engine.JaxEngine` holds the frozen base weights
and a stack of named LoRA adapters, and each request names its adapter (as vLLM/punica and S-LoRA serve
many adapters over one base).

    engine = JaxEngine(model, tok, config=EngineConfig(...),
                       adapters=AdapterConfig(lora=LoRAConfig(rank=8), names=("a", "b")))
    await engine.generate(prompt_ids, params, adapter="a")      # or engine.for_adapter("a").generate(...)
    engine.update_adapter("a", {"layers.wq.lora_a": A, "layers.wq.lora_b": B, ...}, version=3)

* :class:`AdapterConfig` (frozen, keyword-only): the adapters' :class:`~gymllm.models.lora.LoRAConfig`
  (rank, alpha, targets) and their names.
* :class:`AdapterStore` (the engine's, next to its weights): stacks ``layers.<t>.lora_a`` [L, N+1, in, r]
  and ``layers.<t>.lora_b`` [L, N+1, r, out] (``alpha / r`` folded into B) in the engine's weight dtype;
  stack index 0 is the zero adapter (a request naming no adapter: the base model), index k the k-th
  name. Every adapter starts as zeros (the base model) at the engine's version and has its own version;
  :meth:`AdapterStore.submit` parks an update that the engine thread applies between two device steps
  (:meth:`AdapterStore.apply`), so no forward mixes versions of one adapter, and every token records
  the version of its own row's adapter.
* Each device step passes the stacks and a per-row adapter index to the forwards
  (:func:`gymllm.models.blocks.project`: every adapter's delta computed, masked per row), so rows of
  different adapters decode in the same step and the compiled shapes do not multiply per adapter.
* A row's cached prefix is reused only by a request of the same adapter at the same adapter and base
  versions (:meth:`AdapterStore.kv_tag`).
* :class:`AdapterView` (``engine.for_adapter(name)``): the Engine protocol (generate, generate_n,
  stream, version, end_session, update_weights, close) over one adapter of a shared engine, so rollout
  code that takes "an engine" works unchanged.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Sequence

import jax
import numpy as np

from gymllm.errors import EngineError
from gymllm.models.lora import LoRAConfig, MergedWeights, adapter_keys
from gymllm.validation import require

BASE = 0  # the stack index of the zero adapter: the base model


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdapterConfig:
    """The adapters one engine serves: ``lora`` (rank > 0, alpha, targets: every adapter's shape) and
    ``names`` (distinct non-empty strings; stack index k + 1 is ``names[k]``)."""

    lora: LoRAConfig
    names: tuple[str, ...]

    def __post_init__(self) -> None:
        require(
            isinstance(self.lora, LoRAConfig) and self.lora.enabled,
            "AdapterConfig.lora",
            expected="a LoRAConfig with rank > 0",
            received=self.lora,
            fix="e.g. LoRAConfig(rank=8)",
        )
        names = tuple(self.names) if isinstance(self.names, (list, tuple)) else ()
        require(
            bool(names)
            and all(isinstance(n, str) and n for n in names)
            and len(set(names)) == len(names),
            "AdapterConfig.names",
            expected="distinct non-empty adapter names",
            received=self.names,
            fix='e.g. names=("a", "b")',
        )
        object.__setattr__(self, "names", names)


@jax.jit
def write_slot(
    stacks: dict[str, jax.Array], arrays: dict[str, jax.Array], k: jax.Array
) -> dict[str, jax.Array]:
    """``stacks`` with slot ``k`` (axis 1) of each replaced by ``arrays[key]`` ([L, ...]); one program for
    every slot (``k`` traced)."""
    return {
        key: jax.lax.dynamic_update_index_in_dim(v, arrays[key].astype(v.dtype)[:, None], k, 1)
        for key, v in stacks.items()
    }


class AdapterStore:
    """The engine's adapter stacks, their versions and the pending updates (see the module docstring).

    ``base``: the engine's flat weights (shapes and dtype of the adapted projections); ``version``:
    every adapter's first version; ``cv``: the engine's condition (guards ``pending``, wakes the loop)."""

    def __init__(
        self, config: AdapterConfig, base: dict[str, Any], version: int, *, cv: threading.Condition
    ):
        self.config, self.cv = config, cv
        self.index = {name: k + 1 for k, name in enumerate(config.names)}
        n, r = len(config.names) + 1, config.lora.rank
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.stacks: dict[str, jax.Array] = {}
        for t in config.lora.targets:
            w = base[f"layers.{t}"]
            layers, d_in, d_out = w.shape
            self.shapes[f"layers.{t}.lora_a"] = (layers, d_in, r)
            self.shapes[f"layers.{t}.lora_b"] = (layers, r, d_out)
            self.stacks[f"layers.{t}.lora_a"] = jax.numpy.asarray(
                np.zeros((layers, n, d_in, r), w.dtype)
            )
            self.stacks[f"layers.{t}.lora_b"] = jax.numpy.asarray(
                np.zeros((layers, n, r, d_out), w.dtype)
            )
        self.versions = [int(version)] * n
        self.pending: dict[
            int, tuple[dict[str, jax.Array], int]
        ] = {}  # stack index -> (arrays, version)

    @property
    def names(self) -> tuple[str, ...]:
        return self.config.names

    def resolve(self, name: str | None) -> int:
        """The stack index of adapter ``name`` (None: the base model, 0); raises :class:`EngineError`."""
        if name is None:
            return BASE
        k = self.index.get(name) if isinstance(name, str) else None
        require(
            k is not None,
            "adapter",
            expected=f"one of this engine's adapters {list(self.names)} (or None "
            "for the base model)",
            received=name,
            fix="name an adapter of the engine's AdapterConfig",
            error=EngineError,
        )
        return k

    def latest_version(self, name: str) -> int:
        """Adapter ``name``'s version that its tokens sampled from now on carry (a pending update counts)."""
        k = self.resolve(name)
        with self.cv:
            return self.pending[k][1] if k in self.pending else self.versions[k]

    def submit(self, name: str, adapters: Any, version: int) -> None:
        """Check ``adapters`` (``{"layers.<t>.lora_a": [L, in, r], "layers.<t>.lora_b": [L, r, out]}`` of
        this store's LoRAConfig, or :class:`~gymllm.models.lora.MergedWeights`, whose adapters are taken),
        scale B by ``alpha / r``, convert to the stacks' dtype and park it for the engine thread."""
        k = self.resolve(name)
        require(
            name is not None,
            "update_adapter(name)",
            expected=f"one of {list(self.names)}",
            received=None,
            fix="update the base weights with update_weights(state, version)",
            error=EngineError,
        )
        if isinstance(adapters, MergedWeights):
            adapters = adapters.adapters
        got = (
            {key: tuple(np.shape(v)) for key, v in dict(adapters).items()}
            if hasattr(adapters, "items")
            else adapters
        )
        require(
            got == self.shapes,
            f"update_adapter({name!r}, adapters)",
            expected=f"exactly {self.shapes}",
            received=got if isinstance(got, dict) else type(adapters).__name__,
            fix="push the learner's adapters of the engine's LoRAConfig",
            error=EngineError,
        )
        lora = self.config.lora
        scale = np.float32(lora.alpha / lora.rank)
        arrays = {}
        for key in adapter_keys(lora):  # on the host: no compile per array shape
            x = np.asarray(adapters[key], np.float32)
            x = x * scale if key.endswith("lora_b") else x
            dtype = np.dtype(self.stacks[key].dtype)  # uint16 storage holds bfloat16 bit patterns
            arrays[key] = (
                x.astype(jax.numpy.bfloat16).view(np.uint16)
                if dtype == np.uint16
                else x.astype(dtype)
            )
        with self.cv:
            self.pending[k] = (arrays, int(version))
            self.cv.notify_all()

    def apply(self) -> bool:
        """(Engine thread, between device steps.) Write the pending adapters into their stack slots; an
        update stays pending (its version the one callers read) until its weights are in place."""
        with self.cv:
            pending = dict(self.pending)
        if not pending:
            return False
        stacks = self.stacks
        for k, (arrays, _) in pending.items():
            stacks = write_slot(stacks, arrays, np.int32(k))
        with self.cv:
            self.stacks = stacks
            for k, item in pending.items():
                self.versions[k] = item[1]
                if self.pending.get(k) is item:  # not replaced by a newer update meanwhile
                    del self.pending[k]
        return True

    def version_of(self, k: int, base_version: int) -> int:
        """The version a token of a row of stack index ``k`` records (the base's for index 0)."""
        return base_version if k == BASE else self.versions[k]

    def kv_tag(self, k: int, base_version: int) -> tuple[int, int, int]:
        """What a row's k/v were computed under: (adapter, its version, the base version). A cached prefix
        is reused only under an equal tag."""
        return (k, self.version_of(k, base_version), base_version)


def require_store(store: AdapterStore | None, what: str) -> AdapterStore:
    """``store``, or an :class:`EngineError` saying that ``JaxEngine.<what>`` needs an engine built with adapters."""
    require(
        store is not None,
        f"JaxEngine.{what}",
        expected="an engine built with adapters=AdapterConfig(...)",
        received="an engine without adapters",
        fix="build JaxEngine(..., adapters=AdapterConfig(lora=LoRAConfig(rank=...), names=(...)))",
        error=EngineError,
    )
    return store


class AdapterView:
    """One adapter of a shared engine as an Engine of its own (see the module docstring): requests
    go to ``engine`` with ``adapter=name``; ``version`` is that adapter's; ``update_weights`` takes
    that adapter's LoRA arrays (or :class:`~gymllm.models.lora.MergedWeights`); ``close`` leaves the
    shared engine to its owner."""

    def __init__(self, engine: Any, name: str):
        require_store(engine.adapters, "for_adapter(name)").resolve(
            name
        )  # an unknown name fails here, clearly
        self.engine, self.name = engine, name

    @property
    def version(self) -> int:
        """This adapter's version, which its tokens sampled from now on carry (a pending update counts)."""
        return self.engine.adapters.latest_version(self.name)

    @property
    def max_len(self) -> int:
        return self.engine.max_len

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def serving(self) -> bool:
        return self.engine.serving

    async def generate(
        self, prompt_ids: Sequence[int], params: Any = None, *, session_id: str | None = None
    ) -> Any:
        return await self.engine.generate(
            prompt_ids, params, session_id=session_id, adapter=self.name
        )

    async def generate_n(self, prompt_ids: Sequence[int], params: Any) -> list[Any]:
        return await self.engine.generate_n(prompt_ids, params, adapter=self.name)

    async def stream(
        self, prompt_ids: Sequence[int], params: Any = None, *, session_id: str | None = None
    ):
        async for item in self.engine.stream(
            prompt_ids, params, session_id=session_id, adapter=self.name
        ):
            yield item

    def end_session(self, session_id: str) -> None:
        self.engine.end_session(session_id)

    def update_weights(self, adapters: Any, version: int) -> None:
        """Swap in this adapter's new arrays at ``version`` (between two device steps)."""
        self.engine.update_adapter(self.name, adapters, version)

    async def close(self) -> None:
        """Nothing: the shared engine is closed by its owner."""

    def __repr__(self) -> str:
        return f"AdapterView({self.name!r} of {type(self.engine).__name__})"
