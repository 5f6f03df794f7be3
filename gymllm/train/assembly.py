"""Where a run is put together: one table, :data:`KINDS`, maps what the config asks for to the envs the
run builds and the group source its loop reads. :class:`~gymllm.train.run.Run` is only the loop.

    kind = select_kind(cfg)                # the first kind of KINDS whose ``applies(cfg)`` holds
    envs = kind.envs(cfg, components)      # build_parts: the env side (None when an agent program plays)
    source = kind.source(context)          # Run.train: the GroupSource over the built parts

The kinds, first match wins:

    agent_programs  rollout.mode "proxy": agent programs against the run's engine (AgentProgramSource)
    policies        a multi-agent game with multiagent.policies: a seat source over each policy's engine
    game_seats      a multi-agent game (env.id a PettingZoo game): groups per seat (SeatGroupSource)
    sync_baseline   rollout.mode "sync": roll out a step's batch, then train (SyncBatchSource)
    suite_mixture   env.suite: the orchestrator over the suite's mixture, every group counted per env
    single_env      the barrier-free orchestrator over one env (RolloutOrchestrator)

A new way of producing groups is a new source and a :func:`register_kind` call (its module, or a test),
nothing else: the loop reads any :class:`~gymllm.rollout.sources.GroupSource`. The shared values a source
takes (``run.seed``, ``learner.groups_per_step``) are wired here, as constructor arguments.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Callable

from gymllm.train.train_config import TrainConfig
from gymllm.errors import ConfigError, explain
from gymllm.validation import require, require_instance

__all__ = ["SourceContext", "Kind", "KINDS", "register_kind", "select_kind", "kind_named"]


@dataclasses.dataclass
class SourceContext:
    """What a kind's source is built from, passed in (a source never reaches into the run).

    ``cfg``: the run's config; ``parts``: the built :class:`~gymllm.train.components.RunParts`;
    ``resume``: the :class:`~gymllm.train.resume.ResumeState`; ``run_dir``: the run directory;
    ``keep``: the run's zero-variance group filter (replays a resumed run's decisions; tallies every new
    group); ``tally``: the :class:`~gymllm.train.step_log.RolloutTally` of every completed group;
    ``add_metrics``: registers a callable whose figures join every step's record."""

    cfg: TrainConfig
    parts: Any
    resume: Any
    run_dir: pathlib.Path
    keep: Callable[[Any], bool]
    tally: Any
    add_metrics: Callable[[Callable[[], dict[str, float]]], None]


@dataclasses.dataclass(frozen=True)
class Kind:
    """One way a run produces groups, and the parts it needs beyond the components' own."""

    name: str
    """The kind's name (:func:`kind_named`, ``Run.make_source(kind=...)``)."""
    applies: Callable[[TrainConfig], bool]
    """Whether the config asks for this kind (the first kind of :data:`KINDS` that applies is the run's)."""
    envs: Callable[[TrainConfig, Any], Any]
    """``envs(cfg, components)``: the env side of the run's parts."""
    source: Callable[[SourceContext], Any]
    """``source(context)``: the run's group source."""
    learner: Callable[[TrainConfig, Any], Any] | None = None
    """``learner(cfg, lm)``: the kind's own learner; None: the components' (``make_learner``)."""
    engine: Callable[[TrainConfig, Any, int], Any] | None = None
    """``engine(cfg, lm, version)``: the kind's own engine; None: the components' (``make_engine``)."""
    pusher: Callable[[TrainConfig, Any, Any, Any], Any] | None = None
    """``pusher(cfg, engine, lm, learner)``: the kind's own weight push; None: the components'."""


def _is_game(cfg: TrainConfig) -> bool:
    from gymllm.multiagent.factory import game_factory

    return game_factory(cfg.env.id, cfg.env.kwargs) is not None


def _game(cfg: TrainConfig, components: Any) -> Any:
    from gymllm.multiagent.factory import game_factory

    return game_factory(cfg.env.id, cfg.env.kwargs)


def _vector_envs(cfg: TrainConfig, components: Any) -> Any:
    return components.make_envs(cfg)


def _mixture_envs(cfg: TrainConfig, components: Any) -> Any:
    return components.make_mixture(cfg)


