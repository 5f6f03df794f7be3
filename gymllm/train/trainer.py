"""The trainer entry point: ``train(TrainConfig) -> TrainResult`` (what ``gymllm train`` calls).

    from gymllm.train.train_config import preset
    from gymllm.train.trainer import train
    result = train(preset("tiny"))            # tiny model on TinyRepeat-v0: reward rises in ~1-2 min
    print(result.summary())

Wiring (barrier-free): a :class:`~gymllm.inference.JaxEngine` samples for a
:class:`~gymllm.rollout.RolloutOrchestrator` over a barrier-free vector env; complete groups stream
into the :class:`~gymllm.algos.learner.StreamingLearner`, which trains in a worker thread while
rollouts continue; after each update the new weights are pushed to the engine (versioned, between
decode steps) and the orchestrator's policy version advances (admission bounds staleness by eta).

The run directory gets: ``config.json``; ``metrics.jsonl`` (one object per optimizer step: ``step``,
``reward_mean`` (trained groups), ``rollout_reward_mean`` (every completed rollout, filtered groups
included), ``tool_calls_per_episode`` / ``tool_call_share``, tokens/s, engine busy, trainer idle,
staleness, clip fraction, KL, entropy, lengths, weight-sync time ...; with ``eval.every`` also
``eval/<env>/pass@1`` and ``eval/<env>/mean_reward`` at step 0, every N steps and the last);
``profile/`` (with ``run.profile_steps``: the op-level ``jax.profiler`` trace); ``tensorboard/``; ``trajectories.jsonl`` (every trained trajectory: ids,
reward, decoded response, versions); ``trace.json`` (open in ui.perfetto.dev); ``checkpoints/``
(Orbax); ``reward.png`` and the other report plots.

Cluster: with ``cluster.backend="ray"`` the same run is assembled from Ray actors (env workers,
engine replicas behind one pool, optionally learner hosts; see :mod:`gymllm.train.cluster`); the
driver keeps the orchestrator, the run directory, checkpoints and telemetry.

Layout: the configs and presets live in :mod:`gymllm.train.train_config` (the values two components
share are wired in :mod:`gymllm.train.wiring`), the one training loop in :mod:`gymllm.train.run` (its parts
in :mod:`~gymllm.train.components`, :mod:`~gymllm.train.resume`, :mod:`~gymllm.train.step_log` and
:mod:`~gymllm.train.heldout`; where its groups come from in :mod:`gymllm.rollout.sources`), the Ray
wiring in :mod:`gymllm.train.cluster`; this module holds :func:`train` and :class:`TrainResult` and
re-exports the config names.

Resume: with ``run.resume`` (default) a run directory holding checkpoints continues from the latest
one: weights, optimizer state, step, RNG and the ids of every consumed group are restored; the
rollout replays its deterministic group sequence and groups already consumed are skipped without
generating (never trained twice), so with ``eta = 0`` a resumed run equals an uninterrupted one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import pathlib
import time
from typing import Any, Callable, Sequence

import numpy as np

from gymllm.train.components import Components, LocalComponents
from gymllm.train.run import Run
from gymllm.train.train_config import TrainConfig

__all__ = ["train", "TrainResult"]


@dataclasses.dataclass
class TrainResult:
    run_dir: pathlib.Path
    steps: int
    history: list[dict[str, Any]]
    trained_ids: list[list[str]]
    wall_s: float
    resumed_from: int | None = None
    counts: dict[str, Any] = dataclasses.field(default_factory=dict)
    evals: list[dict[str, Any]] = dataclasses.field(
        default_factory=list
    )  # held-out rows, with "step"
    profile_dir: pathlib.Path | None = (
        None  # the jax.profiler trace of run.profile_steps, when written
    )
    profile_steps: tuple[int, int] | None = None  # the optimizer steps that trace covers
    compiles: dict[str, Any] = dataclasses.field(
        default_factory=dict
    )  # telemetry.compiles.summarize of the run

    def rewards(self) -> list[float]:
        """The trained groups' mean reward per step (``reward_mean``; filtered groups left out)."""
        return [float(h["reward_mean"]) for h in self.history]

    def figure(self, key: str) -> list[float]:
        """``key`` of every step record that has it (e.g. ``rollout_reward_mean``, ``tool_call_share``)."""
        return [float(h[key]) for h in self.history if h.get(key) is not None]

    def summary(self) -> str:
        """What the run did: the reward over every completed rollout (filtered groups included) and the
        trained groups' reward, first 3 vs last 3 steps; tool use; held-out figures before and after
        training; what the run compiled (``compile: ...``); where the op-level profile is."""

        def span(values: list[float], fmt: str = "{:.3f}") -> str:
            if not values:
                return "n/a"
            return f"{fmt.format(np.mean(values[:3]))} -> {fmt.format(np.mean(values[-3:]))}"

        every = self.figure("rollout_reward_mean")
        lines = [
            f"trained {self.steps} steps in {self.wall_s:.1f}s; reward over every rollout {span(every)} "
            f"(first 3 steps -> last 3), trained groups {span(self.rewards())}; run dir {self.run_dir}"
        ]
        calls, share = self.figure("tool_calls_per_episode"), self.figure("tool_call_share")
        if calls:
            lines.append(
                f"tool calls per episode {span(calls, '{:.2f}')}; episodes with a tool call "
                f"{span([100 * x for x in share], '{:.1f}%')} (every rollout, first 3 steps -> last 3)"
            )
        for opp in dict.fromkeys(
            r["opponent"] for r in self.evals if "opponent" in r
        ):  # a game's learning curve
            rows = sorted(
                (r for r in self.evals if r.get("opponent") == opp), key=lambda r: r["step"]
            )
            a, b = rows[0], rows[-1]
            lines.append(
                f"against {opp} ({a['games']} games, eval/vs/{opp}/...): win-or-draw {a['win_or_draw']:.3f} "
                f"(step {a['step']}) -> {b['win_or_draw']:.3f} (step {b['step']}); mean reward "
                f"{a['reward']:.3f} -> {b['reward']:.3f}"
            )
        for env in dict.fromkeys(r["env"] for r in self.evals if "env" in r):
            rows = sorted((r for r in self.evals if r["env"] == env), key=lambda r: r["step"])
            a, b = rows[0], rows[-1]
            seeds = a.get("seeds") or [0]
            lines.append(
                f"held-out {env} ({a['episodes']} episodes, seeds {min(seeds)}..{max(seeds)}): pass@1 "
                f"{a['pass@1']:.3f} (step {a['step']}) -> {b['pass@1']:.3f} (step {b['step']}); mean reward "
                f"{a['mean_reward']:.3f} -> {b['mean_reward']:.3f}; tool calls per episode "
                f"{a['tool_calls_per_episode']:.2f} -> {b['tool_calls_per_episode']:.2f}"
                + "".join(
                    f"; {name} {a[k]:.3f} -> {b[k]:.3f}"
                    for k, name in (
                        ("valid_action_rate", "valid-action (legal-move) rate"),
                        ("win_or_draw", "win-or-draw"),
                    )
                    if k in a and k in b
                )
            )
        if self.compiles:
            from gymllm.telemetry.compiles import summary_line

            lines.append(summary_line(self.compiles))
        if self.profile_dir is not None:
            lo, hi = self.profile_steps or (0, 0)
            lines.append(
                f"op-level profile of steps {lo}..{hi}: {self.profile_dir} (tensorboard --logdir "
                f"{self.profile_dir} with the profile plugin, or xprof; the .trace.json.gz opens in ui.perfetto.dev)"
            )
        return "\n".join(lines)


