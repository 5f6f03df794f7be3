"""``gymllm/Terminal-v0``: fix a bug in a small generated repository through a sandboxed shell (SWE-style).

Reset writes a small Python package into a fresh :class:`~gymllm.tools.sandbox.Sandbox` work dir:
three functions drawn from a bank (``clamp``, ``mean``, ``is_leap``, ``fib``, ``count_words``,
``factorial``), one of which carries an injected bug, and ``tests/test_lib.py`` (``unittest``) whose
cases fail because of it. All choices and test data come from the env's ``np_random``.

Each action is either

- a command: the last fenced ```` ```bash ```` (or ``sh``/``shell``) block runs in the sandbox
  (no network, only the repository writable, time/memory/process limits); the observation is
  its output, reward 0; or
- a submission: any reply without such a block. The original tests are restored (so editing the
  tests does not help) and run, and hidden cases (fresh inputs) call the library in the sandbox
  with their values compared outside it (so patching ``unittest`` or hard-coding the visible
  answers does not help); reward 1.0 when all pass, and the episode ends.

Reaching ``max_turns`` truncates (reward 0). ``gymllm/TerminalTools-v0`` is the same task through
the :class:`~gymllm.wrappers.ToolUse` wrapper with a ``shell`` tool bound to the repository.

``task="locate"`` is the easier first half of the job (bug localization): the same repository and
commands, but the submission names the function that holds the bug. Reward 1.0 when the reply
names exactly one of the library's functions and it is the buggy one (naming several earns
nothing, so listing every function does not pay); a blind guess is right 1 time in
``num_functions``, running the tests tells.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets

from gymllm.core import TextEnv
from gymllm.errors import ConfigError, explain
from gymllm.validation import is_int, require
from gymllm.registration import register
from gymllm.tools.sandbox import Sandbox
from gymllm.tools.sandbox_config import SandboxConfig

__all__ = ["TerminalEnv", "make_terminal_tools", "FUNCTIONS", "TASKS", "named_functions"]

# name -> (correct body, buggy body, test cases as (args, expected) builders from rng)
FUNCTIONS: dict[str, dict] = {
    "clamp": {
        "sig": "def clamp(x, lo, hi):",
        "doc": "Return x limited to the range [lo, hi].",
        "good": "    return max(lo, min(x, hi))",
        "bad": "    return min(lo, max(x, hi))",
        "cases": lambda r: [
            ((int(r.integers(-50, 50)), -5, 5),),
            ((100, 0, int(r.integers(1, 20))),),
            ((-100, int(r.integers(-20, 0)), 30),),
        ],
        "ref": lambda x, lo, hi: max(lo, min(x, hi)),
    },
    "mean": {
        "sig": "def mean(xs):",
        "doc": "Return the arithmetic mean of a non-empty list of numbers.",
        "good": "    return sum(xs) / len(xs)",
        "bad": "    return sum(xs) / (len(xs) - 1)",
        "cases": lambda r: [
            ([int(v) for v in r.integers(0, 100, size=int(r.integers(2, 6)))],) for _ in range(3)
        ],
        "ref": lambda xs: sum(xs) / len(xs),
    },
    "is_leap": {
        "sig": "def is_leap(year):",
        "doc": "Return True when year is a leap year in the Gregorian calendar.",
        "good": "    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)",
        "bad": "    return year % 4 == 0 and year % 100 != 0",
        "cases": lambda r: [
            (2000,),
            (int(r.choice([1900, 2100, 1800])),),
            (4 * int(r.integers(480, 520)) + 1,),
            (int(r.choice([1600, 2400])),),
        ],
        "ref": lambda y: y % 4 == 0 and (y % 100 != 0 or y % 400 == 0),
    },
    "fib": {
        "sig": "def fib(n):",
        "doc": "Return the n-th Fibonacci number (fib(0) == 0, fib(1) == 1).",
        "good": "    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a",
        "bad": "    a, b = 0, 1\n    for _ in range(n - 1):\n        a, b = b, a + b\n    return a",
        "cases": lambda r: [(int(r.integers(2, 30)),) for _ in range(3)],
        "ref": None,
    },
    "count_words": {
        "sig": "def count_words(text):",
        "doc": "Return the number of whitespace-separated words in text.",
        "good": "    return len(text.split())",
        "bad": "    return len(text.split(' '))",
        "cases": lambda r: [
            ("  ".join(["w"] * int(r.integers(2, 6))),),
            (" lead and trail ",),
            ("one\ttwo\nthree",),
        ],
        "ref": lambda s: len(s.split()),
    },
    "factorial": {
        "sig": "def factorial(n):",
        "doc": "Return n! for a non-negative integer n.",
        "good": "    result = 1\n    for i in range(2, n + 1):\n        result *= i\n    return result",
        "bad": "    result = 1\n    for i in range(2, n):\n        result *= i\n    return result",
        "cases": lambda r: [(int(r.integers(3, 15)),) for _ in range(3)],
        "ref": None,
    },
}


def _fib(n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def _reference(name: str):
    import math

    return FUNCTIONS[name]["ref"] or {"fib": _fib, "factorial": math.factorial}[name]


_HIDDEN_HARNESS = """
import json, os, sys
sys.path.insert(0, os.getcwd())
_out = []
try:
    import lib
    for _name, _args in json.loads({cases!r}):
        try:
            _out.append({{"value": getattr(lib, _name)(*_args)}})
        except BaseException as _e:
            _out.append({{"error": type(_e).__name__}})
    print({mark!r} + json.dumps({{"results": _out}}, default=repr))
