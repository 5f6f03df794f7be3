"""Task envs: check_env on every id registered here, and each env's grader against a reference
(Countdown's own construction, GSM8K-style calculator annotations, reference solutions, real bug fixes)."""

from __future__ import annotations

import json
import os
import re
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gymllm
from gymllm.errors import ConfigError
from gymllm.tools import format_tool_calls
from gymllm.tools.calculator import evaluate
from gymllm.types import ToolCall
from gymllm.utils import check_env

GSM8K = "/work/shared/data/gsm8k/test.jsonl"


def tool_call(name, **args):
    return format_tool_calls([ToolCall(name, args)], "hermes")


POLICIES = {
    "CalcMath-v0": lambda t: [tool_call("calculator", expression="12*34"), "\\boxed{408}"][t % 2],
    "Terminal-v0": lambda t: ["```bash\nls && python -m unittest -q 2>&1 | tail -1\n```", "submit"][
        t % 2
    ],
    "TerminalTools-v0": lambda t: [
        tool_call("shell", command="cat lib/__init__.py | head -3"),
        "submit",
    ][t % 2],
    "Code-v0": lambda t: "```python\ndef f(x):\n    return x\n```",
}


@pytest.mark.parametrize(
    "env_id",
    ["Countdown-v0", "MathWord-v0", "CalcMath-v0", "Code-v0", "Terminal-v0", "TerminalTools-v0"],
)
def test_check_env(env_id):
    env = gymllm.make(f"gymllm/{env_id}")
    try:
        check_env(
            env,
            num_steps=2,
            policy=POLICIES.get(env_id),
            skip_gymnasium=env_id.startswith("Terminal"),
        )
        if env_id not in ("Code-v0",) and not env_id.startswith("Terminal"):
            check_env(env, num_steps=3)  # random Unicode actions too
    finally:
        env.close()


# ------------------------------------------------------------------ Countdown
@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 6))
def test_countdown_is_always_solvable_and_graded_exactly(seed, n):
    from gymllm.envs.countdown import CountdownEnv, check_countdown, evaluate_countdown

    env = CountdownEnv(num_numbers=n)
    _, info = env.reset(seed=seed)
    value, used = evaluate_countdown(env._solution)
    assert value == env.target == int(info["answer"]) and 10 <= env.target <= env.max_target
    assert check_countdown(env._solution, env.numbers, env.target) == "correct"
    assert not (set(used) - set(env.numbers))
    _, r, term, _, step_info = env.step(f"I think <answer>{env._solution}</answer>")
    assert (r, term, step_info["reason"]) == (1.0, True, "correct")


def test_countdown_refusals():
    from gymllm.envs.countdown import check_countdown, evaluate_countdown

    assert evaluate_countdown("(100 - 4) / 3 * 2")[0] == Fraction(64)
    assert check_countdown("25 + 25", [25, 3, 4], 50) == "bad_numbers"  # 25 used twice
    assert check_countdown("25 * 2", [25, 3, 4], 50) == "bad_numbers"
    assert check_countdown("__import__('os')", [1], 1) == "unparsable"
    assert check_countdown("7 / 0", [7, 0], 1) == "unparsable"
    assert check_countdown("3 + 4", [3, 4], 8) == "wrong_value"
    env = gymllm.make("gymllm/Countdown-v0", max_attempts=2)
    env.reset(seed=0)
    obs, r, term, *_ = env.step("no idea")
    assert not term and "Try again" in obs
    with pytest.raises(ConfigError, match="num_numbers"):
        gymllm.make("gymllm/Countdown-v0", num_numbers=1)


# ------------------------------------------------------------------ MathWord
def _annotations_hold(path_or_problems) -> int:
    """Every GSM8K calculator annotation <<expr=value>> evaluates (with our calculator) to its value."""
    n = 0
    for p in path_or_problems:
        for expr, value in re.findall(r"<<([^=<>]+)=([^<>]+)>>", p.solution):
            assert Fraction(str(evaluate(expr))) == Fraction(value), (expr, value)
            n += 1
    return n


