"""Several policies trained in one run (``--multiagent.policies '{"first": "a", "second": "b"}'``):
each policy has its own trainable weights (a LoRA adapter on the shared base by default, or full
weights), its own optimizer state, its own groups and its own version counter; the one training loop
(:meth:`gymllm.train.run.Run.train`) drives them all through :class:`PolicySet`, which has the
learner's interface and routes every group to the policy that played it.

    policies = build_policy_set(cfg, lm, mesh)        # LocalComponents.make_learner does this
    pusher = policies.make_pusher(cfg, engine, lm)     # LoRA: the run's engine serves every policy's adapter
    # the group source: PolicySeatSource, built by the "policies" kind of gymllm.train.assembly.KINDS
    reports = policies.submit(groups)                  # each group to group.info["policy"]'s learner

Steps and versions
------------------
Every update of any policy is one step of the run: the run's step (``PolicySet.version``, what
``learner.num_steps`` counts) is the sum of the policies' versions, and a policy's own version counts
only its own updates (``policy/<name>/version``). ``learner.groups_per_step`` groups of a policy make
one of its updates; its staleness bound (``learner.max_staleness``) and the versions on its tokens are
its own. The group source's admission bound (``rollout.max_staleness``) counts the run's steps, so with
two policies it is about twice as tight as each policy's own.

Serving
-------
LoRA policies (``policy_weights="lora"``, the default) are all served by the run's one in-process
:class:`~gymllm.inference.jax_engine.JaxEngine`, built with an adapter per policy
(:func:`policy_adapters`; multi-LoRA serving, :mod:`gymllm.inference.adapters`): the frozen base once,
one KV cache, each request naming its policy's adapter (``engine.for_adapter(name)`` is the policy's
engine), rows of different policies decoding in the same steps. A policy's update pushes only its
adapters, to its adapter slot, at its own version; the other policies' rows keep theirs. Full-weight
policies (``policy_weights="full"``) are each served by an engine of their own over the same model
(the run's engine serves the first policy), one more copy of the weights and KV cache per policy.

Records
-------
Each step's record carries the updated policy's figures under the usual names (``loss``,
``reward_mean``, ...) and as ``policy/<name>/loss`` and ``policy/<name>/reward``, and every policy's
``policy/<name>/version``. Every trajectory carries ``info["agent"]`` (its seat) and
``info["policy"]``. A checkpoint holds every policy's state under its name.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Iterable

from gymllm.errors import ConfigError, explain
from gymllm.validation import require
from gymllm.rollout.policy_map import check_policy_seats, policy_map
from gymllm.rollout.seat_source import SeatGroupSource

__all__ = [
    "PolicySet",
    "PolicyPusher",
    "PolicySeatSource",
    "build_policy_set",
    "policy_adapters",
    "policy_lora",
]

DEFAULT_RANK = 8


def policy_lora(cfg: Any) -> Any:
    """The LoRA config of every policy (None: full weights): ``lora`` policies use ``cfg.lora`` when its
    rank is set, else rank 8 with ``cfg.lora``'s other fields; ``full`` refuses a set ``lora.rank``."""
    from gymllm.models.lora import LoRAConfig

    kind, lora = cfg.multiagent.policy_weights, cfg.lora
    if kind == "full":
        require(
            not lora.enabled,
            "multiagent.policy_weights",
            expected="'lora' when --lora.rank is set",
            received=f"full with lora.rank {lora.rank}",
            fix="drop --lora.rank for full "
            "weights per policy, or use --multiagent.policy-weights lora",
        )
        return None
    return (
        lora if lora.enabled else LoRAConfig(**{**dataclasses.asdict(lora), "rank": DEFAULT_RANK})
    )


def policy_adapters(cfg: Any) -> Any:
    """The adapters the run's engine serves (an :class:`~gymllm.inference.adapters.AdapterConfig`: one per
    policy, named after it) for LoRA policies; None without ``multiagent.policies`` or with full weights."""
    if not cfg.multiagent.policies or cfg.multiagent.policy_weights != "lora":
        return None
    from gymllm.inference.adapters import AdapterConfig

    names = tuple(dict.fromkeys(policy_map(cfg.multiagent.policies).values()))
    return AdapterConfig(lora=policy_lora(cfg), names=names)


