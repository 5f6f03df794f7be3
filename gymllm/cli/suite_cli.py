"""``gymllm eval suite`` (several policies, pass@k, intervals, paired comparisons) and ``gymllm compare``.

    gymllm eval suite --eval.suite core --model.name smollm2-135m-instruct --model.checkpoint runs/a --out out/core
    gymllm eval suite --eval.suite my_suite.toml --model.name tiny-qwen3 --oracle --out out/mine --resume
    gymllm compare out/core out/other

Policies, in this order: each ``--model.name`` (a registry name, a local checkpoint directory or
``tiny-<family>``), each ``--model.checkpoint`` (a ``gymllm train`` run directory: the model it trained
with its latest weights), then the oracle (``--oracle``: each env's demo solver). ``--model.label`` names
them in the same order (default: the model name, the run directory's name, ``oracle``). The run
writes ``results.jsonl``, ``suite.json``, ``summary.json``, ``report.md`` and the plots into ``--out``
(:mod:`gymllm.suites.runner`). ``python -m gymllm.cli.suite_cli eval|compare ...`` runs the same.

On a Ray cluster (the ``--cluster.*`` options of ``gymllm train``, the same
:class:`~gymllm.train.train_config.ClusterSection`):

    gymllm eval suite --eval.suite core --model.name smollm2-135m-instruct --out out/core \
        --cluster.backend ray --cluster.address auto --cluster.engine-replicas 4 --cluster.env-workers 8

each policy's engine is ``engine_replicas`` replica actors (each loads the model, and the
``--model.checkpoint`` weights, on its own host) behind one pool, and each env's sub-envs live in
``env_workers`` env actors (:class:`gymllm.train.cluster.SuiteOnRay`); the rows are those of the
in-process run.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
import sys
from typing import Annotated, Any, Sequence

import tyro

from gymllm.train.train_config import ClusterSection
from gymllm.cli.eval_args import EngineShape, Policies
from gymllm.validation import require

__all__ = [
    "SuiteEval",
    "SuiteSelection",
    "SamplingOverrides",
    "eval_suite",
    "compare",
    "compare_main",
    "policy_label",
    "policy_engine",
    "main",
]


def policy_label(model: str | None = None, checkpoint: str | None = None) -> str:
    """A policy's default label: the model name, or the run directory's name (``RUN/checkpoints`` -> RUN)."""
    if checkpoint is not None:
        path = pathlib.Path(checkpoint).resolve()
        return path.parent.name if path.name == "checkpoints" else path.name
    return str(model)


def policy_engine(model: str | None, checkpoint: str | None, num_slots: int, max_len: int) -> Any:
    """The JaxEngine of one policy, as the in-process suite runner builds it (``num_slots`` rows of
    ``max_len`` tokens): what each Ray replica of that policy runs (a module-level function, so that
    a ``ReplicaSpec(factory=partial(policy_engine, ...))`` pickles to the replica's host)."""
    from gymllm.cli.evaluate import load_model
    from gymllm.inference import EngineConfig, JaxEngine

    return JaxEngine.from_loaded(
        load_model(model, checkpoint=checkpoint),
        config=EngineConfig(num_slots=num_slots, max_len=max_len),
    )


def _policies(
    policies: Policies, oracle: bool, on_ray: Any = None, engine_shape: tuple[int, int] = (16, 2048)
) -> list[Any]:
    from gymllm.cli.evaluate import load_model
    from gymllm.suites.runner import PolicySpec

    model, checkpoint, label = policies.name, policies.checkpoint, policies.label
    sources: list[tuple[str | None, str | None]] = [(m, None) for m in model] + [
        (None, c) for c in checkpoint
    ]
    count = len(sources) + bool(oracle)
    require(
        count != 0,
        "gymllm eval suite",
        expected="at least one policy: --model.name, --model.checkpoint or --oracle",
        received="none",
        fix="e.g. --model.name smollm2-135m-instruct",
    )
    require(
        not label or len(label) == count,
        "--model.label",
        expected=f"one label per policy ({count}: the --model.name ones, "
        "then the --model.checkpoint ones, then the oracle), or none",
        received=list(label),
        fix=f"pass --model.label {count} times",
    )
    names = list(label) or [policy_label(m, c) for m, c in sources] + (["oracle"] if oracle else [])
    specs = [
        PolicySpec(
            label=n,
            loaded=load_model(m, checkpoint=c),
            make_engine=None
            if on_ray is None
            else functools.partial(on_ray.engine, _replica_spec(m, c, engine_shape)),
        )
        for n, (m, c) in zip(names, sources)
    ]
    if oracle:
        specs.append(PolicySpec(label=names[-1], oracle=True))
    return specs


def _replica_spec(model: str | None, checkpoint: str | None, engine_shape: tuple[int, int]) -> Any:
    from gymllm.inference.replica import ReplicaSpec

    if (
        checkpoint is not None
    ):  # every replica restores it on its host: the same path there (a shared disk)
        checkpoint = str(pathlib.Path(checkpoint).resolve())
    return ReplicaSpec(factory=functools.partial(policy_engine, model, checkpoint, *engine_shape))


@dataclasses.dataclass(frozen=True, kw_only=True)
class SuiteSelection:
    """What to evaluate and the held-out seeds (``--eval.*``, the names ``gymllm train``'s ``--eval.*`` give
    the same ideas); a flag left unset keeps the suite file's value."""

    suite: str | None = None
    """A suite TOML file, or a shipped suite's name (core, games, reasoning)."""
    envs: tuple[str, ...] = ()
    """Env ids of a one-off suite (instead of --eval.suite): registered ids, 'module:EnvId-v0' or 'module:factory'."""
    seeds: int | None = None
    """Override the held-out seeds per env (every env)."""
    k: int | None = None
    """Override the samples per seed (every env)."""
    seed_base: int | None = None
    """Override the first held-out seed (every env)."""
    max_turns: int | None = None
    """Override the model turns per episode (every env)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingOverrides:
    """The sampler (``--sampling.*``, the :class:`~gymllm.inference.SamplingParams` fields of the same names);
    a flag left unset keeps the suite file's value."""

    temperature: float | None = None
    """Override the sampling temperature (every env)."""
    max_tokens: int | None = None
    """Override the tokens per model turn (every env)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class SuiteEval:
    """Run a benchmark suite for one or more policies: pass@k, intervals, paired comparisons."""

    eval: SuiteSelection = SuiteSelection()
    """The suite (or env ids) and the held-out seeds."""
    model: Policies = Policies()
    """The policies: each --model.name, then each --model.checkpoint, then the oracle."""
    sampling: SamplingOverrides = SamplingOverrides()
    """The sampler's settings the suite file sets, overridden for every env."""
    engine: EngineShape = EngineShape()
    """Each policy's engine."""
    out: str = "suite_out"
    """The output directory (results.jsonl, summary.json, report.md, plots)."""
    resume: bool = False
    """Continue the run in --out: rows already written are skipped."""
    oracle: bool = False
    """Also run each env's demo solver (envs without one are skipped): pass@1 below 1 flags a broken env."""
    max_concurrency_per_env: int = 32
    """Episodes of one env in flight at once."""
    episode_timeout_s: float = 600.0
    """The watchdog: an episode running longer is an error row."""
    progress: bool = True
    """Show a progress bar (rows done, total, ETA)."""
    cluster: ClusterSection = ClusterSection()
    """Where engines and envs run (backend ray: each policy on engine_replicas replica actors, each env's sub-envs
    on env_workers env actors; the options of `gymllm train`, learner ones excepted)."""


def eval_suite(args: SuiteEval) -> int:
    """``gymllm eval suite``: run ``args``' suite for its policies, print the table and the comparisons."""
    from gymllm.suites.report import comparison_table
    from gymllm.suites.runner import RunnerConfig, run_suite
    from gymllm.suites.spec import load_suite, one_off_suite

    e, sampling = args.eval, args.sampling
    overrides = {
        key: v
        for key, v in (
            ("num_seeds", e.seeds),
            ("k", e.k),
            ("seed_base", e.seed_base),
            ("temperature", sampling.temperature),
            ("max_tokens", sampling.max_tokens),
            ("max_turns", e.max_turns),
        )
        if v is not None
    }
    require(
        (e.suite is None) != (not e.envs),
        "gymllm eval suite",
        expected="--eval.suite S, or --eval.envs ID ... (a one-off suite), not both",
        received=f"suite={e.suite!r}, envs={list(e.envs)}",
        fix="e.g. gymllm eval suite --eval.suite core",
    )
    the_suite = (
        load_suite(e.suite, overrides=overrides)
        if e.suite is not None
        else one_off_suite(list(e.envs), **overrides)
    )
    shape = args.engine
    config = RunnerConfig(
        max_concurrency_per_env=args.max_concurrency_per_env,
        num_slots=shape.num_slots,
        max_len=shape.max_len,
        episode_timeout_s=args.episode_timeout_s,
        progress=args.progress,
    )
    on_ray = None
    if args.cluster.backend == "ray":
        from gymllm.train.cluster import SuiteOnRay

        on_ray = SuiteOnRay(args.cluster, num_envs=len(the_suite.envs))
    try:
        policies = _policies(args.model, args.oracle, on_ray, (shape.num_slots, shape.max_len))
        summary = run_suite(
            the_suite,
            policies,
            args.out,
            config=config,
            resume=args.resume,
            make_vec=None if on_ray is None else on_ray.make_vec,
        )
    finally:
        if on_ray is not None:
            on_ray.close()
    _print_results(summary)
    if summary["comparisons"]:
        print(comparison_table(summary))
    for note in summary.get("notes", []):
        print(f"note: {note}")
    print(f"wrote {pathlib.Path(args.out) / 'summary.json'}, report.md, results.jsonl")
    return 0


def compare(
    dirs: Annotated[tuple[str, ...], tyro.conf.Positional],
    /,
    out: str | None = None,
    seed: int = 0,
) -> int:
    """Paired comparisons of the policies in existing suite results (directories written by `gymllm eval suite`).

    Args:
        dirs: Result directories (each with results.jsonl and suite.json); their rows are pooled.
        out: Also write the summary (with the comparisons) as JSON here.
        seed: The bootstrap's seed.
    """
    from gymllm.suites.report import comparison_table
    from gymllm.suites.results import summarize, write_json

    rows, suite, policies = _pooled(dirs)
    summary = summarize(rows, suite, policies, seed=seed)
    _print_results(summary)
    if summary["comparisons"]:
        print(comparison_table(summary))
    else:
        print(
            "no comparisons: the results hold a single policy (give directories with two or more)"
        )
    if out:
        write_json(out, summary)
        print(f"wrote {out}")
    return 0


def _pooled(dirs: Sequence[str]) -> tuple[list[dict[str, Any]], Any, list[str]]:
    """The rows of every directory (labels that clash across directories get ``DIR/`` in front), the first
    directory's suite, and the policies in order of appearance."""
    from gymllm.suites.results import ResultsFile, suite_from_dict

    require(
        bool(dirs),
        "gymllm compare",
        expected="one or more result directories",
        received="none",
        fix="gymllm compare out/a out/b",
    )
    per_dir = []
    for d in dirs:
        path = pathlib.Path(d)
        if not (path / "results.jsonl").is_file() or not (path / "suite.json").is_file():
            raise FileNotFoundError(
                f"{d}: expected a directory written by `gymllm eval suite` (results.jsonl and "
                "suite.json), received one without them. Fix: pass the --out of a suite run"
            )
        per_dir.append(
            (
                path,
                ResultsFile(path / "results.jsonl").read(),
                suite_from_dict(json.loads((path / "suite.json").read_text())),
            )
        )
    suite = per_dir[0][2]
    names = {e.name for e in suite.envs}
    for path, _, other in per_dir[1:]:
        require(
            bool(names & {e.name for e in other.envs}),
            f"gymllm compare {path}",
            expected=f"results on envs of suite {suite.name!r}",
            received=f"suite {other.name!r} with no env in common",
            fix="compare runs of the same suite",
        )
    owners: dict[str, set[pathlib.Path]] = {}
    for path, rows, _ in per_dir:
        for r in rows:
            owners.setdefault(r["policy"], set()).add(path)
    rows_out: list[dict[str, Any]] = []
    for path, rows, _ in per_dir:
        for r in rows:
            clash = len(owners[r["policy"]]) > 1
            rows_out.append({**r, "policy": f"{path.name}/{r['policy']}"} if clash else r)
    policies = list(dict.fromkeys(r["policy"] for r in rows_out))
    return rows_out, suite, policies


def _print_results(summary: dict[str, Any]) -> None:
    header = f"{'policy':<20} {'env':<20} {'mean_reward':>11} {'95% interval':>17} {'pass@1':>7} {'pass@k':>10} {'errors':>6}"
    print(header)
    print("-" * len(header))
    for r in summary["results"]:
        lo, hi = r["mean_reward_ci"]
        pk = r["pass_at"].get(str(r["k"]))
        pk_text = f"{pk:.3f}@{r['k']}" if pk is not None else "-"
        print(
            f"{r['policy']:<20} {r['env']:<20} {r['mean_reward']:>11.3f} {f'[{lo:.3f}, {hi:.3f}]':>17} "
            f"{r['pass_at'].get('1', float('nan')):>7.3f} {pk_text:>10} {r['errors']:>6}"
        )


def compare_main(argv: Sequence[str]) -> int:
    """Paired comparisons of the policies in existing suite results: differences, intervals, p-values.

    ``gymllm compare DIR ...``: parses ``argv`` with tyro and runs :func:`compare`."""
    return int(tyro.cli(compare, prog="gymllm compare", args=list(argv)))


compare_main.takes_argv = True  # type: ignore[attr-defined]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gymllm.cli.suite_cli eval|compare ...``: errors as one line plus a hint, as ``gymllm`` does
    (``eval ...`` is ``gymllm eval suite ...``)."""
    from gymllm.cli.eval_args import eval_main

    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"eval": lambda rest: eval_main(["suite", *rest]), "compare": compare_main}
    if not argv or argv[0] not in commands:
        print(
            "usage: python -m gymllm.cli.suite_cli {eval,compare} [ARGS] (--help for the options)",
            file=sys.stderr,
        )
        return 2
    from gymllm.cli.guard import guarded

    return guarded(lambda: commands[argv[0]](argv[1:]))


if __name__ == "__main__":
    sys.exit(main())
