"""One config vocabulary: ``TrainConfig`` is composed of the components' own configs, every field a run
writes to ``config.json`` is a ``gymllm train`` flag, every flag an error message names exists, recipes
and ``config.json`` load through the same path, and the shared checks say
what was expected, what was received and how to fix it."""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import pathlib
import re
import types

import pytest

from gymllm.train.train_config import TrainConfig, from_tables, preset
from gymllm.cli.tables import print_table
from gymllm.inference.config import EngineConfig
from gymllm.inference.params import SamplingParams
from gymllm.rollout.config import RolloutConfig
from gymllm.cli.train_args import parse_train_args, train_arguments, train_config_from
from gymllm.cli.recipes import shipped_recipes
from gymllm.cli.sft import PROG as SFT_PROG, parse_sft_args
from gymllm.errors import ConfigError
from gymllm.validation import (
    apply_overrides,
    check_choice,
    check_fields,
    check_order,
    check_range,
    require,
    require_one_of,
)

ROOT = pathlib.Path(__file__).resolve().parents[1] / "gymllm"
FLAG = re.compile(r"--[a-z0-9][a-z0-9.-]*")


def _help_flags(cls, default=None, prog="gymllm", capsys=None) -> set[str]:
    import tyro

    with pytest.raises(SystemExit):
        if default is None:
            tyro.cli(cls, prog=prog, args=["--help"])
        else:
            tyro.cli(cls, prog=prog, default=default, args=["--help"])
    return set(FLAG.findall(capsys.readouterr().out))


def train_flags(cfg, capsys) -> set[str]:
    return _help_flags(train_arguments(cfg), capsys=capsys)


def eval_flags(capsys) -> set[str]:
    """The flags of ``gymllm eval env|suite|game`` (train's names, plus their own ``--eval.*`` and ``--model.label``)."""
    from gymllm.cli.eval_args import subcommand_configs

    return set().union(*(_help_flags(cls, capsys=capsys) for cls in subcommand_configs().values()))


def _leaf_flags(written: dict, cfg, prefix: str = "-") -> list[str]:
    """The ``--section.field`` flag of every field in ``written`` (a config's ``config.json`` dict), walking
    nested sections; a dict-valued field with keys (``env.kwargs``) has one flag per key."""
    out = []
    for key, value in written.items():
        flag = (
            f"{prefix}-{key.replace('_', '-')}"
            if prefix == "-"
            else f"{prefix}.{key.replace('_', '-')}"
        )
        field = cfg[key] if isinstance(cfg, dict) else getattr(cfg, key)
        if dataclasses.is_dataclass(field):
            out += _leaf_flags(value, field, flag)
        elif (
            isinstance(field, dict) and field
        ):  # tyro gives a non-empty dict one flag per key, recursively
            out += _leaf_flags(value, field, flag)
        else:
            out.append(flag)
    return out


@pytest.mark.parametrize("source", ["tiny", "default", *shipped_recipes()])
def test_every_field_a_run_writes_to_config_json_is_a_train_flag(source, capsys):
    cfg = (
        preset(source)
        if source in ("tiny", "default")
        else train_config_from(source, None, None, None)
    )
    written = json.loads(cfg.to_json())
    assert set(written) == {f.name for f in dataclasses.fields(TrainConfig)}
    flags = train_flags(cfg, capsys)
    leaves = _leaf_flags(written, cfg)
    assert (
        len(leaves) > 120
        and "--engine.decode-chunk" in leaves
        and "--rollout.max-failed-streak" in leaves
    )
    missing = [f for f in leaves if f not in flags]
    assert not missing, f"config.json fields without a gymllm train flag: {missing}"


def test_the_component_configs_are_the_sections():
    cfg = preset("tiny")
    assert (
        type(cfg.engine) is EngineConfig
        and type(cfg.sampling) is SamplingParams
        and type(cfg.rollout) is RolloutConfig
    )
    # the settings the old hand mapping hid are fields with their values
    assert (cfg.engine.min_bucket, cfg.engine.idle_wait_s, cfg.engine.decode_chunk) == (
        64,
        0.002,
        8,
    )
    assert cfg.rollout.queue_size == 8 and cfg.rollout.max_failed_streak == 64


