"""gymllm.suites: benchmark suites (a TOML file names the envs), their runner, statistics and reports.

    from gymllm.suites import load_suite, run_suite, PolicySpec
    suite = load_suite("core")                       # a shipped suite, or a path to a TOML file
    summary = run_suite(suite, [PolicySpec(label="base", loaded=model)], "out/core")

See :mod:`gymllm.suites.spec` (the file), :mod:`~gymllm.suites.resolve` (env ids, including
``module:EnvId-v0`` and ``module:factory``), :mod:`~gymllm.suites.runner` (one engine per policy,
every env in flight), :mod:`~gymllm.suites.results` (rows, resume, summary),
:mod:`~gymllm.suites.stats` (pass@k, bootstrap intervals, paired comparisons),
:mod:`~gymllm.suites.report` (report.md, plots) and :mod:`~gymllm.suites.mixture` (training on a
suite's mixture: sampler, curriculum, per-env metrics); :mod:`~gymllm.suites.games` plays two-player
games between models, checkpoints and scripted opponents (win/draw/loss, Elo ratings).
"""

from __future__ import annotations

from gymllm._lazy import lazy_exports, lazy_table

_LAZY = lazy_table(
    __name__,
    {
        ".spec": (
            "Suite",
            "SuiteEnv",
            "SuiteError",
            "load_suite",
            "parse_suite",
            "one_off_suite",
            "shipped_suites",
        ),
        "gymllm.registration": ("resolve_env_id",),
        ".runner": ("PolicySpec", "RunnerConfig", "run_suite"),
        ".results": ("ResultsFile", "summarize"),
        ".stats": ("pass_at_k", "pass_at_curve", "bootstrap_ci", "paired_comparison"),
        ".report": ("write_report",),
        ".mixture": ("MixtureSampler", "learnability_weights", "EnvMetrics"),
        ".games": ("Player", "MatchConfig", "run_matches"),
    },
)

__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
