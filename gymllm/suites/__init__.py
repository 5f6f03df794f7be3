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

from gymllm._lazy import lazy_exports

_LAZY = {
    "Suite": "gymllm.suites.spec",
    "SuiteEnv": "gymllm.suites.spec",
    "SuiteError": "gymllm.suites.spec",
    "load_suite": "gymllm.suites.spec",
    "parse_suite": "gymllm.suites.spec",
    "one_off_suite": "gymllm.suites.spec",
    "shipped_suites": "gymllm.suites.spec",
    "resolve_env_id": "gymllm.registration",
    "PolicySpec": "gymllm.suites.runner",
    "RunnerConfig": "gymllm.suites.runner",
    "run_suite": "gymllm.suites.runner",
    "ResultsFile": "gymllm.suites.results",
    "summarize": "gymllm.suites.results",
    "pass_at_k": "gymllm.suites.stats",
    "pass_at_curve": "gymllm.suites.stats",
    "bootstrap_ci": "gymllm.suites.stats",
    "paired_comparison": "gymllm.suites.stats",
    "write_report": "gymllm.suites.report",
    "MixtureSampler": "gymllm.suites.mixture",
    "learnability_weights": "gymllm.suites.mixture",
    "EnvMetrics": "gymllm.suites.mixture",
    "Player": "gymllm.suites.games",
    "MatchConfig": "gymllm.suites.games",
    "run_matches": "gymllm.suites.games",
}

__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