def _messages() -> list[tuple[str, str]]:
    """(file, text) of every string constant inside a call that builds or raises an error message."""
    calls = {
        "explain",
        "require",
        "check_range",
        "check_choice",
        "ConfigError",
        "ValueError",
        "RolloutStalledError",
        "AgentProgramError",
        "EngineError",
        "ToolError",
        "FileNotFoundError",
    }
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in calls:
                    for sub in ast.walk(node):
                        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                            out.append((str(path.relative_to(ROOT.parent)), sub.value))
    return out


def test_every_flag_an_error_message_names_exists(capsys):
    train = (
        train_flags(preset("default"), capsys)
        | train_flags(preset("tiny"), capsys)
        | eval_flags(capsys)
    )
    sft = _help_flags(
        __import__("gymllm.train.sft", fromlist=["SFTConfig"]).SFTConfig, capsys=capsys
    )
    named = []
    for file, text in _messages():
        for flag in FLAG.findall(text):
            flag = flag.rstrip(".-")
            if (
                "." not in flag
            ):  # plain flags of other commands (--checkpoint, --from-run, ...): not config fields
                continue
            named.append(flag)
            known = sft if file.endswith("sft.py") else train
            assert flag in known or flag in train, (
                f"{file}: an error message names {flag}, which is not a flag"
            )
    assert (
        "--rollout.max-failed-streak" in named and "--engine.max-len" in named
    )  # the walk sees the messages


def test_every_section_path_an_error_message_names_exists():
    cfg = preset("default")
    sections = "|".join(f.name for f in dataclasses.fields(TrainConfig))
    path = re.compile(rf"(?<![\w.-])({sections})\.([a-z_]+)(?![\w(])")
    seen = []
    for file, text in _messages():
        if not file.startswith(
            ("gymllm/algos/", "gymllm/train/", "gymllm/cli/", "gymllm/rollout/orchestrator")
        ):
            continue
        for section, field in path.findall(text):
            if field in ("py", "jsonl", "json"):  # file names (run.py, trajectories.jsonl)
                continue
            seen.append(f"{section}.{field}")
            assert hasattr(getattr(cfg, section), field), (
                f"{file}: an error message names {section}.{field}"
            )
    assert "engine.max_len" in seen and "env.num_envs" in seen


def test_old_spellings_are_refused_with_the_field_names(tmp_path):
    """No spelling of an older version is translated: an unknown key or flag is an error naming today's."""
    old = tmp_path / "old.toml"
    old.write_text('preset = "tiny"\n[rollout]\neta = 0\n')
    with pytest.raises(ConfigError, match=r"rollout\.eta.*max_staleness"):
        parse_train_args([str(old)])
    with pytest.raises(SystemExit):
        parse_train_args(["--preset", "tiny", "--rollout.max-tokens", "5"])


def test_a_runs_config_json_loads_back_as_its_config(tmp_path):
    cfg = dataclasses.replace(preset("tiny"), run=dataclasses.replace(preset("tiny").run, seed=5))
    (tmp_path / "config.json").write_text(cfg.to_json())
    assert parse_train_args([str(tmp_path / "config.json")]) == cfg
    assert from_tables(json.loads(cfg.to_json())) == cfg


def test_a_shared_value_has_one_field_and_is_wired_into_each_component():
    """The run's seed, the learner's groups per step and the sampling temperature are each one field; the
    group source, the engine and the learner get them as constructor arguments (gymllm.train.wiring)."""
    from gymllm.train.wiring import engine_config, learner_kwargs

    fields = {f.name for f in dataclasses.fields(RolloutConfig)}
    assert not fields & {"seed", "groups_per_step"}
    assert "temperature" not in {f.name for f in dataclasses.fields(preset("tiny").learner)}
    cfg = parse_train_args(
        [
            "--preset",
            "tiny",
            "--run.seed",
            "7",
            "--learner.groups-per-step",
            "2",
            "--sampling.temperature",
            "0.5",
        ]
    )
    assert engine_config(cfg).seed == 7
    kw = learner_kwargs(cfg)
    assert kw["temperature"] == 0.5 and kw["config"].groups_per_step == 2
    assert (
        kw["sample_budget"]
        == cfg.sampling.max_tokens * cfg.rollout.max_model_calls
        == cfg.sample_budget
    )
    assert (
        kw["context_len"] == cfg.engine.max_len
        and kw["default_staleness"] == cfg.rollout.max_staleness
    )
    with pytest.raises(ConfigError, match=r"engine\.seed.*--run\.seed"):
        parse_train_args(["--preset", "tiny", "--engine.seed", "3"])
    with pytest.raises(SystemExit):  # not a field any more
        parse_train_args(["--preset", "tiny", "--rollout.seed", "3"])


