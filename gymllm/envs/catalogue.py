"""Catalogue adapters (optional extra ``gymllm[catalogue]``): reasoning-gym datasets and TextArena games.

Registered ids (registration is cheap: neither library is imported until an env is made):

* ``gymllm/rg-<dataset>-v0`` for every reasoning-gym dataset (:data:`REASONING_GYM_DATASETS`, the
  registry of reasoning-gym 0.1.25; :func:`register_reasoning_gym` adds datasets of a newer
  installed version). A single-turn :class:`ReasoningGymEnv`: the question (after reasoning-gym's
  instruction prompt) is the observation, the reply's ``<answer>...</answer>`` (or the whole reply)
  is scored by the dataset's own ``score_answer``; reward in [0, 1]. Generators run offline.
* ``gymllm/ta-<Game>[-<variant>]-v0`` for TextArena's offline single-player games
  (:data:`~gymllm.envs.catalogue_textarena.TEXTARENA_SINGLE_PLAYER`; those that need an API key, a
  download or that fail to import here are left out). Multi-player TextArena games are PettingZoo
  AEC envs through :func:`~gymllm.envs.catalogue_textarena.textarena_env` (then
  :class:`~gymllm.multiagent.AgentVectorEnv` for self-play, or
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

This module holds the reasoning-gym envs and the RNG isolation; the TextArena ids and
:func:`~gymllm.envs.catalogue_textarena.textarena_env` are :mod:`gymllm.envs.catalogue_textarena`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import threading
from typing import Any, Iterator

import numpy as np

from gymllm.core import TextEnv
from gymllm.errors import MissingExtraError
from gymllm.validation import is_int, require
from gymllm.registration import register

# reasoning-gym 0.1.25's registry (reasoning_gym.factory.DATASETS), snapshot so import stays cheap.
REASONING_GYM_DATASETS: tuple[str, ...] = (
    "ab",
    "acre",
    "advanced_geometry",
    "aiw",
    "arc_1d",
    "arc_agi",
    "base_conversion",
    "basic_arithmetic",
    "bf",
    "binary_alternation",
    "binary_matrix",
    "bitwise_arithmetic",
    "boxnet",
    "caesar_cipher",
    "calendar_arithmetic",
    "chain_sum",
    "circuit_logic",
    "codeio",
    "coin_flip",
    "color_cube_rotation",
    "complex_arithmetic",
    "composite",
    "count_bits",
    "count_primes",
    "countdown",
    "course_schedule",
    "cryptarithm",
    "decimal_arithmetic",
    "decimal_chain_sum",
    "dice",
    "emoji_mystery",
    "family_relationships",
    "figlet_font",
    "fraction_simplification",
    "futoshiki",
    "game_of_life",
    "game_of_life_halting",
    "gcd",
    "graph_color",
    "group_anagrams",
    "gsm_symbolic",
    "intermediate_integration",
    "isomorphic_strings",
    "jugs",
    "kakurasu",
    "knight_swap",
    "knights_knaves",
    "largest_island",
    "lcm",
    "leg_counting",
    "letter_counting",
    "letter_jumble",
    "list_functions",
    "mahjong_puzzle",
    "manipulate_matrix",
    "maze",
    "mini_sudoku",
    "modulo_grid",
    "n_queens",
    "needle_haystack",
    "number_filtering",
    "number_format",
    "number_sequence",
    "number_sorting",
    "palindrome_generation",
    "palindrome_partitioning",
    "path_star",
    "polynomial_equations",
    "polynomial_multiplication",
    "pool_matrix",
    "power_function",
    "prime_factorization",
    "products",
    "propositional_logic",
    "puzzle24",
    "quantum_lock",
    "ransom_note",
    "rearc",
    "rectangle_count",
    "rotate_matrix",
    "rotten_oranges",
    "rubiks_cube",
    "rush_hour",
    "self_reference",
    "sentence_reordering",
    "shortest_path",
    "simple_equations",
    "simple_geometry",
    "simple_integration",
    "sokoban",
    "spell_backward",
    "spiral_matrix",
    "string_insertion",
    "string_manipulation",
    "string_splitting",
    "string_synthesis",
    "sudoku",
    "survo",
    "syllogism",
    "time_intervals",
    "tower_of_hanoi",
    "tsumego",
    "word_ladder",
    "word_sequence_reversal",
    "word_sorting",
    "zebra_puzzles",
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


def import_extra(module: str, package: str):
    """Import ``module`` of the catalogue extra with the global RNGs private (a
    :class:`~gymllm.errors.MissingExtraError` naming ``package`` when it is not installed)."""
    try:
        with PrivateGlobalRandom(
            0
        ).active():  # some of these libraries draw from `random` at import time
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
        require(
            isinstance(self.dataset, str) and self.dataset,
            "ReasoningGymConfig.dataset",
            expected="a reasoning-gym dataset name",
            received=self.dataset,
            fix=f"e.g. {REASONING_GYM_DATASETS[:3]}",
        )
        for name in ("dataset_size", "dataset_seed"):
            v = getattr(self, name)
            require(
                is_int(v) and v >= (1 if name == "dataset_size" else 0),
                f"ReasoningGymConfig.{name}",
                expected="a positive int" if name == "dataset_size" else "an int >= 0",
                received=v,
                fix=f"pass {name}=1000",
            )


# The mix ``rg-composite-v0`` draws from unless ``dataset_kwargs={"datasets": [...]}`` names its own.
COMPOSITE_DEFAULT = (
    {"name": "leg_counting", "weight": 1.0, "config": {}},
    {"name": "gcd", "weight": 1.0, "config": {}},
    {"name": "basic_arithmetic", "weight": 1.0, "config": {}},
)


def _composite_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """reasoning-gym's composite dataset wants ``DatasetSpec`` objects; accept plain dicts (loggable)."""
    from reasoning_gym.composite import DatasetSpec

    specs = [
        s
        if isinstance(s, DatasetSpec)
        else DatasetSpec(
            name=s["name"], weight=float(s.get("weight", 1.0)), config=dict(s.get("config", {}))
        )
        for s in kwargs.get("datasets", COMPOSITE_DEFAULT)
    ]
    return {**kwargs, "datasets": specs}


