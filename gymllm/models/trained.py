"""The trained weights of a gymllm run directory (``gymllm train`` / ``gymllm sft``), read back.

A run directory holds ``config.json`` (the run's config; its ``model`` section names the base model,
its ``lora`` section the adapters' settings) and ``checkpoints/<step>/`` (Orbax; ``state/trainable``
holds the trained arrays: full weights, or the LoRA adapters ``layers.<t>.lora_a`` / ``lora_b``).

Several policies
----------------
A run with ``--multiagent.policies`` saves every policy's state under its name
(``state/policies/<name>/trainable``: a LoRA adapter on the shared base, or full weights with
``--multiagent.policy-weights full``). One policy of it is named ``DIR#NAME`` (the run directory,
``#``, the policy name: letters, digits, ``_`` and ``-``, as the policy map allows) wherever a
checkpoint is named: ``gymllm eval env ENV --model.checkpoint DIR#a``, ``--multiagent.opponent run:DIR#a``,
``gymllm eval game GAME --model.checkpoint DIR#a``, ``models.load("DIR#a")``. A path that exists as written
is never split, so a directory whose name holds a ``#`` still loads as itself. Loading a bare ``DIR``
of several policies as one raises a :class:`~gymllm.errors.ConfigError` that lists the ``DIR#NAME``
forms; ``#NAME`` on a one-policy checkpoint, or a name the checkpoint does not hold, says so too.
``gymllm eval game GAME --model.checkpoint DIR`` enters every policy as its own player
(:func:`policy_refs`).

* :func:`checkpoint_dir`: the Orbax directory of a run directory (or the directory itself);
* :func:`restore_trained`: the trained arrays of the latest (or a given) step; no optimizer state;
* :func:`apply_trained`: a model with those weights (adapters merged onto the model's own weights:
  ``W + (alpha / rank) A @ B``, the training's own merge);
* :func:`run_model_section`: the run's ``model`` section (to rebuild its base model);
* :func:`split_policy` / :func:`checkpoint_policies` / :func:`policy_refs`: the ``DIR#NAME`` form,
  the policies a checkpoint holds, and one reference per policy;
* :func:`holds_adapters`: whether the weights are LoRA adapters (then they sit on the run's base).

:func:`gymllm.models.load` is the entry point that uses them; ``gymllm.algos.checkpoint`` re-exports
the first three names (the training side writes these checkpoints).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
from typing import Any, Mapping

from gymllm.errors import ConfigError
from gymllm.telemetry import span

__all__ = [
    "checkpoint_dir",
    "restore_trained",
    "apply_trained",
    "run_config",
    "run_model_section",
    "is_run_dir",
    "split_policy",
    "checkpoint_policies",
    "policy_refs",
    "holds_adapters",
    "POLICY_SEP",
]

#: between a run directory and one of its policies: ``runs/ttt#a``
POLICY_SEP = "#"
_POLICY_NAME = re.compile(r"^[A-Za-z0-9_-]+$")  # the names gymllm.rollout.policy_map allows


def split_policy(path: str | os.PathLike) -> tuple[str, str | None]:
    """``DIR#NAME`` -> ``(DIR, NAME)``; anything else -> ``(path, None)``. Split at the last ``#`` only
    when what follows is a policy name and ``path`` does not exist as written (module docstring)."""
    text = os.fspath(path)
    head, sep, name = text.rpartition(POLICY_SEP)
    if (
        not sep
        or not head
        or not _POLICY_NAME.match(name)
        or os.path.exists(os.path.expanduser(text))
    ):
        return text, None
    return head, name


def checkpoint_dir(path: str | os.PathLike) -> pathlib.Path:
    """The Orbax checkpoints directory of ``path``: a run directory (``RUN/checkpoints``) or the
    checkpoints directory itself (a ``DIR#NAME`` policy reference: ``DIR``'s). Raises
    :class:`FileNotFoundError` saying what was looked for."""
    p = pathlib.Path(split_policy(path)[0]).resolve()
    for cand in (p / "checkpoints", p):
        if cand.is_dir() and any(c.name.isdigit() for c in cand.iterdir()):
            return cand
    raise FileNotFoundError(
        f"checkpoint: expected a run directory written by `gymllm train` (with checkpoints/<step>/) "
        f"or its checkpoints directory, received {str(p)!r} (no numbered step directory there). "
        "Fix: pass --run-dir of a run that saved a checkpoint (it saves one at its end)"
    )


def run_config(path: str | os.PathLike) -> dict[str, Any]:
    """The run's ``config.json`` (of ``path`` or, for a checkpoints directory, of its parent; of ``DIR``
    for ``DIR#NAME``); {} if none."""
    p = pathlib.Path(split_policy(path)[0])
    for cand in (p / "config.json", p.parent / "config.json"):
        if cand.is_file():
            data = json.loads(cand.read_text())
            return data if isinstance(data, dict) else {}
    return {}


def run_model_section(path: str | os.PathLike) -> dict[str, Any]:
    """The ``model`` section of the run's config (``name``, tiny sizes, ``checkpoint``); {} if none."""
    section = run_config(path).get("model", {})
    return dict(section) if isinstance(section, Mapping) else {}


def is_run_dir(path: str | os.PathLike) -> bool:
    """A gymllm run directory (or its checkpoints directory): numbered Orbax steps, and a run config
    with a ``model`` section (a Hugging Face ``config.json`` has none)."""
    try:
        checkpoint_dir(path)
    except FileNotFoundError:
        return False
    return bool(run_model_section(path).get("name"))


def _latest(manager: Any, directory: pathlib.Path, step: int | None) -> int:
    step = manager.latest_step() if step is None else int(step)
    if step is None:
        raise FileNotFoundError(f"checkpoint {directory}: expected a saved step, received none")
    return int(step)


def checkpoint_policies(path: str | os.PathLike, *, step: int | None = None) -> list[str]:
    """The policy names a checkpoint of several policies holds (a ``--multiagent.policies`` run), in
    the run's order; ``[]`` for a checkpoint of one policy. Reads the step's JSON metadata only (the
    arrays are not loaded), else the arrays' tree structure."""
    import orbax.checkpoint as ocp

    directory = checkpoint_dir(path)
    manager = ocp.CheckpointManager(directory)
    try:
        step = _latest(manager, directory, step)
        if (
            directory / str(step) / "meta"
        ).exists():  # what a run saves: its bookkeeping names the policies
            meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))[
                "meta"
            ]
            return list(meta.get("policies") or {})
    finally:
        manager.close()
    manager = ocp.CheckpointManager(
        directory, item_handlers={"state": ocp.StandardCheckpointHandler()}
    )
    try:
        tree = manager.item_metadata(step)["state"]
    finally:
        manager.close()
    tree = getattr(tree, "tree", tree)
    return (
        list(tree.get("policies") or {})
        if isinstance(tree, Mapping) and "trainable" not in tree
        else []
    )


