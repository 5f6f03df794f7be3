"""Recipes: small TOML files whose tables are the sections of a ``TrainConfig``, applied as overrides.

The recipes gymllm ships are package data in ``gymllm/recipes/`` (``examples/*.toml`` in the source
tree are links to them), so ``gymllm train calc_math`` finds its recipe wherever gymllm is installed;
a user's own TOML file is given by its path. A recipe ``gymllm/recipes/arithmetic_tiny.toml`` like::

    preset = "tiny"            # optional: start from a named preset
    [env]
    id = "gymllm/Arithmetic-v0"
    [sampling]
    max_tokens = 8
    [learner]
    num_steps = 20

is applied field by field onto the preset's config (:func:`recipe_tables`); an unknown key is
a :class:`~gymllm.errors.ConfigError` that names the key and the allowed ones. A run's
``config.json`` is read the same way (``gymllm train RUN/config.json`` repeats or resumes that run).

A recipe may also hold an ``[sft]`` table (:class:`SFTStage`): ``gymllm train RECIPE`` then runs
three stages, demonstrations -> supervised fine-tuning -> GRPO warm-started from the SFT weights::

    [sft]
    demos = 256                # episodes the env's solver plays (gymllm.envs.demos)
    epochs = 0                 # SFTSection fields, flat (0: learner.num_steps updates)
    batch_size = 8
    num_steps = 40             # LearnerConfig fields, flat
    learning_rate = 1e-4       # OptimizerConfig fields, flat
    seed = 0                   # RunSection fields (the data order's seed)
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import tomllib
from typing import Any

from gymllm.errors import ConfigError
from gymllm.validation import apply_overrides

__all__ = [
    "RECIPES_DIR",
    "shipped_recipes",
    "find_recipe",
    "load_recipe",
    "recipe_tables",
    "SFTStage",
    "sft_stage_from",
    "sft_config_for",
    "NOT_SECTIONS",
]

RECIPES_DIR = (
    pathlib.Path(__file__).resolve().parents[1] / "recipes"
)  # package data: gymllm/recipes/*.toml
EXAMPLES_DIR = (
    RECIPES_DIR  # the name older callers (tests/test_recipes.py) use for the shipped recipes
)


def shipped_recipes() -> list[str]:
    """The names of the recipes gymllm ships (``gymllm train NAME``)."""
    return sorted(p.stem for p in RECIPES_DIR.glob("*.toml"))


def find_recipe(name_or_path: str) -> pathlib.Path:
    """Resolve a recipe given as a path to a TOML file (the user's own) or as the name of a shipped one."""
    candidates = [
        pathlib.Path(name_or_path),
        RECIPES_DIR / name_or_path,
        RECIPES_DIR / f"{name_or_path}.toml",
    ]
    for c in candidates:
        if c.is_file():
            return c
    raise ConfigError(
        f"recipe {name_or_path!r} not found: expected a TOML file path or one of {shipped_recipes()} "
        f"(shipped in {RECIPES_DIR}). Fix: pass a path to a .toml recipe, or one of those names."
    )


def load_recipe(name_or_path: str) -> dict[str, Any]:
    """A recipe's tables: a TOML file, or a run's ``config.json`` (JSON)."""
    path = find_recipe(name_or_path)
    try:
        if path.suffix == ".json":
            return json.loads(path.read_text())
        with open(path, "rb") as f:
            return tomllib.load(f)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(
            f"recipe {str(path)!r} is not valid {'JSON' if path.suffix == '.json' else 'TOML'} ({e}). "
            "Fix: check the line it names."
        ) from e


#: a recipe's top-level keys that are not sections of the config
NOT_SECTIONS = ("preset", "loss_preset", "description", "sft")


def recipe_tables(tables: dict[str, Any], cfg: Any, *, where: str = "") -> Any:
    """``cfg`` (a ``TrainConfig``) with a recipe's sections applied (:func:`gymllm.train.train_config.from_tables`);
    the keys of :data:`NOT_SECTIONS` are skipped."""
    from gymllm.train.train_config import from_tables

    return from_tables({k: v for k, v in tables.items() if k not in NOT_SECTIONS}, cfg, where=where)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SFTStage:
    """A recipe's ``[sft]`` table: the demonstrations and SFT stages before GRPO.

    demos: episodes the env's solver plays (``gymllm.envs.demos.demonstrations``; solved or won/drawn
    ones are kept), seeds ``demo_seed .. demo_seed + demos - 1`` (below the held-out seeds);
    demo_env: the env whose solver plays them (default ``""``: the recipe's ``env.id``), with the
    recipe's ``env.kwargs`` and system prompt, e.g. ``gymllm/TicTacToe-v0`` (one seat against a
    scripted opponent, which has a minimax solver) for a self-play run on the game ``tic-tac-toe``;
    demo_policy: who plays them: ``"solver"`` (the env's solver, the default) or ``"uniform"``
    (uniformly random legal moves of a game seat, every episode kept: a warm start that teaches the
    move syntax and not a strategy, :func:`gymllm.envs.demos_solvers.uniform_legal_player`) or ``"first"``
    (the first legal move every time: the syntax and a state-blind strategy,
    :func:`gymllm.envs.demos_solvers.first_legal_player`);
    overrides: the table's other keys, applied onto :class:`gymllm.train.sft.SFTConfig` by
    :func:`sft_config_for`: a key of ``SFTConfig`` itself (a ``[sft.lora]`` table...), else of its ``sft``
    section (``epochs``, ``batch_size``...), its ``learner`` (``num_steps``, ``max_len``...), its ``run``
    (``seed``, ``checkpoint_every``...) or its ``optimizer`` (``learning_rate``, ``schedule``...). ``data``, ``from_run``, ``model`` and ``run_dir``
    are the stage's own (the demos file, the recipe's model, ``RUN_DIR/sft``) and are refused."""

    demos: int = 256
    demo_seed: int = 0
    demo_env: str = ""
    demo_policy: str = "solver"
    overrides: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, lo in (("demos", 1), ("demo_seed", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ConfigError(
                    f"recipe [sft].{name}: expected an int >= {lo}, received {v!r}. "
                    f"Fix: write {name} = {256 if name == 'demos' else 0}."
                )
        if not isinstance(self.demo_env, str):
            raise ConfigError(
                f"recipe [sft].demo_env: expected an env id string, received {self.demo_env!r}. "
                'Fix: write demo_env = "gymllm/TicTacToe-v0" (or leave it out for env.id).'
            )
        from gymllm.envs.demos import POLICIES

        if self.demo_policy not in POLICIES:
            raise ConfigError(
                f"recipe [sft].demo_policy: expected one of {list(POLICIES)}, received "
                f'{self.demo_policy!r}. Fix: write demo_policy = "solver" (the env\'s solver), '
                '"uniform" (random legal moves of a game seat) or "first" (its first legal move).'
            )
        fixed = sorted(set(self.overrides) & set(SFT_STAGE_OWNED))
        if fixed:
            raise ConfigError(
                f"recipe [sft]: expected no {fixed} (the stage sets them: the demos file, the recipe's "
                f"[model], RUN_DIR/sft), received {fixed}. Fix: remove them; set [model] for both stages."
            )


#: SFTConfig fields the stage sets itself
SFT_STAGE_OWNED = ("data", "from_run", "min_reward", "model", "run_dir")


def sft_stage_from(table: Any) -> SFTStage:
    """The :class:`SFTStage` of a recipe's ``[sft]`` table (a ``ConfigError`` for a table that is not one)."""
    if not isinstance(table, dict):
        raise ConfigError(
            f"recipe 'sft': expected a table ([sft] with demos = N, num_steps = ...), received "
            f"{table!r}. Fix: write it as an [sft] table."
        )
    rest = dict(table)
    known = {k: rest.pop(k) for k in ("demos", "demo_seed", "demo_env", "demo_policy") if k in rest}
    return SFTStage(**known, overrides=rest)


def sft_config_for(stage: SFTStage, train_cfg: Any, *, data: str, run_dir: str) -> Any:
    """The ``SFTConfig`` of the SFT stage before GRPO run ``train_cfg`` (a ``TrainConfig``): its model,
    sharding, compute dtype, learner lengths, system prompt, console and seed, then ``stage.overrides``
    (flat keys: a field of ``SFTConfig`` itself, else of its ``sft``, ``learner``, ``run`` or ``optimizer``
    section)."""
    from gymllm.algos.learner_config import LearnerConfig
    from gymllm.algos.optim import OptimizerConfig
    from gymllm.train.sft import SFTConfig, SFTSection
    from gymllm.train.train_config import RunSection

    tl = train_cfg.learner
    model = dataclasses.replace(train_cfg.model, checkpoint="")
    learner = LearnerConfig(
        max_len=tl.max_len,
        min_bucket=min(tl.min_bucket, tl.max_len),
        compute_dtype=tl.compute_dtype,
    )
    cfg = SFTConfig(
        data=data,
        model=model,
        sharding=train_cfg.sharding,
        learner=learner,
        sft=SFTSection(system_prompt=train_cfg.env.system_prompt),
        run=RunSection(run_dir=run_dir, seed=train_cfg.run.seed, console=train_cfg.run.console),
    )
    top = {f.name for f in dataclasses.fields(SFTConfig)}
    sections = {
        name: {f.name for f in dataclasses.fields(kind)}
        for name, kind in (
            ("sft", SFTSection),
            ("learner", LearnerConfig),
            ("run", RunSection),
            ("optimizer", OptimizerConfig),
        )
    }
    nested: dict[str, Any] = {}
    for key, value in stage.overrides.items():
        name = key.replace("-", "_")
        where = (
            "" if name in top else next((s for s, names in sections.items() if name in names), None)
        )
        if where is None:
            raise ConfigError(
                f"bad recipe key 'sft.{key}': expected demos, demo_seed, demo_env, demo_policy or a field of SFTConfig "
                f"{sorted(top - set(SFT_STAGE_OWNED))} or of its sections "
                + ", ".join(f"{s} {sorted(names)}" for s, names in sections.items())
                + f", received {key!r}. Fix: rename or remove {key!r}."
            )
        if where:
            nested.setdefault(where, {})[name] = value
        else:
            nested[name] = value
    return apply_overrides(cfg, nested, where="sft")