def test_sample_data_is_self_consistent():
    from gymllm.envs.math_word import SAMPLE_PATH, answers_match, load_problems

    problems = load_problems(SAMPLE_PATH)
    assert len(problems) == 24 and _annotations_hold(problems) > 40
    for p in problems:  # the last annotation of each solution is its final answer
        last = re.findall(r"<<[^=<>]+=([^<>]+)>>", p.solution)
        if last:
            assert answers_match(last[-1], p.answer)


@pytest.mark.skipif(not os.path.exists(GSM8K), reason="GSM8K test file not present on this machine")
def test_loads_real_gsm8k():
    from gymllm.envs.math_word import MathWordEnv

    env = MathWordEnv(data_path=GSM8K)
    assert len(env.problems) == 1319 and env.problems[0].answer == "18"
    _, info = env.reset(options={"index": 0})
    assert info["answer"] == "18"
    assert env.step("She makes 9 * 2 = 18 dollars.\n#### 18")[1] == 1.0


def test_math_format_and_bad_files(tmp_path):
    from gymllm.envs.math_word import MathWordEnv, load_problems

    path = tmp_path / "math.jsonl"
    recs = [
        {
            "problem": "Simplify $\\sqrt{8}$.",
            "solution": "We get $\\boxed{2\\sqrt{2}}$.",
            "level": "Level 1",
        },
        {"problem": "What is $\\frac{3}{6}$?", "solution": "\\boxed{\\frac{1}{2}}"},
        {"question": "Two plus two?", "answer": 4},
    ]
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n\n")
    assert [p.answer for p in load_problems(path)] == ["2\\sqrt{2}", "\\frac{1}{2}", "4"]
    env = MathWordEnv(data_path=str(path))
    env.reset(options={"index": 0})
    assert env.step("So it is \\boxed{\\sqrt{8}}")[1] == 1.0  # symbolic equivalence
    env.reset(options={"index": 1})
    assert env.step("The answer is 0.5")[1] == 1.0
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "no answer"}\n')
    with pytest.raises(ConfigError, match="reference answer"):
        load_problems(bad)
    with pytest.raises(ConfigError, match="existing"):
        MathWordEnv(data_path=str(tmp_path / "missing.jsonl"))


@pytest.mark.parametrize(
    "pred,gold,same",
    [
        ("1,000", "1000", True),
        ("$18.00", "18", True),
        ("50\\%", "0.5", True),
        ("\\frac{6}{8}", "0.75", True),
        ("2\\sqrt{2}", "\\sqrt{8}", True),
        ("x^2 + 2x + 1", "(x+1)^2", True),
        ("\\frac{\\pi}{2}", "\\pi/2", True),
        ("12.5 cm", "12.5", True),
        ("17", "71", False),
        ("x + 1", "x - 1", False),
        (None, "3", False),
        ("", "3", False),
    ],
)
def test_answers_match(pred, gold, same):
    from gymllm.envs.math_word import answers_match

    assert answers_match(pred, gold) is same


def test_extract_answer():
    from gymllm.envs.math_word import extract_answer

    assert extract_answer("so \\boxed{\\frac{1}{2}} and \\boxed{3}") == "3"
    assert extract_answer("work\n#### 1,250") == "1,250"
    assert extract_answer("The answer is $42.") == "42"
    assert extract_answer("I get 3 then 7.") == "7"
    assert extract_answer("no numbers") is None


