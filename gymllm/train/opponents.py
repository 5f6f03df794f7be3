"""Model opponents of multi-agent runs: :class:`FrozenOpponent`, a held copy of the learner's weights
(``multiagent.opponent="frozen"``, refreshed every ``refresh_every`` steps) or of a trained checkpoint
(``"run:DIR"``, never refreshed), served by a second in-process engine of the same model.
``run:DIR#NAME`` plays policy ``NAME`` of a run trained with ``--multiagent.policies``
(:mod:`gymllm.models.trained`); a run directory is loaded as the model it trained (its base, and under
LoRA adapters the weights it started from, then its trained weights), as ``gymllm eval env ENV --model.checkpoint``
loads it.

    opp = FrozenOpponent.build(cfg, learner)          # cfg: the run's TrainConfig
    source = SeatGroupSource(..., opponent=opp)        # its seats' moves come from opp.engine
    opp.refresh(step)                                  # the source calls it at each refresh step

League (``multiagent.league_size = N``, with ``frozen``): the opponent is drawn from a pool of the
learner's earlier snapshots instead of being the latest one, so the policy does not chase its own
latest self (SPIRAL, AlphaStar's league). At every refresh the learner's current weights join the pool
(the oldest leaves past ``N``; JAX arrays are immutable, so a snapshot is a reference, not a copy) and the
snapshot served until the next refresh is drawn from the pool: the latest with probability
``league_latest``, else uniformly among all (:class:`League`, seeded by ``run.seed``). The first snapshot is
the learner's weights when the opponent is built, before the first rollout (:meth:`FrozenOpponent.of_learner`):
in a fresh run the warm start (e.g. the SFT checkpoint). ``multiagent.league_keep_first = K`` keeps the
first ``K`` snapshots in the pool for the whole run (anchors: ``K = 1`` keeps the warm start); only the
other ``N - K`` places rotate, and the draw is unchanged (the kept ones are drawn uniformly with the rest).
A resumed run's league starts again from the restored weights (the pool is not checkpointed).

The second engine holds its own weights (a second copy of the model's parameters in memory, and its
own KV cache of ``engine.num_slots`` rows); serving the snapshot as a second set of weights on the one
engine is the better design and is open.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import numpy as np

from gymllm.validation import require

__all__ = ["FrozenOpponent", "League"]


class League:
    """A pool of at most ``size`` snapshots ``(version, flat weights)`` and the draw of the one to serve
    (module doc): :meth:`add` puts one in (past ``size`` the oldest leaves, except the first
    ``keep_first`` added, which stay for good), :meth:`draw` picks the latest with probability ``latest``,
    else one uniformly from the pool, from ``rng`` (seeded: a run replays)."""

    def __init__(self, size: int, *, latest: float = 0.0, seed: int = 0, keep_first: int = 0):
        if size < 1 or not 0.0 <= latest <= 1.0 or not 0 <= keep_first < size:
            raise ValueError(
                f"League: expected size >= 1, 0 <= latest <= 1 and 0 <= keep_first < size, received "
                f"size={size}, latest={latest}, keep_first={keep_first}; "
                "fix: e.g. League(4, latest=0.25, keep_first=1)"
            )
        self.size, self.latest, self.keep_first = int(size), float(latest), int(keep_first)
        self.rng = np.random.default_rng([int(seed), 0x1EA6])
        self.pool: list[tuple[int, dict[str, Any]]] = []
        self.draws: list[int] = []  # the version drawn at each refresh, in order

    def add(self, version: int, flat: dict[str, Any]) -> None:
        self.pool.append((int(version), flat))
        while len(self.pool) > self.size:  # the oldest of the rotating places leaves
            del self.pool[self.keep_first]

    def draw(self) -> tuple[int, dict[str, Any]]:
        if not self.pool:
            raise ValueError("League.draw: the pool is empty; fix: add a snapshot first")
        pick = (
            len(self.pool) - 1
            if self.rng.random() < self.latest
            else int(self.rng.integers(len(self.pool)))
        )
        version, flat = self.pool[pick]
        self.draws.append(version)
        return version, flat


class FrozenOpponent:
    """A snapshot of weights on its own engine (see the module docstring). ``version``: the learner
    step the snapshot was taken at (-1 for a ``run:DIR`` checkpoint); ``refreshes``: how many times
    it was refreshed; :meth:`weights_hash` fingerprints the weights it serves."""

    def __init__(
        self,
        engine: Any,
        pusher: Any,
        learner: Any | None,
        *,
        version: int,
        flat: dict[str, Any],
        league: League | None = None,
    ):
        self.engine, self.pusher, self.learner = engine, pusher, learner
        self.version, self.refreshes, self.flat = version, 0, flat
        self.league = league

    @classmethod
    def build(cls, cfg: Any, learner: Any) -> "FrozenOpponent":
        """``frozen``: the learner's current weights; ``run:DIR``: the checkpoint's trained weights."""
        from gymllm.train.components import load_model
        from gymllm.algos.weight_sync import WeightPusher
        from gymllm.train.wiring import engine_config
        from gymllm.inference.jax_engine import JaxEngine

        spec = cfg.multiagent.opponent
        checkpoint = spec[len("run:") :] if spec.startswith("run:") else ""
        lm = _checkpoint_model(cfg, checkpoint) if checkpoint else load_model(cfg.model)
        engine = JaxEngine(lm.model, lm.tokenizer, version=0, config=engine_config(cfg))
        pusher = WeightPusher(engine, lm.config)
        if checkpoint:
            return cls(engine, pusher, None, version=-1, flat=dict(lm.model.flat_params()))
        ma = cfg.multiagent
        league = (
            League(
                ma.league_size,
                latest=ma.league_latest,
                seed=cfg.run.seed,
                keep_first=ma.league_keep_first,
            )
            if ma.league_size
            else None
        )
        return cls.of_learner(engine, pusher, learner, league=league)

    @classmethod
    def of_learner(
        cls, engine: Any, pusher: Any, learner: Any, *, league: League | None = None
    ) -> "FrozenOpponent":
        """The ``frozen`` opponent on ``engine``: it serves the learner's current weights at once, and with
        a ``league`` they are its first snapshot (a fresh run's warm start, kept by ``keep_first``)."""
        opp = cls(engine, pusher, learner, version=learner.version, flat={}, league=league)
        opp.refresh(learner.version)
        opp.refreshes = 0
        return opp

    def refresh(self, version: int) -> None:
        """Take the learner's weights of step ``version`` (a ``run:DIR`` opponent never changes); with a
        league, add them to the pool and serve a snapshot drawn from it (``version`` then says which)."""
        if self.learner is None:
            return
        flat = dict(self.learner.policy_params())
        if self.league is not None:  # the pool takes the latest; the one served is drawn from it
            self.league.add(int(version), flat)
            version, flat = self.league.draw()
        self.flat = flat
        self.pusher.push(self.flat, version)
        self.version = int(version)
        self.refreshes += 1

    def weights_hash(self) -> str:
        """A SHA-256 over the served weights (names and bytes)."""
        h = hashlib.sha256()
        for name in sorted(self.flat):
            h.update(name.encode())
            h.update(np.asarray(self.flat[name]).tobytes())
        return h.hexdigest()

    async def close(self) -> None:
        await self.engine.close()


def _checkpoint_model(cfg: Any, checkpoint: str) -> Any:
    """The model of a ``run:`` opponent: a run directory (``DIR`` or ``DIR#NAME``) as the model it trained,
    which must be this run's model; any other checkpoint's weights on this run's model."""
    from gymllm import models
    from gymllm.train.components import load_model
    from gymllm.models.trained import is_run_dir, run_model_section

    if not is_run_dir(checkpoint):
        return load_model(dataclasses.replace(cfg.model, checkpoint=checkpoint))
    theirs = run_model_section(checkpoint).get("name")
    require(
        theirs == cfg.model.name,
        "multiagent.opponent",
        expected=f"a run of this run's model ({cfg.model.name}): the "
        "opponent's moves are read with this run's tokenizer",
        received=f"run:{checkpoint} (a run of {theirs})",
        fix="name a run trained from --model.name " + cfg.model.name,
    )
    return models.load(checkpoint)
