"""Run a suite for several policies: one engine per policy serving every env, all envs in flight.

    summary = run_suite(load_suite("core"), [PolicySpec(label="base", loaded=models.load(name))],
                        "out/core", config=RunnerConfig())

For each policy, one :class:`~gymllm.inference.JaxEngine` (continuous batching) serves every env of
the suite at once: each env gets a barrier-free vector env of up to ``max_concurrency_per_env``
sub-envs, and one worker per sub-env takes the next (seed, sample) of that env, plays the episode
(:func:`gymllm.rollout.run_episode`, the training path: the same agents, token buffer and sampling
seeds as :func:`gymllm.rollout.evaluation.evaluate_env`) and appends its row to ``results.jsonl`` the
moment it ends. No env waits for another; a policy ends when its last episode does. Each env's
session ids carry its name (:class:`~gymllm.rollout.evaluation.SessionPrefixed`), so prefixes cached
by the engine never cross envs.

Failures are rows: an env that cannot be built, an episode that raises, or one past
``episode_timeout_s`` (the watchdog; its sub-env is retired) gives a row with ``error`` set. With
``resume=True`` the rows already in ``results.jsonl`` (a torn last line cut off first) are skipped,
so a run killed at any moment and resumed holds every (policy, env, seed, sample) exactly once.

An oracle policy (``PolicySpec(oracle=True)``) plays each env's demo solver
(:data:`gymllm.envs.demos.SOLVERS`) through the same envs, seeds and rows: a solvable env whose
oracle pass@1 is below 1 has a broken env or scorer. Envs without a solver are skipped (noted in the
summary's ``notes``).

At the end: ``summary.json`` (:func:`gymllm.suites.results.summarize`), ``report.md`` and the plots
(:mod:`gymllm.suites.report`).

Elsewhere than this process: ``PolicySpec.make_engine`` builds a policy's engine (e.g. an
:class:`~gymllm.inference.pool.EnginePool` of Ray replica actors) and ``run_suite(make_vec=...)`` each
env's vector env (e.g. its sub-envs on Ray env workers): :class:`gymllm.train.cluster.SuiteOnRay`
gives both, for ``gymllm eval suite --eval.suite S --cluster.backend ray``. The episodes, their seeds and the
rows are the same; only where the engine and the envs run changes.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import pathlib
import time
from typing import Any, Callable, Sequence

from gymllm.errors import ConfigError, explain
from gymllm.suites.results import ResultsFile, row_key, summarize, suite_from_dict, write_json
from gymllm.suites.spec import Suite, SuiteEnv
from gymllm.validation import check_fields, check_range, require

__all__ = ["LabeledPolicy", "PolicySpec", "RunnerConfig", "run_suite", "work_items"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class LabeledPolicy:
    """What a policy under evaluation has (:class:`PolicySpec` here, a game's
    :class:`gymllm.suites.games.Player`): label, its name in every row and table; loaded, a
    ``LoadedModel`` (``gymllm.models.load`` / ``make_tiny``, a checkpoint's weights restored) its own
    engine serves; make_engine, builds the engine instead (``loaded`` still gives the tokenizer), e.g. a
    client of a remote server."""

    label: str
    loaded: Any = None
    make_engine: Callable[[], Any] | None = None

    def __post_init__(self) -> None:
        require(
            isinstance(self.label, str) and self.label.strip(),
            f"{type(self).__name__}.label",
            expected="a non-empty str",
            received=self.label,
            fix="pass --label NAME",
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class PolicySpec(LabeledPolicy):
    """A :class:`LabeledPolicy` a suite runs; oracle: play the envs' demo solvers instead of a model."""

    oracle: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.oracle or self.loaded is not None,
            f"policy {self.label!r}",
            expected="a loaded model (or oracle=True)",
            received=None,
            fix="pass loaded=gymllm.models.load(name)",
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunnerConfig:
    """max_concurrency_per_env: episodes of one env in flight (its sub-envs); num_slots: the engine's
    rows decoded together (16, as ``gymllm eval``'s engines: on a CPU a decode or prefill call costs
    about in proportion to the slots' cache, so more slots pay only where batching is cheap, e.g. a
    GPU); max_len: the engine's tokens a row; episode_timeout_s: the watchdog (None:
    none); progress: a ``rich`` progress bar (rows done / total, ETA); bootstrap_seed and
    num_resamples: the summary's intervals."""

    max_concurrency_per_env: int = 32
    num_slots: int = 16
    max_len: int = 2048
    episode_timeout_s: float | None = 600.0
    progress: bool = True
    bootstrap_seed: int = 0
    num_resamples: int = 2000

    def __post_init__(self) -> None:
        names = ("max_concurrency_per_env", "num_slots", "max_len", "num_resamples")
        check_fields("RunnerConfig", self, names, lo=1, integer=True, fix="set {field}=1 or more")
        check_range(
            "RunnerConfig",
            "episode_timeout_s",
            self.episode_timeout_s,
            lo=0,
            lo_open=True,
            optional=True,
            fix="e.g. 600",
        )


def work_items(env: SuiteEnv) -> list[tuple[int, int, int]]:
    """``(group_index, seed, sample)`` of every episode of ``env``: seed ``i`` of its list is group
    ``i`` (its sampling seeds follow from ``seed_base``, ``i`` and the sample, as in evaluate_env)."""
    return [(i, seed, m) for i, seed in enumerate(env.seeds) for m in range(env.k)]


def _solver(env: SuiteEnv) -> Any:
    from gymllm.envs.demos import SOLVERS

    return SOLVERS.get(env.target) if isinstance(env.target, str) else None


def _check_resume(out: pathlib.Path, suite: Suite, results: ResultsFile, resume: bool) -> None:
    existing = results.path.is_file() and results.path.stat().st_size > 0
    require(
        not existing or resume,
        f"--out {out}",
        expected="a new directory, or --resume to continue its run",
        received=f"{results.path} already holds rows",
        fix="pass --resume, or another --out",
    )
    manifest = out / "suite.json"
    if resume and manifest.is_file():
        import json

        old = suite_from_dict(json.loads(manifest.read_text()))
        then = {e.name: (e.seeds, e.k) for e in old.envs}
        now = {e.name: (e.seeds, e.k) for e in suite.envs}
        changed = sorted(n for n in set(then) & set(now) if then[n] != now[n])
        require(
            not changed,
            f"--resume in {out}",
            expected="the suite of the run being resumed",
            received=f"envs {changed} with other seeds or k than {manifest}",
            fix="resume with the same suite file, or write to another --out",
        )


def _row(
    policy: str,
    env: SuiteEnv,
    seed: int,
    sample: int,
    *,
    reward: float = 0.0,
    turns: int = 0,
    tokens: int = 0,
    error: str | None = None,
) -> dict[str, Any]:
    return {
        "policy": policy,
        "env": env.name,
        "seed": int(seed),
        "sample": int(sample),
        "reward": float(reward),
        "success": error is None and float(reward) >= env.success_threshold,
        "turns": int(turns),
        "tokens": int(tokens),
        "error": error,
    }


def _message(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


class _Progress:
    """A ``rich`` bar of rows done / total with the ETA, or nothing."""

    def __init__(self, total: int, done: int, enabled: bool):
        self.bar = None
        if enabled:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
            )
            self.task = self.bar.add_task("suite", total=total, completed=done)
            self.bar.start()

    def describe(self, text: str) -> None:
        if self.bar is not None:
            self.bar.update(self.task, description=text)

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.advance(self.task)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


async def _model_env(
    policy: PolicySpec,
    env: SuiteEnv,
    items: list,
    engine: Any,
    write: Callable,
    config: RunnerConfig,
    make_vec: Callable[[SuiteEnv, int], Any] | None = None,
) -> None:
    """Every pending episode of one env on ``engine``: one worker per sub-env."""
    from gymllm.inference.params import SamplingParams
    from gymllm.rollout import (
        Episode,
        EpisodeKey,
        as_env_slots,
        check_prefix_preserving,
        run_episode,
    )
    from gymllm.rollout.evaluation import SessionPrefixed, agent_for
    from gymllm.suites.resolve import make_vec_for

    n = max(1, min(config.max_concurrency_per_env, len(items)))
    vec = None
    try:
        agent = agent_for(
            env.target,
            policy.loaded.tokenizer,
            env.kwargs,
            system_prompt=env.system_prompt,
            agent=env.agent,
        )
        prefix_preserving = check_prefix_preserving(agent.tokenizer, agent.observation_roles)
        if make_vec is None:
            vec = make_vec_for(env.target, n, env.kwargs, max_turns=env.max_turns)
        else:  # e.g. on Ray env workers: off the event loop, so the other envs start meanwhile
            vec = await asyncio.to_thread(make_vec, env, n)
        slots = as_env_slots(vec)
    except Exception as e:  # noqa: BLE001 - an env that cannot be built is reported in its rows
        if vec is not None:
            vec.close()
        for _, seed, m in items:
            write(_row(policy.label, env, seed, m, error=f"env could not be built: {_message(e)}"))
        return
    shared = SessionPrefixed(engine, f"{policy.label}/{env.name}/")
    max_len = getattr(engine, "max_len", None)
    limit = int(max_len) - 1 if isinstance(max_len, int) else None
    sampling = SamplingParams(temperature=env.temperature, max_tokens=env.max_tokens)
    queue = collections.deque(items)
    live = [n]

    async def worker(slot: int) -> None:
        while queue:
            group, seed, m = queue.popleft()
            key = EpisodeKey(group, m, 0, seed)
            ep = Episode(
                key,
                agent,
                sampling,
                base_seed=env.seed_base,
                max_model_calls=env.max_turns,
                prefix_preserving=prefix_preserving,
                env_id=slot,
            )
            try:
                await asyncio.wait_for(
                    run_episode(slots, shared, ep, slot, limit), config.episode_timeout_s
                )
                trajs = ep.trajectories()
                tokens = sum(t.num_sampled for t in trajs)
                write(
                    _row(
                        policy.label,
                        env,
                        seed,
                        m,
                        reward=trajs[0].reward if trajs else 0.0,
                        turns=ep.calls,
                        tokens=tokens,
                    )
                )
            except asyncio.TimeoutError:
                write(
                    _row(
                        policy.label,
                        env,
                        seed,
                        m,
                        turns=ep.calls,
                        error=(
                            f"EpisodeTimeout: no end within {config.episode_timeout_s} s (sub-env {slot} retired)"
                        ),
                    )
                )
                live[0] -= 1
                if live[0] == 0:  # every sub-env hung: the rest of this env cannot run
                    while queue:
                        _, s, mm = queue.popleft()
                        write(
                            _row(
                                policy.label,
                                env,
                                s,
                                mm,
                                error="EpisodeTimeout: every sub-env of this env hung",
                            )
                        )
                return
            except Exception as e:  # noqa: BLE001 - isolate: one episode's failure is one row
                write(_row(policy.label, env, seed, m, turns=ep.calls, error=_message(e)))

    try:
        await asyncio.gather(*(worker(i) for i in range(n)))
    finally:
        vec.close()


def _oracle_episode(env_obj: Any, solver: Any, seed: int) -> tuple[float, int]:
    """Play ``solver`` on ``env_obj`` from ``reset(seed)``: (summed reward, steps)."""
    obs, info = env_obj.reset(seed=seed)
    policy = solver(env_obj, obs, info)
    total, steps = 0.0, 0
    for _ in range(solver.max_steps):
        obs, reward, terminated, truncated, info = env_obj.step(policy(obs, info))
        total, steps = total + float(reward), steps + 1
        if terminated or truncated:
            return total, steps
    raise RuntimeError(f"the solver did not end the episode within {solver.max_steps} steps")


async def _oracle_env(
    policy: PolicySpec, env: SuiteEnv, items: list, write: Callable, config: RunnerConfig
) -> None:
    """Every pending episode of one env played by its demo solver, in worker threads."""
    from gymllm.envs.demos_solvers import Unsolvable
    from gymllm.suites.resolve import make_env_for

    solver = _solver(env)
    queue = collections.deque(items)

    async def worker() -> None:
        env_obj = None
        try:
            while queue:
                _, seed, m = queue.popleft()
                try:
                    if env_obj is None:
                        env_obj = await asyncio.to_thread(
                            make_env_for, env.target, env.kwargs, max_turns=env.max_turns
                        )
                    reward, steps = await asyncio.wait_for(
                        asyncio.to_thread(_oracle_episode, env_obj, solver, seed),
                        config.episode_timeout_s,
                    )
                    write(_row(policy.label, env, seed, m, reward=reward, turns=steps))
                except Unsolvable as e:
                    write(
                        _row(
                            policy.label,
                            env,
                            seed,
                            m,
                            error=f"the solver found this seed unsolvable: {e}",
                        )
                    )
                except Exception as e:  # noqa: BLE001 - an oracle failure is the finding: a row with the error
                    write(_row(policy.label, env, seed, m, error=_message(e)))
        finally:
            if env_obj is not None:
                env_obj.close()

    await asyncio.gather(*(worker() for _ in range(max(1, min(4, len(items))))))


async def _run_policy(
    policy: PolicySpec,
    todo: dict[str, list],
    suite: Suite,
    write: Callable,
    config: RunnerConfig,
    make_vec: Callable[[SuiteEnv, int], Any] | None = None,
) -> None:
    envs = [e for e in suite.envs if todo.get(e.name)]
    if policy.oracle:
        await asyncio.gather(*(_oracle_env(policy, e, todo[e.name], write, config) for e in envs))
        return
    if policy.make_engine is not None:
        engine = policy.make_engine()
    else:
        from gymllm.inference import EngineConfig, JaxEngine

        engine = JaxEngine.from_loaded(
            policy.loaded, config=EngineConfig(num_slots=config.num_slots, max_len=config.max_len)
        )
    try:
        await asyncio.gather(
            *(_model_env(policy, e, todo[e.name], engine, write, config, make_vec) for e in envs)
        )
    finally:
        close = getattr(engine, "close", None)
        if close is not None:
            result = close()
            if asyncio.iscoroutine(result):
                await result


def run_suite(
    suite: Suite,
    policies: Sequence[PolicySpec],
    out: str | pathlib.Path,
    *,
    config: RunnerConfig | None = None,
    resume: bool = False,
    write_report: bool = True,
    make_vec: Callable[[SuiteEnv, int], Any] | None = None,
) -> dict[str, Any]:
    """Run every policy on every env of ``suite`` into ``out`` (see the module doc); returns the summary
    (also written to ``out/summary.json``, with ``report.md`` and the plots unless ``write_report`` is off).
    ``make_vec(env, n)``: builds an env's vector env of ``n`` sub-envs for the model policies (default:
    in this process, :func:`~gymllm.suites.resolve.make_vec_for`); the oracle plays in this process."""
    config = config or RunnerConfig()
    labels = [p.label for p in policies]
    if not policies or len(set(labels)) != len(labels):
        dup = sorted({x for x in labels if labels.count(x) > 1})
        raise ConfigError(
            explain(
                "suite policies",
                expected="at least one policy, each with a distinct label",
                received=labels if not dup else f"{dup} repeated",
                fix="give each --model/--checkpoint its own --label",
            )
        )
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results = ResultsFile(out / "results.jsonl")
    _check_resume(out, suite, results, resume)
    repaired = results.repair() if resume else 0
    write_json(out / "suite.json", suite.to_dict())
    done = results.keys()
    notes = [f"resume: cut a torn last line ({repaired} bytes)"] if repaired else []
    plan: list[tuple[PolicySpec, dict[str, list]]] = []
    total = finished = 0
    for p in policies:
        todo: dict[str, list] = {}
        for e in suite.envs:
            if p.oracle and _solver(e) is None:
                notes.append(f"oracle: {e.name} ({e.id}) has no demo solver; skipped")
                continue
            items = work_items(e)
            total += len(items)
            todo[e.name] = [it for it in items if (p.label, e.name, it[1], it[2]) not in done]
            finished += len(items) - len(todo[e.name])
        plan.append((p, todo))
    bar = _Progress(total, finished, config.progress)
    seen: set = set()

    def write(row: dict[str, Any]) -> None:
        key = row_key(row)
        if key in seen or key in done:  # never twice, whatever a worker does
            return
        seen.add(key)
        results.append(row)
        bar.advance()

    t0 = time.perf_counter()
    try:
        for p, todo in plan:
            bar.describe(p.label)
            if any(todo.values()):
                asyncio.run(_run_policy(p, todo, suite, write, config, make_vec))
    finally:
        bar.close()
        results.close()
    rows = results.read()
    summary = summarize(
        rows, suite, labels, seed=config.bootstrap_seed, num_resamples=config.num_resamples
    )
    summary["notes"] = notes
    summary["wall_s"] = time.perf_counter() - t0
    write_json(out / "summary.json", summary)
    if write_report:
        from gymllm.suites.report import write_report as report

        report(out, summary)
    return summary
