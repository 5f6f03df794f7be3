"""``gymllm/Code-v0``: write a Python function; hidden unit tests run in the subprocess sandbox.

Reset draws a task family and its parameter from the env's ``np_random`` (e.g. "return the sum of
the elements of ``xs`` divisible by 7"), computes the hidden test cases with a trusted reference
implementation on inputs from the same RNG, and shows the signature, the description and a couple
of example calls. ``step(reply)`` takes the last fenced ```` ```python ```` block (else the whole
reply), runs it with the test cases in a :class:`~gymllm.tools.sandbox.Sandbox` (time, memory,
no network, no writes outside its work dir) and compares the returned values with the expected
ones in this process. Reward: 1.0 when every case passes (or the fraction passed with
``partial_credit=True``). ``info`` has ``passed``, ``total`` and ``error`` (a compile error,
exception or timeout text). With ``max_attempts > 1`` a failing reply gets the first failing
example back.

The candidate runs in the same sandboxed interpreter as the small harness that calls it, but only
the inputs enter the sandbox: the returned values are reported as JSON after a per-run random
marker and compared with the expected values outside, so a candidate can neither print a fake pass
nor see the answers.
"""

from __future__ import annotations

import dataclasses
import json
import re
import secrets
from typing import Any, Callable, Sequence

import numpy as np

from gymllm.core import TextEnv
from gymllm.errors import ConfigError, explain
from gymllm.registration import register
from gymllm.tools.sandbox import Sandbox
from gymllm.tools.sandbox_config import SandboxConfig
from gymllm.validation import check_range

__all__ = ["CodeEnv", "CodeTask", "TASKS", "extract_code", "run_tests"]


@dataclasses.dataclass(frozen=True)
class CodeTask:
    """A task family: a signature, a description with ``{k}``, a reference, and an input generator."""

    name: str
    signature: str
    description: str
    reference: Callable[[int], Callable[..., Any]]
    inputs: Callable[[np.random.Generator, int], tuple]
    param: tuple[int, int]  # inclusive range of k


def _ints(rng, n_lo=0, n_hi=12, lo=-50, hi=50) -> list[int]:
    return [int(x) for x in rng.integers(lo, hi, size=int(rng.integers(n_lo, n_hi)))]


def _word(rng, lo=1, hi=8, alphabet="abcdefghij") -> str:
    return "".join(
        alphabet[int(i)] for i in rng.integers(len(alphabet), size=int(rng.integers(lo, hi)))
    )


def _rle(s: str) -> str:
    out, i = [], 0
    while i < len(s):
        j = i
        while j < len(s) and s[j] == s[i]:
            j += 1
        out.append(f"{s[i]}{j - i}")
        i = j
    return "".join(out)


def _max_window(xs: list[int], k: int) -> int | None:
    return max(sum(xs[i : i + k]) for i in range(len(xs) - k + 1)) if len(xs) >= k else None


def _caesar(s: str, k: int) -> str:
    return "".join(chr((ord(c) - 97 + k) % 26 + 97) if "a" <= c <= "z" else c for c in s)


