"""One training run: the one training loop, which pulls finished GRPO groups from a
:class:`~gymllm.rollout.sources.GroupSource` and trains on them (train, push, advance, log, checkpoint).

    run = Run(cfg)                        # cfg: a TrainConfig
    run.setup(LocalComponents())          # or gymllm.train.cluster.RayComponents(cfg.cluster)
    counts = await run.train()            # the source of the run's kind, or run.train(my_source)
    await run.close()

The parts come from a :class:`~gymllm.train.components.Components` (:func:`~gymllm.train.components.build_parts`):
:class:`~gymllm.train.components.LocalComponents` keeps everything in this process;
:class:`gymllm.train.cluster.RayComponents` puts env workers, engine replicas and (optionally) learner
hosts on Ray actors behind the same interfaces. The run does not know which it drives, nor where its
groups come from: the kind of run (:data:`gymllm.train.assembly.KINDS`: agent programs, several
policies, game seats, the sync baseline, a suite mixture, one env) gives its envs and its source, and
:meth:`Run.train` takes any other source.

The run's state is kept in small parts with one job each: ``parts`` (the built components,
:class:`~gymllm.train.components.RunParts`), ``resume`` (:class:`~gymllm.train.resume.ResumeState`),
``log`` (the step records and their timing, :class:`~gymllm.train.step_log.StepLog`), ``heldout``
(in-run evaluation, :class:`~gymllm.train.heldout.HeldOutHook`), ``best`` (a game run's best in-run
checkpoint with ``multiagent.eval_keep_best``, :class:`~gymllm.train.best.BestCheckpoint`, else None), ``profiler``, ``listeners``, the
stage ``watchdog`` and ``compiles`` (every XLA compile from setup to close,
:class:`~gymllm.telemetry.compiles.CompileLog`: ``run_dir/compiles.jsonl``, spans on the trace's
"compile" track, ``compile_s`` in each step's record).

Policy versions: after an update's weights are pushed, every listener in ``listeners.versions`` is
told (the group source's ``set_policy_version``, registered when the loop starts); ``listeners.steps``
get every step's metrics record after it is logged (progress hooks, tests that act at a given step);
a step listener may be a coroutine function (awaited in the run's loop).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import pathlib
import time
from typing import Any, Callable, Sequence

from gymllm.train.assembly import SourceContext, kind_named, select_kind
from gymllm.train.best import BestCheckpoint
from gymllm.train.components import Components, LocalComponents, RunParts, build_parts
from gymllm.train.wiring import watchdog_config
from gymllm.train.heldout import HeldOutHook, check_heldout_seeds
from gymllm.train.resume import ResumeState, make_group_filter
from gymllm.train.step_log import RolloutTally, StepLog
from gymllm.train.train_config import TrainConfig
from gymllm.errors import GymLLMError, explain
from gymllm.rollout.group_queue import QueueClosed
from gymllm.rollout.sources import GroupSource, GroupSourceError
from gymllm.telemetry.compiles import CompileLog
from gymllm.telemetry.sinks import ProfileWindow
from gymllm.telemetry.watchdog import Watchdog

__all__ = ["Run", "Listeners", "LearnerStepError"]

log = logging.getLogger("gymllm.algos")


class LearnerStepError(GymLLMError, RuntimeError):
    """A learner step raised: the run stops (the learner may be half-updated, so it is never saved or
    retried); the last checkpoint (``last_checkpoint``, None if none) stays the resume point."""

    def __init__(
        self, step: int, group_ids: list[str], cause: BaseException, last_checkpoint: int | None
    ):
        super().__init__(
            explain(
                f"learner step {step} (groups {', '.join(group_ids)})",
                expected="an update",
                received=f"{type(cause).__name__}: {cause}",
                fix="fix the cause above and run again: "
                f"it resumes from the last checkpoint (step {last_checkpoint}), which this failure "
                "did not touch"
                if last_checkpoint
                else "fix the cause above and run again (no "
                "checkpoint yet: set run.checkpoint_every to keep progress)",
            )
        )
        self.step, self.group_ids, self.cause, self.last_checkpoint = (
            step,
            group_ids,
            cause,
            last_checkpoint,
        )


class Listeners:
    """Who hears of the run's progress: ``versions`` (called with each policy version live on the
    engine) and ``steps`` (called with each step's record once logged; awaited if it returns an awaitable)."""

    def __init__(self, steps: Sequence[Callable[[dict[str, Any]], Any]] = ()):
        self.versions: list[Callable[[int], None]] = []
        self.steps: list[Callable[[dict[str, Any]], Any]] = list(steps)

    def version(self, version: int) -> None:
        for listener in self.versions:
            listener(version)

    async def step(self, record: dict[str, Any]) -> None:
        for listener in self.steps:
            out = listener(record)
            if inspect.isawaitable(out):
                await out


class Run:
    """The state of one ``train`` call and the one training loop (see the module docstring).

    ``max_steps``: stop after that many optimizer steps in this run (the run's step count stays
    ``learner.num_steps``). ``on_step``: callables given each step's metrics record (``{"step": k, ...}``)
    after it is logged, in the run's event loop (awaited when it returns an awaitable)."""

    def __init__(
        self,
        cfg: TrainConfig,
        max_steps: int | None = None,
        *,
        on_step: Sequence[Callable[[dict[str, Any]], None]] = (),
    ):
        self.cfg, self.max_steps, self.steps_here = cfg, max_steps, 0
        self.run_dir = pathlib.Path(cfg.run.run_dir)
        self.log = StepLog(
            RolloutTally(check_heldout_seeds(cfg))
        )  # every completed group since the last step
        self.heldout = HeldOutHook(cfg)
        self.best = BestCheckpoint.for_run(cfg)  # checks its settings before any model loads
        self.profiler = ProfileWindow(self.run_dir / "profile", None)  # setup: run.profile_steps
        self.resume: ResumeState | None = None
        self.listeners = Listeners(on_step)
        self.components: Components | None = None
        self.parts: RunParts | None = None  # setup
        self.source: GroupSource | None = None  # while the loop runs
        self.watchdog = Watchdog(watchdog_config(cfg))  # started by setup, stopped by close
        self.compiles = CompileLog(
            self.run_dir / "compiles.jsonl"
        )  # started by setup, stopped by close

    @property
    def learner(self) -> Any:
        return self.parts.learner

    @property
    def history(self) -> list[dict[str, Any]]:
        """Every step's metrics record so far."""
        return self.log.history

    @property
    def evals(self) -> list[dict[str, Any]]:
        """Every held-out evaluation row so far."""
        return self.heldout.evals

    def done(self) -> bool:
        return self.parts.learner.version >= self.cfg.learner.num_steps or (
            self.max_steps is not None and self.steps_here >= self.max_steps
        )

    def setup(self, components: Components | None = None) -> None:
        """Build the parts with ``components`` (default :class:`LocalComponents`), restore the latest
        checkpoint if ``run.resume``, and open the run directory's logs."""
        from gymllm.telemetry.sinks import parse_step_window

        cfg = self.cfg
        self.components = components if components is not None else LocalComponents()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.json").write_text(cfg.to_json())
        self.log.compiles = self.compiles.start()  # model load and warm-up compiles count too
        try:
            self.parts, self.resume = build_parts(cfg, self.components, select_kind(cfg))
        except (
            BaseException
        ):  # no close() follows a failed setup: the process-wide log must not stay active
            self.compiles.stop()
            raise
        if (
            cfg.run.resume
        ):  # a killed run's records past the restored checkpoint are a lost lineage: set aside
            self.resume.rewind_logs(self.run_dir)
        self.log.open(self.run_dir, cfg, self.parts.tok)
        self.profiler = ProfileWindow(
            self.run_dir / "profile", parse_step_window(cfg.run.profile_steps)
        )
        self.heldout.open(self.parts.agent, self.parts.tok)
        if self.best is not None:
            self.best.open(self.heldout.evaluator, self.resume.resumed_from)
        if cfg.env.suite and self.parts.envs is not None:
            self.log.extra.append(
                self.parts.envs.flush
            )  # env/<name>/reward, success, groups, weight
        self.watchdog.start()

    def make_source(self, kind: str | None = None) -> GroupSource:
        """The group source of the run's kind (:func:`gymllm.train.assembly.select_kind`; ``kind``: one named
        in :data:`gymllm.train.assembly.KINDS` instead), built from what the run passes it: the parts, the
        resume state, and the zero-variance filter over every completed group."""
        cfg, resume = self.cfg, self.resume
        chosen = kind_named(kind) if kind is not None else select_kind(cfg)
        keep = make_group_filter(cfg, resume.decided, resume.filtered, self.log.tally)
        return chosen.source(
            SourceContext(
                cfg=cfg,
                parts=self.parts,
                resume=resume,
                run_dir=self.run_dir,
                keep=keep,
                tally=self.log.tally,
                add_metrics=self.log.extra.append,
            )
        )

    async def train(self, source: GroupSource | None = None) -> dict[str, Any]:
        """The one training loop: take complete groups from ``source`` (default :meth:`make_source`)
        and :meth:`consume` them until the run is done or the source ends; returns the source's
        ``result()``. The source is started after the step-0 evaluation and closed however this ends."""
        self.source = source = source if source is not None else self.make_source()
        self.listeners.versions.append(source.set_policy_version)
        try:
            await (
                self.begin()
            )  # step 1's wall time starts with the rollouts, not the setup or the evaluation
            await source.start()
            self.log.restart_clock()
            while not self.done():
                t = time.perf_counter()
                try:
                    with self.watchdog.stage("rollout", source.waiting_for):
                        batch = await source.next_groups()
                except QueueClosed as e:
                    if not self.done():
                        log.warning(
                            "%s: the run stops at step %d of %d",
                            e,
                            self.parts.learner.version,
                            self.cfg.learner.num_steps,
                        )
                    break
                except GymLLMError:
                    raise
                except Exception as e:
                    raise GroupSourceError(source.name, e) from e
                self.log.wait_s += time.perf_counter() - t
                await self.consume(batch)
        finally:
            await source.close()
        return source.result()

    async def evaluate(self, step: int) -> dict[str, float]:
        """Held-out evaluation on the run's engine at policy ``step``; its time is left out of the step's wall."""
        with self.watchdog.stage("rollout", f"held-out evaluation at step {step}"):
            out = await self.heldout.evaluate(self.parts.engine, step)
        self.log.t_step += out["eval_s"]
        if self.best is not None:  # the policy just evaluated is the learner's current weights
            with self.watchdog.stage("checkpoint", f"keep the best in-run policy (step {step})"):
                self.best.offer(step, self.heldout.last_rows, self.parts.learner)
        return out

    async def begin(self) -> None:
        """Before any rollout: the held-out evaluation at the starting policy (a fresh run's step 0; a
        resumed run evaluated that step before it stopped) and the profile window's start at step 1."""
        version = self.parts.learner.version
        if self.heldout.active and self.resume.resumed_from is None:
            self.log.logger.log(version, {**await self.evaluate(version), "pipeline": {}})
        self.profiler.after_step(version)
        self.log.restart_clock()

    def save(self) -> None:
        learner = self.parts.learner
        with self.watchdog.stage("checkpoint", f"save step {learner.version}"):
            self.parts.ckpt.save(learner.version, learner, extra=self.resume.checkpoint_extra())

    async def consume(self, groups: list[Any]) -> None:
        """Train on complete groups (in a worker thread, so rollouts keep running) and handle the
        updates they complete: push weights, advance the policy version, log, checkpoint.

        Groups go to the learner one step's worth at a time (oldest version first), so a finished
        update is pushed and admits new groups (the staleness bound counts versions) before the
        groups of the next step are trained, not after."""
        learner = self.parts.learner
        fresh = [g for g in groups if g.group_id not in learner.consumed_groups]
        learner.counts["resume_skipped"] += len(groups) - len(fresh)
        gps = (
            self.cfg.learner.groups_per_step
        )  # never train past num_steps: take only the groups still needed
        fresh.sort(key=lambda g: (g.min_version, g.admitted_version))
        fresh = fresh[
            : max(0, (self.cfg.learner.num_steps - learner.version) * gps - learner.groups_in_step)
        ]
        loop = asyncio.get_running_loop()
        while fresh:
            n = max(1, gps - learner.groups_in_step)  # the groups that complete the current step
            chunk, fresh = fresh[:n], fresh[n:]
            self.log.add_trained(chunk)
            try:  # a step that raised may have half-updated the learner: stop, never save or retry it
                with self.watchdog.stage(
                    "learner", f"step {learner.version + 1}: training {len(chunk)} group(s)"
                ):
                    reps = await loop.run_in_executor(self.parts.pool, learner.submit, chunk)
            except Exception as e:
                raise LearnerStepError(
                    learner.version + 1,
                    [g.group_id for g in chunk],
                    e,
                    self.parts.ckpt.latest_step(),
                ) from e
            for rep in reps:
                await self.finish_step(rep)

    async def finish_step(self, rep: Any) -> None:
        """Push the update's weights, advance the policy version, log, checkpoint."""
        p = self.parts
        with self.watchdog.stage("weight_sync", f"push weights of step {rep.step}"):
            sync_s = await asyncio.get_running_loop().run_in_executor(
                p.pool, p.pusher.push, p.learner.policy_params(), rep.step
            )
        self.listeners.version(rep.step)
        self.steps_here += 1
        if self.heldout.due(rep.step, last=self.done()):  # at the policy just pushed
            self.log.pending_eval = await self.evaluate(rep.step)
        stats = self.source.stats() if self.source is not None else {}
        record = self.log.record(
            rep, sync_s, stats, len(self.resume.filtered) if self.resume else 0
        )
        self.profiler.after_step(rep.step)
        every = self.cfg.run.checkpoint_every
        if every and rep.step % every == 0:
            self.save()
        await self.listeners.step(record)
        self.log.restart_step()

    async def close(self) -> None:
        """Stop the learner thread, the engine and the envs, close the logs, then the components."""
        try:
            p = self.parts
            p.pool.shutdown(wait=True)
            self.profiler.close(p.learner.version)
            self.heldout.close()
            await p.engine.close()
            aclose = getattr(
                p.learner, "aclose", None
            )  # engines a learner built (several policies)
            if aclose is not None:
                await aclose()
            close = getattr(p.envs, "close", None)
            if close is not None:
                close()
            self.log.close()
            p.ckpt.close()
        finally:
            self.watchdog.stop()
            self.compiles.stop()
            if self.components is not None:
                self.components.close()
