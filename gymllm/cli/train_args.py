"""The ``gymllm train`` command line: tyro over :class:`~gymllm.train.train_config.TrainConfig` itself.

    cfg = parse_train_args(["calc_math", "--learner.num-steps", "10", "--sampling.temperature", "0.7"])

The recipe and ``--preset`` / ``--loss-preset`` / ``--run-dir`` / ``--env-kwargs`` choose the config
(:func:`train_config_from`); tyro parses the whole command line once onto it (its fields are the
``--section.field`` flags).
"""

from __future__ import annotations

from typing import Annotated, Sequence

import tyro

from gymllm.validation import require

__all__ = [
    "TRAIN_PROG",
    "LEADING",
    "train_arguments",
    "leading_arguments",
    "train_config_from",
    "recipe_sft_stage",
    "parse_train_plan",
    "parse_train_args",
]

TRAIN_PROG = "gymllm train [RECIPE] [--preset NAME] [--loss-preset NAME] [--run-dir DIR] [--section.field VALUE ...]"


def train_arguments(default: object) -> type:
    """The ``gymllm train`` command line as one frozen dataclass for tyro: the recipe (positional),
    ``--preset``, ``--loss-preset``, ``--run-dir``, ``--env-kwargs``, and the training config itself
    (``default``, a ``TrainConfig``, whose fields are the ``--section.field`` flags, without a prefix).
    Presets are ``Literal`` choices."""
    import dataclasses
    from typing import Literal, Optional

    from gymllm.algos.config import PRESETS as LOSS_PRESETS
    from gymllm.train.train_config import PRESETS

    preset_t = Optional[Literal[tuple(PRESETS)]]  # type: ignore[valid-type]
    loss_t = Optional[Literal[tuple(LOSS_PRESETS)]]  # type: ignore[valid-type]

    fields = [  # real type objects (this module's annotations are strings: a class body here could not resolve them)
        (
            "recipe",
            Annotated[
                Optional[str],
                tyro.conf.Positional,
                tyro.conf.arg(
                    metavar="RECIPE",
                    help="a TOML recipe (a path, or the name of a shipped one, e.g. calc_math) or a run's "
                    "config.json",
                ),
            ],
            None,
        ),
        (
            "preset",
            Annotated[
                preset_t,
                tyro.conf.arg(
                    help="start from this preset (default: the recipe's, else 'default')"
                ),
            ],
            None,
        ),
        (
            "loss_preset",
            Annotated[
                loss_t,
                tyro.conf.arg(help="the loss preset (default: the recipe's, else the preset's)"),
            ],
            None,
        ),
        (
            "run_dir",
            Annotated[
                Optional[str], tyro.conf.arg(help="the run directory (same as --run.run-dir)")
            ],
            None,
        ),
        (
            "env_kwargs",
            Annotated[
                Optional[str],
                tyro.conf.arg(
                    help="the env's constructor kwargs as a JSON object, e.g. '{\"digits\": 2}'; replaces the preset's and "
                    "the recipe's env.kwargs (give it with --env.id)"
                ),
            ],
            None,
        ),
        (
            "config",
            Annotated[type(default), tyro.conf.arg(name="")],
            dataclasses.field(default_factory=lambda: default),
        ),
    ]
    TrainArguments = dataclasses.make_dataclass(
        "TrainArguments", [(n, t, d) for n, t, d in fields], frozen=True, kw_only=True
    )
    TrainArguments.__doc__ = "Arguments of `gymllm train`."
    return TrainArguments


#: the arguments of ``gymllm train`` that choose the config the ``--section.field`` flags apply to
LEADING = ("preset", "loss_preset", "run_dir", "env_kwargs")
#: flags whose value is a suite (a TOML file, which :func:`leading_arguments` must not take for the recipe)
SUITE_FLAGS = ("--env.suite", "--eval.suite")


def leading_arguments(args: Sequence[str]) -> dict[str, str | None]:
    """The recipe and the values of :data:`LEADING` (``--name VALUE`` or ``--name=VALUE``, dashes or
    underscores) in ``args``: what the config that the other flags apply to is built from. The recipe is
    the first argument when it is not a flag, else the first later argument that names a recipe file
    or a shipped recipe (tyro's parse confirms it, see :func:`parse_train_plan`). A flag without its
    value is left to tyro's usage error."""
    from gymllm.cli.recipes import find_recipe
    from gymllm.errors import ConfigError

    found: dict[str, str | None] = dict.fromkeys(("recipe", *LEADING))
    taken = set()
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        key = name[2:].replace("-", "_") if name.startswith("--") else ""
        if key in LEADING:
            has_next = not eq and i + 1 < len(args) and not args[i + 1].startswith("--")
            found[key] = value if eq else (args[i + 1] if has_next else None)
            taken.add(i + 1 if has_next else -1)
        elif name in SUITE_FLAGS and not eq:
            taken.add(i + 1)  # a suite file is a .toml too: never the recipe
    for i, arg in enumerate(args):
        if arg.startswith("-") or i in taken:
            continue
        if i == 0:
            found["recipe"] = arg
            break
        try:
            find_recipe(arg)
        except ConfigError:
            continue
        found["recipe"] = arg
        break
    return found