def build_policy_set(cfg: Any, lm: Any, mesh: Any = None) -> "PolicySet":
    """One :class:`~gymllm.algos.learner.StreamingLearner` per policy of ``cfg.multiagent.policies``
    over the weights of ``lm`` (shared: LoRA policies share the frozen base arrays); the map is checked
    against the game of ``cfg.env.id`` first."""
    from gymllm.train.wiring import learner_kwargs
    from gymllm.algos.learner import StreamingLearner
    from gymllm.multiagent.factory import game_factory

    seats = policy_map(cfg.multiagent.policies)
    make = game_factory(cfg.env.id, cfg.env.kwargs)
    require(
        make is not None,
        "multiagent.policies",
        expected="a multi-agent game in --env.id (MODULE:FACTORY of "
        "a PettingZoo env, or a registered game such as tic-tac-toe)",
        received=cfg.env.id,
        fix="name a game, or drop --multiagent.policies",
    )
    probe = make()
    possible = list(probe.possible_agents)
    probe.close()
    check_policy_seats(seats, possible, opponent=cfg.multiagent.opponent)
    lora = policy_lora(cfg)
    flat = lm.model.flat_params()
    pad = int(lm.tokenizer.pad_token_id or 0)
    learners = {
        name: StreamingLearner(
            lm.config, flat, lora=lora, mesh=mesh, pad_id=pad, **learner_kwargs(cfg)
        )
        for name in dict.fromkeys(seats.values())
    }
    return PolicySet(learners, seats, num_steps=cfg.learner.num_steps)


class PolicySet:
    """Several learners behind the one learner interface the run drives (see the module docstring).

    ``learners``: policy name -> learner (``submit``, ``version``, ``policy_params``, ...); ``seats``:
    seat -> policy name; ``num_steps``: the run's steps (updates of all policies together) after which
    groups are no longer trained. ``engines`` (name -> engine) are set by :meth:`make_pusher`."""

    def __init__(self, learners: dict[str, Any], seats: dict[str, str], *, num_steps: int):
        unknown = sorted(set(seats.values()) - set(learners))
        require(
            bool(learners and not unknown),
            "PolicySet(seats)",
            expected=f"policy names among {sorted(learners)}",
            received=seats,
            fix="give every policy the seats map names a learner",
        )
        self.learners, self.seats, self.num_steps = dict(learners), dict(seats), num_steps
        self.counts: collections.Counter = collections.Counter()
        self.engines: dict[str, Any] = {}
        self.extra_engines: list[Any] = []  # built here (the run's own engine is closed by the run)
        self.to_push: collections.deque[str] = (
            collections.deque()
        )  # updated policies, in report order

    # --- the learner interface the run reads ------------------------------------------------------
    @property
    def version(self) -> int:
        """The run's step: updates of every policy together."""
        return sum(int(lrn.version) for lrn in self.learners.values())

    @property
    def step(self) -> int:
        return self.version

    @property
    def consumed_groups(self) -> set[str]:
        return set().union(*(lrn.consumed_groups for lrn in self.learners.values()))

    @property
    def groups_in_step(self) -> int:
        """The fewest groups any policy's unfinished update holds (the run takes at least one more group
        while a step is still due)."""
        return min(lrn.groups_in_step for lrn in self.learners.values())

    def versions(self) -> dict[str, int]:
        """Each policy's own version."""
        return {name: int(lrn.version) for name, lrn in self.learners.items()}

    def policy_params(self) -> dict[str, Any]:
        """The weights the next push sends: the next updated policy's (else the first policy's)."""
        name = self.to_push[0] if self.to_push else next(iter(self.learners))
        return self.learners[name].policy_params()

    def submit(self, groups: Iterable[Any]) -> list[Any]:
        """Each group to the learner of ``group.info["policy"]`` (oldest version first); the updates they
        complete, as reports of the run's step, until the run has ``num_steps`` of them (the groups
        after that are left untrained and not marked consumed)."""
        from gymllm.algos.learner import StepReport

        reports = []
        for g in sorted(groups, key=lambda g: (g.min_version, g.admitted_version)):
            if self.version >= self.num_steps:
                self.counts["groups_after_end"] += 1
                continue
            name = g.info.get("policy")
            learner = self.learners.get(name)
            if learner is None:
                raise ConfigError(
                    explain(
                        f"group {g.group_id}",
                        expected=f"info['policy'] among {sorted(self.learners)}",
                        received=name,
                        fix="route groups through PolicySeatSource",
                    )
                )
            for rep in learner.submit([g]):
                m = dict(rep.metrics)
                m.update(
                    {f"policy/{name}/loss": m["loss"], f"policy/{name}/reward": m["reward_mean"]}
                )
                m.update({f"policy/{n}/version": float(v) for n, v in self.versions().items()})
                self.to_push.append(name)
                self.counts[f"policy/{name}/steps"] += 1
                reports.append(StepReport(step=self.version, metrics=m, sample_ids=rep.sample_ids))
        for key in (
            "groups_in",
            "groups_trained",
            "rows_trained",
            "steps",
            "stale_groups",
            "filtered_groups",
        ):
            self.counts[key] = sum(lrn.counts[key] for lrn in self.learners.values())
        return reports

    def warmup(self, group_size: int | None = None) -> None:
        for learner in self.learners.values():
            learner.warmup(group_size)

    # --- serving ----------------------------------------------------------------------------------
    def make_pusher(
        self, cfg: Any, engine: Any, lm: Any, *, gather: bool = False
    ) -> "PolicyPusher":
        """Serve every policy on ``engine`` (the run's) when it serves an adapter per policy (LoRA policies:
        :func:`policy_adapters`); else the first policy on ``engine`` and every other on a new engine of ``lm``."""
        from gymllm.inference.jax_engine import JaxEngine

        names = list(self.learners)
        served = getattr(engine, "adapters", None)
        if served is not None and set(names) <= set(
            served.names
        ):  # one engine, an adapter per policy
            self.engines = {name: engine.for_adapter(name) for name in names}
            return PolicyPusher(self, lm.config, gather=gather)
        self.engines = {names[0]: engine}
        for name in names[1:]:
            from gymllm.train.wiring import engine_config

            e = JaxEngine(
                lm.model,
                lm.tokenizer,
                version=self.learners[name].version,
                config=engine_config(cfg),
            )
            if cfg.run.warmup:
                e.warmup()
            self.engines[name] = e
            self.extra_engines.append(e)
        return PolicyPusher(self, lm.config, gather=gather)

    async def aclose(self) -> None:
        """Close the engines built for the policies after the first."""
        for e in self.extra_engines:
            await e.close()
        self.extra_engines = []

    # --- checkpoints ------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {"policies": {name: lrn.state() for name, lrn in self.learners.items()}}

    def bookkeeping(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "counts": dict(self.counts),
            "consumed_groups": sorted(self.consumed_groups),
            "policies": {name: lrn.bookkeeping() for name, lrn in self.learners.items()},
        }

    def restore(self, state: dict[str, Any], bookkeeping: dict[str, Any]) -> None:
        saved = sorted(bookkeeping.get("policies", {}))
        require(
            saved == sorted(self.learners),
            "resume (multiagent.policies)",
            expected=f"a checkpoint of policies {saved}",
            received=sorted(self.learners),
            fix="resume with the run's own --multiagent.policies",
        )
        for name, learner in self.learners.items():
            learner.restore(state["policies"][name], bookkeeping["policies"][name])
        self.counts = collections.Counter(bookkeeping.get("counts", {}))
        self.to_push.clear()


