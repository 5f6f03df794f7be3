"""One scheduled game of :mod:`gymllm.suites.games`: the moves of each side and the row it writes.

:func:`play_game` plays one item of :func:`~gymllm.suites.games.schedule` (a model side moves through
:class:`~gymllm.rollout.episode.Episode`, a scripted or random side through
:mod:`gymllm.multiagent.policies`) and scores it as the module doc of :mod:`gymllm.suites.games`
says ("Rows and scoring"): a failing side is a recorded loss (or an unscored row), never a lost row.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

import numpy as np

__all__ = ["play_game"]


class _SideError(Exception):
    """A side failed to produce a move (its policy or engine raised, timed out or ran out of context)."""


async def _model_move(
    game: Any, agent: str, ep: Any, engine: Any, started: set[str], config: Any
) -> str | None:
    obs, reward, _, _, info = game.last()
    info = {**info, "agent": agent}
    if agent not in started:
        started.add(agent)
        ep.begin(obs["observation"], info)
    else:
        ep.on_step(obs["observation"], float(reward), False, False, info, 0.0)
    max_len = getattr(engine, "max_len", None)
    if not ep.fits(int(max_len) - 1 if isinstance(max_len, int) else None):
        if config.overflow == "random":
            return None  # the caller plays a random legal move (training's convention past the context)
        raise _SideError(
            f"the prompt ({len(ep.buffer.prompt_ids)} tokens) is past the engine's context ({max_len}); "
            "fix: raise --max-len"
        )
    prompt, params = ep.next_request()
    call = engine.generate(prompt, params, session_id=ep.key.trajectory_id)
    completion = await (
        asyncio.wait_for(call, config.move_timeout_s) if config.move_timeout_s else call
    )
    return ep.on_completion(completion, 0.0)


async def play_game(
    make_game: Callable[[], Any],
    item: dict[str, Any],
    players: dict[str, Any],
    engines: dict[str, Any],
    agents: dict[str, Any],
    config: Any,
) -> dict[str, Any]:
    """Play one scheduled game (:func:`~gymllm.suites.games.schedule`'s ``item``); returns its row (module
    doc). ``players``: :class:`~gymllm.suites.games.Player` by label; ``config``: the
    :class:`~gymllm.suites.games.MatchConfig` (typed ``Any``: games.py imports this module, not back)."""
    from gymllm.inference.params import SamplingParams
    from gymllm.multiagent.policies import call_scripted, policy_move
    from gymllm.multiagent.seat import game_outcome
    from gymllm.rollout.episode import Episode, EpisodeKey
    from gymllm.rollout.seat_play import move_text

    by_seat: dict[str, str] = item["players"]
    seats = list(by_seat)
    row: dict[str, Any] = {
        "pairing": item["labels"],
        "game": item["game"],
        "seed": item["seed"],
        "players": by_seat,
        "winner": None,
        "draw": False,
        "outcomes": {},
        "rewards": {},
        "moves": [],
        "invalid": {label: 0 for label in by_seat.values()},
        "forfeit": None,
        "truncated": False,
        "error": None,
        "crashed": None,
        "scored": True,
        "overflow": {},
    }
    rng = np.random.default_rng(
        [item["seed"], item["game"]]
    )  # not the pairing: two players meet the same draws
    sampling = SamplingParams(temperature=config.temperature, max_tokens=config.max_tokens)
    episodes = {
        seat: Episode(
            EpisodeKey(
                group_index=item["pairing"],
                member=item["game"] * len(seats) + i,
                env_seed=item["seed"],
            ),
            agents[label],
            sampling,
            base_seed=config.seed,
            max_model_calls=config.max_moves + 1,
        )
        for i, (seat, label) in enumerate(by_seat.items())
        if players[label].kind == "model"
    }
    started: set[str] = set()
    overflowed: set[str] = (
        set()
    )  # model seats past their engine's context (config.overflow == "random")
    final: dict[str, tuple[float, dict]] = {}
    game = None
    try:
        game = make_game()
        game.reset(seed=item["seed"])
        while game.agents:
            agent = game.agent_selection
            obs, reward, term, trunc, info = game.last()
            if term or trunc:
                final[agent] = (float(reward), dict(info))
                game.step(None)
                continue
            if len(row["moves"]) >= config.max_moves:
                row["truncated"] = True
                break
            label = by_seat[agent]
            player = players[label]
            try:
                if (
                    player.kind == "model" and agent in overflowed
                ):  # past its context: random from then on
                    row["overflow"][label] += 1
                    move = policy_move(None, game, agent, rng)
                elif player.kind == "model":
                    move = await _model_move(
                        game, agent, episodes[agent], engines[label], started, config
                    )
                    if move is None:
                        overflowed.add(agent)
                        row["overflow"][label] = 1
                        move = policy_move(None, game, agent, rng)
                elif player.kind == "random":
                    move = policy_move(None, game, agent, rng)
                else:
                    move = move_text(
                        game,
                        agent,
                        call_scripted(player.fn, game.env.observe(agent), agent, game.env, rng),
                    )
            except Exception as e:  # noqa: BLE001 - a failing side is a recorded loss (or unscored), never a lost row
                why = (
                    "no reply within move_timeout_s"
                    if isinstance(e, asyncio.TimeoutError)
                    else str(e)
                    if isinstance(e, _SideError)
                    else f"{type(e).__name__}: {e}"
                )
                row["error"], row["crashed"] = f"{label} ({agent}) failed: {why}", label
                break
            row["moves"].append([agent, str(move)[:200]])
            game.step(move)
            after = game.infos.get(agent, {}) if agent in game.agents else {}
            if after.get("invalid_action") or after.get("forfeit") == agent:
                row["invalid"][label] += 1
    except Exception as e:  # noqa: BLE001 - the game itself failed: an unscored row, the other games go on
        row["error"], row["scored"] = f"the game failed: {type(e).__name__}: {e}", False
    finally:
        for seat, ep in episodes.items():
            end = getattr(engines[by_seat[seat]], "end_session", None)
            if end is not None and seat in started:
                end(ep.key.trajectory_id)
        if game is not None:
            game.close()
    _score(row, final, by_seat, config, game_outcome)
    return row


def _score(
    row: dict[str, Any],
    final: dict[str, tuple[float, dict]],
    by_seat: dict[str, str],
    config: Any,
    game_outcome: Callable[[str, float, dict], str],
) -> None:
    seats = list(by_seat)
    if row["crashed"] is not None:
        other = [label for label in by_seat.values() if label != row["crashed"]][0]
        row["scored"] = config.errors == "loss"
        row["winner"] = other if row["scored"] else None
        return
    if not row["scored"]:
        return
    if row["truncated"] or set(final) != set(seats):
        row["truncated"] = True
        row["draw"] = True
        return
    row["outcomes"] = {by_seat[s]: game_outcome(s, r, i) for s, (r, i) in final.items()}
    row["rewards"] = {by_seat[s]: r for s, (r, _) in final.items()}
    forfeit = next(
        (i.get("forfeit") for _, i in final.values() if i.get("forfeit") is not None), None
    )
    if forfeit is not None:
        row["forfeit"] = by_seat.get(forfeit, forfeit)
        row["winner"] = next(label for s, label in by_seat.items() if s != forfeit)
        return
    r0, r1 = final[seats[0]][0], final[seats[1]][0]
    row["draw"] = r0 == r1
    row["winner"] = None if r0 == r1 else by_seat[seats[0]] if r0 > r1 else by_seat[seats[1]]
