"""``gymllm eval game GAME``: matches between players on a two-player game, win/draw/loss and an Elo table.

    gymllm eval game tic-tac-toe --model.name smollm2-135m-instruct --model.checkpoint runs/ttt \\
        --opponent random --opponent my_pkg.policies:greedy --eval.games 20 --out out/ttt

Players, in this order: each ``--model.name`` (a registry name, a local checkpoint directory or
``tiny-<family>``), each ``--model.checkpoint`` (a ``gymllm train`` run directory: the model it trained
with its latest weights and its system prompt), then each ``--opponent`` (``random``, or ``MODULE:FN``: a
scripted ``fn(observation, agent) -> action`` on the game's own PettingZoo observation and action).
``--model.label`` names the models and checkpoints in the same order (default: the model name, the run
directory's name, as ``gymllm eval suite`` does); opponents are named by their spec. A run trained
with ``--multiagent.policies`` holds several policies: ``--model.checkpoint RUN#NAME`` plays policy ``NAME``
(:mod:`gymllm.models.trained`), and a bare ``--model.checkpoint RUN`` enters every policy as its own player,
labelled ``RUN#NAME`` (``LABEL#NAME`` with ``--model.label``), so one command rates them all. Every pair of
players meets for ``--eval.games`` games, seats swapped in pairs. The run writes ``games.jsonl``,
``summary.json`` and ``ratings.json`` into ``--out`` (:mod:`gymllm.suites.games`).
``python -m gymllm.cli.game_cli GAME ...`` runs the same.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys
from typing import Annotated, Any, Literal, Sequence

import tyro

from gymllm.cli.eval_args import EngineShape, Policies
from gymllm.utils.seeds import HELD_OUT_SEED_BASE
from gymllm.validation import require

__all__ = ["GameEval", "Matches", "MoveSampling", "eval_game", "players_from_flags", "main"]

Repeated = tyro.conf.UseAppendAction


def players_from_flags(
    model: Sequence[str],
    checkpoint: Sequence[str],
    label: Sequence[str],
    opponent: Sequence[str],
    system_prompt: str | None = None,
) -> list[Any]:
    """The :class:`~gymllm.suites.games.Player` list of the flags, in order (module doc); opponents are
    checked before any model loads, a checkpoint plays with its run's system prompt (else
    ``system_prompt``), a ``--model.name`` with ``system_prompt``. A checkpoint of several policies
    (``--multiagent.policies``) named without ``#NAME`` enters each policy as its own player,
    ``RUN#NAME`` (or ``LABEL#NAME`` with ``--model.label``)."""
    from gymllm.cli.evaluate import load_model, run_config
    from gymllm.cli.suite_cli import policy_label
    from gymllm.models.trained import POLICY_SEP, policy_refs, split_policy
    from gymllm.suites.games import Player, opponent_player

    sources: list[tuple[str | None, str | None]] = [(m, None) for m in model] + [
        (None, c) for c in checkpoint
    ]
    require(
        not label or len(label) == len(sources),
        "--model.label",
        expected=f"one label per --model.name / --model.checkpoint "
        f"({len(sources)}, in that order), or none",
        received=list(label),
        fix=f"pass --model.label {len(sources)} times",
    )
    opponents = [opponent_player(o) for o in opponent]  # checked before any model loads

    def default_label(m: str | None, c: str | None) -> str:  # RUN, or RUN#NAME for one policy of it
        run, policy = split_policy(c) if c else (c, None)
        return policy_label(m, run) + (f"{POLICY_SEP}{policy}" if policy else "")

    names = list(label) or [default_label(m, c) for m, c in sources]
    entries: list[tuple[str, str | None, str | None]] = []
    for name, (m, c) in zip(names, sources):
        refs = policy_refs(c) if c else [c]
        if len(refs) > 1:  # a checkpoint of several policies: one player each, NAME#POLICY
            entries += [(f"{name}{POLICY_SEP}{split_policy(r)[1]}", m, r) for r in refs]
        else:
            entries.append((name, m, c))
    players = []
    for name, m, c in entries:
        trained = run_config(c).get("env", {}) if c else {}
        players.append(
            Player(
                label=name,
                loaded=load_model(m, checkpoint=c),
                system_prompt=trained.get("system_prompt") or system_prompt or None,
            )
        )
    return players + opponents