def components_for(cfg: TrainConfig) -> Components:
    """:class:`~gymllm.train.components.LocalComponents` for ``cluster.backend="none"`` (Ray never imported),
    else :class:`gymllm.train.cluster.RayComponents` (connects to or starts Ray)."""
    if not cfg.cluster.distributed:
        return LocalComponents()
    from gymllm.train.cluster import RayComponents

    return RayComponents(cfg.cluster)


def train(
    config: TrainConfig,
    *,
    max_steps: int | None = None,
    on_step: Sequence[Callable[[dict[str, Any]], None]] = (),
    components: Components | None = None,
) -> TrainResult:
    """Run (or resume) the training run ``config`` describes; see the module docstring.

    ``max_steps`` stops after that many optimizer steps *in this call* (to simulate a kill in tests;
    the run's step count is still ``learner.num_steps``). ``on_step``: callables given each step's
    metrics record (``{"step": k, "reward_mean": ..., ...}``) once it is logged. ``components``: the
    parts to assemble the run from (default :func:`components_for` the config; closed at the end)."""
    from gymllm.utils.backend_start import start_backend
    from gymllm.utils.compile_cache import persistent_compile_cache
    from gymllm.utils.host_memory import keep_freed_memory

    keep_freed_memory()  # XLA:CPU's per-call buffers stop page-faulting (about a quarter of a tiny step's CPU)
    cfg = config
    with persistent_compile_cache(cfg.run.compile_cache):  # a rerun loads its compiled programs
        start_backend()  # an accelerator's runtime starts while the host reads the model and envs
        return asyncio.run(
            _train(
                cfg,
                max_steps,
                on_step,
                components if components is not None else components_for(cfg),
            )
        )


async def _train(
    cfg: TrainConfig,
    max_steps: int | None,
    on_step: Sequence[Callable[[dict[str, Any]], None]],
    components: Components,
) -> TrainResult:
    t_start = time.perf_counter()
    run = Run(cfg, max_steps, on_step=on_step)
    try:
        run.setup(components)
    except BaseException:
        components.close()
        raise
    try:
        counts = await run.train()
        if run.learner.version and run.parts.ckpt.latest_step() != run.learner.version:
            run.save()
    finally:
        await run.close()
    if cfg.run.report and run.history:
        try:
            from gymllm.telemetry.report import write_report

            write_report(run.run_dir)
        except Exception as e:  # the run's data is saved; a plotting problem must not lose it
            (run.run_dir / "report_error.txt").write_text(repr(e))
    return TrainResult(
        run_dir=run.run_dir,
        steps=run.learner.version,
        history=run.log.history,
        trained_ids=run.log.trained_ids,
        wall_s=time.perf_counter() - t_start,
        resumed_from=run.resume.resumed_from,
        evals=list(run.heldout.evals),
        profile_dir=run.profiler.logdir if run.profiler.captured else None,
        profile_steps=run.profiler.captured,
        compiles=run.compiles.summary(),
        counts={**dict(run.learner.counts), "filtered_rollout": len(run.resume.filtered), **counts},
    )