class ReasoningGymEnv(TextEnv):
    """One reasoning-gym question per episode, scored by the dataset (see module doc).

    ``reset(options={"index": i})`` picks item ``i`` of the pool instead of a random one.
    """

    def __init__(
        self,
        dataset: str,
        *,
        max_turns: int | None = None,
        render_mode: str | None = None,
        **config: Any,
    ):
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        self.config = ReasoningGymConfig(dataset=dataset, **config)
        self._rng = PrivateGlobalRandom(self.config.dataset_seed)
        self._data = None

    @property
    def data(self) -> Any:
        if self._data is None:
            rg = import_extra("reasoning_gym", "reasoning-gym")
            from reasoning_gym.factory import DATASETS

            cfg = self.config
            require(
                cfg.dataset in DATASETS,
                "ReasoningGymEnv.dataset",
                expected="a dataset of the installed reasoning-gym",
                received=cfg.dataset,
                fix=f"pick one of {sorted(DATASETS)[:8]}...",
            )
            kwargs = (
                _composite_kwargs(cfg.dataset_kwargs)
                if cfg.dataset == "composite"
                else cfg.dataset_kwargs
            )
            with self._rng.active():
                self._data = rg.create_dataset(
                    cfg.dataset, seed=cfg.dataset_seed, size=cfg.dataset_size, **kwargs
                )
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
        self._rng.seed(
            self.config.dataset_seed * 1_000_003 + idx
        )  # item i is the same whatever came before
        with self._rng.active():
            self._item = data[idx]
        info = {
            "task_id": f"rg/{self.config.dataset}/{self.config.dataset_seed}/{idx}",
            "answer": self._item.get("answer"),
            "index": idx,
        }
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
        feedback = (
            "Correct." if score >= 1.0 else ("Partially correct." if score > 0 else "Incorrect.")
        )
        return feedback, score, True, info


def register_reasoning_gym(names: tuple[str, ...] | None = None) -> list[str]:
    """Register ``gymllm/rg-<name>-v0`` for ``names`` (default: the installed registry); returns the ids."""
    if names is None:
        import_extra("reasoning_gym", "reasoning-gym")
        from reasoning_gym.factory import DATASETS

        names = tuple(sorted(DATASETS))
    ids = []
    for name in names:
        register(
            f"rg-{name}-v0",
            entry_point="gymllm.envs.catalogue:ReasoningGymEnv",
            kwargs={"dataset": name},
        )
        ids.append(f"gymllm/rg-{name}-v0")
    return ids


REASONING_GYM_IDS = register_reasoning_gym(REASONING_GYM_DATASETS)

__all__ = [
    "ReasoningGymEnv",
    "ReasoningGymConfig",
    "register_reasoning_gym",
    "PrivateGlobalRandom",
    "import_extra",
    "REASONING_GYM_DATASETS",
    "REASONING_GYM_IDS",
]