def test_cross_section_checks_name_flags():
    with pytest.raises(
        ConfigError, match=r"engine\.max_len: expected > sampling\.max_tokens.*--engine\.max-len"
    ):
        dataclasses.replace(preset("tiny"), sampling=SamplingParams(max_tokens=64))
    with pytest.raises(ConfigError, match=r"sampling\.temperature: expected > 0"):
        dataclasses.replace(preset("tiny"), sampling=SamplingParams(temperature=0.0, max_tokens=6))
    with pytest.raises(ConfigError, match=r"sampling\.n.*--rollout\.group-size"):
        dataclasses.replace(preset("tiny"), sampling=SamplingParams(n=4, max_tokens=6))
    with pytest.raises(ConfigError, match=r"TrainConfig\.engine: expected a EngineConfig"):
        dataclasses.replace(preset("tiny"), engine={"num_slots": 8})


def test_gymllm_sft_flags_are_sftconfig_fields(tmp_path, capsys):
    from gymllm.train.sft import SFTConfig

    flags = _help_flags(SFTConfig, prog=SFT_PROG, capsys=capsys)
    assert {
        "--run.compile-cache",
        "--run.keep-checkpoints",
        "--data",
        "--from-run",
        "--learner.num-steps",
        "--sft.epochs",
        "--model.name",
        "--optimizer.learning-rate",
        "--lora.rank",
        "--sharding.data",
    } <= flags
    data = tmp_path / "d.jsonl"
    cfg = parse_sft_args(
        [
            str(data),
            "--run.keep-checkpoints",
            "3",
            "--run.compile-cache",
            "off",
            "--learner.num-steps",
            "2",
        ]
    )
    assert (cfg.data, cfg.run.keep_checkpoints, cfg.run.compile_cache, cfg.learner.num_steps) == (
        str(data),
        3,
        "off",
        2,
    )
    assert cfg.model.name == "smollm2-135m-instruct" and cfg.optimizer.learning_rate == 2e-5
    assert parse_sft_args(["--from-run", "runs/x", "--min-reward", "0.5"]).from_run == "runs/x"
    with pytest.raises(
        SystemExit
    ) as e:  # the config's own check, reported by tyro as a usage error
        parse_sft_args(["--run.run-dir", str(tmp_path)])
    assert e.value.code == 2 and "exactly one of data" in " ".join(capsys.readouterr().err.split())


def test_check_fields_checks_each_field_and_names_it_in_the_fix():
    obj = types.SimpleNamespace(a=1, b=0, c=None)
    check_fields("X", obj, ("a", "c"), lo=1, integer=True, optional=True, fix="set {field}=1")
    with pytest.raises(
        ConfigError, match=r"^X\.b: expected an int >= 1, received 0\. Fix: set b=1 or more$"
    ):
        check_fields("X", obj, ("a", "b"), lo=1, integer=True, fix="set {field}=1 or more")


def test_one_order_check_serves_every_lower_and_upper_bound_pair():
    from gymllm.algos.learner_config import LearnerConfig
    from gymllm.rollout.concurrency import ConcurrencyConfig
    from gymllm.spaces import Text

    check_order("X", "lo", 2, "hi", 2)
    with pytest.raises(
        ConfigError, match=r"^X\.lo: expected <= hi \(2\), received 3\. Fix: lower lo or raise hi$"
    ):
        check_order("X", "lo", 3, "hi", 2)
    for build, field in (
        (lambda: LearnerConfig(max_len=64, min_bucket=128), "LearnerConfig.min_bucket"),
        (lambda: ConcurrencyConfig(min_limit=9, max_limit=4), "ConcurrencyConfig.min_limit"),
        (lambda: Text(min_length=5, max_length=2), "Text.min_length"),
    ):
        with pytest.raises(ConfigError, match=rf"^{re.escape(field)}: expected <= "):
            build()


