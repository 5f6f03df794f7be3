"""Training on a suite's mixture: :class:`MixtureEnvs`, the env side of ``gymllm train --env.suite S``.

It looks like a barrier-free vector env to the rollout orchestrator (``num_envs``, ``areset_env`` /
``astep_env``), so the one training loop and its group source run unchanged, with every env of the
suite in flight on the one engine at once. A slot is a ticket, not an env: when a trajectory resets
slot ``i`` with env seed ``s`` (every member of a group resets with the group's seed), the group's
env is :meth:`~gymllm.suites.mixture.MixtureSampler.name_for` ``(s)`` (drawn in proportion to the
suite's ``weight``, or the curriculum's), and the slot is bound to an idle instance of that env
(made on first need, with the suite table's ``kwargs`` and ``max_turns``; kept for reuse). So a
group is one env and one seed, and the share of groups per env follows the weights.

Per-env figures: :meth:`observe` wraps the run's group filter, so every finished group (filtered or
not) is counted under its env; :meth:`flush` returns ``env/<name>/reward``, ``env/<name>/success``
and ``env/<name>/groups`` (:class:`~gymllm.suites.mixture.EnvMetrics`) for the step record. With
``curriculum="learnability"`` each flush re-weights the sampler by
:func:`~gymllm.suites.mixture.learnability_weights` of the envs' recent success.

    envs = MixtureEnvs(load_suite("core"), num_envs=16, seed=0)
    orchestrator = RolloutOrchestrator(envs, engine, agent, ..., group_filter=envs.observe(keep))
    ...
    step_metrics.update(envs.flush())

One agent plays every env (the run's ``env.agent`` and ``env.system_prompt``); a suite table's own
``agent`` / ``system_prompt`` apply to evaluation (``gymllm eval suite``), not to this mixture.

Elsewhere than this process (``gymllm train --env.suite S --cluster.backend ray``): ``vec=`` a vector env
of :class:`SuiteSlotEnv` sub-envs (:func:`mixture_vec`, e.g. on Ray env workers). The draw stays here
(the sampler, the per-env figures); each reset tells its sub-env which suite env to play
(``options={"suite_env": name}``), and the sub-env, in its worker, plays an instance of that env it
made on first need. The groups, their envs and seeds are the same wherever the sub-envs live.

    vec = mixture_vec(suite, 16, backend="ray", ray_options={"num_workers": 4})
    envs = MixtureEnvs(suite, num_envs=16, seed=0, vec=vec)
"""

from __future__ import annotations

import collections
import functools
from typing import Any, Callable, Mapping

import gymnasium

from gymllm.validation import require
from gymllm.suites.mixture import EnvMetrics, MixtureSampler, learnability_weights
from gymllm.suites.resolve import make_env_for

__all__ = ["MixtureEnvs", "CURRICULA", "SuiteSlotEnv", "slot_table", "mixture_vec"]

CURRICULA = ("none", "learnability")


class MixtureEnvs:
    """``num_envs`` slots over the envs of ``suite`` (see the module doc)."""

    def __init__(
        self, suite: Any, *, num_envs: int, seed: int = 0, curriculum: str = "none", vec: Any = None
    ):
        require(
            curriculum in CURRICULA,
            "env.curriculum",
            expected=f"one of {CURRICULA}",
            received=curriculum,
            fix="--env.curriculum learnability (or none)",
        )
        require(
            vec is None or getattr(vec, "num_envs", None) == int(num_envs),
            "MixtureEnvs(vec)",
            expected=f"a vector env of num_envs={num_envs} SuiteSlotEnv sub-envs",
            received=f"num_envs={getattr(vec, 'num_envs', None)}",
            fix="build it with mixture_vec(suite, num_envs, ...)",
        )
        self.vec = vec
        self.suite = suite
        self.envs_by_name = {e.name: e for e in suite.envs}
        self.num_envs = int(num_envs)
        self.sampler = MixtureSampler.from_suite(suite, seed=seed)
        self.curriculum = curriculum
        self.metrics = EnvMetrics({e.name: e.success_threshold for e in suite.envs})
        self.idle: dict[str, list[Any]] = collections.defaultdict(list)
        self.bound: dict[int, tuple[str, Any]] = {}  # slot -> (env name, env instance)
        self.group_env: dict[int, str] = {}  # env seed -> env name (what each group drew)

    def env_of_seed(self, seed: int) -> str:
        """The env name of the group with env seed ``seed`` (drawn once, then remembered)."""
        name = self.group_env.get(seed)
        if name is None:
            name = self.group_env[seed] = self.sampler.name_for(seed)
        return name

    def _bind(self, slot: int, name: str) -> Any:
        old = self.bound.pop(slot, None)
        if old is not None:
            self.idle[old[0]].append(old[1])
        pool = self.idle[name]
        if pool:
            env = pool.pop()
        else:
            spec = self.envs_by_name[name]
            env = make_env_for(
                spec.target if spec.target is not None else spec.id,
                dict(spec.kwargs),
                max_turns=spec.max_turns,
            )
        self.bound[slot] = (name, env)
        return env

    async def areset_env(
        self, env_id: int, seed: int | None = None, options: dict | None = None
    ) -> tuple[Any, dict]:
        """Reset slot ``env_id`` on the env its group drew (by ``seed``), bound to the slot until its next reset."""
        from gymllm.core import areset_env

        require(
            seed is not None,
            "MixtureEnvs.areset_env(seed)",
            expected="the group's env seed (an int)",
            received=None,
            fix="the orchestrator passes each group's seed",
        )
        name = self.env_of_seed(int(seed))
        if self.vec is not None:  # the sub-env (in its worker) plays the env it is told to
            obs, info = await self.vec.areset_env(
                env_id, seed=seed, options={**(options or {}), "suite_env": name}
            )
            return obs, {**info, "suite_env": name}
        env = self._bind(env_id, name)
        obs, info = await areset_env(env, seed=seed, options=options)
        return obs, {**info, "suite_env": name}

    async def astep_env(self, env_id: int, action: Any) -> tuple[Any, float, bool, bool, dict]:
        from gymllm.core import astep_env

        if self.vec is not None:
            return await self.vec.astep_env(env_id, action)
        require(
            env_id in self.bound,
            "MixtureEnvs.astep_env",
            expected=f"slot {env_id} reset first",
            received="a step on a slot never reset",
            fix="reset the slot before stepping",
        )
        return await astep_env(self.bound[env_id][1], action)

    def observe(self, group_filter: Callable[[Any], bool] | None) -> Callable[[Any], bool]:
        """``group_filter`` that also counts every finished group under its env (by its seed)."""

        def keep(group: Any) -> bool:
            seed = group.info.get("seed")
            if seed is not None and seed in self.group_env:
                self.metrics.add(self.group_env[seed], [t.reward for t in group.trajectories])
            return True if group_filter is None else bool(group_filter(group))

        return keep

    def flush(self) -> dict[str, float]:
        """The per-env figures since the last flush (and, with the curriculum, new weights)."""
        if self.curriculum == "learnability":
            self.sampler.set_weights(
                learnability_weights(
                    self.metrics.recent_success(self.sampler.names), base=self.sampler.base_weights
                )
            )
        out = self.metrics.flush()
        out.update({f"env/{n}/weight": float(w) for n, w in self.sampler.weights.items()})
        return out

    def close(self) -> None:
        if self.vec is not None:
            self.vec.close()
        envs = [e for pool in self.idle.values() for e in pool] + [
            e for _, e in self.bound.values()
        ]
        self.idle.clear()
        self.bound.clear()
        for env in envs:
            try:
                env.close()
            except Exception:  # noqa: BLE001 - closing the rest matters more than one env's close error
                pass


