"""``VectorEnvConfig``: the options of the barrier-free vector env (frozen, validated)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from gymnasium.vector import AutoresetMode

from gymllm.errors import ConfigError
from gymllm.validation import check_range, field_error, is_int, is_number, require

__all__ = ["VectorEnvConfig", "RayOptions", "parse_autoreset_mode"]

_MODES = {m.value.lower(): m for m in AutoresetMode} | {m.name.lower(): m for m in AutoresetMode}
BACKENDS = ("thread", "process", "ray")
ON_ERROR = ("report", "raise")
MP_CONTEXTS = ("forkserver", "spawn", "fork")


def parse_autoreset_mode(value: Any) -> AutoresetMode:
    """``AutoresetMode`` from the enum itself or its name/value (``"next_step"``, ``"NextStep"``, ...)."""
    if isinstance(value, AutoresetMode):
        return value
    mode = _MODES.get(str(value).lower()) if isinstance(value, str) else None
    require(
        mode is not None,
        "VectorEnvConfig.autoreset_mode",
        expected="next_step, same_step or disabled",
        received=value,
        fix="pass autoreset_mode='next_step' (Gymnasium's default)",
    )
    return mode


@dataclasses.dataclass(frozen=True, kw_only=True)
class RayOptions:
    """Options of the vector env's Ray backend (``backend="ray"``; ``ray_options={...}`` takes these keys).

    Attributes:
        address: the cluster to join when this process is not connected to Ray yet: ``None``
            starts a local Ray on 127.0.0.1 (:func:`gymllm.ray_support.init_ray`), ``"auto"`` or
            ``"host:port"`` joins a running one. Ignored when Ray is already initialized.
        num_workers: number of env actors; the sub-envs are split into contiguous shards of
            ``ceil(num_envs / num_workers)``. Exclusive with ``envs_per_actor``.
        envs_per_actor: sub-envs per actor. When neither this nor ``num_workers`` is given the
            layout is fitted to the cluster found at build time
            (:func:`gymllm.vector.ray_backend.plan_placement`): one actor per sub-env (each fully
            independent) while the cluster can hold that many actor processes, else contiguous
            shards of several sub-envs per actor. A shard's sub-envs run concurrently in their
            actor (one thread each; a slow one holds back no other) but share its process: the
            actor's death fails all of them.
        num_cpus: CPUs each actor reserves (Ray's ``num_cpus``; fractions allowed). None (the
            default): fitted to the cluster, an equal share of the CPUs free at build time, at
            most 1 per actor (0 when none is free: Ray's own actors hold no CPU while they run).
        resources: custom resources each actor reserves, e.g. ``{"sandbox": 1}``: actors are
            placed only on nodes started with them (``ray start --resources='{"sandbox": 8}'``).
        ready_timeout_s: seconds to wait for the actors to be placed and their envs built before
            raising (an actor whose resources no node has would otherwise wait forever); also
            the bound on placing an actor recreated after a death. A demand larger than the
            cluster's total resources is refused at once (no autoscaling wait).
        name_prefix: actor names ``{name_prefix}{shard}`` (None: unnamed actors).
    """

    address: str | None = None
    num_workers: int | None = None
    envs_per_actor: int | None = None
    num_cpus: float | None = None
    resources: Mapping[str, float] = dataclasses.field(default_factory=dict)
    ready_timeout_s: float = 120.0
    name_prefix: str | None = None

    def __post_init__(self) -> None:
        def bad(name: str, expected: str, fix: str) -> ConfigError:
            return field_error(self, name, expected, fix, what=f"ray_options[{name!r}]")

        if self.address is not None and not (isinstance(self.address, str) and self.address):
            raise bad(
                "address",
                "None, 'auto' or 'host:port'",
                "pass address='auto' to join a running cluster",
            )
        for name in ("num_workers", "envs_per_actor"):
            v = getattr(self, name)
            if v is not None and not (is_int(v) and v > 0):
                raise bad(name, "None or an int >= 1", f"pass {name}=4")
        if self.num_workers is not None and self.envs_per_actor is not None:
            raise bad(
                "envs_per_actor", "num_workers or envs_per_actor, not both", "drop one of them"
            )
        if self.num_cpus is not None and not (is_number(self.num_cpus) and self.num_cpus >= 0):
            raise bad(
                "num_cpus",
                "None (fitted to the cluster) or CPUs >= 0 per actor",
                "pass num_cpus=1 (or 0.5)",
            )
        res = self.resources
        if not isinstance(res, Mapping) or not all(
            isinstance(k, str) and is_number(v) and v > 0 for k, v in res.items()
        ):
            raise bad(
                "resources",
                "a dict of resource name -> amount > 0",
                "pass resources={'sandbox': 1}",
            )
        object.__setattr__(self, "resources", dict(res))
        if not (is_number(self.ready_timeout_s) and self.ready_timeout_s > 0):
            raise bad("ready_timeout_s", "seconds > 0", "pass ready_timeout_s=120")
        if self.name_prefix is not None and not isinstance(self.name_prefix, str):
            raise bad("name_prefix", "None or a str", "pass name_prefix='gymllm-env-'")

    @classmethod
    def parse(cls, value: Any) -> "RayOptions":
        """``RayOptions`` from itself, ``None`` (defaults) or a dict of its fields (unknown keys named)."""
        if isinstance(value, cls):
            return value
        if value is None:
            return cls()
        require(
            isinstance(value, Mapping),
            "ray_options",
            expected="a dict or RayOptions",
            received=value,
            fix="pass ray_options={'num_workers': 4, 'num_cpus': 1}",
        )
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - known)
        require(
            not unknown,
            "ray_options",
            expected=f"keys among {sorted(known)}",
            received=unknown,
            fix="drop or rename those keys",
        )
        return cls(**value)

    def shard_size(self, num_envs: int) -> int | None:
        """Sub-envs per actor for ``num_envs`` sub-envs (None: not set, fitted to the cluster)."""
        if self.num_workers is not None:
            return -(-num_envs // self.num_workers)
        return self.envs_per_actor


@dataclasses.dataclass(frozen=True, kw_only=True)
class VectorEnvConfig:
    """Options of :class:`gymllm.vector.VectorEnv`.

    Attributes:
        autoreset_mode: Gymnasium's NEXT_STEP (default), SAME_STEP or DISABLED (enum or name).
        backend: ``"thread"`` runs sync sub-envs on worker threads and async-native sub-envs as
            tasks on one event-loop thread; ``"process"`` hosts each sub-env in its own process
            (for CPU-heavy sync envs; observations travel pickled through a pipe, never through
            shared memory); ``"ray"`` hosts the sub-envs in Ray actors (see :class:`RayOptions`).
        max_concurrency: most sub-env operations in flight at once (None: ``num_envs``; thread
            backend: a Ray actor runs at most one op per env, its envs' ops concurrently).
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
            with ``step_timeout`` or the process and Ray backends.
        ray_options: a :class:`RayOptions` or a dict of its fields (only with ``backend="ray"``).
    """

    autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP
    backend: str = "thread"
    max_concurrency: int | None = None
    step_timeout: float | None = None
    on_error: str = "report"
    mp_context: str = "forkserver"
    inline_below_s: float = 2e-4
    ray_options: RayOptions | Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "autoreset_mode", parse_autoreset_mode(self.autoreset_mode))
        if self.ray_options is not None or self.backend == "ray":
            require(
                self.backend == "ray",
                "VectorEnvConfig.ray_options",
                expected="ray_options only with backend='ray'",
                received={"backend": self.backend},
                fix="pass backend='ray' as well",
            )
            object.__setattr__(self, "ray_options", RayOptions.parse(self.ray_options))
        for name, allowed in (
            ("backend", BACKENDS),
            ("on_error", ON_ERROR),
            ("mp_context", MP_CONTEXTS),
        ):
            require(
                getattr(self, name) in allowed,
                f"VectorEnvConfig.{name}",
                expected=" or ".join(map(repr, allowed)),
                received=getattr(self, name),
                fix=f"pass {name}={allowed[0]!r}",
            )
        mc = self.max_concurrency
        check_range(
            "VectorEnvConfig",
            "max_concurrency",
            mc,
            lo=1,
            integer=True,
            optional=True,
            fix="pass max_concurrency=16",
        )
        check_range(
            "VectorEnvConfig",
            "inline_below_s",
            self.inline_below_s,
            lo=0,
            fix="pass inline_below_s=0 to always use worker threads",
        )
        check_range(
            "VectorEnvConfig",
            "step_timeout",
            self.step_timeout,
            lo=0,
            lo_open=True,
            optional=True,
            fix="pass step_timeout=30.0",
        )