@dataclasses.dataclass(frozen=True, kw_only=True)
class Matches:
    """The games and their scoring (``--eval.*``; ``--eval.seed-base`` as ``gymllm train`` names it)."""

    games: int = 20
    """Games per pairing (even: each side plays each seat equally often)."""
    seed_base: int = HELD_OUT_SEED_BASE
    """The first env seed (games 2i and 2i+1 of a pairing share seed_base + i, seats swapped)."""
    max_moves: int = 200
    """Moves of one game before it is adjudicated a draw."""
    max_concurrency: int = 64
    """Games in flight at once (all pairings together)."""
    move_timeout_s: float = 300.0
    """The watchdog: a model reply taking longer is a failed move (its side loses, see --eval.errors)."""
    errors: Literal["loss", "exclude"] = "loss"
    """A side that raises or stalls: `loss` (it loses the game) or `exclude` (the game is recorded, not scored)."""
    prior_draws: float = 1.0
    """Virtual draws per pairing in the Elo fit (keeps a perfect record's rating finite)."""
    num_resamples: int = 1000
    """Bootstrap resamples of the rating intervals."""
    model_pairs: bool = True
    """Play the pairings of two models too (--eval.no-model-pairs: each model meets only the --opponent players,
    enough for the paired comparison of checkpoints at a fraction of the cost)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class MoveSampling:
    """A model's sampling per move (``--sampling.*``, the :class:`~gymllm.inference.SamplingParams` fields of
    the same names)."""

    temperature: float = 0.7
    """A model's sampling temperature (0: greedy)."""
    max_tokens: int = 64
    """A model's tokens per move."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class GamePrompt:
    """The players' prompt side (``--env.*``, as ``gymllm train`` names it)."""

    system_prompt: str | None = None
    """The --model.name players' system prompt (a --model.checkpoint plays with its run's), e.g. the one a run
    trained with."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class GameEval:
    """Play every pair of players on a two-player game: win/draw/loss per pairing and an Elo table."""

    game: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="GAME")]
    """The game: tic-tac-toe, connect-four, kuhn-poker, or MODULE:FACTORY (a function returning a PettingZoo AEC or
    Parallel env)."""
    model: Policies = Policies()
    """The model players: each --model.name, then each --model.checkpoint (a bare RUN of several policies enters
    each policy as a player); --model.label names them in that order."""
    opponent: Annotated[tuple[str, ...], Repeated] = ()
    """A player: `random` (uniform legal moves) or MODULE:FN, a scripted fn(observation, agent) -> action
    (repeatable)."""
    env: GamePrompt = GamePrompt()
    """The players' system prompt (--env.system-prompt, as train's)."""
    env_kwargs: str | None = None
    """The game factory's keyword arguments as a JSON object (e.g. '{"move_names": null}')."""
    eval: Matches = Matches()
    """The games, their seeds and their scoring."""
    sampling: MoveSampling = MoveSampling()
    """A model's sampling per move."""
    engine: EngineShape = EngineShape()
    """Each model player's engine."""
    out: str = "games_out"
    """The output directory (games.jsonl, summary.json, ratings.json)."""


def eval_game(args: GameEval) -> int:
    """``gymllm eval game``: every pairing of ``args``' players, the table, the ratings and the paired comparisons."""
    from gymllm.cli.json_args import json_object
    from gymllm.suites.games import MatchConfig, resolve_game, run_matches

    kwargs = {} if args.env_kwargs is None else json_object(args.env_kwargs)
    m = args.eval
    config = MatchConfig(
        games=m.games,
        seed=m.seed_base,
        temperature=args.sampling.temperature,
        max_tokens=args.sampling.max_tokens,
        max_moves=m.max_moves,
        max_concurrency=m.max_concurrency,
        num_slots=args.engine.num_slots,
        max_len=args.engine.max_len,
        move_timeout_s=m.move_timeout_s,
        errors=m.errors,
        prior_draws=m.prior_draws,
        num_resamples=m.num_resamples,
        model_pairs=m.model_pairs,
    )
    make_game = resolve_game(args.game, kwargs)
    p = args.model
    require(
        bool(p.name or p.checkpoint or len(args.opponent) >= 2),
        "gymllm eval game",
        expected="a player to evaluate: --model.name or --model.checkpoint (or two --opponent)",
        received="none",
        fix="e.g. --model.name smollm2-135m-instruct --opponent random",
    )
    players = players_from_flags(
        p.name, p.checkpoint, p.label, args.opponent, args.env.system_prompt
    )
    summary = run_matches(make_game, players, args.out, config=config)
    _print(summary)
    from gymllm.multiagent.factory import GAMES

    if (
        GAMES.get(args.game, args.game) == "gymllm.envs.kuhn_poker:kuhn_poker"
    ):  # how each model acts by card
        _kuhn_actions(summary, args.out, kwargs)
    print(f"wrote {pathlib.Path(args.out) / 'games.jsonl'}, summary.json, ratings.json")
    return 0


