"""``gymllm/TinyRepeat-v0``: a task a tiny random model can learn in about a minute on a CPU.

The reset observation names a target letter drawn from the first ``num_letters`` letters of the
alphabet: ``"Repeat the letter c."``. Each reply is scored by the fraction of its non-space
characters that are the target letter (1.0 for ``"cccc"``, 0.0 for an empty reply). A random tiny
model writes random byte-level BPE pieces, so its reward starts near 0.03; a policy that writes only
the target letter gets 1.0 and one that writes one fixed letter gets about ``1 / num_letters``.
``info`` carries ``task_id`` and ``answer`` (the letter).

For pipeline benchmarks the env can behave like a slow agentic env, all from its own seeded RNG:

* ``latency_median_s`` / ``latency_p99_s``: a lognormal (heavy-tailed) delay before each step's
  result (``asyncio.sleep`` in the async hook, so an event loop keeps running other episodes);
* ``continue_prob``: after each reply the episode continues with probability ``continue_prob``
  (``"Again: repeat the letter c."``) up to ``max_replies`` replies, so trajectory lengths are
  geometric (heavy-tailed). The reward of every step is that reply's score divided by the number of
  replies the episode will take, so an episode's total reward stays in [0, 1].
"""

from __future__ import annotations

import asyncio
import math
import string

from gymllm.core import TextEnv
from gymllm.envs.basic import lognormal_sigma
from gymllm.registration import register
from gymllm.validation import check_range, require

__all__ = ["TinyRepeatEnv", "letter_fraction"]


def letter_fraction(reply: str, letter: str) -> float:
    """Fraction of the non-space characters of ``reply`` equal to ``letter`` (0.0 when there are none)."""
    chars = [c for c in reply if not c.isspace()]
    return sum(c == letter for c in chars) / len(chars) if chars else 0.0


class TinyRepeatEnv(TextEnv):
    """Write the target letter, and nothing else (see the module docstring)."""

    def __init__(
        self,
        *,
        num_letters: int = 4,
        latency_median_s: float = 0.0,
        latency_p99_s: float = 0.0,
        continue_prob: float = 0.0,
        max_replies: int = 1,
        max_turns: int | None = None,
        render_mode: str | None = None,
    ):
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        require(
            isinstance(num_letters, int)
            and not isinstance(num_letters, bool)
            and 1 <= num_letters <= 26,
            "TinyRepeatEnv.num_letters",
            expected="an int in [1, 26]",
            received=num_letters,
            fix="pass num_letters=4",
        )
        for name, value, example in (
            ("latency_median_s", latency_median_s, 0.05),
            ("latency_p99_s", latency_p99_s, 1.0),
        ):
            require(
                isinstance(value, (int, float)) and value >= 0,
                f"TinyRepeatEnv.{name}",
                expected="a float >= 0 (seconds)",
                received=value,
                fix=f"pass {name}={example}",
            )
        require(
            isinstance(continue_prob, (int, float)) and 0 <= continue_prob < 1,
            "TinyRepeatEnv.continue_prob",
            expected="a float in [0, 1)",
            received=continue_prob,
            fix="pass continue_prob=0.3",
        )
        check_range(
            "TinyRepeatEnv",
            "max_replies",
            max_replies,
            lo=1,
            integer=True,
            fix="pass max_replies=4",
        )
        self.num_letters, self.continue_prob, self.max_replies = (
            num_letters,
            float(continue_prob),
            max_replies,
        )
        self.median_s, self.p99_s = float(latency_median_s), float(latency_p99_s)
        self._sigma = lognormal_sigma(self.median_s, self.p99_s)
        self._letter, self._replies, self._reply = "a", 1, 0

    def _reset(self, *, seed, options):
        rng = self.np_random
        self._letter = string.ascii_lowercase[int(rng.integers(self.num_letters))]
        self._replies, self._reply = 1, 0
        while self._replies < self.max_replies and rng.random() < self.continue_prob:
            self._replies += 1
        return f"Repeat the letter {self._letter}.", {
            "task_id": f"repeat-{self._letter}",
            "answer": self._letter,
        }

    async def _areset(self, *, seed, options):
        return self._reset(seed=seed, options=options)  # microseconds of work: no executor hop

    def _delay(self) -> float:
        if self.median_s == 0.0:
            return 0.0
        return float(self.median_s * math.exp(self._sigma * self.np_random.standard_normal()))

    async def _astep(self, action: str):
        delay = self._delay()
        if delay:
            await asyncio.sleep(delay)
        score = letter_fraction(action, self._letter)
        self._reply += 1
        done = self._reply >= self._replies
        info = {"task_id": f"repeat-{self._letter}", "answer": self._letter, "score": score}
        obs = "Done." if done else f"Again: repeat the letter {self._letter}."
        return obs, score / self._replies, done, info


register("TinyRepeat-v0", "gymllm.envs.tiny_tasks:TinyRepeatEnv")
