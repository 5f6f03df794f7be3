"""One multi-agent game of a :class:`~gymllm.rollout.seat_source.SeatGroupSource` batch, move by move.

:class:`SeatGamePlayer` plays a game from its env seed (the learner seats through
:class:`~gymllm.rollout.episode.Episode`, the others by the opponent) and checks every move before the
game sees it; :func:`batch_groups` turns a batch's games into one group per trained seat. The module
doc of :mod:`gymllm.rollout.seat_source` says how batches, groups and seats relate.

Opponents (``opponent``)
------------------------
``self``: the learner itself. ``random``: a uniformly random legal move (per-game RNG from the env
seed). ``MODULE:FN``: ``fn(observation, agent) -> action`` on the wrapped PettingZoo env's own
observation and action (as PettingZoo policies are written); the action is turned into the move text
the text env parses (:func:`move_text`).

Illegal moves (``illegal_move``)
--------------------------------
Every seat's move, the learner's reply and a scripted seat's action alike, is checked before the game
sees it; an illegal one (a scripted seat that raised is a :class:`SeatError`, an illegal move too)
is counted (``tally``, trajectory ``info["illegal"]``, the
:class:`~gymllm.rollout.seat_source.SeatMetrics` figures) and handled as the section says: ``retry``
and ``forfeit`` are the game's own rules (:class:`~gymllm.multiagent.MultiAgentConfig` set from the
section), ``random`` plays a random legal move instead and owes the mover the game's
``invalid_penalty``. A game never stops on a seat's error; a batch is dropped only when the game
itself or an engine raises.

A seat whose game ended before its first move gets a trajectory without sampled tokens (its
reward counts in the group's baseline, it trains nothing). A learner seat whose trajectory hit its budget (``rollout.max_model_calls`` moves, or the engine's
context) plays the rest of its game with random legal moves, unrecorded; the trajectory ends truncated and its
reward still sums every reward the seat received, the game's outcome included.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from typing import Any, Callable

import numpy as np

from gymllm.errors import ConfigError, explain
from gymllm.registration import load_callable
from gymllm.rollout.config import RolloutConfig
from gymllm.rollout.episode import Episode, EpisodeKey
from gymllm.types import Group

__all__ = [
    "SeatGamePlayer",
    "SeatError",
    "batch_groups",
    "check_eval_opponents",
    "check_opponent",
    "load_scripted_opponent",
    "move_text",
    "random_move",
    "SCRIPTED_SPEC",
]

log = logging.getLogger("gymllm.rollout")
SCRIPTED_SPEC = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$")  # MODULE:FN


def check_opponent(o: Any) -> None:
    """``multiagent.opponent``: ``self``, ``frozen``, ``random``, ``MODULE:FN`` or ``run:DIR`` (a
    ConfigError otherwise)."""
    ok = (
        o in ("self", "frozen", "random")
        or (o.startswith("run:") and len(o) > 4)
        or (not o.startswith("run:") and bool(SCRIPTED_SPEC.match(o)))
    )
    if not isinstance(o, str) or not ok:
        raise ConfigError(
            explain(
                "multiagent.opponent",
                expected="'self', 'frozen', 'random', 'MODULE:FN' (a "
                "scripted fn(observation, agent) -> action) or 'run:DIR' (a checkpoint)",
                received=o,
                fix="e.g. --multiagent.opponent random or "
                "--multiagent.opponent my_pkg.policies:greedy",
            )
        )


def check_eval_opponents(opponents: Any) -> tuple[str, ...]:
    """``multiagent.eval_opponents`` as a tuple of ``random`` / ``MODULE:FN`` (a ConfigError otherwise)."""
    ev = tuple(opponents)
    if not ev or not all(
        isinstance(o, str) and (o == "random" or SCRIPTED_SPEC.match(o)) for o in ev
    ):
        raise ConfigError(
            explain(
                "multiagent.eval_opponents",
                expected="'random' or 'MODULE:FN' scripted players",
                received=opponents,
                fix="e.g. --multiagent.eval-opponents random gymllm.envs.games:tictactoe_one_ply",
            )
        )
    return ev


def load_scripted_opponent(spec: str) -> Callable[[Any, str], Any]:
    """``MODULE:FN`` -> the callable ``fn(observation, agent) -> action`` (a ConfigError when missing)."""
    return load_callable(
        spec,
        "multiagent.opponent",
        form="MODULE:FN",
        expected="a callable fn(observation, agent) -> action",
        fix="name a function",
    )


def move_text(game: Any, agent: str, action: Any) -> str:
    """The move text :class:`~gymllm.multiagent.TextAECEnv` parses for the inner env's own ``action``."""
    space = game.action_space(agent)
    moves = getattr(space, "moves", ())
    if moves:
        i = int(action) - int(space.inner.start)
        if not 0 <= i < len(moves):
            raise ValueError(
                explain(
                    f"{agent}'s action",
                    expected=f"a move of the game in [{space.inner.start}, "
                    f"{space.inner.start + len(moves)})",
                    received=action,
                    fix="return one of the game's own actions",
                )
            )
        return moves[i]
    if isinstance(action, np.ndarray):
        return json.dumps(action.tolist())
    if isinstance(action, np.generic):
        return str(action.item())
    return action if isinstance(action, str) else json.dumps(action)