def test_checks_say_expected_received_and_fix():
    with pytest.raises(
        ConfigError, match=r"^X\.n: expected an int >= 1, received 0\. Fix: choose n >= 1$"
    ):
        check_range("X", "n", 0, lo=1, integer=True)
    with pytest.raises(
        ConfigError, match=r"expected None or a number > 0, received -1\.0\. Fix: use 5"
    ):
        check_range("X", "t", -1.0, lo=0, lo_open=True, optional=True, fix="use 5")
    for bad in (math.nan, math.inf, True, "3", 1.5):
        with pytest.raises(ConfigError):
            check_range("X", "n", bad, lo=0, integer=bad == 1.5)
    check_range("X", "t", None, lo=0, optional=True)
    check_range("X", "p", 1.0, lo=0, hi=1, lo_open=True)
    with pytest.raises(
        ConfigError, match=r"X\.mode: expected one of \['a', 'b'\], received 'c'\. Fix"
    ):
        check_choice("X", "mode", "c", ("a", "b"))
    with pytest.raises(
        ConfigError, match=r"^X\.m: expected 'a', 'b' or 'c', received 'd'\. Fix: f$"
    ):
        require_one_of("d", ("a", "b", "c"), "X.m", fix="f")
    with pytest.raises(ValueError, match=r"^X\.m: expected 'a', received 'd'"):
        require_one_of("d", ("a",), "X.m", fix="f", error=ValueError)
    require_one_of("b", ("a", "b"), "X.m", fix="f")
    with pytest.raises(ConfigError, match=r"^w: expected e, received 1\. Fix: f$"):
        require(False, "w", expected="e", received=1, fix="f")
    for cls, kwargs, words in (
        (EngineConfig, {"decode_chunk": 0}, "EngineConfig.decode_chunk"),
        (RolloutConfig, {"group_timeout_s": math.inf}, "RolloutConfig.group_timeout_s"),
        (SamplingParams, {"top_k": -1}, "SamplingParams.top_k"),
    ):
        with pytest.raises(ConfigError, match=re.escape(words) + r".*expected.*received.*Fix"):
            cls(**kwargs)


def test_apply_overrides_merges_nested_tables_and_names_unknown_keys():
    cfg = apply_overrides(
        preset("tiny"),
        {
            "engine": {"max-len": 96},
            "eval": {"envs": ["a", "b"]},
            "optimizer": {"learning_rate": 1},
        },
    )
    assert (
        cfg.engine.max_len == 96
        and cfg.eval.envs == ("a", "b")
        and cfg.optimizer.learning_rate == 1.0
    )
    assert (
        isinstance(cfg.optimizer.learning_rate, float)
        and cfg.engine.num_slots == preset("tiny").engine.num_slots
    )
    with pytest.raises(
        ConfigError, match=r"config key 'engine\.slots': expected one of \[.*'num_slots'.*\]"
    ):
        apply_overrides(preset("tiny"), {"engine": {"slots": 8}})
    with pytest.raises(ConfigError, match=r"EngineConfig\.num_slots"):
        apply_overrides(preset("tiny"), {"engine": {"num_slots": 0}})


def test_tables_are_printed_with_rich_whole_off_a_terminal(capsys):
    long = "x" * 150
    print_table(
        [
            {"env": "gymllm/A-v0", "mean_reward": 0.12345, "result": long},
            {"env": "b", "mean_reward": 1},
        ],
        ["env", "mean_reward", "result"],
    )
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert any("env" in line and "mean_reward" in line for line in lines)
    assert any(
        "gymllm/A-v0" in line and "0.123" in line and long in line for line in lines
    )  # nothing wrapped or cut
    assert any(line.split()[:2] == ["b", "1"] for line in lines if line.strip())


def test_every_section_flag_the_docs_name_exists(capsys):
    """README.md, ARCHITECTURE.md and docs/ name ``--section.field`` flags of gymllm train and gymllm sft."""
    from gymllm.train.sft import SFTConfig

    known = (
        train_flags(preset("default"), capsys)
        | _help_flags(SFTConfig, capsys=capsys)
        | eval_flags(capsys)
    )
    top = ROOT.parent
    named = {}
    for page in [top / "README.md", top / "ARCHITECTURE.md", *sorted((top / "docs").rglob("*.md"))]:
        for flag in FLAG.findall(page.read_text()):
            flag = flag.rstrip(".-")
            if "." in flag and not flag.startswith(
                ("--env.kwargs.", "--section.")
            ):  # kwargs: the env's; a placeholder
                named.setdefault(flag, page.name)
    assert "--cluster.backend" in named and "--learner.num-steps" in named
    missing = {flag: page for flag, page in named.items() if flag not in known}
    assert not missing, f"flags the docs name that gymllm train/sft/eval lack: {missing}"
