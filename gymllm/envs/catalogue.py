"""Catalogue adapters (optional extra ``gymllm[catalogue]``): reasoning-gym datasets and TextArena games.

Registered ids (registration is cheap: neither library is imported until an env is made):

* ``gymllm/rg-<dataset>-v0`` for every reasoning-gym dataset (:data:`REASONING_GYM_DATASETS`, the
  registry of reasoning-gym 0.1.25; :func:`register_reasoning_gym` adds datasets of a newer
  installed version). A single-turn :class:`ReasoningGymEnv`: the question (after reasoning-gym's
  instruction prompt) is the observation, the reply's ``<answer>...</answer>`` (or the whole reply)
  is scored by the dataset's own ``score_answer``; reward in [0, 1]. Generators run offline.
* ``gymllm/ta-<Game>[-<variant>]-v0`` for TextArena's offline single-player games
  (:data:`TEXTARENA_SINGLE_PLAYER`; those that need an API key, a download or that fail to import
  here are left out). Multi-player TextArena games are PettingZoo AEC envs through
  :func:`textarena_env` (then :class:`~gymllm.multiagent.AgentVectorEnv` for self-play, or
  :class:`~gymllm.multiagent.SingleAgentView` with an opponent policy).
* ``gymllm/ta-KuhnPoker-v0``: one seat of TextArena's Kuhn poker against random legal moves; the
  two-player game itself is ``gymllm.envs.kuhn_poker:kuhn_poker`` (a ``MODULE:FACTORY`` env id for
  self-play and ``gymllm eval game``), with legal-move masks, Kuhn's chip rewards and the closed-form
  equilibrium its demonstrations play (:mod:`gymllm.envs.kuhn_poker`).

Randomness: TextArena seeds and draws from the global ``random`` module (and a few games from
``np.random``); reasoning-gym mostly uses private generators. Every call into either library runs
inside :class:`PrivateGlobalRandom`: the env's own saved global-RNG states are swapped in under a
process-wide lock and the caller's states are restored afterwards, so the process's global RNGs are
never disturbed and each env is deterministic given the seed it was reset with (drawn from its
``np_random``). Without the extra installed, making one of these ids raises
:class:`~gymllm.errors.MissingExtraError`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import re
import threading
from typing import Any, Iterator

import numpy as np

from gymllm.core import TextEnv
from gymllm.errors import ConfigError, MissingExtraError, explain
from gymllm.registration import register

# reasoning-gym 0.1.25's registry (reasoning_gym.factory.DATASETS), snapshot so import stays cheap.
REASONING_GYM_DATASETS: tuple[str, ...] = (
    "ab", "acre", "advanced_geometry", "aiw", "arc_1d", "arc_agi", "base_conversion", "basic_arithmetic", "bf",
    "binary_alternation", "binary_matrix", "bitwise_arithmetic", "boxnet", "caesar_cipher", "calendar_arithmetic",
    "chain_sum", "circuit_logic", "codeio", "coin_flip", "color_cube_rotation", "complex_arithmetic", "composite",
    "count_bits", "count_primes", "countdown", "course_schedule", "cryptarithm", "decimal_arithmetic",
    "decimal_chain_sum", "dice", "emoji_mystery", "family_relationships", "figlet_font", "fraction_simplification",
    "futoshiki", "game_of_life", "game_of_life_halting", "gcd", "graph_color", "group_anagrams", "gsm_symbolic",
    "intermediate_integration", "isomorphic_strings", "jugs", "kakurasu", "knight_swap", "knights_knaves",
    "largest_island", "lcm", "leg_counting", "letter_counting", "letter_jumble", "list_functions", "mahjong_puzzle",
    "manipulate_matrix", "maze", "mini_sudoku", "modulo_grid", "n_queens", "needle_haystack", "number_filtering",
    "number_format", "number_sequence", "number_sorting", "palindrome_generation", "palindrome_partitioning",
    "path_star", "polynomial_equations", "polynomial_multiplication", "pool_matrix", "power_function",
    "prime_factorization", "products", "propositional_logic", "puzzle24", "quantum_lock", "ransom_note", "rearc",
    "rectangle_count", "rotate_matrix", "rotten_oranges", "rubiks_cube", "rush_hour", "self_reference",
    "sentence_reordering", "shortest_path", "simple_equations", "simple_geometry", "simple_integration", "sokoban",
    "spell_backward", "spiral_matrix", "string_insertion", "string_manipulation", "string_splitting",
    "string_synthesis", "sudoku", "survo", "syllogism", "time_intervals", "tower_of_hanoi", "tsumego", "word_ladder",
    "word_sequence_reversal", "word_sorting", "zebra_puzzles",
)

# TextArena 0.7.4 single-player games that reset and step offline here (probed; raw = no default wrappers).
# Left out: games needing an API key or nltk downloads, games that fail to import, and Sokoban-v0-medium
# (its level generator takes minutes per reset).
TEXTARENA_SINGLE_PLAYER: tuple[str, ...] = (
    "2048-v0-ultra-easy-raw", "2048-v0-mega-easy-raw", "2048-v0-super-easy-raw", "2048-v0-very-easy-raw",
    "2048-v0-easy-raw", "2048-v0-raw", "2048-v0-hard-raw", "2048-v0-very-hard-raw", "2048-v0-extreme-raw",
    "2048-v0-3x3-raw", "2048-v0-5x5-raw", "2048-v0-6x6-raw", "2048-v0-8x8-raw", "2048-v0-10x10-raw", "Bandit-v0-raw",
    "Bandit-v0-hard-raw", "Blackjack-v0-raw", "Blackjack-v0-long-raw", "Countdown-v0-raw", "Crosswords-v0-raw",
    "Crosswords-v0-hardcore-raw", "Cryptarithm-v0-raw", "FifteenPuzzle-v0-raw", "FrozenLake-v0-raw",
    "FrozenLake-v0-random-raw", "FrozenLake-v0-hardcore-raw", "GuessTheNumber-v0-raw", "GuessTheNumber-v0-hardcore-raw",
    "LightsOut-v0-raw", "LogicPuzzle-v0-raw", "LogicPuzzle-v0-hard-raw", "Mastermind-v0-raw", "Mastermind-v0-hard-raw",
    "Mastermind-v0-extreme-raw", "Minesweeper-v0-raw", "Minesweeper-v0-small-raw", "Minesweeper-v0-medium-raw",
    "Minesweeper-v0-hard-raw", "PegJump-v0-raw", "RushHour-v0-raw", "Secretary-v0-raw", "Secretary-v0-long-raw",
    "Set-v0-raw", "Slitherlink-v0-raw", "Sokoban-v0-raw", "Sudoku-v0-very-easy-raw",
    "Sudoku-v0-easy-raw", "Sudoku-v0-raw", "Sudoku-v0-medium-raw", "ThreeCardMonte-v0-raw", "TowerOfHanoi-v0-raw",
    "TowerOfHanoi-v0-medium-raw", "TowerOfHanoi-v0-hard-raw", "TowerOfHanoi-v0-hardcore-raw",
    "TowerOfHanoi-v0-extreme-raw",
)


# ------------------------------------------------------------------------------------------ global RNG isolation

_GLOBAL_RNG_LOCK = threading.RLock()


class PrivateGlobalRandom:
    """A private copy of the global ``random`` / ``np.random`` states for code that insists on them.

    ``with rng.active(): ...`` swaps this object's states in (under a process-wide lock, so threads
    running other envs cannot interleave), and afterwards saves them back and restores the caller's.
    """

    def __init__(self, seed: int = 0):
        self.seed(seed)

    def seed(self, seed: int) -> None:
        self._py = random.Random(seed).getstate()
        self._np = np.random.RandomState(seed % 2**32).get_state()

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        with _GLOBAL_RNG_LOCK:
            caller_py, caller_np = random.getstate(), np.random.get_state()
            random.setstate(self._py)
            np.random.set_state(self._np)
            try:
                yield
            finally:
                self._py, self._np = random.getstate(), np.random.get_state()
                random.setstate(caller_py)
                np.random.set_state(caller_np)


def _import(module: str, package: str):
    try:
        with PrivateGlobalRandom(0).active():  # some of these libraries draw from `random` at import time
            return __import__(module, fromlist=["_"])
    except ImportError as e:
        raise MissingExtraError(package, "catalogue") from e


# ------------------------------------------------------------------------------------------ reasoning-gym


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReasoningGymConfig:
    """dataset: a reasoning-gym dataset name; dataset_size / dataset_seed: the procedural pool the
    episodes draw from; dataset_kwargs: the dataset's own config fields; system_prompt: a key of
    ``reasoning_gym.utils.SYSTEM_PROMPTS``, literal text, or None; answer_tag: the tag the answer is
    read from (None: the whole reply)."""

    dataset: str
    dataset_size: int = 1000
    dataset_seed: int = 0
    dataset_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    system_prompt: str | None = "default"
    answer_tag: str | None = "answer"

    def __post_init__(self) -> None:
        if not isinstance(self.dataset, str) or not self.dataset:
            raise ConfigError(explain("ReasoningGymConfig.dataset", expected="a reasoning-gym dataset name",
                                      received=self.dataset, fix=f"e.g. {REASONING_GYM_DATASETS[:3]}"))
        for name in ("dataset_size", "dataset_seed"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (1 if name == "dataset_size" else 0):
                raise ConfigError(explain(f"ReasoningGymConfig.{name}", expected="a positive int" if name == "dataset_size"
                                          else "an int >= 0", received=v, fix=f"pass {name}=1000"))


# The mix ``rg-composite-v0`` draws from unless ``dataset_kwargs={"datasets": [...]}`` names its own.
COMPOSITE_DEFAULT = ({"name": "leg_counting", "weight": 1.0, "config": {}},
                     {"name": "gcd", "weight": 1.0, "config": {}},
                     {"name": "basic_arithmetic", "weight": 1.0, "config": {}})


def _composite_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """reasoning-gym's composite dataset wants ``DatasetSpec`` objects; accept plain dicts (loggable)."""
    from reasoning_gym.composite import DatasetSpec

    specs = [s if isinstance(s, DatasetSpec) else DatasetSpec(name=s["name"], weight=float(s.get("weight", 1.0)),
                                                              config=dict(s.get("config", {})))
             for s in kwargs.get("datasets", COMPOSITE_DEFAULT)]
    return {**kwargs, "datasets": specs}


