"""The suite runner end to end on the tiny random model (CPU): several policies and an oracle over envs
that succeed, fail and come from a user's module; rows, summary, report and plots; the rows match the
evaluation path of `gymllm eval`; a torn last line and a kill -9 at a row count observed in
results.jsonl, then --resume: every (policy, env, seed, sample) exactly once."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from gymllm import models
from gymllm.suites.results import ResultsFile, row_key
from gymllm.suites.runner import PolicySpec, RunnerConfig, run_suite, work_items
from gymllm.suites.spec import load_suite

USER_MODULE = """
import gymnasium
from gymllm.core import TextEnv


class UserWord(TextEnv):
    def __init__(self, word="a", max_turns=None, render_mode=None):
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        self.word = word

    def _reset(self, *, seed, options):
        return f"Write the letter {self.word}.", {"answer": self.word}

    def _step(self, action):
        return "done", float(self.word in action), True, {}


gymnasium.register(id="UserWordRun-v0", entry_point=__name__ + ":UserWord")
"""

CONFIG = RunnerConfig(
    max_concurrency_per_env=4,
    num_slots=8,
    max_len=256,
    episode_timeout_s=120,
    progress=False,
    num_resamples=300,
)


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("user_mod")
    (d / "suite_user_envs.py").write_text(USER_MODULE)
    sys.path.insert(0, str(d))
    yield d
    sys.path.remove(str(d))


@pytest.fixture(scope="module")
def suite_file(tmp_path_factory, user_dir):
    path = tmp_path_factory.mktemp("suite") / "mixed.toml"
    path.write_text(
        textwrap.dedent("""
        name = "mixed"
        k = 2
        num_seeds = 2
        seed_base = 1_000_000
        max_tokens = 6
        max_turns = 1
        temperature = 1.0

        [[env]]
        id = "gymllm/TinyRepeat-v0"
        name = "repeat"
        kwargs = { num_letters = 2 }
        num_seeds = 3
        k = 3

        [[env]]
        id = "suite_user_envs:UserWordRun-v0"
        name = "user"

        [[env]]
        id = "gymllm/Failing-v0"
        name = "failing"
        kwargs = { fail_at_step = 1 }

        [[env]]
        id = "gymllm/Arithmetic-v0"
        name = "arithmetic"
        weight = 2.0
    """)
    )
    return path


@pytest.fixture(scope="module")
def loaded():
    return models.make_tiny("qwen3"), models.make_tiny("qwen3", seed=1)


@pytest.fixture(scope="module")
def run(tmp_path_factory, suite_file, loaded):
    out = tmp_path_factory.mktemp("run")
    suite = load_suite(suite_file)
    policies = [
        PolicySpec(label="a", loaded=loaded[0]),
        PolicySpec(label="b", loaded=loaded[1]),
        PolicySpec(label="oracle", oracle=True),
    ]
    summary = run_suite(suite, policies, out, config=CONFIG)
    return out, suite, summary


def expected_keys(suite, labels, oracle_envs=("arithmetic",)):
    keys = set()
    for label in labels:
        for e in suite.envs:
            if label == "oracle" and e.name not in oracle_envs:
                continue
            keys |= {(label, e.name, seed, m) for _, seed, m in work_items(e)}
    return keys


def test_every_row_once_with_its_fields(run):
    out, suite, _ = run
    rows = ResultsFile(out / "results.jsonl").read()
    keys = [row_key(r) for r in rows]
    assert len(keys) == len(set(keys)) and set(keys) == expected_keys(suite, ("a", "b", "oracle"))
    assert len(rows) == 2 * (9 + 4 + 4 + 4) + 4
    for r in rows:
        assert set(r) == {
            "policy",
            "env",
            "seed",
            "sample",
            "reward",
            "success",
            "turns",
            "tokens",
            "error",
        }
        if r["env"] == "failing":
            assert r["error"] and "deliberate failure" in r["error"] and r["success"] is False
        else:
            assert r["error"] is None, r
        if r["policy"] != "oracle" and r["env"] != "failing":
            assert r["turns"] == 1 and 1 <= r["tokens"] <= 6 and 0.0 <= r["reward"] <= 1.0
        assert r["success"] == (r["error"] is None and r["reward"] >= 1.0)


def test_summary_entries_comparisons_and_the_oracle(run):
    out, suite, summary = run
    assert json.loads((out / "summary.json").read_text()) == json.loads(json.dumps(summary))
    assert summary["suite"] == "mixed" and summary["policies"] == ["a", "b", "oracle"]
    by = {(r["policy"], r["env"]): r for r in summary["results"]}
    for p in ("a", "b"):
        assert {e for q, e in by if q == p} == {"repeat", "user", "failing", "arithmetic", "*"}
        assert by[(p, "repeat")]["k"] == 3 and set(by[(p, "repeat")]["pass_at"]) == {"1", "2", "3"}
        assert by[(p, "failing")]["errors"] == 4 and by[(p, "failing")]["pass_at"]["1"] == 0.0
        assert by[(p, "*")]["errors"] == 4 and by[(p, "*")]["k"] == 2
    assert by[("oracle", "arithmetic")]["pass_at"] == {
        "1": 1.0,
        "2": 1.0,
    }  # the env and its scorer agree
    assert by[("oracle", "arithmetic")]["mean_reward_ci"] == [1.0, 1.0]
    assert any("no demo solver" in n and "repeat" in n for n in summary["notes"])
    pairs = {(c["a"], c["b"], c["env"], c["metric"]) for c in summary["comparisons"]}
    for env in ("repeat", "user", "failing", "arithmetic", "*"):
        for metric in ("mean_reward", "pass@1"):
            assert ("a", "b", env, metric) in pairs
    assert ("a", "oracle", "arithmetic", "pass@1") in pairs and (
        "a",
        "oracle",
        "repeat",
        "pass@1",
    ) not in pairs
    c = next(
        c
        for c in summary["comparisons"]
        if (c["a"], c["b"], c["env"], c["metric"]) == ("a", "oracle", "*", "pass@1")
    )
    assert c["diff"] == pytest.approx(-1.0) and c["p_value"] < 0.01


def test_report_and_plots(run):
    out, _, _ = run
    md = (out / "report.md").read_text()
    assert (
        "# Suite `mixed`" in md
        and "| repeat |" in md
        and "Paired comparisons" in md
        and "oracle" in md
    )
    for png in ("rewards.png", "pass_at_k.png"):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    suite = json.loads((out / "suite.json").read_text())
    assert [e["name"] for e in suite["envs"]] == ["repeat", "user", "failing", "arithmetic"]


def test_rows_match_the_evaluation_path_of_gymllm_eval(run, loaded):
    """Same env seeds and sampling seeds as `gymllm eval` (evaluate_env through the orchestrator):
    the same mean reward and pass@1 on the same engine settings."""
    import asyncio

    from gymllm.cli.evaluate import eval_env
    from gymllm.inference.params import SamplingParams
    from gymllm.rollout.evaluation import EvalConfig

    out, suite, summary = run
    e = suite.env("repeat")
    config = EvalConfig(
        seeds=len(e.seeds),
        k=e.k,
        seed_base=e.seed_base,
        max_turns=e.max_turns,
        success_threshold=e.success_threshold,
        sampling=SamplingParams(temperature=e.temperature, max_tokens=e.max_tokens),
    )
    row = asyncio.run(
        eval_env(e.id, loaded[0], config=config, env_kwargs=e.kwargs, max_len=CONFIG.max_len)
    )
    ours = [
        r
        for r in ResultsFile(out / "results.jsonl").read()
        if r["policy"] == "a" and r["env"] == "repeat"
    ]
    assert row["seeds"] == list(e.seeds)
    assert np.mean([r["reward"] for r in ours]) == pytest.approx(row["mean_reward"], abs=1e-9)
    assert np.mean([r["success"] for r in ours]) == pytest.approx(row["pass@1"])


def test_resume_repairs_a_torn_line_and_fills_in_the_missing_rows(run, tmp_path, loaded):
    out, suite, _ = run
    lines = (out / "results.jsonl").read_bytes().splitlines(keepends=True)
    keep = [
        ln for ln in lines if json.loads(ln)["policy"] != "b" or json.loads(ln)["env"] != "repeat"
    ]
    dropped = len(lines) - len(keep)
    assert dropped == 9
    (tmp_path / "results.jsonl").write_bytes(
        b"".join(keep) + b'{"policy": "b", "env": "rep'
    )  # torn by a kill
    (tmp_path / "suite.json").write_bytes((out / "suite.json").read_bytes())
    policies = [
        PolicySpec(label="a", loaded=loaded[0]),
        PolicySpec(label="b", loaded=loaded[1]),
        PolicySpec(label="oracle", oracle=True),
    ]
    with pytest.raises(Exception, match="--resume"):
        run_suite(suite, policies, tmp_path, config=CONFIG)
    summary = run_suite(suite, policies, tmp_path, config=CONFIG, resume=True)
    keys = [row_key(r) for r in ResultsFile(tmp_path / "results.jsonl").read()]
    assert len(keys) == len(set(keys)) and set(keys) == expected_keys(suite, ("a", "b", "oracle"))
    assert any("torn" in n for n in summary["notes"])
    assert (tmp_path / "results.jsonl").read_bytes().endswith(b"\n")


def test_resume_refuses_a_different_suite(run, tmp_path):
    out, suite, _ = run
    (tmp_path / "suite.json").write_bytes((out / "suite.json").read_bytes())
    (tmp_path / "results.jsonl").write_bytes((out / "results.jsonl").read_bytes())
    other = load_suite(suite.source, overrides={"num_seeds": 5})
    with pytest.raises(Exception, match="same suite file"):
        run_suite(
            other, [PolicySpec(label="oracle", oracle=True)], tmp_path, config=CONFIG, resume=True
        )


def _cli(args, env, **kw):
    return subprocess.Popen(
        [sys.executable, "-m", "gymllm.cli.suite_cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **kw,
    )


@pytest.mark.slow  # a drill: kills a process or a node
def test_kill_9_then_resume_gives_every_row_exactly_once(tmp_path, user_dir):
    """A run of the command line is killed (SIGKILL) once results.jsonl holds 3 rows, a torn line is
    appended as a kill mid-write would leave it, and `--resume` completes the run."""
    suite = tmp_path / "slow.toml"
    suite.write_text(
        textwrap.dedent("""
        name = "slow"
        k = 2
        num_seeds = 4
        max_tokens = 4
        max_turns = 1
        [[env]]
        id = "gymllm/TinyRepeat-v0"
        name = "slow_a"
        kwargs = { latency_median_s = 0.4, latency_p99_s = 0.6 }
        [[env]]
        id = "suite_user_envs:UserWordRun-v0"
        name = "user"
    """)
    )
    out = tmp_path / "out"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(user_dir), os.environ.get("PYTHONPATH", "")]),
    }
    args = [
        "eval",
        "--eval.suite",
        str(suite),
        "--model.name",
        "tiny-qwen3",
        "--model.label",
        "tiny",
        "--out",
        str(out),
        "--max-concurrency-per-env",
        "1",
        "--engine.num-slots",
        "4",
        "--engine.max-len",
        "256",
        "--no-progress",
    ]
    proc = _cli(args, env)
    results = out / "results.jsonl"
    deadline = time.monotonic() + 500
    rows = 0
    while time.monotonic() < deadline and proc.poll() is None:
        rows = results.read_bytes().count(b"\n") if results.exists() else 0
        if rows >= 3:
            break
        time.sleep(0.01)
    assert proc.poll() is None, f"the run ended before the kill: {proc.communicate()[0][-2000:]}"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    at_kill = results.read_bytes().count(b"\n")
    assert 3 <= at_kill < 16, (
        at_kill
    )  # killed mid-run: the slow env's 8 rows take >= 8 x 0.4 s one at a time
    with results.open("ab") as f:
        f.write(b'{"policy": "tiny", "env": "slow_a", "seed": 10')
    done = _cli([*args, "--resume"], env)
    output = done.communicate(timeout=600)[0]
    assert done.returncode == 0, output[-3000:]
    keys = [row_key(r) for r in ResultsFile(results).read()]
    expected = {
        ("tiny", e, s, m)
        for e in ("slow_a", "user")
        for s in range(1_000_000, 1_000_004)
        for m in range(2)
    }
    assert len(keys) == len(set(keys)) == 16 and set(keys) == expected
    assert "tiny" in output and "torn" in output
    summary = json.loads((out / "summary.json").read_text())
    assert {(r["policy"], r["env"]) for r in summary["results"]} == {
        ("tiny", "slow_a"),
        ("tiny", "user"),
        ("tiny", "*"),
    }


def test_cli_errors_are_one_line(tmp_path):
    proc = _cli(
        ["eval", "--eval.suite", "cor", "--model.name", "tiny-qwen3", "--out", str(tmp_path / "o")],
        dict(os.environ),
    )
    text = proc.communicate(timeout=120)[0]
    assert proc.returncode == 2 and "error: SuiteError" in text and "did you mean core" in text
    proc = _cli(["compare", str(tmp_path)], dict(os.environ))
    text = proc.communicate(timeout=120)[0]
    assert proc.returncode == 2 and "results.jsonl and suite.json" in text


def test_compare_pools_directories(run, tmp_path, capsys):
    from gymllm.cli.suite_cli import compare

    out, _, _ = run
    assert compare((str(out),), out=str(tmp_path / "cmp.json")) == 0
    text = capsys.readouterr().out
    assert "| a | b | * | mean_reward |" in text
    cmp = json.loads((tmp_path / "cmp.json").read_text())
    ran = json.loads((out / "summary.json").read_text())[
        "comparisons"
    ]  # its intervals: fewer resamples

    def strip(cs):
        return [
            (c["a"], c["b"], c["env"], c["metric"], c["pairs"], round(c["diff"], 12)) for c in cs
        ]

    assert strip(cmp["comparisons"]) == strip(ran)
    # the same labels in two directories are told apart by the directory's name
    twin = tmp_path / "twin"
    twin.mkdir()
    for f in ("results.jsonl", "suite.json"):
        (twin / f).write_bytes((out / f).read_bytes())
    assert compare((str(out), str(twin))) == 0
    text = capsys.readouterr().out
    assert f"| {out.name}/a | twin/a | * | mean_reward | +0.000 |" in text


def test_a_user_env_named_on_the_command_line(tmp_path, user_dir, capsys):
    """`gymllm eval suite --eval.envs suite_user_envs:UserWordRun-v0 ...`: the module is imported, its gymnasium.register
    call runs, and its env is a one-off suite (the engine settings of the fixture's run: compiled already)."""
    from gymllm.cli.eval_args import eval_main
    from gymllm.cli.suite_cli import policy_label

    out = tmp_path / "one_off"
    assert (
        eval_main(
            [
                "suite",
                "--eval.envs",
                "suite_user_envs:UserWordRun-v0",
                "--model.name",
                "tiny-qwen3",
                "--out",
                str(out),
                "--eval.seeds",
                "2",
                "--eval.k",
                "2",
                "--sampling.max-tokens",
                "4",
                "--eval.max-turns",
                "1",
                "--engine.num-slots",
                "8",
                "--engine.max-len",
                "256",
                "--max-concurrency-per-env",
                "4",
                "--no-progress",
                "--oracle",
            ]
        )
        == 0
    )
    rows = ResultsFile(out / "results.jsonl").read()
    assert {(r["policy"], r["env"]) for r in rows} == {
        ("tiny-qwen3", "suite_user_envs:UserWordRun-v0")
    }
    assert len(rows) == 4 and all(r["error"] is None for r in rows)
    summary = json.loads((out / "summary.json").read_text())
    assert any("no demo solver" in n for n in summary["notes"])
    assert "tiny-qwen3" in capsys.readouterr().out
    assert policy_label(checkpoint=str(tmp_path / "runs" / "exp1")) == "exp1"
    assert policy_label(checkpoint=str(tmp_path / "runs" / "exp1" / "checkpoints")) == "exp1"
    assert policy_label(model="smollm2-135m-instruct") == "smollm2-135m-instruct"


def test_a_row_counts_more_sampled_tokens_than_an_int8_holds(tmp_path, suite_file, loaded):
    """A reply of more than 127 tokens is counted whole (the loss mask is int8: summing its elements one
    by one in Python wrapped past 127, and the chip's long random-weight replies reported wrong counts)."""
    suite = load_suite(suite_file, overrides={"num_seeds": 1, "k": 1, "max_tokens": 200})
    suite = dataclasses.replace(suite, envs=[e for e in suite.envs if e.name == "repeat"])
    run_suite(suite, [PolicySpec(label="a", loaded=loaded[0])], tmp_path / "out", config=CONFIG)
    (row,) = ResultsFile(tmp_path / "out" / "results.jsonl").read()
    assert row["error"] is None, row
    assert 128 <= row["tokens"] <= 200, row
