"""A user's own env module, as a test names it on the command line (``user_envs:...``, with tests/ on the path): not part
of gymllm. Importing it registers ``UserCount-v0`` in Gymnasium's registry (Gymnasium's
``module:EnvId-v0`` convention); ``make_count`` is a plain factory (the ``module:factory`` form)."""

from __future__ import annotations

import gymnasium

from gymllm.core import TextEnv


class CountEnv(TextEnv):
    """Say the number after ``start``: one turn, reward 1 for the right number."""

    def __init__(self, start: int = 3):
        super().__init__()
        self.start = int(start)
        self.target = self.start + 1

    def _reset(self, *, seed, options):
        self.target = self.start + int(self.np_random.integers(0, 5))
        return f"Reply with the number after {self.target - 1}.", {}

    def _step(self, action):
        ok = action.strip() == str(self.target)
        return "done", float(ok), True, {"success": ok}


def make_count(start: int = 3) -> CountEnv:
    return CountEnv(start=start)


if "UserCount-v0" not in gymnasium.registry:
    gymnasium.register(id="UserCount-v0", entry_point="user_envs:CountEnv")
