"""benchmarks/engine_settings.py: the ``--engine FIELD=VALUE`` parser the benchmarks share."""

from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))

import engine_settings  # noqa: E402


@pytest.mark.parametrize(
    "text, want",
    [
        ("share_prompt_prefill=false", ("share_prompt_prefill", False)),  # JSON's spelling
        ("share_prompt_prefill=False", ("share_prompt_prefill", False)),  # Python's
        ("prefill_tokens=1024", ("prefill_tokens", 1024)),
        ("kv_write=chunk", ("kv_write", "chunk")),
        ("decode_lengths=[1, 2]", ("decode_lengths", [1, 2])),
    ],
)
def test_values_are_read_as_json_then_python_then_text(text, want):
    assert engine_settings.parse(text) == want


def test_an_unknown_or_reserved_field_names_the_fields_and_the_flag():
    with pytest.raises(SystemExit, match="--gymllm-engine: expected FIELD=VALUE .*kv_write"):
        engine_settings.parse("kv_writes=chunk", "--gymllm-engine")
    with pytest.raises(SystemExit, match="max_len have flags of their own"):
        engine_settings.parse("max_len=64", reserved=("max_len",))
    with pytest.raises(SystemExit, match="received 'kv_write'"):
        engine_settings.parse("kv_write")
