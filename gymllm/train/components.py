"""What a :class:`~gymllm.train.run.Run` is built from: the :class:`Components` that make each part
(:class:`LocalComponents` in this process; :class:`gymllm.train.cluster.RayComponents` on Ray), the
model (:func:`load_model`) and :func:`build_parts`, which assembles them into :class:`RunParts`
(restoring the latest checkpoint first when the run resumes).

"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import pathlib
from typing import Any, Protocol

from gymllm.models.config import TINY_FIELDS
from gymllm.train.resume import ResumeState
from gymllm.train.train_config import ModelSection, TrainConfig
from gymllm.train.wiring import engine_config, learner_kwargs

__all__ = ["Components", "LocalComponents", "RunParts", "build_parts", "load_model"]


def load_model(m: ModelSection) -> Any:
    """The :class:`~gymllm.models.LoadedModel` of ``m`` (a random tiny one for ``tiny-<family>``), with
    the trained weights of ``m.checkpoint`` when it is set (warm start)."""
    from gymllm import models

    tiny = {k: getattr(m, k) for k in TINY_FIELDS} if m.is_tiny else {}
    loaded = models.load(m.name, checkpoint=m.checkpoint or None, **tiny)
    return loaded


class Components(Protocol):
    """What a :class:`~gymllm.train.run.Run` is assembled from. Each method builds one part for the config;
    ``close`` releases whatever the components started (actors, a Ray connection)."""

    def make_learner(self, cfg: TrainConfig, lm: Any) -> Any:
        """The learner: ``submit``, ``policy_params``, ``version``, ``consumed_groups``, ``counts``,
        ``groups_in_step``, ``warmup`` (a StreamingLearner or an object with its interface)."""

    def make_checkpointer(self, cfg: TrainConfig, learner: Any) -> Any:
        """``save(step, learner, extra=)``, ``restore_latest(learner)``, ``latest_step()``, ``close()``."""

    def make_engine(self, cfg: TrainConfig, lm: Any, version: int) -> Any:
        """An Engine (see :mod:`gymllm.inference.protocol`) starting at policy ``version``."""

    def make_pusher(self, cfg: TrainConfig, engine: Any, lm: Any, learner: Any) -> Any:
        """``push(flat_params, version) -> seconds``: the learner's weights to the engine."""

    def make_envs(self, cfg: TrainConfig) -> Any:
        """The barrier-free vector env of ``cfg.env.num_envs`` sub-envs."""

    def make_mixture(self, cfg: TrainConfig) -> Any:
        """The env side of ``--env.suite``: the suite's envs as one mixture of ``cfg.env.num_envs`` sub-envs."""

    def close(self) -> None: ...


class LocalComponents:
    """Every part in this process: what ``train`` uses with ``cluster.backend="none"``."""

    def __init__(self) -> None:
        self.gather = False

    def make_learner(self, cfg: TrainConfig, lm: Any) -> Any:
        from gymllm.algos.learner import StreamingLearner
        from gymllm.algos.sharding import make_mesh

        mesh = make_mesh(cfg.sharding)
        self.gather = mesh is not None
        return StreamingLearner(
            lm.config,
            lm.model.flat_params(),
            lora=cfg.lora,
            mesh=mesh,
            pad_id=int(lm.tokenizer.pad_token_id or 0),
            **learner_kwargs(cfg),
        )

    def make_checkpointer(self, cfg: TrainConfig, learner: Any) -> Any:
        from gymllm.algos.checkpoint import Checkpointer

        return Checkpointer(
            pathlib.Path(cfg.run.run_dir) / "checkpoints", max_to_keep=cfg.run.keep_checkpoints
        )

    def make_engine(self, cfg: TrainConfig, lm: Any, version: int) -> Any:
        from gymllm.inference.jax_engine import JaxEngine

        return JaxEngine(lm.model, lm.tokenizer, version=version, config=engine_config(cfg))

    def make_pusher(self, cfg: TrainConfig, engine: Any, lm: Any, learner: Any) -> Any:
        from gymllm.algos.weight_sync import WeightPusher

        return WeightPusher(engine, lm.config, gather=self.gather)

    def make_envs(self, cfg: TrainConfig) -> Any:
        import gymllm

        return gymllm.make_vec(cfg.env.id, cfg.env.num_envs, **cfg.env.kwargs)

    def make_mixture(self, cfg: TrainConfig) -> Any:
        return make_mixture(cfg)

    def close(self) -> None:
        pass