except BaseException as _e:
    print({mark!r} + json.dumps({{"error": type(_e).__name__}}))
"""

_CMD = re.compile(r"```(?:bash|sh|shell|console)[ \t]*\n(.*?)```", re.DOTALL)


TASKS = {
    "fix": (
        "You are in the root of a small Python repository (lib/__init__.py, tests/test_lib.py). "
        "A test is failing. Find and fix the bug in the library code (not in the tests).\n\n"
        "To run a shell command, reply with it in a ```bash code block; you will see its output. "
        "Each command starts in the repository root; there is no network. Useful commands: "
        "`python -m unittest`, `cat lib/__init__.py`, `sed -i 's/old/new/' FILE`.\n"
        "When the tests pass, reply without a code block to submit."
    ),
    "locate": (
        "You are in the root of a small Python repository: lib/__init__.py defines {names}; "
        "tests/test_lib.py tests them. One of these functions has a bug, so a test fails.\n\n"
        "To run a shell command, reply with it in a ```bash code block; you will see its output. "
        "Useful commands: `python -m unittest`, `cat lib/__init__.py`.\n"
        "To answer, reply without a code block, naming only the buggy function."
    ),
}


def named_functions(reply: str, names: list[str]) -> list[str]:
    """The library functions a reply names (whole words, in library order)."""
    return [n for n in names if re.search(rf"\b{re.escape(n)}\b", reply)]


def extract_command(reply: str) -> str | None:
    """The last fenced bash block of a reply (None: the reply is a submission)."""
    blocks = _CMD.findall(reply)
    return blocks[-1].strip() if blocks else None


def _sandbox_config(sandbox: SandboxConfig | dict | None) -> SandboxConfig:
    defaults = {"timeout_s": 10.0, "memory_mb": 512, "max_output_bytes": 4000}
    if isinstance(sandbox, SandboxConfig):
        return sandbox
    require(
        sandbox is None or isinstance(sandbox, dict),
        "TerminalEnv.sandbox",
        expected="a SandboxConfig, a dict of its fields, or None",
        received=type(sandbox).__name__,
        fix='e.g. sandbox={"max_output_bytes": 600}',
    )
    try:
        return SandboxConfig(**{**defaults, **(sandbox or {})})
    except TypeError as e:
        raise ConfigError(
            explain(
                "TerminalEnv.sandbox",
                expected="SandboxConfig field names",
                received=sorted(sandbox),
                fix=f"use fields of SandboxConfig ({e})",
            )
        ) from e


class TerminalEnv(TextEnv):
    """A failing test in a generated repository; the agent runs shell commands, then submits.

    Args:
        num_functions: functions in the generated library (one is buggy), 1..6.
        task: "fix" (make the tests pass) or "locate" (name the buggy function; see the module doc).
        sandbox: limits for every command and for grading: a ``SandboxConfig``, or a dict of its fields
            over this env's defaults (e.g. ``{"max_output_bytes": 600}`` keeps observations short).
        max_turns: commands + submission allowed (default 12).
    """

    def __init__(
        self,
        *,
        num_functions: int = 3,
        task: str = "fix",
        sandbox: SandboxConfig | dict | None = None,
        max_turns: int | None = 12,
        render_mode: str | None = None,
    ):
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        require(
            is_int(num_functions) and 1 <= num_functions <= 6,
            "TerminalEnv.num_functions",
            expected="an int in [1, 6]",
            received=num_functions,
            fix="pass num_functions=3",
        )
        require(
            task in TASKS,
            "TerminalEnv.task",
            expected=f"one of {sorted(TASKS)}",
            received=task,
            fix='pass task="fix" or task="locate"',
        )
        self.num_functions, self.task = num_functions, task
        self.sandbox_config = _sandbox_config(sandbox)
        self.sandbox = Sandbox(self.sandbox_config)
        self._tests = ""

    # ------------------------------------------------------------------ repository
    def _generate(self) -> dict[str, str]:
        rng = self.np_random
        names = [
            list(FUNCTIONS)[int(i)] for i in rng.permutation(len(FUNCTIONS))[: self.num_functions]
        ]
        buggy = names[int(rng.integers(len(names)))]
        self.buggy, self.names = buggy, names
        self._hidden: list[tuple[str, tuple, object]] = []
        lib = ['"""A small utility library."""', ""]
        tests = [
            "import unittest",
            "",
            "from lib import " + ", ".join(names),
            "",
            "",
            "class TestLib(unittest.TestCase):",
        ]
        for name in names:
            f = FUNCTIONS[name]
            body = f["bad"] if name == buggy else f["good"]
            lib += ["", f["sig"], f'    """{f["doc"]}"""', body, ""]
            ref = _reference(name)
            for i, (args,) in enumerate(f["cases"](rng)):
                args = args if isinstance(args, tuple) else (args,)
                call = f"{name}({', '.join(map(repr, args))})"
                want = ref(*args)
                check = (
                    f"self.assertAlmostEqual({call}, {want!r})"
                    if isinstance(want, float)
                    else f"self.assertEqual({call}, {want!r})"
                )
                tests += [f"    def test_{name}_{i}(self):", f"        {check}", ""]
            for (args,) in f["cases"](
                rng
            ):  # hidden cases: fresh inputs, values checked outside the sandbox
                args = args if isinstance(args, tuple) else (args,)
                self._hidden.append((name, args, ref(*args)))
        tests += ["", 'if __name__ == "__main__":', "    unittest.main()", ""]
        readme = (
            "# lib\n\nA small utility library. Run the tests with:\n\n    python -m unittest -v\n\n"
            "Files: lib/__init__.py (the code), tests/test_lib.py (the tests).\n"
        )
        self._tests = "\n".join(tests)
        return {
            "README.md": readme,
            "lib/__init__.py": "\n".join(lib),
            "tests/__init__.py": "",
            "tests/test_lib.py": self._tests,
        }

    def _clear(self) -> None:
        self.sandbox.clear()  # by descriptors, inside the sandbox's own work dir (its host path is empty)

    def _reset(self, *, seed, options):
        if self.sandbox.closed:
            self.sandbox = Sandbox(self.sandbox_config)
        self._clear()
        self.sandbox.write_files(self._generate())
        self._task_id = (
            f"terminal-{self.buggy}-{hashlib.sha1(self._tests.encode()).hexdigest()[:10]}"
        )
        return TASKS[self.task].format(names=", ".join(self.names)), {
            "task_id": self._task_id,
            "buggy_function": self.buggy,
        }

    # ------------------------------------------------------------------ actions
    def grade(self) -> tuple[bool, str]:
        """Restore the original tests and run them, then check hidden cases; (all passed, output).

        The hidden cases (other inputs than the visible tests) call the library in the sandbox and
        their values are compared here, so patching ``unittest`` or hard-coding the visible answers
        does not earn the reward.
        """
        self.sandbox.write_files({"tests/test_lib.py": self._tests, "tests/__init__.py": ""})
        res = self.run_shell("python -m unittest -q 2>&1 | tail -n 15")
        ok = (
            res.ok
            and bool(re.search(r"^OK", res.stdout, re.MULTILINE))
            and "FAILED" not in res.stdout
        )
        output = re.sub(
            r"(Ran \d+ tests?) in [\d.]+s", r"\1", res.as_text()
        )  # no timings: replayable
        if ok and not self._hidden_pass():
            ok, output = False, output + "\n(hidden checks failed)"
        return ok, output

    def run_shell(self, command: str, **kw):
        """Run ``command`` in the repository; the sandbox's temporary path reads as ``/repo`` in the
        output, so observations depend on the seed and the actions only (replayable, checkable)."""
        import dataclasses

        res = self.sandbox.run_shell(command, **kw)
        wd = self.sandbox.workdir
        return dataclasses.replace(
            res, stdout=res.stdout.replace(wd, "/repo"), stderr=res.stderr.replace(wd, "/repo")
        )

    def _hidden_pass(self) -> bool:
        mark = f"@@hidden-{secrets.token_hex(8)}@@"
        cases = [[name, list(args)] for name, args, _ in self._hidden]
        res = self.sandbox.run_python(_HIDDEN_HARNESS.format(cases=json.dumps(cases), mark=mark))
        line = next((ln for ln in reversed(res.stdout.splitlines()) if ln.startswith(mark)), None)
        if line is None:
            return False
        got = json.loads(line[len(mark) :])
        if "results" not in got or len(got["results"]) != len(self._hidden):
            return False
        for (_, _, want), value in zip(self._hidden, got["results"]):
            if "value" not in value:
                return False
            v = value["value"]
            if isinstance(want, float) and isinstance(v, (int, float)) and not isinstance(v, bool):
                if abs(v - want) > 1e-9 * max(1.0, abs(want)):
                    return False
            elif v != want:
                return False
        return True

    def _step(self, action: str):
        cmd = extract_command(action)
        info = {"task_id": self._task_id}
        if cmd is not None:
            res = self.run_shell(cmd)
            truncated = self.max_turns is not None and self.turn + 1 >= self.max_turns
            if (
                truncated
            ):  # out of turns: grade what is there (reward only if it passes; locate: no answer)
                ok = self.grade()[0] if self.task == "fix" else False
                info.update(passed=ok, command=cmd, exit_code=res.exit_code)
                return res.as_text(), float(ok), False, True, info
            info.update(command=cmd, exit_code=res.exit_code, timed_out=res.timed_out)
            return res.as_text(), 0.0, False, info
        if self.task == "locate":
            named = named_functions(action, self.names)
            ok = named == [self.buggy]
            info.update(passed=ok, named=named)
            obs = "Correct." if ok else f"Incorrect: the bug is in {self.buggy}."
            return obs, 1.0 if ok else 0.0, True, info
        ok, output = self.grade()
        info["passed"] = ok
        obs = "All tests pass. Well done." if ok else "The tests still fail:\n" + output
        return obs, 1.0 if ok else 0.0, True, info

    def close(self) -> None:
        self.sandbox.close()
        super().close()


def make_terminal_tools(
    *,
    num_functions: int = 3,
    task: str = "fix",
    parser: str = "hermes",
    max_tool_calls: int = 12,
    sandbox: SandboxConfig | dict | None = None,
    max_turns: int | None = 12,
    render_mode: str | None = None,
):
    """``ToolUse(TerminalEnv(...), tools=[shell])`` where ``shell(command)`` runs in the repository."""
    from gymllm.tools.shell import make_shell_tool
    from gymllm.wrappers.tool_use import ToolUse

    env = TerminalEnv(
        num_functions=num_functions,
        task=task,
        sandbox=sandbox,
        max_turns=max_turns,
        render_mode=render_mode,
    )
    proxy = _SandboxProxy(env)
    return ToolUse(
        env,
        tools=[make_shell_tool(proxy)],
        parser=parser,
        max_tool_calls=max_tool_calls,
        timeout_s=None,
    )


class _SandboxProxy:
    """Forwards to the env's current sandbox (it is replaced when a closed env is reset)."""

    def __init__(self, env: TerminalEnv):
        self._env = env

    def run_shell(self, command: str, **kw):
        return self._env.run_shell(command, **kw)


register("Terminal-v0", "gymllm.envs.terminal:TerminalEnv")
register("TerminalTools-v0", "gymllm.envs.terminal:make_terminal_tools")