class ReasoningGymEnv(TextEnv):
    """One reasoning-gym question per episode, scored by the dataset (see module doc).

    ``reset(options={"index": i})`` picks item ``i`` of the pool instead of a random one.
    """

    def __init__(self, dataset: str, *, max_turns: int | None = None, render_mode: str | None = None, **config: Any):
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        self.config = ReasoningGymConfig(dataset=dataset, **config)
        self._rng = PrivateGlobalRandom(self.config.dataset_seed)
        self._data = None

    @property
    def data(self) -> Any:
        if self._data is None:
            rg = _import("reasoning_gym", "reasoning-gym")
            from reasoning_gym.factory import DATASETS

            cfg = self.config
            if cfg.dataset not in DATASETS:
                raise ConfigError(explain("ReasoningGymEnv.dataset", expected="a dataset of the installed reasoning-gym",
                                          received=cfg.dataset, fix=f"pick one of {sorted(DATASETS)[:8]}..."))
            kwargs = _composite_kwargs(cfg.dataset_kwargs) if cfg.dataset == "composite" else cfg.dataset_kwargs
            with self._rng.active():
                self._data = rg.create_dataset(cfg.dataset, seed=cfg.dataset_seed, size=cfg.dataset_size, **kwargs)
        return self._data

    def _prompt(self, question: str) -> str:
        sp = self.config.system_prompt
        if sp is None:
            return question
        from reasoning_gym.utils import SYSTEM_PROMPTS

        return f"{SYSTEM_PROMPTS.get(sp, sp).strip()}\n\n{question}"

    def _reset(self, *, seed, options):
        data = self.data
        idx = int((options or {}).get("index", self.np_random.integers(len(data))))
        self._rng.seed(self.config.dataset_seed * 1_000_003 + idx)  # item i is the same whatever came before
        with self._rng.active():
            self._item = data[idx]
        info = {"task_id": f"rg/{self.config.dataset}/{self.config.dataset_seed}/{idx}",
                "answer": self._item.get("answer"), "index": idx}
        return self._prompt(str(self._item["question"])), info

    def extract(self, reply: str) -> str | None:
        tag = self.config.answer_tag
        if tag is None:
            return reply.strip()
        from reasoning_gym.utils import extract_answer

        return extract_answer(reply, tag_name=tag)

    def _step(self, action: str):
        answer = self.extract(action)
        info: dict[str, Any] = {"extracted_answer": answer, "answer": self._item.get("answer")}
        try:
            with self._rng.active():
                score = float(self.data.score_answer(answer=answer, entry=self._item))
        except Exception as e:  # recorded, not hidden: the info says why the score is 0
            score, info["score_error"] = 0.0, f"{type(e).__name__}: {e}"
        feedback = "Correct." if score >= 1.0 else ("Partially correct." if score > 0 else "Incorrect.")
        return feedback, score, True, info


