"""``gymllm eval env``: pass@k and mean reward of a model on registered envs, over held-out seeds.

Each held-out seed is one group of k samples (the same env seed, distinct sampling seeds) run by
the rollout orchestrator over the embedded engine, so evaluation uses exactly the training path
(:mod:`gymllm.rollout.evaluation`, which the training run's in-loop evaluation calls too).
pass@1 is the mean success rate; pass@k the fraction of seeds with at least one success
(success: reward >= ``success_threshold``).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Annotated, Any, Sequence

import tyro

from gymllm.cli.eval_args import ModelChoice
from gymllm.inference.params import SamplingParams
from gymllm.models.config import TINY_FIELDS
from gymllm.rollout.evaluation import EvalConfig, agent_for


#: the default suite: small, verifiable, offline tasks of several kinds
SUITE = (
    "gymllm/Arithmetic-v0",
    "gymllm/Countdown-v0",
    "gymllm/MathWord-v0",
    "gymllm/CalcMath-v0",
    "gymllm/FrozenLake-v0",
)


DEFAULT_MODEL = "smollm2-135m-instruct"


def run_config(checkpoint: str | None) -> dict[str, Any]:
    """The ``config.json`` a ``gymllm train`` run directory holds (of ``RUN`` for ``RUN/checkpoints`` and
    for one policy ``RUN#NAME``; ``{}`` for anything else)."""
    from gymllm.models.trained import run_config as read

    return read(checkpoint) if checkpoint else {}


def load_model(name: str | None, *, checkpoint: str | None = None) -> Any:
    """``tiny-<family>`` builds a random tiny model; anything else goes to ``gymllm.models.load``.
    ``checkpoint`` (a run directory or checkpoint written by ``gymllm train``; ``RUN#NAME``: policy
    ``NAME`` of a ``--multiagent.policies`` run) replaces the weights; with ``name=None`` the model is
    the one the run trained (the run directory loaded as a model: its ``config.json``'s model section,
    tiny dimensions included, and, under LoRA adapters, the weights the run started from), else
    :data:`DEFAULT_MODEL`."""
    from gymllm import models
    from gymllm.models.trained import is_run_dir

    if name is None and checkpoint and is_run_dir(checkpoint):
        return models.load(checkpoint)
    section = run_config(checkpoint).get("model", {}) if name is None else {}
    name = section.get("name", DEFAULT_MODEL) if name is None else name
    dims = {k: section.get(k) for k in TINY_FIELDS} if name.startswith("tiny-") else {}
    loaded = models.load(name, checkpoint=checkpoint or None, **dims)
    return loaded


#: ``gymllm eval env``'s evaluation unless flags say otherwise: 4 samples a seed at temperature 0.7
DEFAULT_EVAL = EvalConfig(k=4, sampling=SamplingParams(temperature=0.7, max_tokens=256))


async def eval_env(
    env_id: str,
    loaded: Any,
    *,
    config: EvalConfig,
    env_kwargs: dict[str, Any] | None = None,
    system_prompt: str | None = None,
    agent: str | None = None,
    max_len: int = 2048,
    num_slots: int | None = None,
    engine: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One env's row: a fresh engine (``max_len`` tokens a row, ``num_slots`` rows decoded together;
    default: up to 16; ``engine``: more :class:`~gymllm.inference.EngineConfig` fields) over ``loaded``
    and a vector env, then
    :func:`gymllm.rollout.evaluation.evaluate_env` (the path the training run's evaluation takes)."""
    import gymllm
    from gymllm.inference import EngineConfig, JaxEngine
    from gymllm.rollout.evaluation import evaluate_env

    concurrency = min(config.max_concurrency, config.seeds * config.k)
    vec = gymllm.make_vec(
        env_id, num_envs=concurrency, max_episode_steps=config.max_turns, **(env_kwargs or {})
    )
    engine = JaxEngine.from_loaded(
        loaded,
        config=EngineConfig(
            num_slots=num_slots or min(16, concurrency), max_len=max_len, **(engine or {})
        ),
    )
    try:
        agent_ = agent_for(
            env_id, loaded.tokenizer, env_kwargs, system_prompt=system_prompt, agent=agent
        )
        row = await evaluate_env(
            vec,
            engine,
            agent_,
            config=config,
            env_id=env_id,
            env_kwargs=env_kwargs,
            session_prefix="",
        )
    finally:
        await engine.close()
        vec.close()
    return row


def run_eval(
    env_ids: Sequence[str],
    *,
    model: str | None = None,
    checkpoint: str | None = None,
    config: EvalConfig = DEFAULT_EVAL,
    env_kwargs: dict[str, Any] | None = None,
    system_prompt: str | None = None,
    max_len: int | None = None,
) -> list[dict[str, Any]]:
    """Evaluate ``model`` on each env (``["suite"]`` expands to :data:`SUITE`) under ``config``; one row per env.

    ``env_kwargs`` go to every env; with ``env_kwargs=None`` and a run directory as ``checkpoint``, the
    env the run trained on gets the run's env kwargs (the setting it trained), the others their defaults.
    The env a run trained on is played as the run played it: its ``env.agent`` and ``env.system_prompt``
    (``system_prompt`` overrides it for every env). ``max_len``: the engine's tokens a row (default: the
    run's ``engine.max_len`` plus a reply's ``max_tokens`` times ``max_turns``, capped at 2048; 2048
    without a run)."""
    ids = [i for e in env_ids for i in (SUITE if e == "suite" else (e,))]
    if not ids:
        raise ValueError(
            "gymllm eval env: expected at least one env id (or `suite`), received none. "
            "Fix: gymllm eval env gymllm/Arithmetic-v0"
        )
    loaded = load_model(model, checkpoint=checkpoint)
    conf = run_config(checkpoint)
    trained_env = conf.get("env", {})
    if max_len is None:
        run_len = int(conf.get("engine", {}).get("max_len") or 0)
        max_len = (
            min(2048, run_len + config.sampling.max_tokens * config.max_turns) if run_len else 2048
        )

    def played_as(env_id: str) -> dict[str, Any]:
        trained = env_id == trained_env.get("id")
        return {
            "system_prompt": system_prompt
            if system_prompt is not None
            else (trained_env.get("system_prompt") or None if trained else None),
            "agent": trained_env.get("agent") if trained else None,
        }

    def kwargs_for(env_id: str) -> dict[str, Any]:
        if env_kwargs is not None:
            return dict(env_kwargs)
        return dict(trained_env.get("kwargs") or {}) if env_id == trained_env.get("id") else {}

    return [
        asyncio.run(
            eval_env(
                i, loaded, config=config, env_kwargs=kwargs_for(i), max_len=max_len, **played_as(i)
            )
        )
        for i in ids
    ]


@dataclasses.dataclass(frozen=True, kw_only=True)
class EnvEval:
    """Evaluate a model on one or more envs: pass@k and mean reward on held-out seeds."""

    env: Annotated[tuple[str, ...], tyro.conf.Positional, tyro.conf.arg(metavar="ENV")]
    """One or more env ids (e.g. gymllm/Arithmetic-v0, module:EnvId-v0, module:factory), or `suite` for the
    default suite."""
    model: ModelChoice = ModelChoice()
    """The model and the trained weights to evaluate."""
    eval: EvalConfig = DEFAULT_EVAL
    """The held-out seeds, the samples per seed and the episode's limits."""
    env_kwargs: str | None = None
    """The envs' keyword arguments as a JSON object (e.g. '{"digits": 1}'); default: the run's own env kwargs for
    the env it trained on (with --model.checkpoint), else each env's defaults."""
    out: str | None = None
    """Write the results table (one row per env) as JSON here."""


def eval_envs(args: EnvEval) -> int:
    """``gymllm eval env``: :func:`run_eval` of ``args``, its table on stdout (and in ``args.out``)."""
    import json
    import pathlib

    from gymllm.cli.json_args import json_object
    from gymllm.cli.tables import print_table

    kwargs = None if args.env_kwargs is None else json_object(args.env_kwargs)
    rows = run_eval(
        list(args.env),
        model=args.model.name,
        checkpoint=args.model.checkpoint,
        config=args.eval,
        env_kwargs=kwargs,
    )
    extra = [c for c in ("valid_action_rate", "win_or_draw") if any(c in r for r in rows)]
    print_table(rows, ["env", "mean_reward", "pass@1", f"pass@{args.eval.k}", "episodes", *extra])
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(rows, indent=2))
        print(f"wrote {args.out}")
    return 0