def _print(summary: dict[str, Any]) -> None:
    header = f"{'player':<24} {'opponent':<24} {'games':>5} {'win':>6} {'draw':>6} {'loss':>6} {'errors':>6}"
    print(header)
    print("-" * len(header))
    for r in summary["pairings"]:
        rates = " ".join(
            f"{r[k]:>6.3f}" if r[k] is not None else f"{'-':>6}" for k in ("win", "draw", "loss")
        )
        print(f"{r['player']:<24} {r['opponent']:<24} {r['games']:>5} {rates} {r['errors']:>6}")
    for r in summary["pairings"]:  # what went wrong, once a pairing (games.jsonl has every row's)
        if r.get("top_error"):
            e = r["top_error"]
            print(
                f"errors, {r['player']} vs {r['opponent']}: {e['rows']} games with: {e['error'][:300]}"
            )
    ratings = summary["ratings"]
    print(f"\nElo ({ratings['anchor']}; {ratings['interval']})")
    for r in ratings["ratings"]:
        lo, hi = r["ci"]
        print(
            f"{r['player']:<24} {r['elo']:>7.0f}  [{lo:.0f}, {hi:.0f}]  games {r['games']}, score {r['score']:.3f}"
        )
    if "error" in ratings:
        print(f"note: no ratings: {ratings['error']}")
    if summary.get("paired"):
        print(
            f"\nPaired by seed (later player - earlier one; {summary['paired'][0]['confidence']:.0%} Student's t interval "
            "over the seeds, each seed's seat-swapped games averaged)"
        )
        for d in summary["paired"]:
            print(
                f"{d['player']:<16} - {d['baseline']:<16} vs {d['opponent']:<16} {d['metric']:<12} "
                f"{d['mean_b']:>7.3f} - {d['mean_a']:>7.3f} = {d['diff']:>+7.3f}  [{d['lo']:+.3f}, {d['hi']:+.3f}]  "
                f"seeds {d['n']}"
            )


def _kuhn_actions(summary: dict[str, Any], out: str, kwargs: dict[str, Any]) -> None:
    """Kuhn poker: each model player's moves by card (:func:`gymllm.envs.kuhn_poker.kuhn_action_table`) to
    ``actions.json`` and the screen."""
    from gymllm.envs.kuhn_poker import kuhn_action_table

    rows = [
        json.loads(x)
        for x in (pathlib.Path(out) / "games.jsonl").read_text().splitlines()
        if x.strip()
    ]
    tables = {
        p["label"]: kuhn_action_table(rows, p["label"], **kwargs)
        for p in summary["players"]
        if p["kind"] == "model"
    }
    (pathlib.Path(out) / "actions.json").write_text(json.dumps(tables, indent=2))
    print("\nMoves by card (bet or call share of decisions; counts)")
    for label, table in tables.items():
        for card, t in table.items():
            share = f"{t['aggressive']:.2f}" if t["aggressive"] is not None else "-"
            print(
                f"{label:<24} {card}  {share:>5}  bet {t['[bet]']:>4} check {t['[check]']:>4} call {t['[call]']:>4} "
                f"fold {t['[fold]']:>4}"
            )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gymllm.cli.game_cli ...``: ``gymllm eval game ...``, errors as one line, as ``gymllm`` does."""
    from gymllm.cli.eval_args import eval_main
    from gymllm.cli.guard import guarded

    argv = list(sys.argv[1:] if argv is None else argv)
    return guarded(lambda: eval_main(["game", *argv]))


if __name__ == "__main__":
    sys.exit(main())