class PolicyPusher:
    """The run's weight push for a :class:`PolicySet`: ``push(weights, step)`` sends the weights of the
    policy whose report comes next to that policy's engine (LoRA: its adapters to its adapter slot of the
    shared engine), at that policy's own version (a push
    with no update pending, as on resume, sends every policy's weights). The interface of
    :class:`~gymllm.algos.weight_sync.WeightPusher`."""

    def __init__(self, policies: PolicySet, model_config: Any, *, gather: bool = False):
        from gymllm.algos.weight_sync import WeightPusher

        self.policies = policies
        self.pushers = {
            name: WeightPusher(e, model_config, gather=gather)
            for name, e in policies.engines.items()
        }
        self.pushes, self.total_s, self.last_s = 0, 0.0, 0.0

    def push(self, weights: dict[str, Any], step: int) -> float:
        ps = self.policies
        if ps.to_push:
            name = ps.to_push.popleft()
            s = self.pushers[name].push(weights, ps.learners[name].version)
        else:
            s = sum(
                self.pushers[n].push(lrn.policy_params(), lrn.version)
                for n, lrn in ps.learners.items()
            )
        self.pushes += 1
        self.last_s = s
        self.total_s += s
        return s


class PolicySeatSource(SeatGroupSource):
    """A :class:`~gymllm.rollout.seat_source.SeatGroupSource` whose seats are played by their policies'
    engines: ``engines`` (policy name -> engine), ``seats`` (seat -> policy name). The trained seats are
    the map's seats (in the game's order); a group carries its seat and its policy, so it never mixes
    either."""

    def __init__(
        self,
        game_fn: Any,
        engines: dict[str, Any],
        seats: dict[str, str],
        agent: Any,
        **kwargs: Any,
    ):
        super().__init__(game_fn, engines[next(iter(seats.values()))], agent, **kwargs)
        check_policy_seats(seats, self.possible, opponent=self.config.opponent)
        missing = sorted(set(seats.values()) - set(engines))
        require(
            not missing,
            "PolicySeatSource(engines)",
            expected=f"an engine for every policy of {seats}",
            received=sorted(engines),
            fix=f"add engines for {missing}",
        )
        self.engines, self.seat_policy = dict(engines), dict(seats)
        self.learners = [s for s in self.possible if s in seats]

    def engine_for(self, seat: str, seats: list[str]) -> Any:
        return self.engines[self.seat_policy[seat]]

    def policy_of(self, seat: str) -> str:
        return self.seat_policy[seat]
