"""Replay: re-execute logged episodes and report every observation or reward that differs.

``gymllm.trajectories.replay(log_path)`` reads a :class:`~gymllm.wrappers.TrajectoryLogger` log, rebuilds
each complete episode's env (its logged env id + kwargs, or ``env_factory``), resets it with the
logged seed and options, feeds it the logged actions, and compares what comes back (observation,
reward, terminated, truncated; info optionally) with what was logged, after the same JSON
normalisation. The result is a :class:`ReplayReport` (``ok``, ``differences``, ``summary()``); the
CLI ``gymllm replay LOG`` prints its summary and exits non-zero when anything differs.

The module is ``replaying`` so that ``gymllm.trajectories.replay`` always names the function (a submodule
of the same name would shadow it once imported).
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Callable

import gymnasium as gym

from gymllm.errors import explain
from gymllm.trajectories.format import normalise
from gymllm.trajectories.reader import LoggedEpisode, read_log


@dataclasses.dataclass(frozen=True)
class Difference:
    """One mismatch: which episode and step (0 = reset), which field, the logged and replayed values."""

    episode: str
    step: int
    field: str
    logged: Any
    replayed: Any

    def __str__(self) -> str:
        return f"episode {self.episode} step {self.step} {self.field}: logged {_short(self.logged)} != replayed {_short(self.replayed)}"


@dataclasses.dataclass
class ReplayReport:
    """What a replay found. ``ok`` is True when every checked episode matched and none failed."""

    log: str
    episodes_checked: int = 0
    steps_checked: int = 0
    differences: list[Difference] = dataclasses.field(default_factory=list)
    errors: list[str] = dataclasses.field(default_factory=list)
    skipped: list[str] = dataclasses.field(default_factory=list)
    mismatched_episodes: list[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.differences and not self.errors

    def summary(self, max_lines: int = 20) -> str:
        head = (
            f"replay {self.log}: {self.episodes_checked} episodes, {self.steps_checked} steps checked; "
            f"{len(self.mismatched_episodes)} episodes differ, {len(self.differences)} differences, "
            f"{len(self.errors)} errors, {len(self.skipped)} skipped -> {'OK' if self.ok else 'MISMATCH'}"
        )
        lines = [head] + [f"  {d}" for d in self.differences[:max_lines]]
        if len(self.differences) > max_lines:
            lines.append(f"  ... {len(self.differences) - max_lines} more differences")
        lines += [f"  error: {e}" for e in self.errors[:max_lines]]
        lines += [f"  skipped: {s}" for s in self.skipped[:max_lines]]
        return "\n".join(lines)

    __str__ = summary


def _short(x: Any, n: int = 80) -> str:
    s = repr(x)
    return s if len(s) <= n else s[: n - 3] + "..."


def values_equal(a: Any, b: Any, *, rtol: float = 0.0, atol: float = 0.0) -> bool:
    """Structural equality of JSON values; floats within ``rtol``/``atol`` (NaN equals NaN)."""
    if isinstance(a, float) or isinstance(b, float):
        if (
            not isinstance(a, (int, float))
            or not isinstance(b, (int, float))
            or isinstance(a, bool)
            or isinstance(b, bool)
        ):
            return False
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b or abs(a - b) <= atol + rtol * abs(b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(
            values_equal(x, y, rtol=rtol, atol=atol) for x, y in zip(a, b)
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(
            values_equal(a[k], b[k], rtol=rtol, atol=atol) for k in a
        )
    return type(a) is type(b) and a == b


def default_env_factory(episode: LoggedEpisode) -> gym.Env:
    """Rebuild a logged episode's env with ``gymnasium.make`` (``gymllm/`` ids live in Gymnasium's
    registry once ``gymllm`` is imported; ``gymllm.make`` is ``gymnasium.make`` for them)."""
    if not episode.env_id:
        raise ValueError(
            explain(
                f"replay of episode {episode.episode}",
                expected="a logged env id",
                received=None,
                fix="log with TrajectoryLogger(env, path, env_id=...) or pass env_factory",
            )
        )
    if episode.env_id not in gym.registry:
        raise ValueError(
            explain(
                f"replay of episode {episode.episode}",
                expected="an env id registered in Gymnasium",
                received=episode.env_id,
                fix="import the package that registers it, or pass env_factory",
            )
        )
    env = gym.make(episode.env_id, **episode.env_kwargs)
    return rebuild_wrappers(env, episode.wrappers)


def rebuild_wrappers(env: gym.Env, wrappers: list[dict[str, Any]]) -> gym.Env:
    """Re-apply a logged wrapper stack (innermost first); a wrapper without kwargs cannot be rebuilt."""
    from gymnasium.envs.registration import load_env_creator

    for w in wrappers:
        if w.get("kwargs") is None:
            env.close()
            raise ValueError(
                explain(
                    f"replay: wrapper {w.get('name')}",
                    expected="constructor kwargs in the log",
                    received=None,
                    fix="make the wrapper a gymnasium.utils.RecordConstructorArgs with "
                    "plain-JSON kwargs, or pass env_factory= to rebuild the stack yourself",
                )
            )
        env = load_env_creator(w["entry_point"])(env, **w["kwargs"])
    return env


def replay_episode(
    env: gym.Env,
    episode: LoggedEpisode,
    report: ReplayReport,
    *,
    compare_info: bool = False,
    rtol: float = 0.0,
    atol: float = 0.0,
) -> None:
    """Re-run one episode in ``env`` and add what differs to ``report``."""
    before = len(report.differences)

    def check(step: int, field: str, logged: Any, replayed: Any) -> None:
        replayed = normalise(replayed)
        if not values_equal(logged, replayed, rtol=rtol, atol=atol):
            report.differences.append(Difference(episode.episode, step, field, logged, replayed))

    obs, info = env.reset(seed=episode.seed, options=episode.options)
    check(0, "observation", episode.observation, obs)
    if compare_info:
        check(0, "info", episode.info, info)
    for rec in episode.steps:
        step = int(rec["step"])
        obs, reward, terminated, truncated, info = env.step(rec["action"])
        report.steps_checked += 1
        check(step, "observation", rec["observation"], obs)
        check(step, "reward", rec["reward"], reward)
        check(step, "terminated", rec["terminated"], bool(terminated))
        check(step, "truncated", rec["truncated"], bool(truncated))
        if compare_info:
            check(step, "info", rec["info"], info)
        if (terminated or truncated) and step < len(episode.steps):
            report.differences.append(
                Difference(episode.episode, step, "length", len(episode.steps), step)
            )
            break
    report.episodes_checked += 1
    if len(report.differences) > before:
        report.mismatched_episodes.append(episode.episode)


def replay(
    log: str | os.PathLike,
    *,
    max_episodes: int | None = None,
    episodes: list[str] | None = None,
    env_factory: Callable[[LoggedEpisode], gym.Env] | None = None,
    compare_info: bool = False,
    rtol: float = 0.0,
    atol: float = 0.0,
) -> ReplayReport:
    """Re-execute the complete episodes of a log and report every difference (see module doc).

    ``episodes`` picks episode ids; ``max_episodes`` caps the count; ``env_factory(episode) -> env``
    overrides how envs are rebuilt (e.g. to re-apply the wrappers that were around the logged env).
    An episode whose env cannot be built or that raises is recorded in ``errors``; the rest still runs.
    """
    factory = env_factory or default_env_factory
    report = ReplayReport(log=os.fspath(log))
    logged = read_log(log)
    if episodes is not None:
        wanted = set(episodes)
        logged = [e for e in logged if e.episode in wanted]
    if max_episodes is not None:
        logged = logged[:max_episodes]
    for ep in logged:
        if ep.seed is None:
            report.skipped.append(
                f"{ep.episode}: no seed was logged, so it cannot be replayed exactly"
            )
            continue
        env = None
        try:
            env = factory(ep)
            replay_episode(env, ep, report, compare_info=compare_info, rtol=rtol, atol=atol)
        except Exception as e:  # isolate: one broken episode never stops the others
            report.errors.append(f"{ep.episode}: {type(e).__name__}: {e}")
        finally:
            if env is not None:
                try:
                    env.close()
                except Exception:
                    pass
    return report


__all__ = [
    "replay",
    "replay_episode",
    "rebuild_wrappers",
    "ReplayReport",
    "Difference",
    "values_equal",
    "default_env_factory",
]