TASKS: tuple[CodeTask, ...] = (
    CodeTask(
        "sum_multiples",
        "def sum_multiples(xs: list[int]) -> int:",
        "Return the sum of the elements of xs that are divisible by {k}.",
        lambda k: lambda xs: sum(x for x in xs if x % k == 0),
        lambda r, k: (_ints(r),),
        (2, 9),
    ),
    CodeTask(
        "count_above",
        "def count_above(xs: list[int]) -> int:",
        "Return how many elements of xs are strictly greater than {k}.",
        lambda k: lambda xs: sum(1 for x in xs if x > k),
        lambda r, k: (_ints(r),),
        (-10, 10),
    ),
    CodeTask(
        "rotate",
        "def rotate(xs: list[int]) -> list[int]:",
        "Return xs rotated left by {k} positions (wrapping around; an empty list stays empty).",
        lambda k: lambda xs: xs[k % len(xs) :] + xs[: k % len(xs)] if xs else [],
        lambda r, k: (_ints(r),),
        (1, 5),
    ),
    CodeTask(
        "caesar",
        "def caesar(s: str) -> str:",
        "Shift every lowercase letter of s forward by {k} places in the alphabet (z wraps to a); "
        "keep other characters.",
        lambda k: lambda s: _caesar(s, k),
        lambda r, k: (_word(r, 0, 12, "abcxyz -!q"),),
        (1, 25),
    ),
    CodeTask(
        "run_length",
        "def run_length(s: str) -> str:",
        "Return the run-length encoding of s: each run of a repeated character as the character "
        "followed by the run length, e.g. 'aaab' -> 'a3b1'. The empty string gives ''.",
        lambda k: _rle,
        lambda r, k: (_word(r, 0, 12, "aab"),),
        (0, 0),
    ),
    CodeTask(
        "max_window",
        "def max_window(xs: list[int]):",
        "Return the largest sum of {k} consecutive elements of xs, or None if xs has fewer than {k} elements.",
        lambda k: lambda xs: _max_window(xs, k),
        lambda r, k: (_ints(r),),
        (1, 4),
    ),
    CodeTask(
        "dedupe",
        "def dedupe(xs: list[int]) -> list[int]:",
        "Return xs without repeated values, keeping the first occurrence of each and the order.",
        lambda k: lambda xs: list(dict.fromkeys(xs)),
        lambda r, k: (_ints(r, lo=0, hi=6),),
        (0, 0),
    ),
    CodeTask(
        "digit_power_sum",
        "def digit_power_sum(n: int) -> int:",
        "Return the sum of the {k}-th powers of the decimal digits of the non-negative integer n.",
        lambda k: lambda n: sum(int(d) ** k for d in str(n)),
        lambda r, k: (int(r.integers(0, 10**6)),),
        (1, 4),
    ),
)

_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)

_HARNESS = """
import json as _json
_CASES = _json.loads({cases!r})
_MARK = {mark!r}
_ns = {{"__name__": "solution"}}
try:
    exec(compile({source!r}, "solution.py", "exec"), _ns)
    _fn = _ns[{name!r}]
except KeyError:
    print(_MARK + _json.dumps({{"error": "the code does not define a function named " + {name!r}}}))
except BaseException as _e:
    print(_MARK + _json.dumps({{"error": "%s: %s" % (type(_e).__name__, _e)}}))
else:
    _out = []
    for _args in _CASES:
        try:
            _out.append({{"value": _fn(*_args)}})
        except BaseException as _e:
            _out.append({{"error": "%s: %s" % (type(_e).__name__, _e)}})
    _text = _json.dumps({{"results": _out}}, default=repr)
    print(_MARK + _text)
"""


def extract_code(reply: str) -> str:
    """The last fenced python block of a reply, else the reply itself."""
    blocks = _FENCE.findall(reply)
    return blocks[-1] if blocks else reply


def _normalize(value: Any) -> Any:
    return json.loads(
        json.dumps(value, default=repr)
    )  # tuples -> lists, as the harness reports them


def run_tests(
    sandbox: Sandbox,
    source: str,
    name: str,
    cases: list[tuple],
    expected: list[Any],
    timeout_s: float | None = None,
) -> dict[str, Any]:
    """Run ``name(*case)`` for every case in the sandbox; ``{"passed", "total", "error", "first_failure"}``."""
    mark = f"@@result-{secrets.token_hex(8)}@@"
    harness = _HARNESS.format(
        cases=json.dumps([list(c) for c in cases]), mark=mark, source=source, name=name
    )
    res = sandbox.run_python(harness, timeout_s=timeout_s)
    out = {"passed": 0, "total": len(cases), "error": None, "first_failure": None}
    line = next((ln for ln in reversed(res.stdout.splitlines()) if ln.startswith(mark)), None)
    if res.timed_out or line is None:
        out["error"] = (
            "timed out"
            if res.timed_out
            else (res.stderr.strip()[-500:] or "no result (did it exit?)")
        )
        return out
    report = json.loads(line[len(mark) :])
    if "error" in report:
        out["error"] = report["error"]
        return out
    for case, want, got in zip(cases, expected, report["results"]):
        ok = "value" in got and got["value"] == _normalize(want)
        out["passed"] += ok
        if not ok and out["first_failure"] is None:
            out["first_failure"] = {
                "args": list(case),
                "expected": want,
                "got": got.get("value", got.get("error")),
            }
    return out


