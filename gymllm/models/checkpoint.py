"""Between external tensors (Hugging Face or GGUF names, [out, in] layout) and gymllm's flat params.

:func:`assemble_params` checks a checkpoint against the family's weight-name table and raises one
``ModelLoadError`` naming every missing, unexpected and wrongly shaped tensor;
:func:`external_tensors` is its inverse (used by the writers).
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from gymllm.errors import ModelLoadError
from gymllm.validation import require
from gymllm.models.config import ModelConfig
from gymllm.models.transformer import param_shapes
from gymllm.models.weight_names import IGNORED_SUFFIXES, expand

Fix = Callable[[str, int | None, np.ndarray], np.ndarray]  # (our_name, layer, array) -> array


def assemble_params(
    cfg: ModelConfig,
    get: Callable[[str], np.ndarray],
    names: list[str],
    fmt: str,
    *,
    source: str = "",
    fix: Fix | None = None,
) -> dict[str, np.ndarray]:
    """Flat gymllm params from external tensors ``get(name)`` for ``names`` in format ``fmt``."""
    table = expand(cfg, fmt)
    tied_head = {"lm_head.weight", "output.weight"} if cfg.tie_word_embeddings else set()
    present = [n for n in names if not n.endswith(IGNORED_SUFFIXES) and n not in tied_head]
    unexpected = sorted(n for n in present if n not in table)
    missing = sorted(set(table) - set(present))
    require(
        not missing and not unexpected,
        f"checkpoint {source or ''} for family {cfg.family!r}".strip(),
        expected=f"the {len(table)} tensors of the {cfg.family} weight table",
        received={
            "missing": missing[:20],
            "unexpected": unexpected[:20],
            "n_missing": len(missing),
            "n_unexpected": len(unexpected),
        },
        fix="check the config matches the weights (family, layer count, tied embeddings); "
        "see gymllm.models.weight_names for the expected names",
        error=ModelLoadError,
    )
    shapes = param_shapes(cfg)
    layers: dict[str, list] = {
        n: [None] * cfg.num_layers for n in shapes if n.startswith("layers.")
    }
    out: dict[str, np.ndarray] = {}
    wrong: dict[str, tuple] = {}
    for ext, (ours, layer, transpose) in table.items():
        arr = np.asarray(get(ext))
        if fix is not None:
            arr = fix(ours, layer, arr)
        if transpose:
            arr = arr.T
        want = shapes[ours][1:] if layer is not None else shapes[ours]
        if tuple(arr.shape) != tuple(want):
            wrong[ext] = (tuple(arr.shape), tuple(want))
            continue
        if layer is None:
            out[ours] = arr
        else:
            layers[ours][layer] = arr
    require(
        not wrong,
        f"checkpoint {source}".strip(),
        expected="tensor shapes matching the config",
        received={"wrong_shape (got, want)": dict(list(wrong.items())[:20])},
        fix="check hidden/intermediate sizes, head counts and head_dim in the config",
        error=ModelLoadError,
    )
    out.update({n: np.stack(v) for n, v in layers.items()})
    return out


def external_tensors(
    cfg: ModelConfig, params: Mapping[str, np.ndarray], fmt: str, *, fix: Fix | None = None
) -> dict[str, np.ndarray]:
    """External-name tensors (``[out, in]`` layout) from flat gymllm params."""
    out = {}
    for ext, (ours, layer, transpose) in expand(cfg, fmt).items():
        arr = np.asarray(params[ours] if layer is None else params[ours][layer])
        if transpose:
            arr = arr.T
        if fix is not None:
            arr = fix(ours, layer, arr)
        out[ext] = np.ascontiguousarray(arr)
    return out