class SeatError:
    """The move of a scripted seat that raised (or returned no move of the game): an illegal move under
    :attr:`MultiAgentSection.illegal_move` (the game never parses it as text)."""

    def __init__(self, agent: str, error: BaseException):
        self.agent, self.why = agent, f"{agent} crashed: {type(error).__name__}: {error}"

    def __repr__(self) -> str:
        return f"SeatError({self.why!r})"


def random_move(game: Any, agent: str, rng: np.random.Generator) -> str:
    """A uniformly random legal move of ``agent`` (:func:`gymllm.multiagent.policies.policy_move`)."""
    from gymllm.multiagent.policies import policy_move

    return policy_move(None, game, agent, rng)


class SeatGamePlayer:
    """Plays the games of a :class:`~gymllm.rollout.seat_source.SeatGroupSource` (module doc).

    ``game_fn``: the source's game factory; ``agent`` / ``sampling``: the learner seats' chat agent and
    sampling; ``seed``: the run's seed (the episodes' sampling base seed); ``possible``: the game's seats; ``frozen``: the opponent is an engine (``frozen`` /
    ``run:DIR``), whose moves count as ``opponent_moves``; ``counts``: the source's counters, shared
    (``learner_moves``, ``opponent_moves``, ``illegal_moves``, ``seat_errors`` are counted here)."""

    def __init__(
        self,
        game_fn: Callable[[], Any],
        agent: Any,
        *,
        sampling: Any,
        rollout: RolloutConfig,
        config: Any,
        seed: int,
        possible: list[str],
        frozen: bool,
        counts: dict[str, int],
    ):
        self.game_fn, self.agent, self.sampling, self.rollout, self.config = (
            game_fn,
            agent,
            sampling,
            rollout,
            config,
        )
        self.seed, self.possible, self.frozen, self.counts = seed, possible, frozen, counts
        self.scripted = (
            load_scripted_opponent(config.opponent)
            if config.opponent not in ("self", "random") and not frozen
            else None
        )

    def new_game(self) -> Any:
        """A game from ``game_fn`` whose illegal moves follow ``illegal_move`` / ``max_invalid``."""
        game = self.game_fn()
        mode = (
            "retry" if self.config.illegal_move == "random" else self.config.illegal_move
        )  # random: never stepped
        game.config = dataclasses.replace(
            game.config, invalid_action=mode, max_invalid=self.config.max_invalid
        )
        return game

    def play_move(
        self,
        game: Any,
        agent: str,
        move: Any,
        rng: np.random.Generator,
        tally: dict[str, dict[str, int]],
    ) -> float:
        """Step ``game`` with ``agent``'s ``move`` (its text, or a :class:`SeatError`) under ``illegal_move``;
        an illegal one is counted in ``tally["illegal"]`` (a SeatError in ``tally["errors"]`` too). Returns
        the penalty the mover is owed on top of the game's rewards (``random``: the game saw a legal move)."""
        if isinstance(move, SeatError):
            why: str | None = move.why
            tally["errors"][agent] = tally["errors"].get(agent, 0) + 1
            self.counts["seat_errors"] += 1
            if (
                self.counts["seat_errors"] & (self.counts["seat_errors"] - 1) == 0
            ):  # the 1st, 2nd, 4th, 8th...
                log.warning(
                    "multi-agent seat error #%d (an illegal move under multiagent.illegal_move=%s, the game "
                    "goes on): %s",
                    self.counts["seat_errors"],
                    self.config.illegal_move,
                    why,
                )
        else:
            mask = game.codec.mask(agent, game.env.observe(agent), game.infos.get(agent))
            why = game.codec.parse(agent, move, mask)[1]
        if why is None:
            game.step(move)
            return 0.0
        tally["illegal"][agent] = tally["illegal"].get(agent, 0) + 1
        self.counts["illegal_moves"] += 1
        if self.config.illegal_move == "random":
            game.step(random_move(game, agent, rng))
            return float(game.config.invalid_penalty)
        game.step(
            move
        )  # the game's retry (penalty, the mover again) or forfeit, as new_game set them
        return 0.0

    async def play_game(
        self,
        k: int,
        member: int,
        seed: int,
        seats: list[str],
        engine_for: Callable[[str, list[str]], Any],
        limit: int | None,
    ) -> tuple[dict[str, Episode], dict[str, dict[str, int]]]:
        """Play game ``member`` of batch ``k`` from ``seed``, training ``seats``; returns the learner seats'
        episodes and the game's tally (``{"illegal": {seat: n}, "errors": {seat: n}}``, see
        :meth:`play_move`; and ``"keys": {seat: value}``, the ``baseline_key`` info of each learner seat's first
        decision). ``engine_for(seat, seats)``: the engine that plays a modelled seat (the
        source's hook); ``limit``: the longest prompt a learner seat may send (``rollout.prompt_limit``)."""
        game = self.new_game()
        tally: dict[str, dict[str, Any]] = {"illegal": {}, "errors": {}}
        owed: dict[
            str, float
        ] = {}  # penalties of ``random`` illegal moves, paid with the mover's next reward
        rng = np.random.default_rng([seed, member])
        modelled = (
            self.possible if self.config.opponent == "self" or self.frozen else seats
        )  # seats a model plays
        engines = {a: engine_for(a, seats) for a in modelled}
        episodes: dict[str, Episode] = {}
        for i, seat in enumerate(modelled):
            key = EpisodeKey(
                group_index=k,
                member=member * len(self.possible) + self.possible.index(seat),
                env_seed=seed,
                task_id=f"seed{seed}",
            )
            episodes[seat] = Episode(
                key,
                self.agent,
                self.sampling,
                base_seed=self.seed,
                max_model_calls=self.rollout.max_model_calls,
                env_id=member,
            )
        try:
            game.reset(seed=seed)
            started: set[str] = set()
            while game.agents:
                agent = game.agent_selection
                obs, reward, term, trunc, info = game.last()
                reward = float(reward) + owed.pop(agent, 0.0)
                ep = episodes.get(agent)
                info = {**info, "agent": agent}
                if term or trunc:
                    if (
                        ep is not None and agent not in started
                    ):  # the game ended before its first move
                        started.add(agent)
                        ep.begin(obs["observation"], info)
                    if ep is not None and not ep.done:
                        ep.on_step(obs["observation"], float(reward), term, trunc, info, 0.0)
                    elif ep is not None:
                        ep.rewards.append(
                            float(reward)
                        )  # the outcome still counts after its budget
                    game.step(None)
                    continue
                if ep is None:
                    self.play_move(game, agent, self.opponent_move(game, agent, rng), rng, tally)
                    continue
                if agent not in started:
                    started.add(agent)
                    ep.begin(obs["observation"], info)
                    name = getattr(self.config, "baseline_key", "")
                    if name and name in info:
                        tally.setdefault("keys", {})[agent] = info[name]
                elif not ep.done:
                    ep.on_step(obs["observation"], float(reward), False, False, info, 0.0)
                else:
                    ep.rewards.append(float(reward))
                if ep.done or not ep.fits(limit):  # over its budget: the rest unrecorded
                    game.step(random_move(game, agent, rng))
                    continue
                prompt, params = ep.next_request()
                completion = await engines[agent].generate(
                    prompt, params, session_id=ep.key.trajectory_id
                )
                self.counts[
                    "learner_moves" if agent in seats or not self.frozen else "opponent_moves"
                ] += 1
                owe = self.play_move(game, agent, ep.on_completion(completion, 0.0), rng, tally)
                if owe:
                    owed[agent] = owed.get(agent, 0.0) + owe
            for seat, ep in episodes.items():
                if seat in started and not ep.done:
                    ep.on_step(
                        "The game is over.", owed.pop(seat, 0.0), True, False, {"agent": seat}, 0.0
                    )
        finally:
            for seat, ep in episodes.items():
                end = getattr(engines[seat], "end_session", None)
                if end is not None:
                    end(ep.key.trajectory_id)
            game.close()
        return {s: episodes[s] for s in seats}, tally

    def opponent_move(self, game: Any, agent: str, rng: np.random.Generator) -> str | SeatError:
        from gymllm.multiagent.policies import call_scripted

        self.counts["opponent_moves"] += 1
        if self.scripted is None:
            return random_move(game, agent, rng)
        try:
            raw = game.env.observe(agent)  # the wrapped PettingZoo env's own observation
            return move_text(game, agent, call_scripted(self.scripted, raw, agent, game.env, rng))
        except (
            Exception
        ) as e:  # a crashing seat: an illegal move (multiagent.illegal_move); the game goes on
            return SeatError(agent, e)


