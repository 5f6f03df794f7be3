"""One vocabulary across the ``gymllm`` commands: every flag of every command (``train``, ``eval env|suite|game``,
``sft`` and the others of :data:`gymllm.cli.main.COMMANDS`) is walked; an idea has one flag name, the one
``gymllm train`` gives it (:data:`IDEAS`), and no command spells it another way; every flag has help text;
a flag of an earlier version is refused with the flag to give instead."""

from __future__ import annotations

import argparse
import warnings

import pytest
import tyro

from gymllm.train.sft import SFTConfig
from gymllm.train.train_config import preset
from gymllm.cli import main as cli_main
from gymllm.cli.eval_args import RENAMED, SUBCOMMANDS, eval_main, subcommand_configs
from gymllm.cli.train_args import train_arguments

#: idea -> (the one flag, spellings no command may use for it)
IDEAS: dict[str, tuple[str, frozenset[str]]] = {
    "the model": ("--model.name", frozenset({"--model", "--model-name", "--policy"})),
    "trained weights": (
        "--model.checkpoint",
        frozenset({"--checkpoint", "--model-checkpoint", "--ckpt"}),
    ),
    "policy labels": ("--model.label", frozenset({"--label", "--labels"})),
    "held-out seed base": (
        "--eval.seed-base",
        frozenset({"--seed-offset", "--seed-base", "--eval.seed-offset", "--eval.seed"}),
    ),
    "held-out seeds": ("--eval.seeds", frozenset({"--num-seeds", "--eval.num-seeds", "--seeds"})),
    "samples per seed": ("--eval.k", frozenset({"--k", "--samples"})),
    "sampling temperature": ("--sampling.temperature", frozenset({"--temperature", "--temp"})),
    "tokens per reply": ("--sampling.max-tokens", frozenset({"--max-tokens", "--max-new-tokens"})),
    "engine rows": ("--engine.num-slots", frozenset({"--num-slots", "--max-slots", "--slots"})),
    "engine row length": ("--engine.max-len", frozenset({"--max-len", "--context-len"})),
    "prefill bucket": ("--engine.min-bucket", frozenset({"--min-bucket"})),
    "decode lengths": ("--engine.decode-lengths", frozenset({"--decode-lengths"})),
    "cluster backend": ("--cluster.backend", frozenset({"--backend", "--ray"})),
    "env kwargs": ("--env-kwargs", frozenset({"--game-kwargs", "--kwargs", "--env-args"})),
    "suite to evaluate": ("--eval.suite", frozenset({"--suite"})),
    "system prompt": ("--env.system-prompt", frozenset({"--system-prompt", "--prompt"})),
    "agent kind": ("--env.agent", frozenset({"--agent"})),
}


def _parser(target, **kw) -> argparse.ArgumentParser:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return tyro.extras.get_parser(target, **kw)