def policy_refs(path: str | os.PathLike, *, step: int | None = None) -> list[str]:
    """``["DIR#a", "DIR#b"]`` for a checkpoint of several policies named without one, else ``[path]``
    (a one-policy checkpoint, a ``DIR#NAME`` already naming one, or a path with no checkpoint)."""
    text = os.fspath(path)
    if split_policy(text)[1] is not None:
        return [text]
    try:
        names = checkpoint_policies(text, step=step)
    except FileNotFoundError:  # nothing saved there: loading it says what is missing
        names = []
    return [f"{text}{POLICY_SEP}{name}" for name in names] or [text]


def _pick_policy(
    state: Mapping[str, Any], directory: pathlib.Path, path: str | os.PathLike, name: str | None
) -> Mapping[str, Any]:
    """The ``trainable`` arrays of ``state`` for policy ``name`` (None: the one policy), else a
    ConfigError that says which references would load."""
    run = split_policy(path)[0]
    if (
        "policies" in state and "trainable" not in state
    ):  # a --multiagent.policies run: one state per policy
        names = list(state["policies"])
        forms = ", ".join(f"{run}{POLICY_SEP}{n}" for n in names)
        if name is None:
            raise ConfigError(
                f"checkpoint {directory}: expected one policy's weights (state/trainable), received a "
                f"run of several policies ({', '.join(sorted(names))}). Fix: name one of them: {forms} "
                f"(e.g. gymllm eval env ENV --model.checkpoint {run}{POLICY_SEP}{names[0]}, --multiagent.opponent "
                f"run:{run}{POLICY_SEP}{names[0]}); gymllm eval game GAME --model.checkpoint {run} rates them all"
            )
        if name not in state["policies"]:
            raise ConfigError(
                f"checkpoint {directory}: expected a policy it holds after '{POLICY_SEP}', received "
                f"{name!r}; it holds {', '.join(names)}. Fix: use one of {forms}"
            )
        return state["policies"][name]["trainable"]
    if name is not None:
        raise ConfigError(
            f"checkpoint {directory}: expected no '{POLICY_SEP}{name}' (a policy name picks one policy of "
            f"a --multiagent.policies run), received a checkpoint of one policy. Fix: name it as {run}"
        )
    return state["trainable"]


