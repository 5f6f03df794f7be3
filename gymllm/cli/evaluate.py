"""``gymllm eval``: pass@k and mean reward of a model on registered envs, over held-out seeds.

Each held-out seed is one group of k samples (the same env seed, distinct sampling seeds) run by
the rollout orchestrator over the embedded engine, so evaluation uses exactly the training path.
pass@1 is the mean success rate; pass@k the fraction of seeds with at least one success
(success: reward >= ``success_threshold``).
"""

from __future__ import annotations

import asyncio
from typing import Any, Sequence

import numpy as np

#: the default suite: small, verifiable, offline tasks of several kinds
SUITE = ("gymllm/Arithmetic-v0", "gymllm/Countdown-v0", "gymllm/MathWord-v0", "gymllm/CalcMath-v0",
         "gymllm/FrozenLake-v0")


DEFAULT_MODEL = "smollm2-135m-instruct"


def run_config(checkpoint: str | None) -> dict[str, Any]:
    """The ``config.json`` a ``gymllm train`` run directory holds (``{}`` for anything else)."""
    import json
    import pathlib

    conf = pathlib.Path(checkpoint) / "config.json" if checkpoint else None
    return json.loads(conf.read_text()) if conf is not None and conf.is_file() else {}


def load_model(name: str | None, *, checkpoint: str | None = None) -> Any:
    """``tiny-<family>`` builds a random tiny model; anything else goes to ``gymllm.models.load``.
    ``checkpoint`` (a run directory or checkpoint written by ``gymllm train``) replaces the weights; with
    ``name=None`` the model is the one the run trained (its ``config.json``'s model section, tiny
    dimensions included), else :data:`DEFAULT_MODEL`."""
    from gymllm import models

    section = run_config(checkpoint).get("model", {}) if name is None else {}
    name = section.get("name", DEFAULT_MODEL) if name is None else name
    if name.startswith("tiny-"):
        dims = {k: section[k] for k in ("seed", "vocab_size", "hidden_size", "intermediate_size", "num_layers",
                                        "num_heads", "num_kv_heads") if section.get(k) is not None}
        loaded = models.make_tiny(name.removeprefix("tiny-"), **dims)
    else:
        loaded = models.load(name)
    if checkpoint:
        import dataclasses

        from gymllm.algos.checkpoint import restore_model_weights

        loaded = dataclasses.replace(loaded, model=restore_model_weights(loaded.model, checkpoint),
                                     source=f"{loaded.source} + {checkpoint}")
    return loaded


def make_agent(env_id: str, tokenizer: Any, env_kwargs: dict | None = None) -> Any:
    """A ``ToolAgent`` when the env offers tools at reset (``info["tools"]``), else a ``ModelAgent``."""
    import gymllm
    from gymllm.rollout import ModelAgent, ToolAgent

    env = gymllm.make(env_id, **(env_kwargs or {}))
    try:
        _, info = env.reset(seed=0)
    finally:
        env.close()
    system = info.get("system_prompt") if isinstance(info, dict) else None
    if isinstance(info, dict) and info.get("tools"):
        return ToolAgent(tokenizer, system_prompt=system)
    return ModelAgent(tokenizer, system_prompt=system)


async def _eval_env(env_id: str, loaded: Any, *, num_seeds: int, k: int, seed_offset: int, temperature: float,
                    max_tokens: int, max_turns: int, success_threshold: float,
                    env_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    import gymllm
    from gymllm.inference import EngineConfig, JaxEngine, SamplingParams
    from gymllm.rollout import RolloutConfig, RolloutOrchestrator

    concurrency = min(32, num_seeds * k)
    vec = gymllm.make_vec(env_id, num_envs=concurrency, max_episode_steps=max_turns, **(env_kwargs or {}))
    engine = JaxEngine.from_loaded(loaded, config=EngineConfig(num_slots=min(16, concurrency), max_len=2048))
    cfg = RolloutConfig(group_size=k, max_concurrency=concurrency, num_groups=num_seeds, max_staleness=None,
                        groups_per_step=1, seed=seed_offset, max_model_calls=max_turns)
    sampling = SamplingParams(temperature=temperature, max_tokens=max_tokens)
    rewards: list[np.ndarray] = []
    try:
        async with RolloutOrchestrator(vec, engine, make_agent(env_id, loaded.tokenizer, env_kwargs), sampling=sampling,
                                       config=cfg) as orch:
            for _ in range(num_seeds):
                rewards.append((await orch.get_group()).rewards)
    finally:
        await engine.close()
        vec.close()
    r = np.stack(rewards)  # [num_seeds, k]
    ok = r >= success_threshold
    return {"env": env_id, "env_kwargs": dict(env_kwargs or {}), "mean_reward": float(r.mean()), "pass@1": float(ok.mean()),
            f"pass@{k}": float(ok.any(axis=1).mean()), "episodes": int(r.size)}


def run_eval(env_ids: Sequence[str], *, model: str | None = None, checkpoint: str | None = None, num_seeds: int = 16,
             k: int = 4, seed_offset: int = 100_000, temperature: float = 0.7, max_tokens: int = 256, max_turns: int = 4,
             success_threshold: float = 1.0, env_kwargs: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Evaluate ``model`` on each env (``["suite"]`` expands to :data:`SUITE`); one row per env.

    ``env_kwargs`` go to every env; with ``env_kwargs=None`` and a run directory as ``checkpoint``, the
    env the run trained on gets the run's env kwargs (the setting it trained), the others their defaults."""
    ids = [i for e in env_ids for i in (SUITE if e == "suite" else (e,))]
    if not ids:
        raise ValueError("gymllm eval: expected at least one env id (or `suite`), received none. "
                         "Fix: gymllm eval gymllm/Arithmetic-v0")
    loaded = load_model(model, checkpoint=checkpoint)
    trained_env = run_config(checkpoint).get("env", {})

    def kwargs_for(env_id: str) -> dict[str, Any]:
        if env_kwargs is not None:
            return dict(env_kwargs)
        return dict(trained_env.get("kwargs") or {}) if env_id == trained_env.get("id") else {}

    return [asyncio.run(_eval_env(i, loaded, num_seeds=num_seeds, k=k, seed_offset=seed_offset,
                                  temperature=temperature, max_tokens=max_tokens, max_turns=max_turns,
                                  success_threshold=success_threshold, env_kwargs=kwargs_for(i))) for i in ids]
