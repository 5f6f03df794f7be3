"""``gymllm/TinyRepeat-v0``: a task a tiny random model can learn in about a minute on a CPU.

The reset observation names a target letter drawn from the first ``num_letters`` letters of the
alphabet: ``"Repeat the letter c."``. The reply is scored by the fraction of its non-space
characters that are the target letter (1.0 for ``"cccc"``, 0.0 for an empty reply), and the episode
ends after one reply. A random tiny model writes random byte-level BPE pieces, so its reward starts
near 1/50; a policy that writes only the target letter gets 1.0 and one that writes one fixed letter
gets about ``1 / num_letters``. ``info`` carries ``task_id`` and ``answer`` (the letter).
"""

from __future__ import annotations

import string

from gymllm.core import TextEnv
from gymllm.errors import ConfigError, explain
from gymllm.registration import register

__all__ = ["TinyRepeatEnv", "letter_fraction"]


def letter_fraction(reply: str, letter: str) -> float:
    """Fraction of the non-space characters of ``reply`` equal to ``letter`` (0.0 when there are none)."""
    chars = [c for c in reply if not c.isspace()]
    return sum(c == letter for c in chars) / len(chars) if chars else 0.0


class TinyRepeatEnv(TextEnv):
    """Write the target letter, and nothing else."""

    def __init__(self, *, num_letters: int = 4, max_turns: int | None = None, render_mode: str | None = None):
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        if isinstance(num_letters, bool) or not isinstance(num_letters, int) or not 1 <= num_letters <= 26:
            raise ConfigError(explain("TinyRepeatEnv.num_letters", expected="an int in [1, 26]", received=num_letters,
                                      fix="pass num_letters=4"))
        self.num_letters = num_letters
        self._letter = "a"

    def _reset(self, *, seed, options):
        self._letter = string.ascii_lowercase[int(self.np_random.integers(self.num_letters))]
        return f"Repeat the letter {self._letter}.", {"task_id": f"repeat-{self._letter}", "answer": self._letter}

    def _step(self, action: str):
        reward = letter_fraction(action, self._letter)
        info = {"task_id": f"repeat-{self._letter}", "answer": self._letter, "score": reward}
        return "Done.", reward, True, info


register("TinyRepeat-v0", "gymllm.envs.tiny_tasks:TinyRepeatEnv")