def _policy_learner(cfg: TrainConfig, lm: Any) -> Any:
    """A learner per policy (:func:`gymllm.train.policies.build_policy_set`; the map checked against the game)."""
    from gymllm.algos.sharding import make_mesh
    from gymllm.train.policies import build_policy_set

    return build_policy_set(cfg, lm, make_mesh(cfg.sharding))


def _policy_engine(cfg: TrainConfig, lm: Any, version: int) -> Any:
    """The run's engine, serving an adapter per policy when the policies are LoRA adapters."""
    from gymllm.inference.jax_engine import JaxEngine
    from gymllm.train.policies import policy_adapters
    from gymllm.train.wiring import engine_config

    return JaxEngine(
        lm.model,
        lm.tokenizer,
        version=version,
        config=engine_config(cfg),
        adapters=policy_adapters(cfg),
    )


def _policy_pusher(cfg: TrainConfig, engine: Any, lm: Any, learner: Any) -> Any:
    """Every policy's update pushed to where it is served (:meth:`~gymllm.train.policies.PolicySet.make_pusher`)."""
    from gymllm.algos.sharding import make_mesh

    return learner.make_pusher(cfg, engine, lm, gather=make_mesh(cfg.sharding) is not None)


def _agent_programs(ctx: SourceContext) -> Any:
    from gymllm.rollout.agent_programs import AgentProgramSource
    from gymllm.rollout.proxy_source import ProxySourceConfig

    cfg, p, r = ctx.cfg, ctx.parts, ctx.cfg.rollout
    config = ProxySourceConfig(
        group_size=r.group_size, max_queued_groups=r.queue_size, max_staleness=r.max_staleness
    )
    return AgentProgramSource(
        p.gen_engine,
        p.tok,
        command=r.agent_program,
        run_dir=ctx.run_dir,
        config=config,
        processes=r.agent_processes,
        seed=cfg.run.seed,
        start_timeout_s=r.agent_start_timeout_s,
        group_filter=ctx.keep,
    )


def _policies(ctx: SourceContext) -> Any:
    """Several policies (:mod:`gymllm.train.policies`): each seat played by its policy's engine; on resume every
    policy's engine replays the consumed groups."""
    from gymllm.train.policies import PolicySeatSource, PolicySet
    from gymllm.rollout.seat_source import SeatMetrics

    cfg, p = ctx.cfg, ctx.parts
    require_instance(
        p.learner,
        PolicySet,
        "multiagent.policies",
        expected="an in-process learner (cluster.backend 'none')",
        fix="drop --cluster.backend for a run with "
        "several policies (serving them on Ray is not implemented)",
    )
    seats = SeatMetrics(opponent=cfg.multiagent.opponent)
    ctx.add_metrics(seats.flush)
    engines = {
        name: p.gen_engine if e is p.engine else ctx.resume.generation_engine(e, p.tok)
        for name, e in p.learner.engines.items()
    }
    return PolicySeatSource(
        p.envs,
        engines,
        p.learner.seats,
        p.agent,
        **_seat_source_settings(ctx, seats),
    )


def _game_seats(ctx: SourceContext) -> Any:
    from gymllm.train.opponents import FrozenOpponent
    from gymllm.rollout.seat_source import SeatGroupSource, SeatMetrics

    cfg, p = ctx.cfg, ctx.parts
    o = cfg.multiagent.opponent
    opp = FrozenOpponent.build(cfg, p.learner) if o == "frozen" or o.startswith("run:") else None
    seats = SeatMetrics(version=(lambda: opp.version) if opp is not None else None, opponent=o)
    ctx.add_metrics(seats.flush)  # seat/<seat>/reward|win|draw|loss|groups, opponent/version
    return SeatGroupSource(
        p.envs,
        p.gen_engine,
        p.agent,
        **_seat_source_settings(ctx, seats),
        opponent=opp,
    )


def _seat_source_settings(ctx: SourceContext, seats: Any) -> dict[str, Any]:
    """What every seat source takes from the run: its sampling, rollout and multiagent settings, its
    seed, and the group filter (``ctx.keep``) that also records the seat metrics ``seats`` logs."""
    cfg = ctx.cfg
    return {
        "sampling": cfg.sampling,
        "rollout": cfg.rollout,
        "config": cfg.multiagent,
        "seed": cfg.run.seed,
        "group_filter": seats.observe(ctx.keep),
    }


