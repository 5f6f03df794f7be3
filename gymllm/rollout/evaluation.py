"""Held-out evaluation: pass@k, mean reward and tool use of a policy on an env, over fixed seeds.

The one evaluation path of gymllm: ``gymllm eval`` (:mod:`gymllm.cli.evaluate`, a fresh engine per
model) and the training run's in-loop evaluation (:class:`gymllm.train.run.Run` with ``eval.every``,
on the run's own engine at the current policy version) both call :func:`evaluate_env`.

    row = await evaluate_env(vec_env, engine, agent, config=EvalConfig(seeds=16),
                             env_id="gymllm/Arithmetic-v0")
    row["pass@1"], row["mean_reward"], row["tool_calls_per_episode"], row["seeds"]

Each held-out seed ``seed_base + i`` (``i < seeds``) is one group of ``k`` samples (the same env
seed, distinct sampling seeds) run by the :class:`~gymllm.rollout.RolloutOrchestrator`, so an
evaluation episode is exactly a training episode. pass@1 is the mean success rate; pass@k the
fraction of seeds with at least one success (success: reward >= ``success_threshold``).

Sharing an engine: every session id an evaluation sends is prefixed (:class:`SessionPrefixed`), so its
trajectories never meet a training rollout's cached prefix on the same engine.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Sequence

import numpy as np
import tyro

from gymllm.inference.params import SamplingParams
from gymllm.rollout.agents import Agent, ModelAgent, ToolAgent
from gymllm.rollout.config import RolloutConfig
from gymllm.types import Group
from gymllm.utils.seeds import HELD_OUT_SEED_BASE
from gymllm.validation import check_fields, check_range, require

__all__ = [
    "EvalConfig",
    "SessionPrefixed",
    "HeldOutEvaluator",
    "evaluate_env",
    "agent_for",
    "group_episodes",
    "group_tool_calls",
    "episode_figures",
    "eval_metrics",
]


def _eval_sampling() -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=256)


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalConfig:
    """Held-out evaluation of one env: ``seeds`` groups of ``k`` episodes, on env seeds ``seed_base ..
    seed_base + seeds - 1``, sampled with ``sampling``. ``gymllm eval env`` takes it as its ``--eval.*``
    flags and ``--sampling.*`` (the sampler's own flags, as ``gymllm train`` names them)."""

    seeds: int = 16
    """Held-out env seeds per env (one group of --eval.k episodes each)."""
    k: int = 1
    """Samples per seed: pass@k counts a seed solved when any of its k episodes is."""
    seed_base: int = HELD_OUT_SEED_BASE
    """The first held-out seed; training uses seeds below it (utils.seeds.HELD_OUT_SEED_BASE)."""
    max_turns: int = 4
    """Model calls per episode at most (the env's step limit too)."""
    success_threshold: float = 1.0
    """The reward that counts an episode as solved (pass@k)."""
    max_concurrency: int = 32
    """Episodes in flight at once (also bounded by the vector env's sub-envs)."""
    sampling: Annotated[SamplingParams, tyro.conf.arg(prefix_name=False)] = dataclasses.field(
        default_factory=_eval_sampling
    )
    """How each reply is sampled (temperature 0: greedy, so pass@1 is deterministic; max_tokens: a reply's
    budget); n must be 1 (k sets the samples per seed)."""

    def __post_init__(self) -> None:
        names = ("seeds", "k", "max_turns", "max_concurrency")
        check_fields("EvalConfig", self, names, lo=1, integer=True, fix="set {field}=1 or more")
        check_range(
            "EvalConfig",
            "seed_base",
            self.seed_base,
            lo=0,
            integer=True,
            fix=f"e.g. --eval.seed-base {HELD_OUT_SEED_BASE}",
        )
        require(
            isinstance(self.sampling, SamplingParams) and self.sampling.n == 1,
            "EvalConfig.sampling",
            expected="a SamplingParams with n=1 (k sets the samples per seed)",
            received=self.sampling,
            fix="e.g. SamplingParams(temperature=0.0)",
        )

    @property
    def seed_range(self) -> range:
        """The held-out env seeds."""
        return range(self.seed_base, self.seed_base + self.seeds)


class SessionPrefixed:
    """An engine whose session ids get ``prefix`` (generate and end_session); everything else is the
    wrapped engine's. Keeps an evaluation's trajectory ids (``g0/m0/a0`` ...) apart from a training
    orchestrator's identical ones on a shared engine."""

    def __init__(self, engine: Any, prefix: str):
        self.engine, self.prefix = engine, prefix

    @property
    def version(self) -> int:
        return int(getattr(self.engine, "version", 0))

    async def generate(
        self, prompt_ids: Sequence[int], params: Any, *, session_id: str | None = None
    ) -> Any:
        sid = None if session_id is None else self.prefix + session_id
        return await self.engine.generate(prompt_ids, params, session_id=sid)

    def end_session(self, session_id: str) -> None:
        end = getattr(self.engine, "end_session", None)
        if end is not None:
            end(self.prefix + session_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


def agent_for(
    env_id: str,
    tokenizer: Any,
    env_kwargs: dict | None = None,
    *,
    system_prompt: str | None = None,
    agent: str | None = None,
) -> Agent:
    """The agent a run on ``env_id`` uses: ``agent`` ("model" | "tool", a run's ``env.agent``) or, when
    None, a ``ToolAgent`` if the env offers tools at reset (``info["tools"]``), else a ``ModelAgent``;
    the system prompt is ``system_prompt`` (a run's ``env.system_prompt``) or the env's
    ``info["system_prompt"]`` when it gives one."""
    import gymllm

    if agent not in (None, "model", "tool"):
        raise ValueError(
            f"agent: expected 'model' or 'tool', received {agent!r}. Fix: pass one of them"
        )
    env = gymllm.make(env_id, **(env_kwargs or {}))
    try:
        _, info = env.reset(seed=0)
    finally:
        env.close()
    info = info if isinstance(info, dict) else {}
    system = system_prompt or info.get("system_prompt")
    if agent == "tool" or (agent is None and info.get("tools")):
        return ToolAgent(tokenizer, system_prompt=system)
    return ModelAgent(tokenizer, system_prompt=system)


def group_episodes(group: Group) -> list[Any]:
    """One trajectory per episode of ``group`` (row 0: an episode split into several training rows
    carries its ``info`` on each)."""
    return [t for t in group.trajectories if t.row_index == 0]


def group_tool_calls(group: Group) -> list[int]:
    """Tool calls of each episode of ``group`` (``Trajectory.info["tool_calls"]``, recorded by the
    episode from the agent's parsed calls; one entry per episode, not per training row)."""
    return [int(t.info.get("tool_calls", 0) or 0) for t in group_episodes(group)]


def episode_figures(episodes: Sequence[Any]) -> dict[str, float]:
    """Env-side figures over finished episodes (one :class:`~gymllm.types.Trajectory` each, its
    ``info`` as recorded by the episode): ``valid_action_rate`` (env steps that accepted the reply over
    all env steps: tic-tac-toe's legal-move rate), and where the env reports a game result
    (``info["outcome"]``: win, loss, draw, forfeit) ``win_or_draw`` and ``outcome/<result>`` shares."""
    steps = sum(int(t.info.get("env_steps", 0) or 0) for t in episodes)
    invalid = sum(int(t.info.get("invalid_actions", 0) or 0) for t in episodes)
    out: dict[str, float] = {}
    if steps:
        out["valid_action_rate"] = 1.0 - invalid / steps
    outcomes = [str(t.info["outcome"]) for t in episodes if t.info.get("outcome") is not None]
    if outcomes:
        out["win_or_draw"] = sum(o in ("win", "draw") for o in outcomes) / len(episodes)
        for o in sorted(set(outcomes) | {"win", "loss", "draw", "forfeit"}):
            out[f"outcome/{o}"] = outcomes.count(o) / len(episodes)
    return out


async def evaluate_env(
    envs: Any,
    engine: Any,
    agent: Agent,
    *,
    config: EvalConfig,
    env_id: str = "",
    env_kwargs: dict[str, Any] | None = None,
    session_prefix: str = "eval/",
) -> dict[str, Any]:
    """Run ``config.seeds`` groups of ``config.k`` episodes on ``envs`` (a vector env; not closed
    here) with ``engine`` (not closed either) and return one row: ``env``, ``env_kwargs``, ``mean_reward``,
    ``pass@1``, ``pass@<k>``, ``episodes``, ``tool_calls_per_episode``, ``tool_call_share`` (episodes with
    at least one call), the :func:`episode_figures` (``valid_action_rate``; ``win_or_draw`` and
    ``outcome/<result>`` for games), ``seeds`` (the env seeds the episodes used), ``policy_versions`` (of every
    sampled token: [min, max])."""
    from gymllm.rollout.orchestrator import RolloutOrchestrator

    c = config
    num_envs = int(getattr(envs, "num_envs", c.max_concurrency))
    concurrency = max(1, min(c.max_concurrency, c.seeds * c.k, num_envs))
    rcfg = RolloutConfig(
        group_size=c.k,
        max_concurrency=concurrency,
        num_groups=c.seeds,
        max_staleness=None,
        max_model_calls=c.max_turns,
    )
    groups: list[Group] = []
    async with RolloutOrchestrator(
        envs,
        SessionPrefixed(engine, session_prefix),
        agent,
        sampling=c.sampling,
        config=rcfg,
        seed=c.seed_base,
        groups_per_step=1,
    ) as orch:
        async for group in orch.groups():
            groups.append(group)
    if len(groups) != c.seeds:
        raise RuntimeError(
            f"evaluation of {env_id or 'the env'}: expected {c.seeds} complete groups, received "
            f"{len(groups)} (errors: {'; '.join(orch.errors[-3:]) or 'none'}). Fix: run the env alone "
            f"with `gymllm check {env_id or 'ENV_ID'}`"
        )
    groups.sort(key=lambda g: int(g.group_id[1:]))
    r = np.stack([g.rewards for g in groups])  # [seeds, k]
    ok = r >= c.success_threshold
    calls = np.array([n for g in groups for n in group_tool_calls(g)], dtype=np.float64)
    versions = [
        int(v)
        for g in groups
        for t in g.trajectories
        for v in np.asarray(t.versions)[np.asarray(t.loss_mask, bool)]
    ]
    return {
        "env": env_id,
        "env_kwargs": dict(env_kwargs or {}),
        "mean_reward": float(r.mean()),
        "pass@1": float(ok.mean()),
        f"pass@{c.k}": float(ok.any(axis=1).mean()),
        "episodes": int(r.size),
        "tool_calls_per_episode": float(calls.mean()) if calls.size else 0.0,
        "tool_call_share": float((calls > 0).mean()) if calls.size else 0.0,
        **episode_figures([t for g in groups for t in group_episodes(g)]),
        "seeds": sorted(
            {int(t.seed) for g in groups for t in g.trajectories if t.seed is not None}
        ),
        "policy_versions": [min(versions), max(versions)] if versions else [],
    }


def eval_metrics(row: dict[str, Any]) -> dict[str, float]:
    """The step metrics of one :func:`evaluate_env` row: ``eval/<env>/pass@1``, ``.../mean_reward``,
    ``.../pass@<k>``, ``.../tool_calls_per_episode``, ``.../tool_call_share`` and the row's
    :func:`episode_figures` (``.../valid_action_rate``, ``.../win_or_draw``, ``.../outcome/<result>``)."""
    env = row["env"]
    figures = ("valid_action_rate", "win_or_draw")
    keys = [k for k in row if k.startswith("pass@")] + [
        "mean_reward",
        "tool_calls_per_episode",
        "tool_call_share",
    ]
    keys += [k for k in row if k in figures or k.startswith("outcome/")]
    return {f"eval/{env}/{k}": float(row[k]) for k in keys}


class HeldOutEvaluator:
    """The held-out evaluation of a training run: one vector env per evaluated env (built once, kept
    for the run), each evaluated on the run's engine at whatever policy version it holds.

    ``specs``: ``(env_id, env_kwargs, agent)`` per env; ``num_envs``: sub-envs per vector env (at most
    ``config.seeds * config.k`` are used). :meth:`evaluate` returns one :func:`evaluate_env` row per
    env, with ``step`` added; :meth:`close` closes the vector envs."""

    def __init__(
        self,
        specs: Sequence[tuple[str, dict[str, Any], Agent]],
        *,
        config: EvalConfig,
        num_envs: int,
    ):
        import gymllm

        self.config = config
        self.specs = list(specs)
        n = max(1, min(num_envs, config.seeds * config.k))
        self.envs: list[Any] = []
        try:
            for env_id, kwargs, _ in self.specs:
                self.envs.append(gymllm.make_vec(env_id, n, **kwargs))
        except BaseException:
            self.close()
            raise

    async def evaluate(self, engine: Any, step: int) -> list[dict[str, Any]]:
        rows = []
        for (env_id, kwargs, agent), envs in zip(self.specs, self.envs):
            row = await evaluate_env(
                envs,
                engine,
                agent,
                config=self.config,
                env_id=env_id,
                env_kwargs=kwargs,
                session_prefix=f"eval{step}/",
            )
            rows.append({"step": int(step), **row})
        return rows

    def close(self) -> None:
        for envs in self.envs:
            close = getattr(envs, "close", None)
            if close is not None:
                close()
        self.envs = []