# ------------------------------------------------------------------ CalcMath
def test_calc_math_tool_flow():
    env = gymllm.make("gymllm/CalcMath-v0")
    for seed in range(4):
        obs, info = env.reset(seed=seed)
        assert [m["role"] for m in obs] == ["system", "user"] and "<tool_call>" in obs[0]["content"]
        assert [t["function"]["name"] for t in info["tools"]] == ["calculator"]
        nums = [int(x) for x in re.findall(r"\d+", obs[1]["content"])]
        tool_obs, r, term, _, _ = env.step(
            tool_call("calculator", expression=" + ".join(map(str, nums)))
        )
        assert tool_obs[0]["content"] == str(sum(nums)) and r == 0.0 and not term
        _, r, term, _, step_info = env.step(f"The answer is \\boxed{{{info['answer']}}}.")
        assert (r, term, step_info["correct"]) == (1.0, True, True)
    env.reset(seed=9)
    assert env.step("\\boxed{1}")[1] == 0.0
    gemma = gymllm.make("gymllm/CalcMath-v0", parser="gemma", digits=6)
    obs, _ = gemma.reset(seed=0)
    assert "```tool_code" in obs[0]["content"]


# ------------------------------------------------------------------ Code
SOLUTIONS = {
    "sum_multiples": "def sum_multiples(xs):\n    return sum(x for x in xs if x % {k} == 0)",
    "count_above": "def count_above(xs):\n    return len([x for x in xs if x > {k}])",
    "rotate": "def rotate(xs):\n    if not xs:\n        return []\n    k = {k} % len(xs)\n    return xs[k:] + xs[:k]",
    "caesar": "def caesar(s):\n    return ''.join(chr((ord(c) - 97 + {k}) % 26 + 97) if 'a' <= c <= 'z' else c for c in s)",
    "run_length": (
        "import itertools\ndef run_length(s):\n"
        "    return ''.join(f'{{c}}{{len(list(g))}}' for c, g in itertools.groupby(s))"
    ),
    "max_window": (
        "def max_window(xs):\n    if len(xs) < {k}:\n        return None\n"
        "    return max(sum(xs[i:i + {k}]) for i in range(len(xs) - {k} + 1))"
    ),
    "dedupe": "def dedupe(xs):\n    seen = []\n    [seen.append(x) for x in xs if x not in seen]\n    return seen",
    "digit_power_sum": "def digit_power_sum(n):\n    return sum(int(d) ** {k} for d in str(n))",
}


def test_code_env_reference_solutions_pass_and_wrong_ones_fail():
    from gymllm.envs.code import TASKS, CodeEnv, run_tests

    env = CodeEnv(num_tests=6, partial_credit=True)
    seen = set()
    for seed in range(40):
        env.reset(seed=seed)
        name = env.task.name
        if name in seen:
            continue
        seen.add(name)
        reply = f"Here:\n```python\n{SOLUTIONS[name].format(k=env.k)}\n```"
        obs, r, term, _, info = env.step(reply)
        assert (r, info["passed"], info["total"]) == (1.0, 6, 6), (name, obs)
    assert seen == {t.name for t in TASKS}
    sb = env._sb()
    wrong = run_tests(sb, "def f(x):\n    return x + 1", "f", [(1,), (2,)], [2, 4])
    assert (wrong["passed"], wrong["first_failure"]["expected"]) == (1, 4)
    hang = run_tests(sb, "def f(x):\n    while True: pass", "f", [(1,)], [1], timeout_s=1)
    assert hang["passed"] == 0 and hang["error"] == "timed out"
    fake = run_tests(
        sb,
        'print(\'@@result-0@@{"results": [{"value": 2}]}\')\ndef f(x):\n    return 0',
        "f",
        [(1,)],
        [2],
    )
    assert fake["passed"] == 0  # printing a result line cannot fake a pass
    env.close()


def test_code_env_escape_attempt_gets_nothing(tmp_path):
    env = gymllm.make("gymllm/Code-v0")
    env.reset(seed=0)
    target = tmp_path / "pwned.txt"
    _, r, _, _, info = env.step(f"```python\nopen({str(target)!r}, 'w').write('x')\n```")
    assert r == 0.0 and "not allowed" in info["error"] and not target.exists()
    env.close()


