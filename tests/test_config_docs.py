"""Every setting explains itself: each dataclass field reachable from ``TrainConfig`` (``gymllm train``)
and ``SFTConfig`` (``gymllm sft``) has its own docstring, the text tyro prints under its flag in
``--help`` (an attribute docstring under the field, or an inline comment)."""

from __future__ import annotations

import dataclasses
import typing

from tyro._docstrings import get_field_docstring

from gymllm.train.sft import SFTConfig
from gymllm.train.train_config import TrainConfig


def reachable(root: type) -> list[type]:
    """``root`` and every dataclass its fields hold, nested (each once)."""
    out, todo = [], [root]
    while todo:
        cls = todo.pop()
        if cls in out:
            continue
        out.append(cls)
        hints = typing.get_type_hints(cls)
        todo += [
            hints[f.name]
            for f in dataclasses.fields(cls)
            if dataclasses.is_dataclass(hints[f.name])
        ]
    return out


def test_every_field_of_the_train_and_sft_configs_has_a_docstring():
    classes = {c for root in (TrainConfig, SFTConfig) for c in reachable(root)}
    assert len(classes) > 15  # the walk reaches the nested sections (engine, loss.advantage, ...)
    missing = [
        f"{c.__module__}.{c.__qualname__}.{f.name}"
        for c in sorted(classes, key=lambda c: c.__qualname__)
        for f in dataclasses.fields(c)
        if not (get_field_docstring(c, f.name, ()) or "").strip()
    ]
    assert not missing, f"fields without a docstring (write one under each): {missing}"


def test_the_help_of_a_flag_is_its_docstring(capsys):
    import pytest

    from gymllm.cli.train_args import parse_train_args

    with pytest.raises(SystemExit):
        parse_train_args(["--help"])
    out = " ".join(capsys.readouterr().out.split()).lower()
    assert "trajectories per group, all with the group's env seed" in out  # --rollout.group-size
    assert "steps between checkpoints (0 = only at the end)" in out  # --run.checkpoint-every