def restore_trained(
    path: str | os.PathLike, *, step: int | None = None
) -> tuple[dict[str, Any], int]:
    """The trained arrays (``{"layers.wq": ...}``: full weights, or LoRA adapters) of the latest
    checkpoint under ``path`` (or of ``step``) and its step; the optimizer state is not loaded.
    ``path`` ``DIR#NAME`` picks policy ``NAME`` of a several-policy run (module docstring); a
    ConfigError names the fix for a bare several-policy ``DIR``, an unknown name, or a name on a
    one-policy checkpoint."""
    import orbax.checkpoint as ocp

    directory = checkpoint_dir(path)
    manager = ocp.CheckpointManager(directory)
    try:
        step = _latest(manager, directory, step)
        with span("checkpoint_restore", track="trainer", step=step):
            out = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
    finally:
        manager.close()
    return dict(_pick_policy(out["state"], directory, path, split_policy(path)[1])), int(step)


def holds_adapters(path: str | os.PathLike) -> bool:
    """Whether the run's trained weights are LoRA adapters (merged onto its base model, which must then
    be the weights the run started from): ``lora.rank`` > 0, or, for a ``--multiagent.policies`` run,
    ``multiagent.policy_weights`` ``lora`` (its default)."""
    conf = run_config(path)
    multi = conf.get("multiagent") or {}
    if isinstance(multi, Mapping) and multi.get("policies"):
        return multi.get("policy_weights", "lora") != "full"
    return int((conf.get("lora") or {}).get("rank", 0) or 0) > 0


def _lora_settings(path: str | os.PathLike, lora: Any) -> tuple[int, float, tuple[str, ...]]:
    """(rank, alpha, targets) of ``lora`` (an object with those fields, e.g. ``LoRAConfig``, or a
    mapping), else of the run's ``config.json`` ``lora`` section; rank 0: no adapters."""
    if lora is None:
        lora = run_config(path).get("lora", {})
    get = lora.get if isinstance(lora, Mapping) else (lambda k, d=None: getattr(lora, k, d))
    return int(get("rank", 0) or 0), float(get("alpha", 16.0)), tuple(get("targets", ("wq", "wv")))


def apply_trained(
    model: Any, path: str | os.PathLike, *, lora: Any = None, step: int | None = None
) -> Any:
    """A model of ``model``'s architecture with the trained weights of the checkpoint at ``path`` (a run
    directory or its checkpoints directory). ``lora`` (a ``LoRAConfig`` or a mapping with rank, alpha,
    targets; read from the run's ``config.json`` when None) merges adapter checkpoints onto ``model``'s
    own weights, which must be the base weights the run started from."""
    import jax.numpy as jnp

    from gymllm.models.transformer import Transformer

    trained, step = restore_trained(path, step=step)
    rank, alpha, targets = _lora_settings(path, lora)
    adapters = sorted(k[len("layers.") : -len(".lora_a")] for k in trained if k.endswith(".lora_a"))
    if (
        lora is None and split_policy(path)[1] is not None
    ):  # a policy's adapters: their own rank and targets
        rank = int(trained[f"layers.{adapters[0]}.lora_a"].shape[-1]) if adapters else 0
        targets = tuple(adapters)
    base = model.flat_params()
    flat = {k: jnp.asarray(v) for k, v in trained.items()}
    if rank > 0:  # the training's own merge: W + (alpha / r) A @ B on the targets
        from gymllm.models.lora import LoRAConfig, merge

        flat = dict(merge(LoRAConfig(rank=rank, alpha=alpha, targets=targets), base, flat))
    missing, extra = sorted(set(base) - set(flat)), sorted(set(flat) - set(base))
    if missing or extra:
        raise ValueError(
            f"checkpoint {str(path)!r} at step {step}: expected the weights of this model "
            f"({len(base)} arrays), received {len(flat)} (missing {missing[:3]}, unexpected {extra[:3]}). "
            "Fix: evaluate with the model the run trained (gymllm eval env ENV --model.checkpoint RUN reads it from "
            "RUN/config.json when --model is not given)"
        )
    for k, v in flat.items():
        if tuple(v.shape) != tuple(base[k].shape):
            raise ValueError(
                f"checkpoint {str(path)!r}: expected {k} of shape {tuple(base[k].shape)}, received "
                f"{tuple(v.shape)}. Fix: evaluate with the model the run trained"
            )
    return Transformer(model.config, params={k: v.astype(base[k].dtype) for k, v in flat.items()})
