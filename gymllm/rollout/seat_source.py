"""Multi-agent training groups: :class:`SeatGroupSource`, a :class:`~gymllm.rollout.sources.GroupSource`
over a multi-agent text game (a :class:`~gymllm.multiagent.TextAECEnv`), and its config section
:class:`MultiAgentSection` (``--multiagent.*``).

    source = SeatGroupSource(game_fn, engine, agent, sampling=sp, rollout=rcfg, config=MultiAgentSection())
    run.train(source)                                        # the one training loop, unchanged

Groups and seats
----------------
Batch ``k`` plays ``rollout.group_size`` games from env seed ``run.seed + k`` (``game_seeds="game"``: game ``m``
from ``run.seed + k * group_size + m``). A **group** is
the ``group_size`` trajectories of one seat in that batch (group id ``g<k>:<seat>``, ``group.info["agent"]`` the
seat, every trajectory's ``info["agent"]`` and ``info["policy"]``), so a group never mixes seats (nor
seeds, unless ``game_seeds="game"``). With ``opponent="self"`` the learner plays every seat of every game and each batch yields one
group per learner seat (seats outside ``learner_seats`` are played by the same model, not trained).
With any other opponent each batch has one learner seat, rotating over ``learner_seats`` with ``k``
(batch ``k`` trains seat ``learner_seats[k % n]``), so no seat is favoured; the other seats are the
opponent's.

Barrier-free
------------
Every game is its own coroutine: it asks the engine for its current mover's reply and waits only for
that. Moves of different games (and batches) interleave in the engine's continuous batch; a batch's
groups are released when its ``group_size`` games have ended. Learner moves are sampled through
:class:`~gymllm.rollout.episode.Episode` exactly as the single-agent path does (token ids, behaviour
logprobs and the policy version of every sampled token recorded, token-in token-out), so staleness
and TITO hold. ``rollout.max_staleness`` bounds admission: batch ``k`` starts only while the batches
in flight were admitted within that many versions of the current one; ``rollout.max_concurrency``
bounds the games in flight.

Opponents and illegal moves
---------------------------
One game is played by :class:`~gymllm.rollout.seat_play.SeatGamePlayer` (its module doc: the
opponents, the ``illegal_move`` rules, a seat past its budget); a batch is dropped only when the
game itself or an engine raises.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any, Callable, Literal

import numpy as np

from gymllm.errors import explain
from gymllm.validation import is_int, require, require_one_of
from gymllm.rollout.config import RolloutConfig
from gymllm.rollout.episode import Episode
from gymllm.rollout.group_queue import QueueClosed
from gymllm.rollout.policy_map import check_policies
from gymllm.rollout.producer import RolloutStalledError
from gymllm.rollout.seat_play import (
    SeatGamePlayer,
    batch_groups,
    check_eval_opponents,
    check_opponent,
)
from gymllm.rollout.sources import QueueSource
from gymllm.types import Group

__all__ = ["MultiAgentSection", "SeatGroupSource", "SeatMetrics"]

log = logging.getLogger("gymllm.rollout")


@dataclasses.dataclass(frozen=True, kw_only=True)
class MultiAgentSection:
    """How a multi-agent env trains (used when ``env.id`` names a multi-agent game)."""

    opponent: str = "self"
    """self (the learner plays every seat), frozen (a snapshot of the learner refreshed every refresh_every steps),
    random (uniform legal moves), MODULE:FN (a scripted fn(observation, agent) -> action on the game's own
    PettingZoo observation and action) or run:DIR (a trained checkpoint, frozen)."""
    refresh_every: int = 1
    """steps between frozen refreshes (>= 1)."""
    learner_seats: tuple[str, ...] = ("all",)
    """``("all",)`` or the seat names the learner plays (the others go to the opponent)."""
    baseline: str = "group"
    """group (per-seat group baseline: the loss's estimator over each seat's group) or role_ema (SPIRAL's role-
    conditioned EMA per game and seat, decay baseline_decay; the learner then uses the advantage estimator
    role_ema, a group's role being its seat)."""
    baseline_decay: float = 0.95
    """role_ema's decay (b <- decay * b + (1 - decay) * R)."""
    baseline_key: str = ""
    """with role_ema, an info key the game sets for each seat at its first decision (Kuhn poker's ``card``): the
    baseline is then kept per seat and value, b[seat/card], so a hand's advantage no longer carries the luck of
    the card dealt, only how it was played ('' keys by seat alone, SPIRAL's RAE)."""
    policies: str = ""
    """'' (one learner) or a JSON object from seat to policy name ({"first": "a", "second": "b"}): several policies
    trained in one run, each with its own weights, optimizer, groups and version (gymllm.train.policies)."""
    policy_weights: str = "lora"
    """lora (an adapter per policy on the shared base, lora.rank or 8) or full (weights and an engine per policy)."""
    illegal_move: Literal["retry", "forfeit", "random"] = "retry"
    """What a seat's illegal move does: retry (the game's invalid_penalty, then move again; max_invalid in a row
    forfeit), forfeit (the first one forfeits) or random (a random legal move is played and the mover gets
    invalid_penalty); overrides the game's own MultiAgentConfig in training."""
    max_invalid: int = 3
    """Illegal moves in a row that forfeit the game with illegal_move retry (>= 1)."""
    game_seeds: Literal["batch", "game"] = "batch"
    """batch: every game of batch k from env seed run.seed + k, so a group compares its games on one deal (one
    board, one hand of cards); game: game m of batch k from env seed run.seed + k * group_size + m, so a group mixes
    deals, as SPIRAL's games do (use with baseline role_ema: a group mean over different deals compares luck; a
    near-deterministic policy plays one deal alike in every game, which leaves a group no spread)."""
    league_size: int = 0
    """With frozen, a league of the learner's last league_size snapshots (0: the latest only): at each refresh the
    current weights join the pool and the opponent until the next refresh is drawn from it."""
    league_latest: float = 0.0
    """the chance that draw is the latest snapshot (else uniform over the pool)."""
    league_keep_first: int = 0
    """the first league_keep_first snapshots stay in the pool for the whole run (the first is the weights the run
    starts from: the warm start, e.g. the SFT checkpoint); the other league_size - league_keep_first places rotate
    as above; 0 keeps none (< league_size, so the latest snapshot always has a place)."""
    eval_opponents: tuple[str, ...] = ("random",)
    """the fixed players the in-run evaluation plays (``eval.every``): ``random`` or ``MODULE:FN`` scripted players
    the run need never have trained against (:mod:`gymllm.suites.game_eval`)."""
    eval_games: int = 32
    """games against each of them per evaluation (even: seeds from ``eval.seed_base``, each played from both seats,
    greedy at ``eval.temperature``)."""
    eval_keep_best: bool = False
    """save the policy whose in-run score (the mean win-or-draw rate over ``eval_opponents`` at an evaluation step,
    step 0 included) beats every earlier one to ``run_dir/best`` (a run directory ``gymllm eval game --model.checkpoint``
    loads) and its step and score to ``run_dir/best.json`` (:mod:`gymllm.train.best`; needs ``eval.every``)."""
    eval_best_metric: str = "win_or_draw"
    """the in-run evaluation's figure ``eval_keep_best`` ranks steps by, averaged over ``eval_opponents``:
    ``win_or_draw``, ``score`` (a draw counts 1/2), ``win`` or ``reward`` (the game's own payoff a game, e.g. chips
    in Kuhn poker, where any policy that reaches the showdown wins half its games whatever it bets)."""

    def needs(self, field: str, setting: str, met: bool, *, why: str, other: str) -> None:
        """A ConfigError unless ``field`` is left at its default or ``setting`` is given (``met``)."""
        value, default = getattr(self, field), type(self).__dataclass_fields__[field].default
        require(
            value == default or met,
            f"multiagent.{field}",
            expected=f"{default!r} unless {setting} ({why})",
            received=f"{value!r} with {other}",
            fix=f"add {setting}, or leave --multiagent.{field.replace('_', '-')} at {default!r}",
        )

    def __post_init__(self) -> None:
        check_opponent(self.opponent)
        require(
            isinstance(self.refresh_every, int) and self.refresh_every >= 1,
            "multiagent.refresh_every",
            expected="an int >= 1 (optimizer steps between frozen-opponent refreshes)",
            received=self.refresh_every,
            fix="e.g. --multiagent.refresh-every 10",
        )
        seats = tuple(self.learner_seats)
        require(
            seats
            and all(isinstance(s, str) and s for s in seats)
            and ("all" not in seats or len(seats) <= 1),
            "multiagent.learner_seats",
            expected="('all',) or a non-empty list of seat names",
            received=self.learner_seats,
            fix="e.g. --multiagent.learner-seats player_1 (or all)",
        )
        object.__setattr__(self, "learner_seats", seats)
        require_one_of(
            self.baseline,
            ("group", "role_ema"),
            "multiagent.baseline",
            fix="--multiagent.baseline group",
        )
        require(
            0.0 <= float(self.baseline_decay) < 1.0,
            "multiagent.baseline_decay",
            expected="a float in [0, 1)",
            received=self.baseline_decay,
            fix="e.g. 0.95 (SPIRAL's)",
        )
        require_one_of(
            self.game_seeds,
            ("batch", "game"),
            "multiagent.game_seeds",
            fix="--multiagent.game-seeds game",
        )
        require_one_of(
            self.illegal_move,
            ("retry", "forfeit", "random"),
            "multiagent.illegal_move",
            fix="e.g. --multiagent.illegal-move forfeit",
        )
        require(
            is_int(self.max_invalid) and self.max_invalid >= 1,
            "multiagent.max_invalid",
            expected="an int >= 1 (illegal moves in a row that forfeit under illegal_move='retry')",
            received=self.max_invalid,
            fix="e.g. --multiagent.max-invalid 3",
        )
        require(
            is_int(self.league_size) and self.league_size >= 0,
            "multiagent.league_size",
            expected="an int >= 0 (earlier snapshots the frozen "
            "opponent is drawn from; 0: the latest only)",
            received=self.league_size,
            fix="e.g. --multiagent.league-size 4",
        )
        for field, setting, met, why, other in (  # settings that only mean something with another
            (
                "baseline_key",
                "--multiagent.baseline role_ema",
                self.baseline == "role_ema",
                "the key picks which EMA a game's reward is compared with",
                f"baseline={self.baseline!r}",
            ),
            (
                "league_size",
                "--multiagent.opponent frozen",
                self.opponent == "frozen",
                "the league is a pool of frozen snapshots",
                f"opponent={self.opponent!r}",
            ),
        ):
            self.needs(field, setting, met, why=why, other=other)
        require(
            0.0 <= float(self.league_latest) <= 1.0,
            "multiagent.league_latest",
            expected="a probability in [0, 1]",
            received=self.league_latest,
            fix="e.g. 0.25",
        )
        require(
            is_int(self.league_keep_first)
            and 0 <= self.league_keep_first < max(self.league_size, 1),
            "multiagent.league_keep_first",
            expected=f"an int in [0, league_size) = [0, {max(self.league_size, 1)}) (the "
            "snapshots kept for the whole run; the latest needs a place of its own)",
            received=f"{self.league_keep_first} with league_size={self.league_size}",
            fix="e.g. --multiagent.league-size 4 --multiagent.league-keep-first 1 (keeps the warm start)",
        )
        object.__setattr__(self, "eval_opponents", check_eval_opponents(self.eval_opponents))
        require(
            isinstance(self.eval_keep_best, bool),
            "multiagent.eval_keep_best",
            expected="a bool",
            received=repr(self.eval_keep_best),
            fix="--multiagent.eval-keep-best (or --multiagent.no-eval-keep-best)",
        )
        require(
            not (self.eval_keep_best and self.policies),
            "multiagent.eval_keep_best",
            expected="one policy (the in-run evaluation scores the run's one policy)",
            received=f"eval_keep_best with policies={self.policies!r}",
            fix="drop --multiagent.eval-keep-best, or train one policy",
        )
        require(
            is_int(self.eval_games) and self.eval_games >= 2 and self.eval_games % 2 == 0,
            "multiagent.eval_games",
            expected="an even int >= 2 (each seed from both seats)",
            received=self.eval_games,
            fix="e.g. --multiagent.eval-games 32",
        )
        check_policies(self)

    def seats(self, possible: list[str]) -> list[str]:
        """The learner's seats among the game's ``possible`` agents (a ConfigError names unknown ones)."""
        if self.learner_seats == ("all",):
            return list(possible)
        bad = [s for s in self.learner_seats if s not in possible]
        require(
            not bad,
            "multiagent.learner_seats",
            expected=f"seats of this game: {possible}",
            received=list(self.learner_seats),
            fix=f"drop {bad} (or use all)",
        )
        return list(self.learner_seats)


class SeatMetrics:
    """Per-seat figures of a multi-agent run for the step record: ``observe(filter)`` wraps the run's
    group filter so every finished group (filtered or not) counts under its seat
    (``group.info["agent"]``); :meth:`flush` returns, over the groups since the last flush,
    ``seat/<seat>/reward`` (mean), ``seat/<seat>/win`` / ``draw`` / ``loss`` (shares of games with a
    reward above, at or below 0, the zero-sum convention of PettingZoo's classic games) and
    ``seat/<seat>/groups`` (so far); ``opponent/version`` when ``version()`` gives one; against an
    ``opponent`` other than ``"self"``, ``vs/<opponent>/win|draw|loss`` over every learner seat's games
    (the three sum to 1; a ``/`` in the opponent's name becomes ``_``). Illegal moves
    (:attr:`MultiAgentSection.illegal_move`): ``seat/<seat>/illegal`` (the seat's illegal moves per
    game) and, against an opponent, ``opponent/illegal`` (its illegal moves per game, errors included)
    and ``opponent/errors`` (its seats' crashes since the last flush)."""

    def __init__(self, version: Callable[[], Any] | None = None, opponent: str = "self"):
        self.version = version
        self.opponent = opponent.replace("/", "_")
        self.pending: dict[str, list[float]] = {}
        self.illegal: dict[str, list[int]] = {}
        self.others = {"illegal": 0, "errors": 0, "games": 0}
        self.groups: dict[str, int] = {}

    def observe(self, group_filter: Callable[[Any], bool] | None) -> Callable[[Any], bool]:
        def keep(group: Any) -> bool:
            seat = group.info.get("agent")
            if seat is not None:
                self.pending.setdefault(seat, []).extend(
                    float(t.reward) for t in group.trajectories
                )
                self.illegal.setdefault(seat, []).extend(
                    int(getattr(t, "info", {}).get("illegal", 0)) for t in group.trajectories
                )
                self.groups[seat] = self.groups.get(seat, 0) + 1
                self.others["games"] += len(group.trajectories)
                self.others["illegal"] += int(group.info.get("opponent_illegal", 0))
                self.others["errors"] += int(group.info.get("opponent_errors", 0))
            return True if group_filter is None else bool(group_filter(group))

        return keep

    def flush(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for seat, rewards in self.pending.items():
            r = np.asarray(rewards, dtype=np.float64)
            out.update(
                {
                    f"seat/{seat}/reward": float(r.mean()),
                    f"seat/{seat}/win": float((r > 0).mean()),
                    f"seat/{seat}/draw": float((r == 0).mean()),
                    f"seat/{seat}/loss": float((r < 0).mean()),
                }
            )
        out.update({f"seat/{seat}/groups": float(n) for seat, n in self.groups.items()})
        if self.opponent != "self" and self.pending:
            r = np.concatenate([np.asarray(v, dtype=np.float64) for v in self.pending.values()])
            out.update(
                {
                    f"vs/{self.opponent}/win": float((r > 0).mean()),
                    f"vs/{self.opponent}/draw": float((r == 0).mean()),
                    f"vs/{self.opponent}/loss": float((r < 0).mean()),
                }
            )
        out.update(
            {f"seat/{seat}/illegal": float(np.mean(n)) for seat, n in self.illegal.items() if n}
        )
        if self.opponent != "self" and self.others["games"]:
            out["opponent/illegal"] = self.others["illegal"] / self.others["games"]
            out["opponent/errors"] = float(self.others["errors"])
        self.pending, self.illegal = {}, {}
        self.others = {"illegal": 0, "errors": 0, "games": 0}
        v = self.version() if self.version is not None else None
        if v is not None:
            out["opponent/version"] = float(v)
        return out


class SeatGroupSource(QueueSource):
    """Groups per seat from many multi-agent games in flight on one engine (see the module docstring).

    ``game_fn``: a zero-argument factory of :class:`~gymllm.multiagent.TextAECEnv`; ``agent``: the
    :class:`~gymllm.rollout.agents.Agent` (chat template, reply -> move); ``group_filter(group) -> bool``
    decides whether a group reaches the learner (the run's zero-variance filter)."""

    name = "multi-agent seats"
    waiting_for = "waiting for the next game batch to end"

    def __init__(
        self,
        game_fn: Callable[[], Any],
        engine: Any,
        agent: Any,
        *,
        sampling: Any,
        rollout: RolloutConfig,
        config: MultiAgentSection,
        seed: int = 0,
        group_filter: Callable[[Group], bool] | None = None,
        opponent: Any = None,
    ):
        self.frozen = config.opponent == "frozen" or config.opponent.startswith("run:")
        require(
            not self.frozen or opponent is not None,
            "multiagent.opponent",
            expected="an opponent engine for a frozen or run:DIR "
            "opponent (SeatGroupSource(..., opponent=FrozenOpponent.build(cfg, learner)))",
            received=config.opponent,
            fix="train through gymllm train / train(), which builds it, or pass opponent=",
        )
        self.game_fn, self.engine, self.agent, self.sampling = game_fn, engine, agent, sampling
        self.rollout, self.config, self.group_filter = rollout, config, group_filter
        self.seed = seed  # batch k: env seed seed + k (the run's run.seed)
        self.opponent = opponent  # frozen / run:DIR: .engine, .version, .refresh(step), .close()
        probe = game_fn()
        self.possible = list(probe.possible_agents)
        probe.close()
        self.learners = config.seats(self.possible)
        self.version = int(getattr(engine, "version", 0))
        self.queue: asyncio.Queue = asyncio.Queue()
        self.ready: list[Group] = []
        self.tasks: set[asyncio.Task] = set()
        self.producer: asyncio.Task | None = None
        self.changed = asyncio.Event()
        self.in_flight: dict[int, int] = {}  # batch -> admitted version
        self.games_in_flight = 0
        self.counts = {
            "groups": 0,
            "games": 0,
            "filtered": 0,
            "failed_batches": 0,
            "opponent_moves": 0,
            "learner_moves": 0,
            "illegal_moves": 0,
            "seat_errors": 0,
        }
        self.error: BaseException | None = None
        self.failed_streak = 0
        self.closed = False
        self.player = SeatGamePlayer(
            game_fn,
            agent,
            sampling=sampling,
            rollout=rollout,
            config=config,
            seed=seed,
            possible=self.possible,
            frozen=self.frozen,
            counts=self.counts,
        )

    # --- GroupSource ------------------------------------------------------------------------------
    async def start(self) -> None:
        if self.producer is None:
            self.producer = asyncio.ensure_future(self._produce())

    def set_policy_version(self, version: int) -> None:
        self.version = int(version)
        if self.config.opponent == "frozen" and version % self.config.refresh_every == 0:
            self.opponent.refresh(
                version
            )  # games already in flight finish against the new snapshot
        self.changed.set()

    def stats(self) -> dict[str, Any]:
        out = {"games_in_flight": self.games_in_flight, "batches_in_flight": len(self.in_flight)}
        if self.opponent is not None:
            out["opponent_version"] = self.opponent.version
        return out

    def result(self) -> dict[str, Any]:
        return dict(self.counts)

    @property
    def ready_groups(self) -> int:
        return len(self.ready)

    async def get_group(self) -> Group:
        await self.start()
        while not self.ready:
            if self.error is not None:
                raise self.error
            if self.closed:
                raise QueueClosed("the multi-agent source is closed")
            self.changed.clear()
            await self.changed.wait()
        self.ready.sort(key=lambda g: g.admitted_version)
        group = self.ready.pop(0)
        self.changed.set()  # a full queue has room again: the producer may be waiting on exactly that
        return group

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        tasks = [t for t in (self.producer, *self.tasks) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.opponent is not None:
            await self.opponent.close()
        self.changed.set()

    # --- production -------------------------------------------------------------------------------
    def _admissible(self) -> bool:
        r = self.rollout
        if self.games_in_flight + r.group_size > max(r.max_concurrency, r.group_size):
            return False
        if len(self.ready) >= max(r.queue_size, 1):
            return False
        bound = r.max_staleness
        return bound is None or all(self.version - v <= bound for v in self.in_flight.values())

    async def _produce(self) -> None:
        k = 0
        while not self.closed:
            while not self._admissible():
                self.changed.clear()
                await self.changed.wait()
            self.in_flight[k] = self.version
            self.games_in_flight += self.rollout.group_size
            task = asyncio.ensure_future(self._batch(k))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
            k += 1
            await asyncio.sleep(0)

    def engine_for(self, seat: str, seats: list[str]) -> Any:
        """The engine that plays ``seat`` in a batch training ``seats`` (a hook: one engine per policy)."""
        return self.engine if seat in seats or not self.frozen else self.opponent.engine

    def policy_of(self, seat: str) -> str:
        """The policy name a trained ``seat``'s groups and trajectories carry (a hook)."""
        return "learner"

    def batch_seats(self, k: int) -> list[str]:
        """The seats trained in batch ``k``: every learner seat in self-play, else one, rotating."""
        if self.config.opponent == "self":
            return list(self.learners)
        return [self.learners[k % len(self.learners)]]

    def game_seed(self, k: int, m: int) -> int:
        """The env seed of game ``m`` of batch ``k`` (``multiagent.game_seeds``)."""
        if self.config.game_seeds == "game":
            return self.seed + k * self.rollout.group_size + m
        return self.seed + k

    async def _batch(self, k: int) -> None:
        seed = self.game_seed(k, 0)
        seats = self.batch_seats(k)
        tasks = [
            asyncio.ensure_future(self.play_game(k, m, self.game_seed(k, m), seats))
            for m in range(self.rollout.group_size)
        ]
        try:
            games = await asyncio.gather(*tasks)
        except (
            Exception,
            asyncio.CancelledError,
        ) as e:  # a game that raised: the batch is lost (its other games stop), the run goes on
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if isinstance(e, asyncio.CancelledError):
                raise
            self.counts["failed_batches"] += 1
            self.failed_streak += 1
            log.warning(
                "multi-agent batch %d (seed %d) failed and is dropped: %s: %s",
                k,
                seed,
                type(e).__name__,
                e,
            )
            if self.failed_streak > self.rollout.max_failed_streak:
                self.error = RolloutStalledError(
                    explain(
                        "multi-agent games",
                        expected="games that finish",
                        received=f"{self.failed_streak} failed "
                        f"batches in a row, the last: {type(e).__name__}: {e}",
                        fix="fix the game or the opponent",
                    ),
                    failures=self.failed_streak,
                    last_errors=[repr(e)],
                )
            self._finish_batch(k)
            return
        self.failed_streak = 0
        for group in batch_groups(
            k,
            seed,
            seats,
            games,
            admitted=self.in_flight[k],
            released=self.version,
            opponent=self.config.opponent,
            policy_of=self.policy_of,
        ):
            self.counts["groups"] += 1
            if self.group_filter is None or self.group_filter(group):
                self.ready.append(group)
            else:
                self.counts["filtered"] += 1
        self.counts["games"] += len(games)
        self._finish_batch(k)

    def _finish_batch(self, k: int) -> None:
        self.in_flight.pop(k, None)
        self.games_in_flight -= self.rollout.group_size
        self.changed.set()

    async def play_game(
        self, k: int, member: int, seed: int, seats: list[str]
    ) -> tuple[dict[str, Episode], dict[str, dict[str, int]]]:
        """Play game ``member`` of batch ``k`` from ``seed`` (:meth:`SeatGamePlayer.play_game
        <gymllm.rollout.seat_play.SeatGamePlayer.play_game>`, with this source's :meth:`engine_for`)."""
        return await self.player.play_game(
            k, member, seed, seats, self.engine_for, self.rollout.prompt_limit(self.engine)
        )