def _sync_baseline(ctx: SourceContext) -> Any:
    from gymllm.rollout.sync_baseline import SyncBatchSource

    require(
        not ctx.resume.decided,
        "rollout.mode",
        expected="'async' to resume a run",
        received="sync",
        fix="resume with mode='async' (eta=0 is synchronous) or use a fresh run_dir",
    )

    def tally(group: Any) -> bool:  # every rollout of the batch counts, whatever the learner keeps
        ctx.tally.add(group)
        return True

    per_step = ctx.cfg.learner.groups_per_step
    return _rollout_source(ctx, SyncBatchSource, tally, batch_groups=per_step)


def _rollout_source(
    ctx: SourceContext, source: Callable[..., Any], keep: Callable[[Any], bool], **per_step: int
) -> Any:
    """A single-env rollout ``source`` (the orchestrator or the sync baseline) over the run's envs,
    engine and agent with its sampling, rollout config and seed; ``keep`` filters its groups."""
    cfg, p = ctx.cfg, ctx.parts
    return source(
        p.envs,
        p.gen_engine,
        p.agent,
        sampling=cfg.sampling,
        config=cfg.rollout,
        seed=cfg.run.seed,
        group_filter=keep,
        **per_step,
    )


def _orchestrator(ctx: SourceContext, keep: Callable[[Any], bool]) -> Any:
    from gymllm.rollout import RolloutOrchestrator

    per_step = ctx.cfg.learner.groups_per_step
    return _rollout_source(ctx, RolloutOrchestrator, keep, groups_per_step=per_step)


def _suite_mixture(ctx: SourceContext) -> Any:
    return _orchestrator(
        ctx, ctx.parts.envs.observe(ctx.keep)
    )  # every group also counted under its env


def _single_env(ctx: SourceContext) -> Any:
    return _orchestrator(ctx, ctx.keep)


#: the kinds of run, in the order they are tried (see the module docstring)
KINDS: list[Kind] = [
    Kind(
        "agent_programs",
        lambda cfg: cfg.rollout.mode == "proxy",
        lambda cfg, components: None,
        _agent_programs,
    ),
    Kind(
        "policies",
        lambda cfg: bool(cfg.multiagent.policies),
        _game,
        _policies,
        learner=_policy_learner,
        engine=_policy_engine,
        pusher=_policy_pusher,
    ),
    Kind("game_seats", _is_game, _game, _game_seats),
    Kind("sync_baseline", lambda cfg: cfg.rollout.mode == "sync", _vector_envs, _sync_baseline),
    Kind("suite_mixture", lambda cfg: bool(cfg.env.suite), _mixture_envs, _suite_mixture),
    Kind("single_env", lambda cfg: True, _vector_envs, _single_env),
]


def register_kind(kind: Kind, *, before: str | None = None) -> Kind:
    """Add ``kind`` to :data:`KINDS` (before the kind named ``before``, default: before ``single_env``, the
    catch-all); a kind of the same name is replaced. Returns ``kind``."""
    for i, k in enumerate(KINDS):
        if k.name == kind.name:
            KINDS[i] = kind
            return kind
    names = [k.name for k in KINDS]
    target = before or "single_env"
    require(
        target in names,
        "register_kind(before)",
        expected=f"one of {names}",
        received=before,
        fix="name a registered kind, or leave before unset",
    )
    KINDS.insert(names.index(target), kind)
    return kind


def select_kind(cfg: TrainConfig) -> Kind:
    """The first kind of :data:`KINDS` the config asks for."""
    return next(k for k in KINDS if k.applies(cfg))


def kind_named(name: str) -> Kind:
    """The kind registered as ``name``."""
    for k in KINDS:
        if k.name == name:
            return k
    raise ConfigError(
        explain(
            "group source kind",
            expected=f"one of {[k.name for k in KINDS]}",
            received=name,
            fix="register it with gymllm.train.assembly.register_kind",
        )
    )