def register_reasoning_gym(names: tuple[str, ...] | None = None) -> list[str]:
    """Register ``gymllm/rg-<name>-v0`` for ``names`` (default: the installed registry); returns the ids."""
    if names is None:
        _import("reasoning_gym", "reasoning-gym")
        from reasoning_gym.factory import DATASETS

        names = tuple(sorted(DATASETS))
    ids = []
    for name in names:
        register(f"rg-{name}-v0", entry_point="gymllm.envs.catalogue:ReasoningGymEnv", kwargs={"dataset": name})
        ids.append(f"gymllm/rg-{name}-v0")
    return ids


# ------------------------------------------------------------------------------------------ TextArena


def format_textarena_observation(obs: Any) -> str:
    """TextArena observations (a list of ``(from_id, message, type)`` or already a str) as one text."""
    if isinstance(obs, str):
        return obs
    lines = []
    for item in obs or ():
        sender, message = item[0], item[1]
        who = "GAME" if sender == -1 else f"Player {sender}"
        lines.append(f"[{who}] {message}")
    return "\n".join(lines)


INVALID_MOVE_REWARD = -1.0  # TextArena's own default reward for a losing invalid move


def _numeric_reward(r: Any) -> tuple[float, str | None]:
    """``(reward, None)``, or ``(INVALID_MOVE_REWARD, repr)`` when a game hands back a non-number.

    Some TextArena 0.7.4 games call ``set_invalid_move(0.0, "message")`` with the arguments swapped,
    so the "reward" is the message; it is kept in ``info["textarena_bad_reward"]``, not hidden.
    """
    if r is None:
        return 0.0, None
    try:
        return float(r), None
    except (TypeError, ValueError):
        return INVALID_MOVE_REWARD, repr(r)


