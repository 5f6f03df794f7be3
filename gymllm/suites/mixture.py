"""Training on a suite's mixture: the pure pieces (no engine, no learner).

* :class:`MixtureSampler`: draws each group's (env, seed): the env with probability proportional
  to its weight (the suite's ``weight``, or the curriculum's), the env seed uniformly below
  :data:`~gymllm.envs.demos.HELD_OUT_SEED_BASE` (held-out evaluation seeds start there), all from
  one seeded ``numpy.random.Generator``.
* :func:`learnability_weights`: the learnability curriculum: an env's weight is its base weight
  times ``p (1 - p)`` of its recent success rate ``p`` (largest at p = 1/2, zero for envs always or
  never solved), with a ``floor`` so no env is starved and an unseen env counted as p = 1/2.
* :func:`env_metric_names` and :class:`EnvMetrics`: per-env metrics ``env/<name>/reward``,
  ``env/<name>/success`` (means over the groups since the last :meth:`EnvMetrics.flush`) and
  ``env/<name>/groups`` (groups so far), plus each env's recent success rate for the curriculum.

    sampler = MixtureSampler.from_suite(load_suite("core"), seed=0)
    metrics = EnvMetrics(success_threshold={e.name: e.success_threshold for e in suite.envs})
    name, env_seed = sampler.draw()                 # one group: env and seed
    metrics.add(name, group_rewards)
    sampler.set_weights(learnability_weights(metrics.recent_success(), base=sampler.base_weights))
    log(metrics.flush())                            # {"env/core/reward": ..., ...}
"""

from __future__ import annotations

import collections
from typing import Mapping, Sequence

import numpy as np

from gymllm.utils.seeds import HELD_OUT_SEED_BASE
from gymllm.validation import check_range, require

__all__ = ["MixtureSampler", "learnability_weights", "env_metric_names", "EnvMetrics"]


def _normalised(weights: Mapping[str, float], what: str) -> dict[str, float]:
    vals = {k: float(v) for k, v in weights.items()}
    require(
        vals and all(np.isfinite(v) and v >= 0 for v in vals.values()) and sum(vals.values()) > 0,
        what,
        expected="finite weights >= 0, some > 0, one per env",
        received=dict(weights),
        fix="give every env a weight, e.g. weight = 1.0",
    )
    total = sum(vals.values())
    return {k: v / total for k, v in vals.items()}


class MixtureSampler:
    """Draws (env name, env seed) for each group; see the module doc. ``seed_high``: env seeds are
    drawn from ``[0, seed_high)``."""

    def __init__(
        self, weights: Mapping[str, float], *, seed: int = 0, seed_high: int = HELD_OUT_SEED_BASE
    ):
        check_range(
            "MixtureSampler",
            "seed_high",
            seed_high,
            lo=1,
            integer=True,
            fix=f"e.g. {HELD_OUT_SEED_BASE}",
        )
        self.names = list(weights)
        self.base_weights = _normalised(weights, "MixtureSampler weights")
        self.probs = np.array([self.base_weights[n] for n in self.names])
        self.seed_high = seed_high
        self.seed = int(seed)
        self.rng = np.random.default_rng(seed)

    @classmethod
    def from_suite(
        cls, suite: object, *, seed: int = 0, seed_high: int = HELD_OUT_SEED_BASE
    ) -> "MixtureSampler":
        return cls({e.name: e.weight for e in suite.envs}, seed=seed, seed_high=seed_high)  # type: ignore[attr-defined]

    @property
    def weights(self) -> dict[str, float]:
        """The current probabilities of each env."""
        return dict(zip(self.names, self.probs.tolist()))

    def set_weights(self, weights: Mapping[str, float]) -> None:
        """New weights (e.g. :func:`learnability_weights`); every env of the sampler must have one."""
        missing = sorted(set(self.names) - set(weights))
        require(
            not missing,
            "MixtureSampler.set_weights",
            expected=f"a weight for each of {self.names}",
            received=f"none for {missing}",
            fix="pass a weight for every env",
        )
        w = _normalised({n: weights[n] for n in self.names}, "MixtureSampler.set_weights")
        self.probs = np.array([w[n] for n in self.names])

    def draw(self) -> tuple[str, int]:
        """One group's env name and env seed."""
        i = int(self.rng.choice(len(self.names), p=self.probs))
        return self.names[i], int(self.rng.integers(0, self.seed_high))

    def name_for(self, key: int) -> str:
        """The env of the group with key ``key`` (its env seed): drawn with the current weights from a
        generator seeded by (this sampler's seed, ``key``), so a group's env depends on its key and the
        weights alone, not on the order in which groups ask (members of one group ask concurrently)."""
        rng = np.random.default_rng([self.seed, int(key) & 0xFFFFFFFF])
        return self.names[int(rng.choice(len(self.names), p=self.probs))]

    def draws(self, n: int) -> list[tuple[str, int]]:
        return [self.draw() for _ in range(n)]


