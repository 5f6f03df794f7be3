"""``VectorEnvConfig``: the options of the barrier-free vector env (frozen, validated)."""

from __future__ import annotations

import dataclasses
from typing import Any

from gymnasium.vector import AutoresetMode

from gymllm.errors import ConfigError, explain

__all__ = ["VectorEnvConfig", "AutoresetMode", "parse_autoreset_mode"]

_MODES = {m.value.lower(): m for m in AutoresetMode} | {m.name.lower(): m for m in AutoresetMode}
BACKENDS = ("thread", "process")
ON_ERROR = ("report", "raise")
MP_CONTEXTS = ("forkserver", "spawn", "fork")


def parse_autoreset_mode(value: Any) -> AutoresetMode:
    """``AutoresetMode`` from the enum itself or its name/value (``"next_step"``, ``"NextStep"``, ...)."""
    if isinstance(value, AutoresetMode):
        return value
    mode = _MODES.get(str(value).lower()) if isinstance(value, str) else None
    if mode is None:
        raise ConfigError(explain("VectorEnvConfig.autoreset_mode", expected="next_step, same_step or disabled",
                                  received=value, fix="pass autoreset_mode='next_step' (Gymnasium's default)"))
    return mode


@dataclasses.dataclass(frozen=True, kw_only=True)
class VectorEnvConfig:
    """Options of :class:`gymllm.vector.VectorEnv`.

    Attributes:
        autoreset_mode: Gymnasium's NEXT_STEP (default), SAME_STEP or DISABLED (enum or name).
        backend: ``"thread"`` runs sync sub-envs on worker threads and async-native sub-envs as
            tasks on one event-loop thread; ``"process"`` hosts each sub-env in its own process
            (for CPU-heavy sync envs; observations travel pickled through a pipe, never through
            shared memory).
        max_concurrency: most sub-env operations in flight at once (None: ``num_envs``).
        step_timeout: seconds a reset/step may take before the sub-env is reported with
            :class:`~gymllm.errors.EnvTimeoutError` and replaced by a fresh instance on its next
            reset (None: no limit).
        on_error: ``"report"`` puts a failing sub-env's :class:`~gymllm.errors.EnvError` in
            ``infos["error"]`` (obs None, truncated True); ``"raise"`` raises it from
            ``recv``/``step`` with the whole batch kept on the exception (``err.results``,
            ``err.errors``), so no other sub-env's result is lost.
        mp_context: multiprocessing start method of the process backend.
        inline_below_s: a sync sub-env whose ops have averaged under this many seconds runs its
            next op on the calling thread (CPU-bound Python gains nothing from threads under the
            GIL, and skipping the hand-off keeps per-step overhead low); 0 disables. Never used
            with ``step_timeout`` or the process backend.
    """

    autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP
    backend: str = "thread"
    max_concurrency: int | None = None
    step_timeout: float | None = None
    on_error: str = "report"
    mp_context: str = "forkserver"
    inline_below_s: float = 2e-4

    def __post_init__(self) -> None:
        object.__setattr__(self, "autoreset_mode", parse_autoreset_mode(self.autoreset_mode))
        for name, allowed in (("backend", BACKENDS), ("on_error", ON_ERROR), ("mp_context", MP_CONTEXTS)):
            if getattr(self, name) not in allowed:
                raise ConfigError(explain(f"VectorEnvConfig.{name}", expected=" or ".join(map(repr, allowed)),
                                          received=getattr(self, name), fix=f"pass {name}={allowed[0]!r}"))
        mc = self.max_concurrency
        if mc is not None and (isinstance(mc, bool) or not isinstance(mc, int) or mc < 1):
            raise ConfigError(explain("VectorEnvConfig.max_concurrency", expected="None or an int >= 1",
                                      received=mc, fix="pass max_concurrency=16"))
        ib = self.inline_below_s
        if isinstance(ib, bool) or not isinstance(ib, (int, float)) or ib < 0:
            raise ConfigError(explain("VectorEnvConfig.inline_below_s", expected="seconds >= 0", received=ib,
                                      fix="pass inline_below_s=0 to always use worker threads"))
        st = self.step_timeout
        if st is not None and (isinstance(st, bool) or not isinstance(st, (int, float)) or st <= 0):
            raise ConfigError(explain("VectorEnvConfig.step_timeout", expected="None or seconds > 0",
                                      received=st, fix="pass step_timeout=30.0"))
