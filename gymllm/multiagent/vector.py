""":class:`AgentVectorEnv`: many multi-agent text games with one slot per (game, learning seat),
barrier-free ``send`` / ``recv`` like :class:`gymllm.vector.VectorEnv` (self-play or vs. opponents)."""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np

from gymllm.errors import ConfigError, GymLLMError, explain
from gymllm.multiagent.aec import TextAECEnv
from gymllm.multiagent.policies import Policy, advance_game
from gymllm.validation import check_range

__all__ = ["AgentVectorEnv"]


class AgentVectorEnv:
    """``num_games`` text games with one slot per (game, learning seat): self-play or vs. opponents.

    Slot ``i`` is game ``i // len(learners)``, seat ``learners[i % len(learners)]``. Barrier-free like
    :class:`gymllm.vector.VectorEnv`: ``recv()`` returns the slots that need a move (or that just saw
    their game end) with their ``env_ids``; ``send(actions, env_ids)`` plays those moves and runs the
    scripted seats. A slot's reward is what its seat accumulated since its previous move, so each
    slot's transitions form that seat's own trajectory. When every learning seat of a finished game
    has seen its final transition, the game is reset (seeded from the vector's RNG) and its slots
    come back with ``info["episode_start"] = True``.
    """

    def __init__(
        self,
        env_fn: Callable[[], TextAECEnv],
        num_games: int,
        *,
        learners: Iterable[str] | None = None,
        opponents: dict[str, Policy | None] | None = None,
    ):
        check_range(
            "AgentVectorEnv", "num_games", num_games, lo=1, integer=True, fix="pass num_games=4"
        )
        self.games = [env_fn() for _ in range(num_games)]
        seats = list(self.games[0].possible_agents)
        self.learners = list(learners) if learners is not None else seats
        bad = [s for s in self.learners if s not in seats]
        if bad or not self.learners:
            raise ConfigError(
                explain(
                    "AgentVectorEnv.learners",
                    expected=f"a non-empty subset of {seats}",
                    received=self.learners,
                    fix="name the seats the policy plays",
                )
            )
        self.opponents = {s: (opponents or {}).get(s) for s in seats if s not in self.learners}
        self.num_envs = num_games * len(self.learners)
        self._rng = np.random.default_rng()
        self._pending: set[int] = set()
        self._final_seen: set[int] = set()
        self._start: set[int] = set()

    def slot(self, env_id: int) -> tuple[int, str]:
        return env_id // len(self.learners), self.learners[env_id % len(self.learners)]

    def _slots_of(self, g: int) -> list[int]:
        return [g * len(self.learners) + k for k in range(len(self.learners))]

    def _advance(self, g: int) -> None:
        advance_game(self.games[g], lambda a: a in self.learners, self.opponents, self._rng)

    def _reset_game(self, g: int, seed: int | None) -> None:
        self.games[g].reset(
            seed=seed if seed is not None else int(self._rng.integers(0, 2**31 - 1))
        )
        for i in self._slots_of(g):
            self._final_seen.discard(i)
            self._start.add(i)
        self._advance(g)

    def reset(self, seed: int | None = None):
        """Reset every game (game ``g`` gets ``seed + g``); returns ``recv()`` of the first movers."""
        self._rng = np.random.default_rng(seed)
        self._start.clear()
        self._final_seen.clear()
        for g in range(len(self.games)):
            self._reset_game(g, None if seed is None else seed + g)
        return self.recv()

    def _ready(self, i: int) -> bool:
        g, seat = self.slot(i)
        env = self.games[g]
        if i in self._final_seen:
            return False
        if seat not in env.agents:
            return True
        return env.agent_selection == seat or env.terminations[seat] or env.truncations[seat]

    def recv(self):
        """``(obs, rewards, terminations, truncations, infos, env_ids)`` of every slot ready now."""
        ids = [i for i in range(self.num_envs) if self._ready(i)]
        obs, rews, terms, truncs, infos = [], [], [], [], []
        for i in ids:
            g, seat = self.slot(i)
            env = self.games[g]
            if seat in env.agents:
                o = env.observe(seat)
                # ``_cumulative_rewards`` is PettingZoo's AECEnv attribute (what its ``last()`` reads), on any AEC env
                r, te, tr, inf = (
                    env._cumulative_rewards[seat],
                    env.terminations[seat],
                    env.truncations[seat],
                    env.infos[seat],
                )
                env._cumulative_rewards[seat] = (
                    0.0  # delivered: the next transition starts from zero
                )
            else:
                o, r, te, tr, inf = {"observation": "The game is over."}, 0.0, True, False, {}
            info = {
                **inf,
                "agent": seat,
                "game": g,
                "episode_start": i in self._start,
                "action_mask": o.get("action_mask"),
            }
            self._start.discard(i)
            (
                obs.append(o["observation"]),
                rews.append(float(r)),
                terms.append(bool(te)),
                truncs.append(bool(tr)),
            )
            infos.append(info)
            if te or tr:
                self._final_seen.add(i)
        self._pending = {i for i, te, tr in zip(ids, terms, truncs) if not (te or tr)}
        for g in range(len(self.games)):
            if all(i in self._final_seen for i in self._slots_of(g)):
                self._reset_game(g, None)
        return (
            obs,
            np.asarray(rews, np.float32),
            np.asarray(terms),
            np.asarray(truncs),
            infos,
            np.asarray(ids, np.int64),
        )

    def send(self, actions: list[str], env_ids: Iterable[int]) -> None:
        """Play one move per given slot (each must be a slot ``recv`` returned as needing a move)."""
        env_ids = [int(i) for i in env_ids]
        if len(actions) != len(env_ids):
            raise GymLLMError(
                explain(
                    "AgentVectorEnv.send",
                    expected=f"{len(env_ids)} actions (one per env id)",
                    received=len(actions),
                    fix="pass one action per env id",
                )
            )
        for a, i in zip(actions, env_ids):
            if i not in self._pending:
                raise GymLLMError(
                    explain(
                        "AgentVectorEnv.send",
                        expected=f"an env id from the last recv ({sorted(self._pending)})",
                        received=i,
                        fix="send moves only for slots that recv returned",
                    )
                )
            g, seat = self.slot(i)
            env = self.games[g]
            if env.agent_selection != seat:  # another learner of this game moves first; keep order
                raise GymLLMError(
                    explain(
                        "AgentVectorEnv.send",
                        expected=f"{env.agent_selection} to move in game {g}",
                        received=seat,
                        fix="send moves only for slots that recv returned",
                    )
                )
            self._pending.discard(i)
            env.step(a)
            self._advance(g)

    def step(self, actions: list[str], env_ids: Iterable[int]):
        """``send`` then ``recv``."""
        self.send(actions, env_ids)
        return self.recv()

    async def asend(self, actions: list[str], env_ids: Iterable[int]) -> None:
        """Async twin of :meth:`send` (the games are in-process and fast: it runs inline)."""
        self.send(actions, env_ids)

    async def arecv(self):
        """Async twin of :meth:`recv`."""
        return self.recv()

    def close(self) -> None:
        for g in self.games:
            g.close()