def learnability_weights(
    success: Mapping[str, float | None],
    *,
    base: Mapping[str, float] | None = None,
    floor: float = 0.01,
) -> dict[str, float]:
    """Normalised curriculum weights: ``base[env] * max(p (1 - p), floor)`` with ``p`` the env's recent
    success rate (None: not seen yet, taken as 1/2, the most learnable). ``base``: the suite's weights
    (equal by default)."""
    require(
        0.0 <= floor <= 0.25,
        "learnability_weights(floor)",
        expected="a float in [0, 0.25]",
        received=floor,
        fix="e.g. floor=0.01",
    )
    raw = {}
    for name, p in success.items():
        p = 0.5 if p is None else float(p)
        require(
            0.0 <= p <= 1.0,
            f"learnability_weights({name!r})",
            expected="a success rate in [0, 1]",
            received=p,
            fix="pass the share of recent episodes that succeeded",
        )
        raw[name] = (1.0 if base is None else float(base[name])) * max(p * (1.0 - p), floor)
    if (
        sum(raw.values()) <= 0
    ):  # floor 0 and every env solved or hopeless: fall back to the base weights
        raw = {n: (1.0 if base is None else float(base[n])) for n in success}
    return _normalised(raw, "learnability_weights")


def env_metric_names(name: str) -> tuple[str, str, str]:
    """``(env/<name>/reward, env/<name>/success, env/<name>/groups)``."""
    return f"env/{name}/reward", f"env/{name}/success", f"env/{name}/groups"


class EnvMetrics:
    """Per-env metrics of a mixture run (see the module doc). ``success_threshold``: per env, the
    reward that counts as solved (default 1.0); ``window``: episodes behind :meth:`recent_success`."""

    def __init__(self, success_threshold: Mapping[str, float] | None = None, *, window: int = 256):
        self.threshold = dict(success_threshold or {})
        self.window = window
        self.groups: collections.Counter[str] = collections.Counter()
        self._pending: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
        self._recent: dict[str, collections.deque] = collections.defaultdict(
            lambda: collections.deque(maxlen=window)
        )

    def add(self, env: str, rewards: Sequence[float]) -> None:
        """One finished group of ``env`` with its episodes' rewards."""
        r = np.asarray(rewards, dtype=np.float64)
        ok = r >= self.threshold.get(env, 1.0)
        self.groups[env] += 1
        self._pending[env].append((float(r.mean()), float(ok.mean())))
        self._recent[env].extend(ok.tolist())

    def recent_success(self, names: Sequence[str] | None = None) -> dict[str, float | None]:
        """Each env's success rate over its last ``window`` episodes (None before its first group)."""
        names = list(names) if names is not None else sorted(set(self.groups) | set(self.threshold))
        return {
            n: (float(np.mean(self._recent[n])) if self._recent.get(n) else None) for n in names
        }

    def flush(self) -> dict[str, float]:
        """The metrics since the last flush: mean reward and success over those groups (envs with
        groups only), and every env's group count so far."""
        out: dict[str, float] = {}
        for env, vals in self._pending.items():
            reward, success, _ = env_metric_names(env)
            out[reward] = float(np.mean([v[0] for v in vals]))
            out[success] = float(np.mean([v[1] for v in vals]))
        for env, n in self.groups.items():
            out[env_metric_names(env)[2]] = float(n)
        self._pending.clear()
        return out