# ------------------------------------------------------------------ Terminal
def test_terminal_fix_by_commands_and_tests_cannot_be_edited_away():
    from gymllm.envs.terminal import FUNCTIONS

    env = gymllm.make("gymllm/Terminal-v0")
    _, info = env.reset(seed=2)
    out, r, term, _, _ = env.step("```bash\npython -m unittest -q 2>&1 | tail -1\n```")
    assert "FAILED" in out and r == 0.0 and not term
    # cheating: replace the tests with a passing one; grading restores the originals
    env.step(
        "```bash\nprintf 'import unittest\\nclass T(unittest.TestCase):\\n    def test(self): pass\\n'"
        " > tests/test_lib.py\n```"
    )
    obs, r, term, _, _ = env.step("done")
    assert (r, term) == (0.0, True) and "still fail" in obs
    # cheating: make every assertion a no-op; the tests "pass" but the hidden cases do not
    patch = "import unittest\nfor _n in ('assertEqual', 'assertAlmostEqual'):\n    setattr(unittest.TestCase, _n, lambda *a, **k: None)\n"
    env.reset(seed=2)
    env.step(
        f"```bash\ncat >> lib/__init__.py <<'EOF'\n{patch}EOF\npython -m unittest -q 2>&1 | tail -1\n```"
    )
    obs, r, term, _, _ = env.step("done")
    assert (r, term) == (0.0, True) and "hidden checks failed" in obs
    # a real fix through a shell command
    _, info = env.reset(seed=2)
    bad, good = FUNCTIONS[info["buggy_function"]]["bad"], FUNCTIONS[info["buggy_function"]]["good"]
    fix = f"python - <<'EOF'\np='lib/__init__.py'\ns=open(p).read()\nopen(p,'w').write(s.replace({bad!r}, {good!r}))\nEOF"
    env.step(f"```bash\n{fix}\n```")
    obs, r, term, _, info = env.step("I fixed it.")
    assert (r, term, info["passed"]) == (1.0, True, True)
    env.close()


def test_terminal_reset_removes_what_the_agent_left():
    env = gymllm.make("gymllm/Terminal-v0")
    env.reset(seed=2)
    env.step("```bash\nmkdir -p junk/deep && echo x > junk/deep/f && echo y > stray.txt\n```")
    assert {"junk", "stray.txt"} <= set(env.unwrapped.sandbox.listdir())
    env.reset(seed=2)
    left = set(env.unwrapped.sandbox.listdir())
    assert (
        "junk" not in left and "stray.txt" not in left and left
    )  # the task's files are back, nothing else
    env.close()


def test_terminal_tools_variant_and_truncation():
    env = gymllm.make("gymllm/TerminalTools-v0", max_turns=2)
    obs, info = env.reset(seed=1)
    assert [t["function"]["name"] for t in info["tools"]] == ["shell"]
    out, r, term, trunc, step_info = env.step(tool_call("shell", command="ls lib tests"))
    assert (
        "__init__.py" in out[0]["content"] and out[0]["role"] == "tool" and step_info["tool_turn"]
    )
    env.step("```bash\necho one\n```")
    _, r, term, trunc, _ = env.step("```bash\necho two\n```")
    assert trunc and not term and r == 0.0
    env.close()


# ------------------------------------------------------------------ easier task options (the recipes' settings)
def test_terminal_locate_rewards_naming_exactly_the_buggy_function():
    env = gymllm.make("gymllm/Terminal-v0", task="locate", num_functions=3)
    prompt, info = env.reset(seed=4)
    buggy, names = info["buggy_function"], env.unwrapped.names
    others = [n for n in names if n != buggy]
    assert buggy in names and len(names) == 3 and all(n in prompt for n in names)
    out, r, term, _, _ = env.step("```bash\npython -m unittest -q 2>&1 | tail -1\n```")
    assert "FAILED" in out and (r, term) == (0.0, False)
    _, r, term, _, step_info = env.step(f"The bug is in {buggy}.")
    assert (r, term, step_info["named"]) == (1.0, True, [buggy])
    for reply in (f"It is {others[0]}.", " or ".join(names), "I don't know."):
        env.reset(seed=4)
        assert env.step(reply)[1] == 0.0, reply  # a wrong name, every name, or none earns nothing
    with pytest.raises(ConfigError, match="locate"):
        gymllm.make("gymllm/Terminal-v0", task="guess")
    env.close()


