"""Multi-agent text envs over PettingZoo: AEC and Parallel wrappers, single-seat and per-agent vector views.

* :class:`TextAECEnv` wraps any PettingZoo AEC env. Each agent observes
  ``{"observation": <text>, "action_mask": int8[n]}`` (the PettingZoo classic convention, so masks
  reach tools that read them) and acts with a ``str``: a move name or index from the move list
  (``move_names=`` or indices), or numbers / JSON for non-Discrete action spaces (the same parser as
  :func:`gymllm.envs.from_gymnasium`). The text shows the agent's seat, the rendered observation and
  the legal moves.
* Illegal or unparsable moves follow the declared policy (:class:`MultiAgentConfig`):
  ``"retry"``: the mover gets ``invalid_penalty``, stays selected and its next observation explains
  the mistake; after ``max_invalid`` consecutive invalid moves it forfeits. ``"forfeit"``: the game
  ends at once, the mover gets ``forfeit_reward`` and everyone else 0 (as PettingZoo's classic games
  do for an illegal move). The inner env never sees an illegal move.
* :class:`TextParallelEnv` does the same for Parallel envs; an invalid action there is replaced by
  the first legal move (``"retry"``: penalty, the step goes on) or ends the episode (``"forfeit"``).
* The text action space is :class:`MoveText`, a :class:`gymllm.spaces.Text` whose ``sample(mask)``
  draws a legal move name from its own RNG, so PettingZoo's ``api_test`` / ``seed_test`` play real
  games through the text layer.
* :class:`SingleAgentView` is a :class:`~gymllm.core.TextEnv` for one seat against scripted or
  frozen opponents (a policy is ``f(observation: dict, rng) -> str``); :class:`AgentVectorEnv` runs
  many games with one slot per (game, learning seat), barrier-free ``send`` / ``recv`` with
  ``env_ids`` like :class:`gymllm.vector.VectorEnv`: self-play gives one trajectory per seat.

PettingZoo's ``api_test`` reads ``observation.dtype`` of every leaf, which a ``str`` does not have
(``'str' object has no attribute 'dtype'``). :func:`text_api_test` runs PettingZoo's own ``api_test``
with exactly that check adapted: a text leaf must be a ``str`` inside its ``Text`` space (numeric
leaves keep the original dtype check). Everything else in ``api_test`` runs unchanged; its
``test_action_flexibility`` is a no-op for text action spaces (it only acts on Discrete/Box
spaces), and it warns that observations are not NumPy arrays, which is expected for text.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Iterable, Literal

import gymnasium as gym
import numpy as np
from gymnasium import spaces as gspaces
from pettingzoo import AECEnv, ParallelEnv

from gymllm.core import TextEnv
from gymllm.errors import ConfigError, GymLLMError, explain
from gymllm.spaces import Text

Policy = Callable[[dict[str, Any], np.random.Generator], str]


# ------------------------------------------------------------------------------------------- config


@dataclasses.dataclass(frozen=True, kw_only=True)
class MultiAgentConfig:
    """How a PettingZoo env is turned into text.

    move_names: names of a Discrete action space's moves in index order (None: indices only).
    invalid_action: "retry" (penalty, the mover tries again) or "forfeit" (the game ends).
    invalid_penalty: reward for one invalid move under "retry".
    forfeit_reward: the forfeiting agent's reward when the game ends by forfeit.
    max_invalid: consecutive invalid moves that forfeit under "retry" (None: never).
    renderer: ``f(env, agent, raw_observation) -> str`` (None: the env's ANSI render if it has
        one, else a structured description of the raw observation).
    instructions: a line put before every observation (None: a generic one naming the seat).
    """

    move_names: tuple[str, ...] | None = None
    invalid_action: Literal["retry", "forfeit"] = "retry"
    invalid_penalty: float = -0.1
    forfeit_reward: float = -1.0
    max_invalid: int | None = 3
    renderer: Callable[[Any, str, Any], str] | None = None
    instructions: str | None = None

    def __post_init__(self) -> None:
        if self.invalid_action not in ("retry", "forfeit"):
            raise ConfigError(explain("MultiAgentConfig.invalid_action", expected="'retry' or 'forfeit'",
                                      received=self.invalid_action, fix="pick one of the two policies"))
        if self.max_invalid is not None and (not isinstance(self.max_invalid, int) or self.max_invalid < 1):
            raise ConfigError(explain("MultiAgentConfig.max_invalid", expected="None or an int >= 1",
                                      received=self.max_invalid, fix="use max_invalid=3"))
        if self.move_names is not None:
            names = tuple(self.move_names)
            if not all(isinstance(n, str) and n.strip() for n in names) or len({n.lower() for n in names}) != len(names):
                raise ConfigError(explain("MultiAgentConfig.move_names", expected="distinct non-empty str",
                                          received=names, fix="give one unique name per move"))
            object.__setattr__(self, "move_names", names)


# ------------------------------------------------------------------------------------------- spaces


class MoveText(Text):
    """A text action space whose samples are legal moves: ``sample(action_mask)`` picks a masked-in move.

    Any ``str`` belongs to the space (unparsable text is the env's invalid-move policy's business);
    ``moves`` lists the canonical move texts of the inner action space (empty when it is not Discrete,
    then ``sample`` formats a sample of ``inner``).
    """

    def __init__(self, inner: gym.Space, moves: tuple[str, ...], max_length: int = 1 << 16, seed: Any = None):
        super().__init__(max_length=max_length, seed=seed)
        self.inner = inner
        self.moves = tuple(moves)

    def sample(self, mask: Any = None, probability: Any = None) -> str:  # type: ignore[override]
        from gymllm.wrappers.space_text import format_action

        if self.moves:
            legal = np.arange(len(self.moves)) if mask is None else np.flatnonzero(np.asarray(mask))
            if legal.size == 0:
                return self.moves[0]
            return self.moves[int(legal[int(self.np_random.integers(legal.size))])]
        self.inner.seed(int(self.np_random.integers(2**31 - 1)))
        return format_action(self.inner.sample(), self.inner)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, MoveText) and self.moves == other.moves and self.inner == other.inner

    def __hash__(self) -> int:
        return hash(("gymllm.MoveText", self.moves))

    def __repr__(self) -> str:
        return f"MoveText(moves={len(self.moves)})"


def _moves(space: gym.Space, names: tuple[str, ...] | None) -> tuple[str, ...]:
    if not isinstance(space, gspaces.Discrete):
        return ()
    if names is not None and len(names) != space.n:
        raise ConfigError(explain("move_names", expected=f"{space.n} names (one per move)", received=names,
                                  fix="give exactly one name per move, in index order"))
    return tuple(names) if names else tuple(str(space.start + i) for i in range(space.n))


def _raw_mask(raw_obs: Any, info: dict[str, Any] | None) -> np.ndarray | None:
    if isinstance(raw_obs, dict) and "action_mask" in raw_obs:
        return np.asarray(raw_obs["action_mask"], dtype=np.int8)
    if info and "action_mask" in info:
        return np.asarray(info["action_mask"], dtype=np.int8)
    return None


class _TextCodec:
    """Per-agent observation/action text conversion shared by the AEC and Parallel wrappers."""

    def __init__(self, env: Any, config: MultiAgentConfig):
        self.env, self.config = env, config
        self._obs_spaces: dict[str, gym.Space] = {}
        self._act_spaces: dict[str, MoveText] = {}

    def action_space(self, agent: str) -> MoveText:
        if agent not in self._act_spaces:
            inner = self.env.action_space(agent)
            self._act_spaces[agent] = MoveText(inner, _moves(inner, self.config.move_names))
        return self._act_spaces[agent]

    def observation_space(self, agent: str) -> gym.Space:
        if agent not in self._obs_spaces:
            moves = self.action_space(agent).moves
            parts: dict[str, gym.Space] = {"observation": Text()}
            if moves:
                parts["action_mask"] = gspaces.Box(0, 1, (len(moves),), np.int8)
            self._obs_spaces[agent] = gspaces.Dict(parts)
        return self._obs_spaces[agent]

    def mask(self, agent: str, raw_obs: Any, info: dict[str, Any] | None) -> np.ndarray | None:
        moves = self.action_space(agent).moves
        if not moves:
            return None
        m = _raw_mask(raw_obs, info)
        return np.ones(len(moves), np.int8) if m is None else m

    def render(self, agent: str, raw_obs: Any, mask: np.ndarray | None, note: str = "") -> str:
        from gymllm.wrappers.space_text import action_menu, ansi_to_text, describe

        cfg = self.config
        head = cfg.instructions or f"You are {agent}. Reply with one move."
        if cfg.renderer is not None:
            body = cfg.renderer(self.env, agent, raw_obs)
        elif getattr(self.env, "render_mode", None) == "ansi":
            body = ansi_to_text(str(self.env.render()))
        else:
            inner_space = self.env.observation_space(agent)
            if isinstance(raw_obs, dict) and "observation" in raw_obs and isinstance(inner_space, gspaces.Dict):
                body = describe(raw_obs["observation"], inner_space["observation"])
            else:
                body = describe(raw_obs, inner_space)
        space = self.action_space(agent)
        if space.moves:
            legal = [m for m, ok in zip(space.moves, mask if mask is not None else np.ones(len(space.moves))) if ok]
            menu = f"Legal moves: {', '.join(legal)}."
        else:
            menu = action_menu(space.inner, None)
        return "\n".join(p for p in (note, head, body, menu) if p)

    def parse(self, agent: str, text: Any, mask: np.ndarray | None) -> tuple[Any, str | None]:
        """``(inner_action, None)`` for a legal move, ``(None, why)`` otherwise."""
        from gymllm.wrappers.space_text import ActionParseError, parse_action

        space = self.action_space(agent)
        if not isinstance(text, str):
            return None, f"a move must be text (str), received {type(text).__name__}"
        try:
            value = parse_action(text, space.inner, space.moves or None)
        except ActionParseError as e:
            return None, str(e)
        if space.moves:
            idx = int(value) - space.inner.start
            if mask is not None and not mask[idx]:
                return None, f"move {space.moves[idx]!r} is not legal now"
        return value, None


# ------------------------------------------------------------------------------------------- AEC


class TextAECEnv(AECEnv):
    """A PettingZoo AEC env with text observations and text actions around an AEC env (module doc)."""

    def __init__(self, env: AECEnv, config: MultiAgentConfig | None = None):
        super().__init__()
        if not isinstance(env, AECEnv):
            raise ConfigError(explain("TextAECEnv(env)", expected="a pettingzoo.AECEnv", received=type(env).__name__,
                                      fix="use TextParallelEnv for Parallel envs (or from_pettingzoo)"))
        self.env = env
        self.config = config or MultiAgentConfig()
        self.codec = _TextCodec(env, self.config)
        self.possible_agents = list(env.possible_agents)
        self.metadata = {**getattr(env, "metadata", {}), "name": f"text_{env.metadata.get('name', 'env')}",
                         "render_modes": ["ansi"]}
        self.render_mode = None
        self._forfeited = False
        self._notes: dict[str, str] = {}
        self._invalid: dict[str, int] = {}

    def __str__(self) -> str:
        return f"TextAECEnv<{self.env}>"

    # spaces (cached: the same object every call, as api_test demands)
    def observation_space(self, agent: str) -> gym.Space:
        return self.codec.observation_space(agent)

    def action_space(self, agent: str) -> MoveText:
        return self.codec.action_space(agent)

    # state mirroring
    def _sync(self) -> None:
        e = self.env
        self.agents = list(e.agents)
        self.rewards = {a: float(e.rewards[a]) for a in self.agents}
        self.terminations = {a: bool(e.terminations[a]) for a in self.agents}
        self.truncations = {a: bool(e.truncations[a]) for a in self.agents}
        self.infos = {a: dict(e.infos[a]) for a in self.agents}
        self._cumulative_rewards = {a: float(e._cumulative_rewards[a]) for a in self.agents}
        self.agent_selection = e.agent_selection

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        self.env.reset(seed=seed, options=options)
        self._forfeited = False
        self._notes, self._invalid = {}, {}
        self._sync()

    def _raw(self, agent: str) -> Any:
        return self.env.observe(agent)

    def observe(self, agent: str) -> dict[str, Any]:
        raw = self._raw(agent) if not self._forfeited else None
        mask = self.codec.mask(agent, raw, self.infos.get(agent))
        if self._forfeited:
            mask = None if mask is None else np.zeros_like(mask)  # the game is over: no legal move
            text = self._notes.get(agent, "The game is over.")
        else:
            text = self.codec.render(agent, raw, mask, self._notes.get(agent, ""))
        out: dict[str, Any] = {"observation": text}
        if mask is not None:
            out["action_mask"] = mask
        return out

    def step(self, action: Any) -> None:
        agent = self.agent_selection
        if self.terminations.get(agent) or self.truncations.get(agent):
            return self._step_dead(agent, action)
        raw = self._raw(agent)
        mask = self.codec.mask(agent, raw, self.infos.get(agent))
        value, why = self.codec.parse(agent, action, mask)
        if why is not None:
            return self._invalid_move(agent, action, why)
        self._invalid[agent] = 0
        self._notes.pop(agent, None)
        self.env.step(value)
        self._sync()

    def _step_dead(self, agent: str, action: Any) -> None:
        if self._forfeited:
            # our own bookkeeping after a forfeit: remove the agent as PettingZoo's _was_dead_step does
            for d in (self.rewards, self.terminations, self.truncations, self.infos, self._cumulative_rewards):
                d.pop(agent, None)
            self.agents.remove(agent)
            if self.agents:
                self.agent_selection = self.agents[0]
            self.rewards = {a: 0.0 for a in self.agents}
            return
        self.env.step(None)
        self._sync()

    def _invalid_move(self, agent: str, action: Any, why: str) -> None:
        n = self._invalid[agent] = self._invalid.get(agent, 0) + 1
        cfg = self.config
        if cfg.invalid_action == "forfeit" or (cfg.max_invalid is not None and n >= cfg.max_invalid):
            return self._forfeit(agent, why)
        self._cumulative_rewards[agent] = 0.0
        self.rewards = {a: 0.0 for a in self.agents}
        self.rewards[agent] = cfg.invalid_penalty
        self.infos[agent] = {**self.infos[agent], "invalid_action": why}
        self._notes[agent] = f"Invalid move ({n} in a row): {why}"
        self._accumulate_rewards()

    def _forfeit(self, agent: str, why: str) -> None:
        self._forfeited = True
        self._cumulative_rewards[agent] = 0.0
        self.rewards = {a: 0.0 for a in self.agents}
        self.rewards[agent] = self.config.forfeit_reward
        self.terminations = {a: True for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        for a in self.agents:
            self.infos[a] = {**self.infos[a], "forfeit": agent}
            self._notes[a] = f"The game is over: {agent} forfeited ({why})."
        self._accumulate_rewards()
        self.agent_selection = agent

    def render(self) -> str:
        agent = self.agent_selection
        return self.observe(agent)["observation"] if agent else ""

    def state(self) -> Any:
        return self.env.state()

    def close(self) -> None:
        self.env.close()


# ------------------------------------------------------------------------------------------- Parallel


class TextParallelEnv(ParallelEnv):
    """A PettingZoo Parallel env with text observations and actions around a Parallel env (module doc)."""

    def __init__(self, env: ParallelEnv, config: MultiAgentConfig | None = None):
        if not isinstance(env, ParallelEnv):
            raise ConfigError(explain("TextParallelEnv(env)", expected="a pettingzoo.ParallelEnv",
                                      received=type(env).__name__, fix="use TextAECEnv for AEC envs (or from_pettingzoo)"))
        self.env = env
        self.config = config or MultiAgentConfig()
        self.codec = _TextCodec(env, self.config)
        self.possible_agents = list(env.possible_agents)
        self.metadata = {**getattr(env, "metadata", {}), "name": f"text_{env.metadata.get('name', 'env')}"}
        self.render_mode = None
        self.agents: list[str] = []

    def observation_space(self, agent: str) -> gym.Space:
        return self.codec.observation_space(agent)

    def action_space(self, agent: str) -> MoveText:
        return self.codec.action_space(agent)

    def _text(self, raw: dict[str, Any], infos: dict[str, dict], notes: dict[str, str]) -> dict[str, dict[str, Any]]:
        out = {}
        for a, o in raw.items():
            mask = self.codec.mask(a, o, infos.get(a))
            out[a] = {"observation": self.codec.render(a, o, mask, notes.get(a, ""))}
            if mask is not None:
                out[a]["action_mask"] = mask
        return out

    def reset(self, seed: int | None = None, options: dict | None = None):
        raw, infos = self.env.reset(seed=seed, options=options)
        self.agents = list(self.env.agents)
        self._raw, self._infos = raw, infos
        return self._text(raw, infos, {}), {a: dict(i) for a, i in infos.items()}

    def step(self, actions: dict[str, Any]):
        inner, notes, penalties, forfeit = {}, {}, {}, None
        for a in self.agents:
            mask = self.codec.mask(a, self._raw.get(a), self._infos.get(a))
            value, why = self.codec.parse(a, actions.get(a), mask)
            if why is not None:
                if self.config.invalid_action == "forfeit":
                    forfeit = forfeit or (a, why)
                    continue
                space = self.codec.action_space(a)
                legal = np.flatnonzero(mask) if mask is not None else [0]
                value = space.inner.start + int(legal[0]) if space.moves else space.inner.sample()
                penalties[a], notes[a] = self.config.invalid_penalty, f"Invalid move, the first legal move was played: {why}"
            inner[a] = value
        if forfeit is not None:
            return self._forfeit(*forfeit)
        raw, rewards, terms, truncs, infos = self.env.step(inner)
        rewards = {a: float(r) + penalties.get(a, 0.0) for a, r in rewards.items()}
        infos = {a: {**i, **({"invalid_action": notes[a]} if a in notes else {})} for a, i in infos.items()}
        self._raw, self._infos = raw, infos
        self.agents = list(self.env.agents)
        return self._text(raw, infos, notes), rewards, dict(terms), dict(truncs), infos

    def _forfeit(self, agent: str, why: str):
        agents = list(self.agents)
        note = f"The game is over: {agent} forfeited ({why})."
        obs = {a: {"observation": note, **({"action_mask": np.zeros(len(self.codec.action_space(a).moves), np.int8)}
                                           if self.codec.action_space(a).moves else {})} for a in agents}
        rewards = {a: (self.config.forfeit_reward if a == agent else 0.0) for a in agents}
        self.agents = []
        return (obs, rewards, {a: True for a in agents}, {a: False for a in agents},
                {a: {"forfeit": agent} for a in agents})

    def render(self) -> Any:
        return self.env.render()

    def state(self) -> Any:
        return self.env.state()

    def close(self) -> None:
        self.env.close()


# ------------------------------------------------------------------------------------------- policies


def random_legal_policy(observation: dict[str, Any], rng: np.random.Generator, moves: tuple[str, ...] = ()) -> str:
    """A scripted opponent: a uniformly random legal move (drawn from the given RNG)."""
    mask = observation.get("action_mask")
    legal = np.flatnonzero(mask) if mask is not None else np.arange(len(moves))
    return moves[int(legal[int(rng.integers(legal.size))])] if legal.size else (moves[0] if moves else "0")


def _act(policy: Policy | None, env: Any, agent: str, rng: np.random.Generator) -> str:
    obs = env.observe(agent)
    if policy is not None:
        return policy(obs, rng)
    space = env.action_space(agent)
    moves = getattr(space, "moves", ())
    if moves or "action_mask" in obs:
        return random_legal_policy(obs, rng, moves)
    space.seed(int(rng.integers(0, 2**31 - 1)))  # free-text games: a random reply, reproducibly
    return space.sample()


def _advance(env: TextAECEnv, stop: Callable[[str], bool], opponents: dict[str, Policy | None],
             rng: np.random.Generator) -> None:
    """Step dead agents and scripted seats until ``stop(agent)`` or the game has no agents left."""
    while env.agents:
        agent = env.agent_selection
        if env.terminations[agent] or env.truncations[agent]:
            if stop(agent):
                return
            env.step(None)
            continue
        if stop(agent):
            return
        env.step(_act(opponents.get(agent), env, agent, rng))


# ------------------------------------------------------------------------------------------- one seat


class SingleAgentView(TextEnv):
    """One seat of a :class:`TextAECEnv` as a :class:`~gymllm.core.TextEnv`; other seats are policies.

    ``learner``: the seat played through ``step`` (None: drawn from ``np_random`` at every reset, so
    the policy learns both first and second moves). ``opponent``: a policy for every other seat (a
    callable ``f(observation_dict, rng) -> str``, a dict seat -> policy, or None for random legal
    moves from ``np_random``). ``step`` returns the learner's reward accumulated since its last move.
    """

    def __init__(self, env: TextAECEnv, *, learner: str | None = None, opponent: Policy | dict | None = None,
                 max_turns: int | None = None, render_mode: str | None = None):
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        if learner is not None and learner not in env.possible_agents:
            raise ConfigError(explain("SingleAgentView.learner", expected=f"one of {env.possible_agents}",
                                      received=learner, fix="pass a seat name or None"))
        self.env, self.fixed_learner = env, learner
        self.opponents = opponent if isinstance(opponent, dict) else {a: opponent for a in env.possible_agents}
        self.observation_space = Text()
        self.action_space = Text()

    def _until_learner(self) -> tuple[str, float, bool, bool, dict[str, Any]]:
        me = self.learner
        _advance(self.env, lambda a: a == me, {a: p for a, p in self.opponents.items() if a != me}, self.np_random)
        if me not in self.env.agents:  # removed already (should not happen with final-step-first games)
            return "The game is over.", 0.0, True, False, {}
        obs, reward, term, trunc, info = self.env.last()
        return obs["observation"], float(reward), bool(term), bool(trunc), {**info, "agent": me,
                                                                             "action_mask": obs.get("action_mask")}

    def _reset(self, *, seed, options):
        self.env.reset(seed=int(self.np_random.integers(0, 2**31 - 1)), options=options)
        seats = self.env.possible_agents
        self.learner = self.fixed_learner or seats[int(self.np_random.integers(len(seats)))]
        text, _, _, _, info = self._until_learner()
        return text, info

    def _step(self, action: str):
        self.env.step(action)
        return self._until_learner()

    def close(self) -> None:
        self.env.close()
        super().close()


# ------------------------------------------------------------------------------------------- vector of seats


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

    def __init__(self, env_fn: Callable[[], TextAECEnv], num_games: int, *, learners: Iterable[str] | None = None,
                 opponents: dict[str, Policy | None] | None = None):
        if not isinstance(num_games, int) or num_games < 1:
            raise ConfigError(explain("AgentVectorEnv.num_games", expected="an int >= 1", received=num_games,
                                      fix="pass num_games=4"))
        self.games = [env_fn() for _ in range(num_games)]
        seats = list(self.games[0].possible_agents)
        self.learners = list(learners) if learners is not None else seats
        bad = [s for s in self.learners if s not in seats]
        if bad or not self.learners:
            raise ConfigError(explain("AgentVectorEnv.learners", expected=f"a non-empty subset of {seats}",
                                      received=self.learners, fix="name the seats the policy plays"))
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
        _advance(self.games[g], lambda a: a in self.learners, self.opponents, self._rng)

    def _reset_game(self, g: int, seed: int | None) -> None:
        self.games[g].reset(seed=seed if seed is not None else int(self._rng.integers(0, 2**31 - 1)))
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
                r, te, tr, inf = env._cumulative_rewards[seat], env.terminations[seat], env.truncations[seat], env.infos[seat]
                env._cumulative_rewards[seat] = 0.0  # delivered: the next transition starts from zero
            else:
                o, r, te, tr, inf = {"observation": "The game is over."}, 0.0, True, False, {}
            info = {**inf, "agent": seat, "game": g, "episode_start": i in self._start,
                    "action_mask": o.get("action_mask")}
            self._start.discard(i)
            obs.append(o["observation"]), rews.append(float(r)), terms.append(bool(te)), truncs.append(bool(tr))
            infos.append(info)
            if te or tr:
                self._final_seen.add(i)
        self._pending = {i for i, te, tr in zip(ids, terms, truncs) if not (te or tr)}
        for g in range(len(self.games)):
            if all(i in self._final_seen for i in self._slots_of(g)):
                self._reset_game(g, None)
        return obs, np.asarray(rews, np.float32), np.asarray(terms), np.asarray(truncs), infos, np.asarray(ids, np.int64)

    def send(self, actions: list[str], env_ids: Iterable[int]) -> None:
        """Play one move per given slot (each must be a slot ``recv`` returned as needing a move)."""
        env_ids = [int(i) for i in env_ids]
        if len(actions) != len(env_ids):
            raise GymLLMError(explain("AgentVectorEnv.send", expected=f"{len(env_ids)} actions (one per env id)",
                                      received=len(actions), fix="pass one action per env id"))
        for a, i in zip(actions, env_ids):
            if i not in self._pending:
                raise GymLLMError(explain("AgentVectorEnv.send", expected=f"an env id from the last recv ({sorted(self._pending)})",
                                          received=i, fix="send moves only for slots that recv returned"))
            g, seat = self.slot(i)
            env = self.games[g]
            if env.agent_selection != seat:  # another learner of this game moves first; keep order
                raise GymLLMError(explain("AgentVectorEnv.send", expected=f"{env.agent_selection} to move in game {g}",
                                          received=seat, fix="send moves only for slots that recv returned"))
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


# ------------------------------------------------------------------------------------------- api_test


@contextlib.contextmanager
def _text_aware_api_checks():
    """Adapt api_test's one check that cannot handle ``str`` leaves (see module doc)."""
    import importlib

    mod = importlib.import_module("pettingzoo.test.api_test")
    original = mod._test_observation_space_compatibility

    def compat(expected, seen, recursed_keys):
        if isinstance(expected, Text):
            assert isinstance(seen, str) and expected.contains(seen), f"text observation at {recursed_keys} invalid"
            return
        if isinstance(expected, gspaces.Dict) and isinstance(seen, dict):
            for key in expected:
                if not recursed_keys and key != "observation":
                    continue
                compat(expected[key], seen[key], recursed_keys + [key])
            return
        original(expected, seen, recursed_keys)

    mod._test_observation_space_compatibility = compat
    try:
        yield
    finally:
        mod._test_observation_space_compatibility = original


def text_api_test(env: AECEnv, num_cycles: int = 1000) -> None:
    """PettingZoo's ``api_test`` with its dtype check made text-aware (module doc says what changes)."""
    from pettingzoo.test import api_test

    with _text_aware_api_checks():
        api_test(env, num_cycles=num_cycles)


__all__ = ["TextAECEnv", "TextParallelEnv", "MultiAgentConfig", "MoveText", "SingleAgentView", "AgentVectorEnv",
           "random_legal_policy", "text_api_test"]
