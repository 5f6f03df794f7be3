"""A model's move probabilities at chosen decision points of a text game, scored exactly (no sampling).

    from gymllm.suites.move_probs import move_probabilities
    probs = move_probabilities(loaded, kuhn_poker(), seed=3, moves=["[bet]"], move_names=KUHN_MOVES,
                               system_prompt=SYSTEM)
    # {'seat': 'player_0', 'info': {...}, 'moves': {'[call]': 0.71, '[fold]': 0.29}, 'legal_mass': 0.98}

A game played to the end says which move the policy sampled once; this says how likely each legal move
was, so a policy that leans on its private card (or any state) shows it without thousands of games. The
game is played from ``seed`` with the scripted ``moves`` (both seats, in turn order); the seat to move
next is probed. Its prompt is built as training and ``gymllm eval game`` build it: the seat's
:class:`~gymllm.rollout.episode.Episode` sees each of its observations and its own earlier replies, so the
prompt ids are the ones the engine would be sent. Each legal move's reply (its text, then the model's end
of turn) is scored with the model's log-probabilities (temperature 1); ``moves`` gives each one's share of
the legal replies' probability and ``legal_mass`` the probability of replying with any of them exactly.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax.numpy as jnp
import numpy as np

from gymllm.errors import ConfigError, explain
from gymllm.inference.completion import Completion
from gymllm.inference.params import SamplingParams
from gymllm.models.logprobs import token_logprobs
from gymllm.rollout.agents import ModelAgent
from gymllm.rollout.episode import Episode, EpisodeKey
from gymllm.validation import require

__all__ = ["decision_table", "move_probabilities", "reply_ids"]


def reply_ids(tokenizer: Any, text: str) -> list[int]:
    """The token ids of a reply ``text`` as the model ends it: the text, then its end of turn (the
    tokenizer's eos, else its lowest stop id)."""
    stop = getattr(tokenizer, "eos_token_id", None)
    if stop is None:
        stop = min(getattr(tokenizer, "stop_token_ids", ()) or (None,))  # type: ignore[type-var]
    require(
        stop is not None,
        "reply_ids",
        expected="a tokenizer with an eos or stop token id",
        received=type(tokenizer).__name__,
        fix="load a chat model's tokenizer",
    )
    return [*tokenizer.encode(text), int(stop)]


def _legal_moves(obs: Any, move_names: Sequence[str] | None) -> list[str]:
    mask = obs.get("action_mask") if isinstance(obs, dict) else None
    require(
        mask is not None and move_names is not None,
        "move_probabilities",
        expected="a game whose observations carry an action_mask, and move_names in its order",
        received=f"action_mask {'missing' if mask is None else 'present'}, move_names {move_names!r}",
        fix="pass move_names (e.g. gymllm.envs.kuhn_poker.KUHN_MOVES)",
    )
    return [m for m, ok in zip(move_names, np.asarray(mask).tolist()) if ok]


def move_probabilities(
    loaded: Any,
    game: Any,
    *,
    seed: int,
    moves: Sequence[str],
    move_names: Sequence[str] | None = None,
    system_prompt: str | None = None,
    score: Callable[[list[int], list[list[int]]], list[float]] | None = None,
) -> dict[str, Any]:
    """The probed seat's move probabilities after ``moves`` in ``game`` from ``seed`` (module doc).

    ``loaded``: a :class:`~gymllm.models.loaded.LoadedModel` (its tokenizer builds the prompt; its model
    scores unless ``score`` is given); ``game``: a text AEC game (``game.last()`` gives ``{"observation":
    text, "action_mask": ...}``), reset here; ``move_names``: the move text of each action index (the
    mask's order); ``system_prompt``: the run's ``env.system_prompt``; ``score(prompt_ids, replies)``:
    each reply's summed log-probability (default: the model's forward). Returns ``{"seat", "info" (the
    seat's info at the probe), "prompt_ids", "logprobs" {move: summed logprob}, "moves" {move: share of
    the legal replies' probability}, "legal_mass"}``."""
    tok = loaded.tokenizer
    agent = ModelAgent(tok, system_prompt=system_prompt)
    script = list(moves)
    episodes: dict[str, Episode] = {}
    game.reset(seed=seed)
    while game.agents:
        seat = game.agent_selection
        obs, reward, term, trunc, info = game.last()
        require(not (term or trunc), **_running(moves, len(moves) - len(script)))
        ep = episodes.get(seat)
        info = {**info, "agent": seat}
        if ep is None:
            ep = episodes[seat] = Episode(
                EpisodeKey(
                    group_index=0, member=len(episodes), env_seed=seed, task_id=f"seed{seed}"
                ),
                agent,
                SamplingParams(temperature=1.0),
            )
            ep.begin(obs["observation"], info)
        else:
            ep.on_step(obs["observation"], float(reward), False, False, info, 0.0)
        prompt, _ = ep.next_request()
        if not script:
            legal = _legal_moves(obs, move_names)
            replies = [reply_ids(tok, m) for m in legal]
            lps = (score or _model_score(loaded))(list(prompt), replies)
            lp = np.asarray(lps, np.float64)
            share = np.exp(lp - lp.max())
            return {
                "seat": seat,
                "info": {k: v for k, v in info.items() if isinstance(v, (str, int, float, bool))},
                "prompt_ids": list(prompt),
                "logprobs": dict(zip(legal, lp.tolist())),
                "moves": dict(zip(legal, (share / share.sum()).tolist())),
                "legal_mass": float(np.exp(lp).sum()),
            }
        move = script.pop(0)
        ids = reply_ids(tok, move)
        n = len(ids)
        ep.on_completion(
            Completion(
                token_ids=np.asarray(ids, np.int32),
                logprobs=np.zeros(n, np.float32),
                finish_reason="stop",
                versions=np.zeros(n, np.int32),
                prompt_len=len(prompt),
            ),
            0.0,
        )
        game.step(move)
    raise ConfigError(explain(**_running(moves, len(moves))))


def _running(moves: Sequence[str], played: int) -> dict[str, str]:
    """What a probe whose scripted moves end the game is told."""
    return dict(
        what="move_probabilities",
        expected="scripted moves that leave the game running",
        received=f"the game was over after {played} of {list(moves)}",
        fix="probe a decision the game reaches",
    )


def decision_table(
    loaded: Any,
    game: Any,
    *,
    situations: dict[str, Sequence[str]],
    key: str,
    values: Sequence[Any],
    move_names: Sequence[str],
    system_prompt: str | None = None,
    seeds: Sequence[int] = range(256),
    score: Callable[[list[int], list[list[int]]], list[float]] | None = None,
) -> dict[str, dict[str, dict[str, float]]]:
    """``{situation: {value: {move: probability}}}``: for each named situation (its scripted moves) and
    each ``value`` of the probed seat's ``info[key]`` (Kuhn poker: ``"card"``, J Q K), the first seed of
    ``seeds`` that deals it is probed with :func:`move_probabilities`. A value no seed deals is refused."""
    blind = lambda prompt, replies: [0.0] * len(replies)  # noqa: E731  finds the deal, scores nothing
    table: dict[str, dict[str, dict[str, float]]] = {}
    for name, moves in situations.items():
        first: dict[Any, int] = {}  # each value's first dealing seed, from one pass over the seeds
        for s in seeds:
            if len(first) == len(values):
                break
            dealt = move_probabilities(
                loaded, game, seed=s, moves=moves, move_names=move_names, score=blind
            )["info"].get(key)
            if dealt in values:
                first.setdefault(dealt, s)
        row: dict[str, dict[str, float]] = {}
        for value in values:
            require(
                value in first,
                "decision_table",
                expected=f"a seed that deals {key}={value!r} to the seat probed after {list(moves)}",
                received=f"none in {len(seeds)} seeds",
                fix="pass more seeds, or values the game deals",
            )
            row[str(value)] = move_probabilities(
                loaded,
                game,
                seed=first[value],
                moves=moves,
                move_names=move_names,
                system_prompt=system_prompt,
                score=score,
            )["moves"]
        table[name] = row
    return table


def _model_score(loaded: Any) -> Callable[[list[int], list[list[int]]], list[float]]:
    """Each reply's summed log-probability under ``loaded.model`` after ``prompt`` (one forward a
    reply, float32 logits, temperature 1)."""

    def score(prompt: list[int], replies: list[list[int]]) -> list[float]:
        out = []
        for reply in replies:
            ids = np.asarray([*prompt, *reply], np.int32)[None]
            positions = np.arange(ids.shape[1], dtype=np.int32)[None]
            logits, _ = loaded.model(jnp.asarray(ids), jnp.asarray(positions))
            lp = token_logprobs(logits[:, :-1], jnp.asarray(ids[:, 1:]))[0]
            out.append(float(jnp.sum(lp[len(prompt) - 1 :])))
        return out

    return score