def slot_table(suite: Any) -> dict[str, tuple[Any, dict[str, Any], int | None]]:
    """``{name: (target, kwargs, max_turns)}`` of every env of ``suite``, as a :class:`SuiteSlotEnv` in
    another process builds them: the suite table's own ``id`` for a registered or ``module:EnvId-v0``
    env (the worker imports the module itself), the factory for ``module:factory``."""
    return {
        e.name: (e.target if callable(e.target) else e.id, dict(e.kwargs), e.max_turns)
        for e in suite.envs
    }


class SuiteSlotEnv(gymnasium.Env):
    """One sub-env of a mixture's vector env that plays the suite env each reset names.

    Args:
        table: :func:`slot_table` of the suite (picklable: it travels to a Ray env worker).

    ``reset(seed=s, options={"suite_env": name, ...})`` resets an instance of env ``name`` (made on first
    need with its table's kwargs and ``max_turns``, then kept: one instance per env a sub-env has
    played) and returns its observation with ``info["suite_env"] = name``; the other options go to that
    env. ``step`` steps the env of the last reset. A reset without ``suite_env`` (an autoreset) plays
    the last env again. The spaces are :class:`~gymllm.spaces.Text` (the envs of a suite are text envs;
    each checks its own actions).
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, table: Mapping[str, tuple[Any, Mapping[str, Any], int | None]]):
        from gymllm.spaces import Text

        self.table = {str(k): tuple(v) for k, v in table.items()}
        require(
            self.table,
            "SuiteSlotEnv(table)",
            expected="one entry per suite env",
            received={},
            fix="pass slot_table(suite)",
        )
        self.observation_space, self.action_space = Text(), Text()
        self.envs: dict[str, Any] = {}
        self.current: str | None = None

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        options = dict(options or {})
        name = options.pop("suite_env", self.current)
        require(
            name in self.table,
            "SuiteSlotEnv.reset(options['suite_env'])",
            expected=f"one of {sorted(self.table)}",
            received=name,
            fix="reset with options={'suite_env': NAME} (MixtureEnvs passes the group's env)",
        )
        env = self.envs.get(name)
        if env is None:
            target, kwargs, max_turns = self.table[name]
            env = self.envs[name] = make_env_for(target, dict(kwargs), max_turns=max_turns)
        self.current = name
        obs, info = env.reset(seed=seed, options=options or None)
        return obs, {**info, "suite_env": name}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        require(
            self.current is not None,
            "SuiteSlotEnv.step",
            expected="a reset first",
            received="a step",
            fix="reset with options={'suite_env': NAME} before stepping",
        )
        return self.envs[self.current].step(action)

    def close(self) -> None:
        envs, self.envs = list(self.envs.values()), {}
        for env in envs:
            try:
                env.close()
            except Exception:  # noqa: BLE001 - closing the rest matters more than one env's close error
                pass


def mixture_vec(suite: Any, num_envs: int, **vector_kwargs: Any) -> Any:
    """A ``gymllm.make_vec`` of ``num_envs`` :class:`SuiteSlotEnv` sub-envs of ``suite`` (``vector_kwargs``:
    ``backend="ray"``, ``ray_options``, ...), for ``MixtureEnvs(..., vec=)``."""
    from gymllm.registration import make_vec

    return make_vec(
        functools.partial(SuiteSlotEnv, slot_table(suite)), num_envs, vector_kwargs=vector_kwargs
    )