def make_mixture(cfg: TrainConfig) -> Any:
    """The env side of ``--env.suite``: a :class:`~gymllm.suites.training.MixtureEnvs` of the suite's envs."""
    from gymllm.suites import load_suite
    from gymllm.suites.training import MixtureEnvs

    return MixtureEnvs(
        load_suite(cfg.env.suite),
        num_envs=cfg.env.num_envs,
        seed=cfg.run.seed,
        curriculum=cfg.env.curriculum,
    )


@dataclasses.dataclass
class RunParts:
    """The built parts of one run: ``tok`` (the tokenizer), ``learner``, ``ckpt`` (checkpointer),
    ``engine`` and ``pusher`` (learner -> engine weights), ``gen_engine`` (what rollouts call: the
    engine, or a :class:`~gymllm.rollout.engine_wrappers.SkipConsumed` over it on resume), ``envs``
    (None in proxy mode: the agent program plays), ``agent`` and ``pool`` (the learner's thread)."""

    tok: Any
    learner: Any
    ckpt: Any
    engine: Any
    gen_engine: Any
    pusher: Any
    envs: Any
    agent: Any
    pool: concurrent.futures.ThreadPoolExecutor


def build_parts(
    cfg: TrainConfig, parts: Components, kind: Any = None
) -> tuple[RunParts, ResumeState]:
    """Build the run's parts with ``parts``, and with the run's ``kind`` (a
    :class:`~gymllm.train.assembly.Kind`: its envs, and its own learner, engine or weight push where it has
    them; None: ``parts``' every part); with ``run.resume`` restore the latest checkpoint into the
    learner and push its weights to the engine; with ``run.warmup`` compile the engine and learner, else a
    learner with ``fixed_shapes`` compiles its program set in a background thread (its first step waits)."""
    from gymllm.rollout import ModelAgent, ToolAgent

    lm = load_model(cfg.model)
    tok = lm.tokenizer

    def own(name: str) -> Any:
        return getattr(kind, name, None)

    learner = own("learner")(cfg, lm) if own("learner") else parts.make_learner(cfg, lm)
    ckpt = parts.make_checkpointer(cfg, learner)
    resume = ResumeState.restore(cfg, ckpt, learner)
    engine = (own("engine") or parts.make_engine)(cfg, lm, learner.version)
    pusher = (own("pusher") or parts.make_pusher)(cfg, engine, lm, learner)
    if resume.resumed_from is not None:
        pusher.push(learner.policy_params(), learner.version)
    # the envs before any warm-up: an env that fails to build fails the setup with no compile thread left behind;
    # the run's kind decides them (a game's GameFactory, a suite's mixture, a vector env; none for agent programs)
    envs = kind.envs(cfg, parts) if kind is not None else parts.make_envs(cfg)
    if cfg.run.warmup:
        engine.warmup()
        learner.warmup(group_size=cfg.rollout.group_size)
    elif getattr(
        getattr(learner, "config", None), "fixed_shapes", False
    ):  # its programs, while rollouts start
        learner.warmup(group_size=cfg.rollout.group_size, background=True)
    agent_cls = ToolAgent if cfg.env.agent == "tool" else ModelAgent
    return RunParts(
        tok=tok,
        learner=learner,
        ckpt=ckpt,
        engine=engine,
        gen_engine=resume.generation_engine(engine, tok),
        pusher=pusher,
        envs=envs,
        agent=agent_cls(tok, system_prompt=cfg.env.system_prompt or None),
        pool=concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gymllm-learner"),
    ), resume