def batch_groups(
    k: int,
    seed: int,
    seats: list[str],
    games: list[tuple[dict[str, Episode], dict[str, dict[str, int]]]],
    *,
    admitted: int,
    released: int,
    opponent: str,
    policy_of: Callable[[str], str],
) -> list[Group]:
    """One group per trained seat of batch ``k`` (``games``: each game's :meth:`SeatGamePlayer.play_game`
    result): ``g<k>:<seat>``, its trajectories tagged with the seat, policy, game and illegal moves; the
    opponent's illegal moves and errors are counted once per batch, in its first seat's group."""
    out = []
    for seat in seats:
        trajs = []
        others = {
            "illegal": 0,
            "errors": 0,
        }  # the seats no group of this batch trains (the opponent's)
        for m, (episodes, tally) in enumerate(games):
            ep = episodes[seat]
            for t in ep.trajectories():
                t.group_id = f"g{k}:{seat}"
                t.info.update(
                    agent=seat,
                    policy=policy_of(seat),
                    game=m,
                    opponent=opponent,
                    illegal=tally["illegal"].get(seat, 0),
                )
                keys = tally.get(
                    "keys", {}
                )  # multiagent.baseline_key's value at each first decision
                if seat in keys:
                    t.info["baseline_key"] = str(keys[seat])
                trajs.append(t)
            for key in others:  # counted once per batch: in its first seat's group
                others[key] += (
                    sum(n for a, n in tally[key].items() if a not in seats)
                    if seat == seats[0]
                    else 0
                )
        out.append(
            Group(
                group_id=f"g{k}:{seat}",
                task_id=f"seed{seed}",
                trajectories=trajs,
                admitted_version=admitted,
                info={
                    "agent": seat,
                    "role": seat,
                    "policy": policy_of(seat),
                    "seed": seed,
                    "opponent": opponent,
                    "released_version": released,
                    "opponent_illegal": others["illegal"],
                    "opponent_errors": others["errors"],
                },
            )
        )
    return out
