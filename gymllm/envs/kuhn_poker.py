"""Kuhn poker from TextArena (``KuhnPoker-v0``, optional extra ``gymllm[catalogue]``) as a two-player text game.

    game = kuhn_poker()                      # a TextAECEnv: self-play, `gymllm eval game`
    env = gymllm.make("gymllm/ta-KuhnPoker-v0")   # one seat against random legal moves (demos, eval)

On the command line the game is ``--env.id gymllm.envs.kuhn_poker:kuhn_poker`` (training) and
``--game gymllm.envs.kuhn_poker:kuhn_poker`` (``gymllm eval game``); the one-seat env is
``gymllm/ta-KuhnPoker-v0``.

The game
--------
A 3-card deck (J < Q < K), each player antes 1 chip and gets one card; the first to act may
``[check]`` or ``[bet]`` (1 chip); facing a bet a player may ``[call]`` (1 chip, then showdown) or
``[fold]`` (the other takes the pot); check-check is a showdown. ``max_rounds`` hands are played (1 by
default, TextArena's registered id plays 3); the starting player alternates, and in hand 1 it is
``player_1`` (TextArena's order). Moves and observations are TextArena's own: the action syntax is
``[check]`` / ``[bet]`` / ``[call]`` / ``[fold]``, and each observation is the TextArena messages the
player received since its previous move (the rules prompt, its card, the opponent's moves, the legal
actions), with the legal moves listed after them.

:class:`KuhnPokerAEC` is the PettingZoo AEC env under the text wrapper: a ``Discrete(4)`` action per
player in :data:`KUHN_MOVES` order with an ``action_mask`` of the legal ones, so a random opponent plays
legal moves and an illegal or unparsable reply is the text wrapper's invalid move (``MultiAgentConfig``:
retried with ``invalid_penalty``, ``max_invalid`` in a row forfeit).

Reward: each player's net chips over the game, paid when it ends (zero-sum; +1 / +2 for a hand won
without / with a called bet). TextArena 0.7.4 never adds a bet or a call to the pot (every hand is
worth the antes alone, so betting is free and folding is never right); :class:`KuhnPokerAEC` plays the
TextArena env with that fixed (a bet or call moves one chip from the player into the pot before
TextArena resolves the move), so its score messages, its winner and the reward follow Kuhn's rules.

Equilibrium
-----------
:func:`kuhn_equilibrium` is the closed-form Nash equilibrium family (Kuhn 1950), parameter
``alpha`` in [0, 1/3] (default 1/3): first to act, bet a J with probability alpha, never a Q, a K with
3 alpha; facing a bet after checking, fold a J, call a Q with alpha + 1/3, call a K; second to act
after a check, bet a J with 1/3, check a Q, bet a K; facing a bet, fold a J, call a Q with 1/3, call a
K. The first player's value is -1/18 (:data:`KUHN_GAME_VALUE`) for every alpha.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium.spaces as gspaces
import numpy as np
from pettingzoo import AECEnv

from gymllm.envs.catalogue import PrivateGlobalRandom
from gymllm.envs.catalogue_textarena import textarena_pull, textarena_reset
from gymllm.errors import ConfigError, MissingExtraError, explain
from gymllm.validation import check_range, require
from gymllm.spaces import Text

__all__ = [
    "KUHN_MOVES",
    "KUHN_CARDS",
    "KUHN_GAME_VALUE",
    "KuhnPokerConfig",
    "KuhnPokerAEC",
    "kuhn_poker",
    "kuhn_equilibrium",
    "kuhn_equilibrium_player",
    "kuhn_card_player",
    "render_kuhn_poker",
    "replay_chips",
    "kuhn_action_table",
]

KUHN_MOVES: tuple[str, ...] = ("[check]", "[bet]", "[call]", "[fold]")
KUHN_CARDS: tuple[str, ...] = ("J", "Q", "K")
KUHN_GAME_VALUE = -1.0 / 18.0  # the first player's expected chips per hand at equilibrium
KUHN_INSTRUCTIONS = (
    "You play Kuhn poker. Reply with one of the legal moves listed, in brackets, and nothing else."
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class KuhnPokerConfig:
    """max_rounds: hands per game (the reward is the net chips over all of them); ta_id: the TextArena
    id played (its ``-raw`` form: no TextArena wrappers, gymllm formats the messages)."""

    max_rounds: int = 1
    ta_id: str = "KuhnPoker-v0-raw"

    def __post_init__(self) -> None:
        check_range(
            "KuhnPokerConfig",
            "max_rounds",
            self.max_rounds,
            lo=1,
            integer=True,
            fix="pass max_rounds=1 (hands per game)",
        )
        require(
            isinstance(self.ta_id, str) and self.ta_id.startswith("KuhnPoker-v0"),
            "KuhnPokerConfig.ta_id",
            expected="a TextArena KuhnPoker-v0 id",
            received=self.ta_id,
            fix="leave ta_id at 'KuhnPoker-v0-raw'",
        )


def _textarena() -> Any:
    try:
        with PrivateGlobalRandom(0).active():  # TextArena draws from `random` at import time
            import textarena
    except ImportError as e:
        raise MissingExtraError("textarena", "catalogue") from e
    return textarena


def kuhn_equilibrium(
    card: str, history: tuple[str, ...] | list[str], alpha: float = 1.0 / 3.0
) -> dict[str, float]:
    """The equilibrium probability of each legal move (module doc) for the player holding ``card``
    ("J", "Q" or "K") after ``history``, the hand's moves so far without brackets: ``()`` (first to
    act), ``("check",)`` / ``("bet",)`` (second to act) or ``("check", "bet")`` (first, facing a bet)."""
    require(
        card in KUHN_CARDS,
        "kuhn_equilibrium(card)",
        expected=f"one of {KUHN_CARDS}",
        received=card,
        fix="pass the card as a letter",
    )
    require(
        0.0 <= alpha <= 1.0 / 3.0,
        "kuhn_equilibrium(alpha)",
        expected="a number in [0, 1/3]",
        received=alpha,
        fix="pass alpha=1/3",
    )
    j, q, k = (card == c for c in KUHN_CARDS)
    h = tuple(history)
    if h == ():
        p = alpha if j else 3 * alpha if k else 0.0
        return {"[check]": 1.0 - p, "[bet]": p}
    if h == ("check",):
        p = 1.0 / 3.0 if j else 1.0 if k else 0.0
        return {"[check]": 1.0 - p, "[bet]": p}
    if h in (("bet",), ("check", "bet")):
        p = 0.0 if j else 1.0 if k else (1.0 / 3.0 if h == ("bet",) else alpha + 1.0 / 3.0)
        return {"[call]": p, "[fold]": 1.0 - p}
    raise ConfigError(
        explain(
            "kuhn_equilibrium(history)",
            expected="(), ('check',), ('bet',) or ('check', 'bet')",
            received=h,
            fix="pass the moves of the current hand before this decision",
        )
    )


class KuhnPokerAEC(AECEnv):
    """TextArena's Kuhn poker as a PettingZoo AEC env with ``Discrete(4)`` actions in :data:`KUHN_MOVES`
    order and an ``action_mask`` (module doc). ``reset(seed)`` seeds the deal (TextArena's own RNG, kept
    private: :class:`~gymllm.envs.catalogue.PrivateGlobalRandom`)."""

    def __init__(self, config: KuhnPokerConfig | None = None):
        super().__init__()
        self.config = config or KuhnPokerConfig()
        ta = _textarena()
        with PrivateGlobalRandom(0).active():
            self.ta = ta.make(self.config.ta_id, max_rounds=self.config.max_rounds)
        # TextArena shuffles its deck in place (``random.shuffle(self.deck)`` each round), so a reset's
        # cards would depend on the hands before it; every reset restores this order first.
        self._deck_env = self.ta
        while not hasattr(self._deck_env, "deck") and hasattr(self._deck_env, "env"):
            self._deck_env = self._deck_env.env
        self._deck = list(getattr(self._deck_env, "deck", []))
        self.possible_agents = ["player_0", "player_1"]
        self.metadata = {
            "name": "textarena_kuhn_poker",
            "render_modes": ["ansi"],
            "is_parallelizable": False,
        }
        self.render_mode = None
        self._rng = PrivateGlobalRandom(0)
        self._seed_rng = np.random.default_rng()
        self._obs_space = gspaces.Dict(
            {
                "observation": Text(max_length=1 << 16),
                "action_mask": gspaces.Box(0, 1, (len(KUHN_MOVES),), np.int8),
            }
        )
        self._act_space = gspaces.Discrete(len(KUHN_MOVES))

    def observation_space(self, agent: str) -> Any:
        return self._obs_space

    def action_space(self, agent: str) -> Any:
        return self._act_space

    # --- state
    def _game(self) -> dict[str, Any]:
        return self.ta.state.game_state

    def _legal(self) -> list[str]:
        tree = self._game()["current_legal_action_tree"]
        return [m for m in ("check", "bet", "call", "fold") if isinstance(tree, dict) and m in tree]

    def decision_state(self, agent: str) -> tuple[str, tuple[str, ...]]:
        """``(agent's card, the current hand's moves so far)``: what :func:`kuhn_equilibrium` takes."""
        pid = int(agent.split("_")[1])
        return KUHN_CARDS[self._game()["player_cards"][pid]], tuple(self._history)

    def _pull(self) -> None:
        textarena_pull(self)

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        if self._deck:
            self._deck_env.deck = list(self._deck)
        textarena_reset(self, seed, 2)
        self._history: list[str] = []
        self._round = self._game()["current_round"]
        # each seat's private card in its info (what a card-conditioned baseline keys on:
        # --multiagent.baseline-key card)
        self.infos = {a: {"card": self.decision_state(a)[0]} for a in self.agents}
        self._pull()

    def observe(self, agent: str) -> dict[str, Any]:
        mask = np.zeros(len(KUHN_MOVES), np.int8)
        if agent == self.agent_selection and not self.terminations.get(agent, True):
            legal = self._legal()
            mask[:] = [m.strip("[]") in legal for m in KUHN_MOVES]
        return {"observation": self._texts.get(agent, ""), "action_mask": mask}

    def step(self, action: Any) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            return self._was_dead_step(action)
        move = KUHN_MOVES[int(action)].strip("[]")
        if move not in self._legal():
            raise ValueError(
                f"KuhnPokerAEC: {KUHN_MOVES[int(action)]} is not legal now (legal: {self._legal()}); "
                "the action_mask says which moves are"
            )
        self._cumulative_rewards[agent] = 0.0
        game, pid = self._game(), int(agent.split("_")[1])
        if move in (
            "bet",
            "call",
        ):  # TextArena 0.7.4 leaves the pot at the antes; put the chip in (module doc)
            game["pot"] += 1
            game["player_chips"][pid] -= 1
        with self._rng.active():
            done, _ = self.ta.step(KUHN_MOVES[int(action)])
        self._history.append(move)
        if self._game()["current_round"] != self._round:
            self._round, self._history = self._game()["current_round"], []
        self.rewards = {a: 0.0 for a in self.agents}
        if done:
            self._finish()
        else:
            self._pull()
        self._accumulate_rewards()

    def _finish(self) -> None:
        with self._rng.active():
            _, game_info = self.ta.close()
        chips = self._game()["player_chips"]
        net0 = (
            chips[0] - chips[1]
        ) / 2  # zero-sum; both paid the ante of the hand dealt after the last
        for a in self.agents:
            pid = int(a.split("_")[1])
            self.rewards[a] = float(net0 if pid == 0 else -net0)
            self.terminations[a] = True
            reason = str((game_info or {}).get(pid, {}).get("reason", ""))
            self.infos[a] = {"chips": self.rewards[a], "reason": reason}
            self._texts[a] = f"The game is over. {reason} Your net chips: {self.rewards[a]:+g}."

    def render(self) -> str:
        return self._texts.get(self.agent_selection, "")

    def close(self) -> None:
        pass


def render_kuhn_poker(env: Any, agent: str, raw: Any) -> str:
    """The TextArena messages of ``raw["observation"]`` with repeated consecutive lines dropped
    (TextArena 0.7.4 sends the second player its card line twice); when the player is to act and the
    messages since its last move do not show its card (TextArena says it once, at the deal), TextArena's
    card line is repeated at the end, so every decision is made next to the card it should depend on."""
    lines: list[str] = []
    for line in str(raw["observation"]).split("\n"):
        if not lines or line != lines[-1] or not line.strip():
            lines.append(line)
    text = "\n".join(lines)
    to_act = np.asarray(raw.get("action_mask", ())).any() if isinstance(raw, dict) else False
    if to_act and "Your card is:" not in text and hasattr(env, "decision_state"):
        text += f"\n[GAME] Your card is: '{env.decision_state(agent)[0]}'"
    return text


def kuhn_poker(*, max_rounds: int = 1, **kwargs: Any):
    """Kuhn poker as a PettingZoo AEC text env (``TextAECEnv``); ``kwargs`` are ``MultiAgentConfig``
    fields (``instructions``, ``max_invalid``, ``invalid_penalty``...; moves and renderer are set)."""
    from gymllm.envs.pettingzoo_adapter import from_pettingzoo

    for fixed in ("move_names", "renderer"):
        require(
            fixed not in kwargs,
            f"kuhn_poker({fixed}=)",
            expected="no move_names / renderer (the game sets them)",
            received=fixed,
            fix=f"remove {fixed}",
        )
    aec = KuhnPokerAEC(KuhnPokerConfig(max_rounds=max_rounds))
    return from_pettingzoo(
        aec,
        **{
            "instructions": KUHN_INSTRUCTIONS,
            **kwargs,
            "move_names": KUHN_MOVES,
            "renderer": render_kuhn_poker,
        },
    )


def _inner(env: Any) -> "KuhnPokerAEC":
    return env if isinstance(env, KuhnPokerAEC) else env.unwrapped


def _scripted(probs: dict[str, float], context: Any) -> int:
    moves = sorted(probs)
    p = np.asarray([probs[m] for m in moves], dtype=np.float64)
    return KUHN_MOVES.index(moves[int(context.rng.choice(len(moves), p=p / p.sum()))])


def kuhn_equilibrium_player(observation: Any, agent: str, context: Any) -> int:
    """A scripted Kuhn player of the equilibrium (:func:`kuhn_equilibrium`, alpha = 1/3), sampled from the
    game's seeded RNG (``--opponent gymllm.envs.kuhn_poker:kuhn_equilibrium_player``). It reads only its
    own card and the hand's moves (``decision_state``; TextArena's observation after the first move no
    longer repeats the card); returns the action index in :data:`KUHN_MOVES`."""
    card, history = _inner(context.env).decision_state(agent)
    return _scripted(kuhn_equilibrium(card, history), context)


kuhn_equilibrium_player.takes_context = True  # type: ignore[attr-defined]


def kuhn_card_player(observation: Any, agent: str, context: Any) -> int:
    """A simple scripted Kuhn player that follows its card (``--opponent gymllm.envs.kuhn_poker:kuhn_card_player``):
    a K bets or calls, a J checks or folds, a Q checks, and calls a bet half the time (seeded RNG)."""
    card, history = _inner(context.env).decision_state(agent)
    facing = bool(history) and history[-1] == "bet"
    if card == "K":
        return KUHN_MOVES.index("[call]" if facing else "[bet]")
    if card == "J" or not facing:
        return KUHN_MOVES.index("[fold]" if facing else "[check]")
    return _scripted({"[call]": 0.5, "[fold]": 0.5}, context)


kuhn_card_player.takes_context = True  # type: ignore[attr-defined]


def kuhn_action_table(
    rows: list[dict[str, Any]], player: str, **game_kwargs: Any
) -> dict[str, dict[str, Any]]:
    """How ``player`` acted by card over ``games.jsonl`` rows of ``gymllm eval game`` (each replayed on its
    seed with ``game_kwargs``, the ``--game-kwargs`` it was played with): ``{card: {"decisions": n, "[bet]":
    k, "[check]": k, "[call]": k, "[fold]": k, "aggressive": (bets + calls) / n, "first": {...},
    "after_check": {...}, "facing_bet": {...}}}`` (the last three: move counts in each situation). Only
    legal moves count (an illegal reply is retried by the game); rows with an error or truncated are skipped."""
    table = {
        c: {
            "decisions": 0,
            **{m: 0 for m in KUHN_MOVES},
            "first": {},
            "after_check": {},
            "facing_bet": {},
        }
        for c in KUHN_CARDS
    }
    for row in rows:
        if (
            row.get("error") is not None
            or row.get("truncated")
            or player not in row["players"].values()
        ):
            continue
        game = kuhn_poker(**game_kwargs)
        game.reset(seed=int(row["seed"]))
        for agent, move in row["moves"]:
            while game.agents and (
                game.terminations[game.agent_selection] or game.truncations[game.agent_selection]
            ):
                game.step(None)
            if not game.agents:
                break
            if row["players"].get(agent) == player:
                card, history = _inner(game.env).decision_state(agent)
                mask = game.codec.mask(agent, game.env.observe(agent), game.infos.get(agent))
                action, why = game.codec.parse(agent, move, mask)
                if why is None:
                    name = KUHN_MOVES[int(action) - int(game.action_space(agent).inner.start)]
                    where = (
                        "facing_bet"
                        if history and history[-1] == "bet"
                        else "after_check"
                        if history
                        else "first"
                    )
                    t = table[card]
                    t["decisions"] += 1
                    t[name] += 1
                    t[where][name] = t[where].get(name, 0) + 1
            game.step(move)
    for t in table.values():
        t["aggressive"] = (t["[bet]"] + t["[call]"]) / t["decisions"] if t["decisions"] else None
    return table


def replay_chips(row: dict[str, Any], **game_kwargs: Any) -> dict[str, float]:
    """Each player's reward in one ``games.jsonl`` row of ``gymllm eval game`` (net chips; a forfeit
    is ``forfeit_reward``), by replaying the row's moves on its seed: ``{label: reward}``. ``game_kwargs``:
    the ``--game-kwargs`` the games were played with. A row whose game did not finish (an error, a
    crash, a truncation) has no chips: a ConfigError says so."""
    require(
        row.get("error") is None and not row.get("truncated"),
        "replay_chips(row)",
        expected="a finished game",
        received=row.get("error") or "truncated",
        fix="leave out rows with an error or truncated",
    )
    game = kuhn_poker(**game_kwargs)
    game.reset(seed=int(row["seed"]))
    moves = list(row["moves"])
    final: dict[str, float] = {}
    while game.agents:
        agent = game.agent_selection
        _, reward, term, trunc, _ = game.last()
        if term or trunc:
            final[agent] = float(reward)
            game.step(None)
            continue
        require(
            moves and moves[0][0] == agent,
            "replay_chips(row)",
            expected=f"a move of {agent} next",
            received=moves[:1],
            fix="pass the row with the --game-kwargs its games were played with",
        )
        game.step(moves.pop(0)[1])
    return {row["players"][seat]: r for seat, r in final.items()}
