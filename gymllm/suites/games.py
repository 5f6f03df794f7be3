"""Matches on a two-player text game: win/draw/loss per pairing and an Elo table over every player.

    game = resolve_game("tic-tac-toe")
    players = [Player(label="base", loaded=models.load(name)), opponent_player("random")]
    summary = run_matches(game, players, "out/ttt", config=MatchConfig(games=20))

Players
-------
A :class:`Player` is a model (``loaded``: a ``LoadedModel``, served by its own
:class:`~gymllm.inference.JaxEngine`; or ``make_engine``), a scripted policy (``fn(observation,
agent) -> action`` on the wrapped PettingZoo env's own observation and action, as PettingZoo policies
are written and as ``--multiagent.opponent MODULE:FN`` takes it) or the random player (a uniformly
random legal move). A model moves through :class:`~gymllm.rollout.episode.Episode`, the path training
takes (:class:`~gymllm.rollout.seat_source.SeatGroupSource`): the same agent, chat template and token
buffer, one conversation per seat and game.

Schedule
--------
Every pair of players meets (a round robin: the opponents play each other too, which costs no model
call and ties the ratings to them); each pairing plays ``games`` games (even): games ``2i`` and
``2i + 1`` share the env seed ``seed + i`` with the seats swapped, so each side plays each seat
equally often. Every game of every pairing is in flight at once (up to ``max_concurrency``): a game
awaits only its own mover's reply, so moves of different games interleave in each player's engine
(continuous batching), and no game waits for another.

Rows and scoring
----------------
``games.jsonl`` gets one row per game the moment it ends: the players by seat, the winner (a label,
or None for a draw), ``draw``, the moves (``[seat, move]``), invalid moves per player, the forfeit,
``error`` and ``scored``, and each player's final ``rewards``. The winner is the seat with the higher final reward (the game's own
outcome; invalid-move penalties are cleared by the next legal move), a forfeit (an illegal move
under the game's ``MultiAgentConfig``) loses. A side that raises (a scripted policy's exception, an
engine error, a model reply past ``move_timeout_s``, a prompt past the engine's context) is recorded
with ``error`` and ``crashed``: with ``errors="loss"`` (default, the engine-tournament convention:
a crash, a stall or an illegal move loses) the other side wins; with ``errors="exclude"`` the row is
kept but not scored. A game past ``max_moves`` moves is adjudicated a draw (``truncated``). An
error of the game itself (its reset or step raising) is an unscored row with ``crashed`` None.
Nothing is dropped: the other games go on.

Outputs
-------
``summary.json``: per ordered (player, opponent) the scored games, ``win`` / ``draw`` / ``loss``
(rates that sum to 1), their 95% Wilson intervals, the score rate (wins + draws / 2) and the games
played in each seat; under ``paired``, every two model players compared against each opponent both met,
paired by seed with a Student's t interval on the difference (:mod:`gymllm.suites.game_stats`: score,
win-or-draw, win and final reward); ``ratings.json``: the Bradley-Terry maximum-likelihood Elo ratings of every
player from all scored games (draws half a win; :mod:`gymllm.utils.elo`), anchored ``random = 1000``
when the random player plays, else the mean at 1000, with a bootstrap interval per rating (games
resampled within each pairing).

One game is played and scored by :mod:`gymllm.suites.game_play`; the win/draw/loss and Elo tables are
:mod:`gymllm.suites.game_tables`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import pathlib
import re
from typing import Any, Callable, Literal, Sequence

from gymllm.errors import ConfigError
from gymllm.validation import check_range, require, require_one_of
from gymllm.suites.game_play import play_game
from gymllm.suites.game_tables import ratings_table, summarize_games
from gymllm.suites.runner import LabeledPolicy
from gymllm.utils.seeds import HELD_OUT_SEED_BASE

__all__ = [
    "Player",
    "MatchConfig",
    "opponent_player",
    "resolve_game",
    "schedule",
    "run_matches",
    "arun_matches",
]

_FN = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$")
GAME_HELP = "tic-tac-toe, connect-four, or MODULE:FACTORY (a function returning a PettingZoo AEC or Parallel env)"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Player(LabeledPolicy):
    """A :class:`~gymllm.suites.runner.LabeledPolicy` in a game: exactly one of ``loaded`` (a model),
    ``fn`` (a scripted ``fn(observation, agent) -> action``) or ``random=True``. system_prompt: a
    model's system prompt (a run's ``env.system_prompt``)."""

    fn: Callable[[Any, str], Any] | None = None
    random: bool = False
    system_prompt: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        kinds = [self.loaded is not None, self.fn is not None, bool(self.random)]
        require(
            sum(kinds) == 1,
            f"player {self.label!r}",
            expected="exactly one of loaded= (a model), fn= (a scripted policy) or random=True",
            received=f"{sum(kinds)} of them",
            fix="give one kind per player",
        )
        require(
            self.fn is None or callable(self.fn),
            f"player {self.label!r}.fn",
            expected="a callable fn(observation, agent)",
            received=type(self.fn).__name__,
            fix="name a function",
        )

    @property
    def kind(self) -> str:
        """``model``, ``scripted`` or ``random``."""
        return (
            "model" if self.loaded is not None else "scripted" if self.fn is not None else "random"
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class MatchConfig:
    """games: games per pairing (even: seats swap in pairs); seed: the first env seed (held-out
    range); temperature, max_tokens: a model's sampling per move; max_moves: moves of one game before
    it is adjudicated a draw; max_concurrency: games in flight at once (all pairings together);
    num_slots, max_len: each model engine's rows decoded together and tokens a row; move_timeout_s: the
    watchdog on one model reply (None: none); errors: ``loss`` (a crashing side loses) or ``exclude``
    (its game is not scored); anchor: the player rated ``anchor_value`` when it plays (else the mean
    is ``anchor_value``); prior_draws: virtual draws per pairing in the rating fit (keeps a perfect
    record finite); confidence, num_resamples, bootstrap_seed: the intervals; model_pairs: False leaves out
    the pairings of two models (each model then meets only the scripted and random players, which is what
    a paired comparison of checkpoints needs, at a fraction of the model calls); overflow: a model whose
    conversation outgrows its engine's context ``error``\ s (its side loses, ``errors``) or plays a ``random``
    legal move from then on, as training does past its budget (counted in the row's ``overflow``). A
    scripted policy runs
    inline in the event loop (no watchdog: it must return)."""

    games: int = 20
    seed: int = HELD_OUT_SEED_BASE
    temperature: float = 0.7
    max_tokens: int = 64
    max_moves: int = 200
    max_concurrency: int = 64
    num_slots: int = 16
    max_len: int = 2048
    move_timeout_s: float | None = 300.0
    errors: Literal["loss", "exclude"] = "loss"
    anchor: str | None = "random"
    anchor_value: float = 1000.0
    prior_draws: float = 1.0
    confidence: float = 0.95
    num_resamples: int = 1000
    bootstrap_seed: int = 0
    model_pairs: bool = True
    overflow: Literal["error", "random"] = "error"

    def __post_init__(self) -> None:
        require(
            isinstance(self.games, int) and self.games >= 2 and not (self.games % 2),
            "games",
            expected="an even int >= 2 (seats swap in pairs, so each side plays each seat equally)",
            received=self.games,
            fix="e.g. --games 20",
        )
        for name, lo in (
            ("max_tokens", 1),
            ("max_moves", 1),
            ("max_concurrency", 1),
            ("num_slots", 1),
            ("max_len", 16),
            ("num_resamples", 1),
        ):
            v = getattr(self, name)
            require(
                isinstance(v, int) and v >= lo,
                name,
                expected=f"an int >= {lo}",
                received=v,
                fix=f"e.g. {name}={max(lo, 16)}",
            )
        require_one_of(
            self.errors,
            ("loss", "exclude"),
            "errors",
            fix="--errors loss",
        )
        check_range(
            "MatchConfig",
            "move_timeout_s",
            self.move_timeout_s,
            lo=0,
            lo_open=True,
            optional=True,
            fix="e.g. 300",
        )
        require(
            0.0 < self.confidence < 1.0 and self.prior_draws >= 0 and self.temperature >= 0,
            "MatchConfig",
            expected="0 < confidence < 1, prior_draws >= 0, temperature >= 0",
            received=(self.confidence, self.prior_draws, self.temperature),
            fix="e.g. confidence=0.95, prior_draws=1, temperature=0.7",
        )


def opponent_player(spec: str, label: str | None = None) -> Player:
    """``random`` or ``MODULE:FN`` as a :class:`Player` (a ConfigError names the fix otherwise)."""
    from gymllm.rollout.seat_play import load_scripted_opponent

    if spec == "random":
        return Player(label=label or "random", random=True)
    require(
        isinstance(spec, str) and _FN.match(spec),
        "--opponent",
        expected="'random' or 'MODULE:FN' (a scripted fn(observation, agent) "
        "-> action on the game's own PettingZoo observation and action)",
        received=spec,
        fix="e.g. --opponent random or --opponent my_pkg.policies:greedy; a model or a run "
        "is a player: --model NAME / --checkpoint RUN",
    )
    try:
        fn = load_scripted_opponent(spec)
    except ConfigError as e:
        raise ConfigError(str(e).replace("multiagent.opponent", "--opponent")) from e
    return Player(label=label or spec, fn=fn)


def resolve_game(game: str, kwargs: dict[str, Any] | None = None) -> Any:
    """A zero-argument factory of two-seat :class:`~gymllm.multiagent.TextAECEnv` for ``game`` (a
    registered name or ``MODULE:FACTORY``, as training resolves ``env.id``); a ConfigError otherwise."""
    from gymllm.multiagent.factory import GAMES, game_factory

    try:
        make = game_factory(game, kwargs or {})
    except ConfigError as e:  # the factory refused the kwargs: name this command's flag
        raise ConfigError(
            str(e).replace("--env-kwargs", "--game-kwargs").replace("env.kwargs", "--game-kwargs")
        ) from e
    require(
        make is not None,
        "--game",
        expected=f"a multi-agent game: {GAME_HELP}",
        received=game,
        fix=f"use one of {sorted(GAMES)} or point MODULE:FACTORY at an importable factory "
        "(single-agent envs are evaluated with gymllm eval env ENV)",
    )
    probe = make()
    seats = list(probe.possible_agents)
    probe.close()
    require(
        len(seats) == 2,
        "--game",
        expected="a two-player game (pairings, win/draw/loss and Elo are pairwise)",
        received=f"{game} with seats {seats}",
        fix="evaluate a two-player game",
    )
    return make


def schedule(
    labels: Sequence[str],
    games: int,
    seed: int,
    seats: Sequence[str],
    *,
    skip: Callable[[str, str], bool] | None = None,
) -> list[dict[str, Any]]:
    """Every game of a round robin: ``{"pairing", "game", "seed", "players": {seat: label}}``; in pairing
    ``(a, b)`` game ``2i`` seats ``a`` first and ``b`` second with env seed ``seed + i``, game ``2i + 1``
    the same seed with the seats swapped. ``skip(a, b)`` True leaves the pairing out."""
    require(
        len(set(labels)) == len(labels),
        "players",
        expected="distinct labels",
        received=list(labels),
        fix="name them apart with --label",
    )
    require(
        len(labels) >= 2,
        "players",
        expected="at least two players (a --model or --checkpoint and an "
        "--opponent, or two of either)",
        received=list(labels),
        fix="add --opponent random",
    )
    out = []
    for p, (a, b) in enumerate(itertools.combinations(labels, 2)):
        if skip is not None and skip(a, b):
            continue
        for j in range(games):
            order = (a, b) if j % 2 == 0 else (b, a)
            out.append(
                {
                    "pairing": p,
                    "game": j,
                    "seed": seed + j // 2,
                    "players": dict(zip(seats, order)),
                    "labels": [a, b],
                }
            )
    return out


async def arun_matches(
    make_game: Callable[[], Any],
    players: Sequence[Player],
    out: str | pathlib.Path,
    *,
    config: MatchConfig = MatchConfig(),
) -> dict[str, Any]:
    """Play the round robin (module doc) and write ``games.jsonl``, ``summary.json`` and ``ratings.json``
    into ``out``; returns the summary (``ratings`` included)."""
    from gymllm.rollout import ModelAgent
    from gymllm.suites.game_stats import paired_comparisons

    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    labels = [p.label for p in players]
    by_label = {p.label: p for p in players}
    probe = make_game()
    seats = list(probe.possible_agents)
    probe.close()
    models = {p.label for p in players if p.kind == "model"}
    items = schedule(
        labels,
        config.games,
        config.seed,
        seats,
        skip=None if config.model_pairs else lambda a, b: a in models and b in models,
    )
    engines: dict[str, Any] = {}
    agents = {
        p.label: ModelAgent(p.loaded.tokenizer, system_prompt=p.system_prompt)
        for p in players
        if p.kind == "model"
    }
    rows: list[dict[str, Any]] = []
    gate = asyncio.Semaphore(config.max_concurrency)
    try:
        for p in players:
            if p.kind == "model":
                engines[p.label] = (
                    p.make_engine() if p.make_engine is not None else _engine(p.loaded, config)
                )
        with open(out / "games.jsonl", "w") as f:

            async def one(item: dict[str, Any]) -> None:
                async with gate:
                    row = await play_game(make_game, item, by_label, engines, agents, config)
                rows.append(row)
                f.write(json.dumps(row) + "\n")
                f.flush()

            await asyncio.gather(*(one(i) for i in items))
    finally:
        for engine in engines.values():
            close = getattr(engine, "close", None)
            if close is not None:
                result = close()
                if asyncio.iscoroutine(result):
                    await result
    summary = {
        "players": [{"label": p.label, "kind": p.kind} for p in players],
        "seats": seats,
        "config": {k: v for k, v in dataclasses.asdict(config).items()},
        "games": len(rows),
        "errors": sum(r["error"] is not None for r in rows),
        "pairings": summarize_games(rows, labels, confidence=config.confidence),
        "paired": paired_comparisons(
            rows,
            [p.label for p in players if p.kind == "model"],
            labels,
            confidence=config.confidence,
        ),
    }
    ratings = ratings_table(rows, labels, config)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "ratings.json").write_text(json.dumps(ratings, indent=2))
    return {**summary, "ratings": ratings}


def _engine(loaded: Any, config: MatchConfig) -> Any:
    from gymllm.inference import EngineConfig, JaxEngine

    return JaxEngine.from_loaded(
        loaded, config=EngineConfig(num_slots=config.num_slots, max_len=config.max_len)
    )


def run_matches(
    make_game: Callable[[], Any],
    players: Sequence[Player],
    out: str | pathlib.Path,
    *,
    config: MatchConfig = MatchConfig(),
) -> dict[str, Any]:
    """:func:`arun_matches` in a fresh event loop."""
    return asyncio.run(arun_matches(make_game, players, out, config=config))