def textarena_pull(env: Any) -> None:
    """The AEC env ``env`` (fields ``ta``, ``_rng``, ``_texts``) takes TextArena's next observation: its
    player becomes ``agent_selection`` and the text is that agent's observation."""
    with env._rng.active():
        pid, obs = env.ta.get_observation()
    agent = f"player_{pid}"
    env.agent_selection = agent
    env._texts[agent] = format_textarena_observation(obs)


def textarena_reset(env: Any, seed: int | None, num_players: int) -> None:
    """Reset the TextArena game of the AEC env ``env`` (``ta``, ``_rng``, ``_seed_rng``) and its
    per-agent fields: ``seed`` (None: the next draw of the last seed's generator) decides TextArena's
    own seed and the private ``random`` state it runs under. The caller pulls the first observation."""
    if seed is not None:
        env._seed_rng = np.random.default_rng(seed)
    ta_seed = int(env._seed_rng.integers(0, 2**31 - 1))
    env._rng.seed(ta_seed)
    with env._rng.active():
        env.ta.reset(num_players=num_players, seed=ta_seed)
    env.agents = list(env.possible_agents)
    env.rewards = {a: 0.0 for a in env.agents}
    env._cumulative_rewards = {a: 0.0 for a in env.agents}
    env.terminations = {a: False for a in env.agents}
    env.truncations = {a: False for a in env.agents}
    env.infos = {a: {} for a in env.agents}
    env._texts = {a: "" for a in env.agents}


def textarena_env(env_id: str, *, num_players: int | None = None, **kwargs: Any):
    """A TextArena game as a PettingZoo AEC env with text observations and free-text actions.

    Agents are ``player_0 .. player_{n-1}``; each agent's observation is the messages it received
    since its previous move; rewards arrive when the game ends (TextArena's ``close``).
    """
    return _textarena_aec_class()(env_id, num_players=num_players, **kwargs)


_AEC_CLASS = None