def _select_tasks(names: Sequence[str] | None) -> tuple[CodeTask, ...]:
    by_name = {t.name: t for t in TASKS}
    if names is None:
        return TASKS
    unknown = [n for n in names if n not in by_name] if not isinstance(names, str) else [names]
    if unknown or not names:
        raise ConfigError(
            explain(
                "CodeEnv.tasks",
                expected=f"a non-empty list of {sorted(by_name)}",
                received=names,
                fix='e.g. tasks=["count_above", "sum_multiples"], or None for all',
            )
        )
    return tuple(by_name[n] for n in names)


class CodeEnv(TextEnv):
    """Write one function; hidden tests decide the reward.

    Args:
        num_tests: hidden test cases per task.
        partial_credit: reward the fraction of tests passed instead of all-or-nothing.
        tasks: names of the task families to draw from (None: all of :data:`TASKS`).
        max_attempts: replies allowed (a failing one gets its first failing case back).
        sandbox: limits for running candidate code (default 5 s, 256 MB).
    """

    def __init__(
        self,
        *,
        num_tests: int = 8,
        partial_credit: bool = False,
        tasks: Sequence[str] | None = None,
        max_attempts: int = 1,
        sandbox: SandboxConfig | None = None,
        max_turns: int | None = None,
        render_mode: str | None = None,
    ):
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        self.tasks = _select_tasks(tasks)
        for name, value in (("num_tests", num_tests), ("max_attempts", max_attempts)):
            check_range(
                "CodeEnv", name, value, lo=1, integer=True, fix=f"pass {name}= a positive int"
            )
        self.num_tests, self.partial_credit, self.max_attempts = (
            num_tests,
            bool(partial_credit),
            max_attempts,
        )
        self.sandbox_config = sandbox or SandboxConfig(timeout_s=5.0, memory_mb=256)
        self._sandbox: Sandbox | None = None
        self.task: CodeTask | None = None

    def _reset(self, *, seed, options):
        rng = self.np_random
        self.task = self.tasks[int(rng.integers(len(self.tasks)))]
        lo, hi = self.task.param
        self.k = int(rng.integers(lo, hi + 1))
        fn = self.task.reference(self.k)
        self.cases = [self.task.inputs(rng, self.k) for _ in range(self.num_tests + 2)]
        self.expected = [fn(*c) for c in self.cases]
        examples = "\n".join(
            f"    {self.task.name}({', '.join(map(repr, c))}) == {e!r}"
            for c, e in zip(self.cases[:2], self.expected[:2])
        )
        self.cases, self.expected = self.cases[2:], self.expected[2:]
        self._task_id = f"code-{self.task.name}-{self.k}"
        prompt = (
            f"Write a Python function:\n\n    {self.task.signature}\n\n"
            f"{self.task.description.format(k=self.k)}\n\nExamples:\n{examples}\n\n"
            "Reply with the complete function in a ```python code block."
        )
        return prompt, {"task_id": self._task_id}

    def _sb(self) -> Sandbox:
        if self._sandbox is None:
            self._sandbox = Sandbox(self.sandbox_config)
        return self._sandbox

    def _step(self, action: str):
        result = run_tests(
            self._sb(), extract_code(action), self.task.name, self.cases, self.expected
        )
        passed, total = result["passed"], result["total"]
        all_pass = passed == total
        reward = passed / total if self.partial_credit else float(all_pass)
        done = all_pass or self.turn + 1 >= self.max_attempts
        if all_pass:
            obs = f"All {total} tests passed."
        elif result["error"]:
            obs = f"Your code failed: {result['error']}"
        else:
            f = result["first_failure"]
            obs = (
                f"{passed}/{total} tests passed. For example {self.task.name}"
                f"({', '.join(map(repr, f['args']))}) should be {f['expected']!r}, got {f['got']!r}."
            )
        if not done:
            obs += " Try again."
        info = {
            "task_id": self._task_id,
            "passed": passed,
            "total": total,
            "error": result["error"],
            "correct": all_pass,
        }
        return obs, reward, done, info

    def close(self) -> None:
        if self._sandbox is not None:
            self._sandbox.close()
            self._sandbox = None
        super().close()


register("Code-v0", "gymllm.envs.code:CodeEnv")