def train_config_from(
    recipe: str | None,
    preset: str | None,
    loss_preset: str | None,
    run_dir: str | None,
    env_kwargs: str | None = None,
) -> object:
    """The config a recipe, a preset, a loss preset and a run directory give, before the ``--section.field``
    flags: the preset (``preset``, else the recipe's, else ``default``), then the loss preset, then the
    recipe's tables, then ``run_dir``, then ``env_kwargs`` (a JSON object replacing ``env.kwargs``)."""
    import dataclasses

    from gymllm.train.train_config import preset as train_preset
    from gymllm.cli.recipes import load_recipe, recipe_tables

    overrides = load_recipe(recipe) if recipe else {}
    cfg = train_preset(preset or overrides.get("preset") or "default")
    if loss_preset or overrides.get("loss_preset"):
        cfg = cfg.with_loss(
            loss_preset or overrides["loss_preset"]
        )  # grpo | dapo | dr_grpo | gspo | async_agentic
    cfg = recipe_tables(overrides, cfg, where=f"recipe {recipe}" if recipe else "")
    if run_dir is not None:
        cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, run_dir=run_dir))
    if env_kwargs is not None:
        from gymllm.cli.json_args import json_object

        kwargs = json_object(env_kwargs)
        cfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, kwargs=kwargs))
    return cfg


def flag_value(args: Sequence[str], flag: str) -> str | None:
    """The value of ``flag`` in ``args`` (``--flag V`` or ``--flag=V``; the last one wins), or None."""
    value = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(flag + "="):
            value = a.split("=", 1)[1]
    return value


def suite_base(base: object, args: Sequence[str]) -> object:
    """``base`` with the env of ``--env.suite S`` when the command line gives one: the preset's or the
    recipe's env id and kwargs give way (a suite names its envs, with their kwargs), so
    ``gymllm train --env.suite core`` works with any preset. ``--env.suite`` with ``--env.id`` or
    ``--env-kwargs`` on the command line is a :class:`~gymllm.errors.ConfigError`: exactly one env source."""
    import dataclasses

    from gymllm.train.train_config import DEFAULT_ENV_ID

    suite = flag_value(args, "--env.suite")
    if not suite:
        return base
    for flag in ("--env.id", "--env-kwargs", "--env_kwargs"):
        given = flag_value(args, flag)
        require(
            given is None,
            "gymllm train --env.suite",
            expected=f"--env.suite S or {flag}, not both",
            received=f"--env.suite {suite} {flag} {given}",
            fix=f"drop {flag} (the suite names its envs, with their kwargs) or drop --env.suite",
        )
    env = base.env  # type: ignore[attr-defined]
    return dataclasses.replace(
        base, env=dataclasses.replace(env, id=DEFAULT_ENV_ID, kwargs={}, suite=suite)
    )


def env_id_base(base: object, args: Sequence[str]) -> object:
    """``base`` without its env kwargs when ``--env.id`` on the command line names another env than the
    preset's or the recipe's: those kwargs belong to that env (``--preset tiny --env.id my_games:nim_env``
    must not hand TinyRepeat's ``num_letters`` to the user's factory), so the env id takes them away with
    it, as a suite does. ``--env-kwargs`` (applied before) and ``--env.kwargs`` still set the new env's own."""
    import dataclasses

    env_id = flag_value(args, "--env.id")
    env = base.env  # type: ignore[attr-defined]
    if (
        env_id is None
        or env_id == env.id
        or flag_value(args, "--env-kwargs") is not None
        or flag_value(args, "--env_kwargs") is not None
    ):
        return base
    return dataclasses.replace(base, env=dataclasses.replace(env, kwargs={}))


def recipe_sft_stage(recipe: str | None) -> object:
    """The recipe's ``[sft]`` table as a :class:`~gymllm.cli.recipes.SFTStage`, or None (no recipe or no table)."""
    from gymllm.cli.recipes import load_recipe, sft_stage_from

    table = load_recipe(recipe).get("sft") if recipe else None
    return None if table is None else sft_stage_from(table)


def parse_train_plan(
    args: Sequence[str], *, description: str | None = None
) -> tuple[object, object]:
    """``(TrainConfig, SFTStage or None)`` of a ``gymllm train`` argv: :func:`parse_train_args`' config and
    the recipe's ``[sft]`` stage (see :func:`gymllm.cli.commands.run_stages`); ``description`` heads ``--help``."""

    from gymllm.algos.config import PRESETS as LOSS_PRESETS
    from gymllm.train.train_config import PRESETS

    lead = leading_arguments(args)
    for key, known in (("preset", PRESETS), ("loss_preset", LOSS_PRESETS)):
        if lead[key] not in known:
            lead[key] = None  # tyro's usage error names the choices
    base = train_config_from(
        lead["recipe"], lead["preset"], lead["loss_preset"], lead["run_dir"], lead["env_kwargs"]
    )
    base = env_id_base(suite_base(base, args), args)
    parsed = tyro.cli(train_arguments(base), prog=TRAIN_PROG, description=description, args=args)
    # a positional the scan could not place (e.g. a recipe that does not exist)
    require(
        parsed.recipe == lead["recipe"],
        "gymllm train RECIPE",
        expected="a TOML recipe (a path or a shipped name) or a run's config.json",
        received=parsed.recipe,
        fix="check the path, or give one of the shipped recipes (gymllm/recipes/*.toml)",
    )
    return parsed.config, recipe_sft_stage(lead["recipe"])


def parse_train_args(args: Sequence[str]) -> object:
    """The ``TrainConfig`` a ``gymllm train`` argv gives; every argument is parsed by tyro (a malformed
    one exits with tyro's usage error, ``SystemExit(2)``), over ``TrainConfig`` itself.

    The recipe (the first argument) and ``--preset`` / ``--loss-preset`` / ``--run-dir`` /
    ``--env-kwargs`` (:func:`leading_arguments`) choose the config (:func:`train_config_from`) that
    tyro then parses the command line onto, as its defaults: so ``--help`` shows the defaults the run
    will use, a ``--section.field`` flag overrides the recipe, and the config's checks see the final
    values."""
    return parse_train_plan(args)[0]