def _textarena_aec_class():
    global _AEC_CLASS
    if _AEC_CLASS is not None:
        return _AEC_CLASS
    import gymnasium.spaces as gspaces
    from pettingzoo import AECEnv

    from gymllm.spaces import Text

    class TextArenaAEC(AECEnv):
        """A TextArena game as a PettingZoo AEC env (see :func:`textarena_env`)."""

        def __init__(self, env_id: str, *, num_players: int | None = None, default_num_players: int = 2):
            super().__init__()
            ta = _import("textarena", "textarena")
            self.env_id = env_id
            with PrivateGlobalRandom(0).active():
                self.ta = ta.make(env_id)
            self.num_players_ = num_players or self._probe_players(default_num_players)
            self.possible_agents = [f"player_{i}" for i in range(self.num_players_)]
            self.metadata = {"name": f"textarena_{env_id}", "render_modes": ["ansi"], "is_parallelizable": False}
            self.render_mode = None
            self._rng = PrivateGlobalRandom(0)
            self._obs_spaces = {a: gspaces.Dict({"observation": Text()}) for a in self.possible_agents}
            self._act_spaces = {a: Text(max_length=1 << 16) for a in self.possible_agents}
            self._seed_rng = np.random.default_rng()

        def _probe_players(self, default: int) -> int:
            for n in (default, 1, 2, 3, 4, 5, 6):
                try:
                    with PrivateGlobalRandom(0).active():
                        self.ta.reset(num_players=n, seed=0)
                    return n
                except (AssertionError, ValueError, TypeError):
                    continue
            raise ConfigError(explain(f"textarena_env({self.env_id!r})", expected="a game that resets with 1-6 players",
                                      received="none worked", fix="pass num_players="))

        def observation_space(self, agent):
            return self._obs_spaces[agent]

        def action_space(self, agent):
            return self._act_spaces[agent]

        def _pull(self) -> None:
            textarena_pull(self)

        def reset(self, seed: int | None = None, options: dict | None = None) -> None:
            textarena_reset(self, seed, self.num_players_)
            self._pull()

        def observe(self, agent: str) -> dict[str, Any]:
            return {"observation": self._texts.get(agent, "")}

        def step(self, action: Any) -> None:
            agent = self.agent_selection
            if self.terminations[agent] or self.truncations[agent]:
                return self._was_dead_step(action)
            self._cumulative_rewards[agent] = 0.0
            with self._rng.active():
                done, info = self.ta.step(str(action))
            self.rewards = {a: 0.0 for a in self.agents}
            if done:
                with self._rng.active():
                    rewards, game_info = self.ta.close()
                for a in self.agents:
                    pid = int(a.split("_")[1])
                    reward, bad = _numeric_reward((rewards or {}).get(pid, 0.0))
                    self.rewards[a] = reward
                    self.terminations[a] = True
                    gi = (game_info or {}).get(pid, {})
                    self.infos[a] = {k: v for k, v in gi.items() if isinstance(v, (str, int, float, bool))}
                    if bad is not None:
                        self.infos[a]["textarena_bad_reward"] = bad
                    self._texts[a] = f"The game is over. {gi.get('reason', '')}".strip()
            else:
                self._pull()
            self._accumulate_rewards()

        def render(self) -> str:
            return self._texts.get(self.agent_selection, "")

        def close(self) -> None:
            pass

    _AEC_CLASS = TextArenaAEC
    return _AEC_CLASS


def ta_gym_id(ta_id: str) -> str:
    """``"Sudoku-v0-easy-raw"`` -> ``"ta-Sudoku-easy-v0"`` (a valid Gymnasium id)."""
    m = re.fullmatch(r"(?P<name>.+?)-v(?P<ver>\d+)(?P<variant>(?:-[\w.]+)*)", ta_id.removesuffix("-raw"))
    if m is None:
        raise ConfigError(explain("TextArena id", expected="'<Name>-v<N>[-variant][-raw]'", received=ta_id,
                                  fix="pass an id from textarena's registry"))
    return f"ta-{m['name']}{m['variant']}-v{m['ver']}"


def make_textarena_single(*, ta_id: str, max_turns: int | None = None, render_mode: str | None = None):
    """Entry point of the ``gymllm/ta-*`` ids: the single seat of a one-player TextArena game."""
    from gymllm.multiagent import SingleAgentView

    return SingleAgentView(textarena_env(ta_id, num_players=1), learner="player_0", max_turns=max_turns,
                           render_mode=render_mode)


def register_textarena(ta_ids: tuple[str, ...] = TEXTARENA_SINGLE_PLAYER) -> list[str]:
    """Register ``gymllm/ta-*`` ids for single-player TextArena games; returns the ids."""
    ids = []
    for ta_id in ta_ids:
        gid = ta_gym_id(ta_id)
        register(gid, entry_point="gymllm.envs.catalogue:make_textarena_single", kwargs={"ta_id": ta_id})
        ids.append(f"gymllm/{gid}")
    return ids


REASONING_GYM_IDS = register_reasoning_gym(REASONING_GYM_DATASETS)
TEXTARENA_IDS = register_textarena()
register("ta-KuhnPoker-v0", entry_point="gymllm.envs.kuhn_poker:make_kuhn_poker_seat")
KUHN_POKER_ID = "gymllm/ta-KuhnPoker-v0"

__all__ = ["ReasoningGymEnv", "ReasoningGymConfig", "register_reasoning_gym", "textarena_env", "register_textarena",
           "PrivateGlobalRandom", "format_textarena_observation", "ta_gym_id", "REASONING_GYM_DATASETS",
           "TEXTARENA_SINGLE_PLAYER", "REASONING_GYM_IDS", "TEXTARENA_IDS", "KUHN_POKER_ID"]
