"""The autoreset policy of the vector env: Gymnasium's three modes over ``send`` / ``recv``.

An operation is one of ``"reset"``, ``"step"`` or ``"step_same"`` (a step that, when it ends the
episode, resets the env right away and puts the terminal observation and info in
``info["final_obs"]`` / ``info["final_info"]``: SAME_STEP). :class:`AutoresetPolicy` decides which
operation a ``send`` starts on a sub-env and the sub-env's state after it; :func:`run_op` /
:func:`arun_op` perform an operation on an env instance wherever it lives (a worker thread, a
child process, a Ray actor).

States: ``"new"`` (never reset), ``"running"``, ``"done"`` (the episode ended or the sub-env
failed). Under NEXT_STEP a send to a done sub-env resets it (its action is ignored; reward 0);
under SAME_STEP only a failed sub-env is left done (the next send resets it); under DISABLED
sending to it raises :class:`~gymllm.errors.ResetNeededError`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gymnasium.vector import AutoresetMode

from gymllm.errors import InvalidActionError, ResetNeededError, explain
from gymllm.vector.errors import VectorStateError

__all__ = ["AutoresetPolicy", "run_op", "arun_op", "state_after"]


def state_after(op: str, terminated: bool, truncated: bool, failed: bool) -> str:
    """A sub-env's state once ``op`` returned (``failed``: it raised or timed out)."""
    if failed:
        return "done"
    if op == "step" and (terminated or truncated):
        return "done"
    return "running"


class AutoresetPolicy:
    """Which operation a ``send`` starts, for one :class:`~gymnasium.vector.AutoresetMode`."""

    def __init__(self, mode: AutoresetMode):
        self.mode = mode
        self.enabled = mode != AutoresetMode.DISABLED
        self.step_op = "step_same" if mode == AutoresetMode.SAME_STEP else "step"

    def op_for(self, slot: Any, action: Any) -> str:
        """The operation a send starts on ``slot`` (lock held); raises on caller errors, before anything starts.

        An ended (or failed) episode is reset by this send under NEXT_STEP and SAME_STEP (under
        SAME_STEP only a failed sub-env can be left ended), and refused under DISABLED.
        """
        if slot.busy:
            raise VectorStateError(
                explain(
                    f"send to env {slot.env_id}",
                    expected="an env whose last result was received",
                    received="an env still in flight",
                    fix="recv() its result first",
                )
            )
        state = slot.state
        if state != "running":
            if state == "new":
                raise ResetNeededError(
                    explain(
                        f"send to env {slot.env_id}",
                        expected="a reset env",
                        received="an env never reset",
                        fix="call reset() or reset_env(id) first",
                    )
                )
            if self.enabled:
                return "reset"
            raise ResetNeededError(
                explain(
                    f"send to env {slot.env_id}",
                    expected="a running episode",
                    received="an ended episode (autoreset_mode=DISABLED)",
                    fix="reset it: reset(options={'reset_mask': vec.ended}) or reset_env(id)",
                )
            )
        why = slot.check(action)
        if why is not None:
            raise InvalidActionError(
                explain(
                    f"action for env {slot.env_id}",
                    expected=f"an action in {slot.env.action_space!r}",
                    received=why,
                    fix="pass one str per env",
                )
            )
        return self.step_op


def run_op(
    env: Any,
    op: str,
    action: Any,
    seed: int | None,
    options: dict | None,
    step: Callable[[Any], tuple] | None = None,
) -> tuple:
    """Run ``op`` on a sync env: ``(obs, reward, terminated, truncated, info)``."""
    if op == "reset":
        obs, info = env.reset(seed=seed, options=options)
        return obs, 0.0, False, False, info
    obs, reward, terminated, truncated, info = (step or env.step)(action)
    if op == "step_same" and (terminated or truncated):
        final_obs, final_info = obs, info
        obs, info = env.reset()
        info = {**info, "final_obs": final_obs, "final_info": final_info}
    return obs, reward, terminated, truncated, info


async def arun_op(env: Any, op: str, action: Any, seed: int | None, options: dict | None) -> tuple:
    """:func:`run_op` through the env's async twins (``areset`` / ``astep``)."""
    if op == "reset":
        obs, info = await env.areset(seed=seed, options=options)
        return obs, 0.0, False, False, info
    obs, reward, terminated, truncated, info = await env.astep(action)
    if op == "step_same" and (terminated or truncated):
        final_obs, final_info = obs, info
        obs, info = await env.areset()
        info = {**info, "final_obs": final_obs, "final_info": final_info}
    return obs, reward, terminated, truncated, info