def _actions(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _actions(sub)
        elif not isinstance(action, argparse._HelpAction):
            yield action


def commands() -> dict[str, argparse.ArgumentParser]:
    """Every command's parser: train (over the default preset), sft, each eval subcommand, and each command of
    ``gymllm`` that tyro parses from its signature."""
    out = {"train": _parser(train_arguments(preset("default"))), "sft": _parser(SFTConfig)}
    out |= {f"eval {name}": _parser(cls) for name, cls in subcommand_configs().items()}
    for name, fn in cli_main.COMMANDS.items():
        if name in ("train", "sft", "eval"):
            continue
        if name == "compare":
            from gymllm.cli.suite_cli import compare as fn
        assert not getattr(fn, "takes_argv", False), (
            f"{name}: a command parsing its own argv needs its parser here"
        )
        out[name] = _parser(fn)
    return out


@pytest.fixture(scope="module")
def parsers() -> dict[str, argparse.ArgumentParser]:
    return commands()


def flags_of(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in _actions(parser) for s in a.option_strings if s.startswith("--")}


def test_every_command_is_walked(parsers):
    assert set(parsers) == {
        *(n for n in cli_main.COMMANDS if n != "eval"),
        *(f"eval {n}" for n in SUBCOMMANDS),
    }
    assert all(flags_of(p) for name, p in parsers.items() if name not in ("report",))


def test_one_name_per_idea_across_every_command(parsers):
    flags = {name: flags_of(p) for name, p in parsers.items()}
    clashes = {
        (cmd, idea, f)
        for cmd, fs in flags.items()
        for idea, (_, synonyms) in IDEAS.items()
        for f in fs & synonyms
    }
    assert not clashes, (
        f"commands spelling an idea another way (command, idea, flag): {sorted(clashes)}"
    )
    for idea, (flag, synonyms) in IDEAS.items():
        assert flag not in synonyms, idea
    # the one names are train's where train has the idea, and the eval subcommands use them
    for flag in (
        "--model.name",
        "--model.checkpoint",
        "--eval.seed-base",
        "--eval.seeds",
        "--eval.suite",
        "--sampling.temperature",
        "--sampling.max-tokens",
        "--engine.num-slots",
        "--engine.max-len",
        "--cluster.backend",
        "--env-kwargs",
    ):
        assert flag in flags["train"], flag
    assert {
        "--model.name",
        "--model.checkpoint",
        "--eval.seed-base",
        "--eval.seeds",
        "--eval.k",
        "--sampling.temperature",
        "--sampling.max-tokens",
        "--env-kwargs",
    } <= flags["eval env"]
    assert {
        "--model.name",
        "--model.checkpoint",
        "--model.label",
        "--eval.suite",
        "--eval.seed-base",
        "--eval.seeds",
        "--eval.k",
        "--sampling.temperature",
        "--sampling.max-tokens",
        "--engine.num-slots",
        "--engine.max-len",
        "--cluster.backend",
    } <= flags["eval suite"]
    assert {
        "--model.name",
        "--model.checkpoint",
        "--model.label",
        "--eval.seed-base",
        "--sampling.temperature",
        "--sampling.max-tokens",
        "--engine.num-slots",
        "--engine.max-len",
        "--env-kwargs",
    } <= flags["eval game"]
    assert {
        "--model.name",
        "--model.checkpoint",
        "--engine.num-slots",
        "--engine.max-len",
    } <= flags["serve"]
    assert {"--model.name", "--model.checkpoint"} <= flags["sft"]


def _has_help(action: argparse.Action) -> bool:
    text = (action.help or "").replace("%%", "%")
    for marker in ("(default: ", "(required)", "(repeatable)", "(fixed to: "):
        text = text.split(marker)[0]
    return bool(text.strip())


def test_every_flag_has_help_text(parsers):
    missing = []
    for name, parser in parsers.items():
        for action in _actions(parser):
            flag = (action.option_strings or [action.dest])[0]
            if flag.startswith(
                "--env.kwargs."
            ):  # one entry of the preset's env kwargs dict: the env names it
                continue
            if not _has_help(action):
                missing.append(f"{name} {flag}")
    assert not missing, f"flags without help text: {missing}"


@pytest.mark.parametrize("sub", list(SUBCOMMANDS))
def test_a_flag_of_an_earlier_version_names_the_one_to_give(sub, capsys):
    from gymllm.errors import ConfigError

    for old, new in RENAMED.items():
        with pytest.raises(ConfigError, match=rf"{new}.*Fix: give {new} instead of {old}"):
            eval_main([sub, "x", old, "1"])
        assert new.startswith("--") and "." in new or new == "--env-kwargs"
    # any other unknown flag: tyro's usage error, naming the flags it resembles
    with pytest.raises(SystemExit) as done:
        eval_main([sub, "x", "--eval.seed-bse", "5"])
    assert done.value.code == 2
    assert "--eval.seed-base" in capsys.readouterr().err


def test_eval_without_a_subcommand_names_the_subcommands(capsys):
    from gymllm.cli.main import main

    assert main(["eval", "gymllm/Arithmetic-v0", "--eval.seeds", "2"]) == 2
    err = capsys.readouterr().err
    assert "env, suite, game" in err and "gymllm eval env gymllm/Arithmetic-v0" in err
    assert main(["eval", "--game", "tic-tac-toe"]) == 2
    assert "gymllm eval game" in capsys.readouterr().err
    assert main(["eval", "--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in SUBCOMMANDS)


def test_the_eval_subcommands_parse_into_their_configs():
    from gymllm.cli.evaluate import EnvEval
    from gymllm.cli.game_cli import GameEval
    from gymllm.cli.suite_cli import SuiteEval
    from gymllm.utils.seeds import HELD_OUT_SEED_BASE

    env = tyro.cli(
        EnvEval,
        args=[
            "gymllm/A-v0",
            "gymllm/B-v0",
            "--model.checkpoint",
            "runs/a",
            "--eval.seed-base",
            "7",
            "--eval.seeds",
            "3",
            "--sampling.temperature",
            "0",
        ],
    )
    assert (
        env.env == ("gymllm/A-v0", "gymllm/B-v0")
        and env.model.checkpoint == "runs/a"
        and env.model.name is None
    )
    assert (env.eval.seed_base, env.eval.seeds, env.eval.sampling.temperature) == (7, 3, 0.0)
    suite = tyro.cli(
        SuiteEval,
        args=[
            "--eval.suite",
            "core",
            "--model.name",
            "a",
            "--model.name",
            "b",
            "--sampling.max-tokens",
            "9",
            "--cluster.backend",
            "ray",
        ],
    )
    assert (
        suite.eval.suite == "core"
        and suite.model.name == ("a", "b")
        and suite.sampling.max_tokens == 9
    )
    assert (
        suite.sampling.temperature is None
        and suite.eval.seed_base is None
        and suite.cluster.backend == "ray"
    )
    game = tyro.cli(
        GameEval,
        args=[
            "tic-tac-toe",
            "--model.checkpoint",
            "runs/t",
            "--opponent",
            "random",
            "--eval.games",
            "4",
            "--engine.max-len",
            "512",
        ],
    )
    assert (
        game.game == "tic-tac-toe"
        and game.model.checkpoint == ("runs/t",)
        and game.opponent == ("random",)
    )
    assert (game.eval.games, game.eval.seed_base, game.engine.max_len) == (
        4,
        HELD_OUT_SEED_BASE,
        512,
    )