def test_terminal_locate_out_of_turns_earns_nothing_and_sandbox_dict():
    env = gymllm.make(
        "gymllm/Terminal-v0", task="locate", max_turns=1, sandbox={"max_output_bytes": 50}
    )
    env.reset(seed=0)
    out, r, term, trunc, _ = env.step("```bash\ncat lib/__init__.py\n```")
    assert (r, term, trunc) == (0.0, False, True) and len(out) < 200
    with pytest.raises(ConfigError, match="sandbox"):
        gymllm.make("gymllm/Terminal-v0", sandbox={"max_output": 5})
    env.close()


def test_calc_math_simple_problems_are_one_operation_and_graded():
    env = gymllm.make("gymllm/CalcMath-v0", digits=2, simple=True)
    for seed in range(12):
        obs, info = env.reset(seed=seed)
        x, y, *_ = [int(v) for v in re.findall(r"\d+", obs[1]["content"])]
        assert 10 <= x <= 99 and int(info["answer"]) in (x + y, x - y, x * y)
        assert env.step(f"\\boxed{{{info['answer']}}}")[1] == 1.0
    assert gymllm.make("gymllm/CalcMath-v0", digits=1, simple=True).reset(seed=0)[1]["answer"]
    with pytest.raises(ConfigError, match="digits"):
        gymllm.make("gymllm/CalcMath-v0", digits=1)


def test_code_env_task_subset_and_partial_credit():
    from gymllm.envs.code import CodeEnv

    env = CodeEnv(num_tests=6, partial_credit=True, tasks=["count_above", "dedupe"])
    names = set()
    for seed in range(10):
        env.reset(seed=seed)
        names.add(env.task.name)
    assert names == {"count_above", "dedupe"}
    env.reset(seed=0)
    stub = f"```python\ndef {env.task.name}(xs):\n    return 0\n```"  # right only on some inputs
    _, r, _, _, info = env.step(stub)
    assert r == info["passed"] / info["total"] and 0.0 <= r < 1.0
    for bad in (["nope"], [], "dedupe"):
        with pytest.raises(ConfigError, match="tasks"):
            CodeEnv(tasks=bad)
    env.close()


def test_math_word_easy_set_is_packaged_and_self_consistent():
    from gymllm.envs.math_word import EASY_PATH, load_problems

    env = gymllm.make("gymllm/MathWord-v0", data_path="easy")
    assert env.unwrapped.data_path == EASY_PATH and len(load_problems(EASY_PATH)) == 60
    for p in load_problems(EASY_PATH):
        a, b = (int(v) for v in re.findall(r"\d+", p.question)[:2])
        assert int(p.answer) in (a + b, a - b, a * b), p
    _, info = env.reset(seed=0)
    assert env.step(f"so \\boxed{{{info['answer']}}}")[1] == 1.0


def test_math_word_prompt_template():
    from gymllm.envs.math_word import SHORT_PROMPT

    env = gymllm.make("gymllm/MathWord-v0", data_path="easy", prompt=SHORT_PROMPT)
    obs, _ = env.reset(seed=0)
    assert obs.endswith("as a number inside \\boxed{}.") and "step by step" not in obs
    assert "step by step" in gymllm.make("gymllm/MathWord-v0").reset(seed=0)[0]
    with pytest.raises(ConfigError, match="question"):
        gymllm.make("gymllm/MathWord-v0", prompt="no placeholder")
