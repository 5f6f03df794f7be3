"""One training run, assembled from components: the learner, the engine, the vector env and the
orchestrator that joins them, plus the per-step handling (train, push, advance, log, checkpoint).

    run = Run(cfg)                        # cfg: an effective TrainConfig (see train_config.effective)
    run.setup(LocalComponents())          # or gymllm.algos.cluster.RayComponents(cfg.cluster)
    counts = await run.run_async()        # or run.run_sync() (the synchronous baseline)
    await run.close()

A :class:`Components` builds the parts: :class:`LocalComponents` keeps everything in this process
(a :class:`~gymllm.inference.JaxEngine`, an in-process vector env, a
:class:`~gymllm.algos.learner.StreamingLearner`); :class:`gymllm.algos.cluster.RayComponents` puts
env workers, engine replicas and (optionally) learner hosts on Ray actors behind the same interfaces.
The run itself does not know which it drives.

Policy versions: after an update's weights are pushed, :meth:`Run.set_version` tells every listener
in ``version_listeners`` (the orchestrator's admission control, registered when the run starts
streaming); ``step_listeners`` get every step's metrics record after it is logged (progress hooks,
tests that act at a given step); a listener may be a coroutine function (awaited in the run's loop).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import inspect
import json
import pathlib
import time
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from gymllm.algos.train_config import ModelSection, TrainConfig
from gymllm.errors import ConfigError, GymLLMError, explain
from gymllm.telemetry.sinks import ProfileWindow
from gymllm.telemetry.watchdog import Watchdog, WatchdogConfig

__all__ = ["Run", "Components", "LocalComponents", "LearnerStepError", "AgentPrograms", "AgentProgramError",
           "load_model", "mask_spans", "RolloutTally", "training_seed_bound", "check_heldout_seeds"]


def load_model(m: ModelSection) -> Any:
    """The :class:`~gymllm.models.LoadedModel` of ``m`` (a random tiny one for ``tiny-<family>``), with
    the trained weights of ``m.checkpoint`` when it is set (warm start)."""
    from gymllm import models

    if m.is_tiny:
        loaded = models.make_tiny(m.name[len("tiny-"):], seed=m.seed, vocab_size=m.vocab_size,
                                  hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
                                  num_layers=m.num_layers, num_heads=m.num_heads, num_kv_heads=m.num_kv_heads)
    else:
        loaded = models.load(m.name)
    if m.checkpoint:
        from gymllm.algos.checkpoint import restore_model_weights

        loaded = dataclasses.replace(loaded, model=restore_model_weights(loaded.model, m.checkpoint),
                                     source=f"{loaded.source} + {m.checkpoint}")
    return loaded


class _SkipConsumed:
    """Engine wrapper for resume: trajectories of groups consumed before the checkpoint get an empty
    completion (one stop token, no compute) so the deterministic group sequence is replayed without
    generating it again; the learner then skips those groups."""

    def __init__(self, engine: Any, skip: set[str], stop_id: int):
        self.engine, self.skip, self.stop_id = engine, skip, stop_id

    @property
    def version(self) -> int:
        return self.engine.version

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    async def generate(self, prompt_ids, params, *, session_id=None):
        gid = (session_id or "").split("/")[0]
        if gid in self.skip:
            from gymllm.inference.completion import Completion

            return Completion(token_ids=[self.stop_id], logprobs=[0.0], finish_reason="stop",
                              versions=[self.engine.version], prompt_len=len(prompt_ids))
        return await self.engine.generate(prompt_ids, params, session_id=session_id)


class RolloutTally:
    """Figures over every completed rollout (filtered groups included) since the last step: the
    honest progress of a run, beside the trained groups' ``reward_mean``. :meth:`add` each group as
    it completes; :meth:`pop` the step metrics ``rollout_reward_mean``, ``rollout_groups``,
    ``rollout_episodes``, ``tool_calls_per_episode`` and ``tool_call_share`` (episodes with at least
    one tool call), and the env-side figures of :func:`~gymllm.rollout.evaluation.episode_figures`
    (``valid_action_rate``; ``win_or_draw``, ``outcome/<result>`` for games). ``seeds``: every env seed a training group used (the whole run). ``heldout``: env
    seeds training must never use (the evaluation's): a group on one raises :class:`ConfigError`."""

    def __init__(self, heldout: range | None = None):
        self.heldout = heldout
        self.seeds: set[int] = set()
        self.rewards: list[float] = []  # per group: its mean reward
        self.tool_calls: list[int] = []  # per episode
        self.episodes: list[Any] = []  # row 0 of each episode (its info: env steps, invalid replies, outcome)
        self.totals = {"episodes": 0, "with_tool_call": 0, "tool_calls": 0}

    def add(self, group: Any) -> None:
        from gymllm.rollout.evaluation import group_episodes, group_tool_calls

        seeds = {int(t.seed) for t in group.trajectories if t.seed is not None}
        bad = sorted(x for x in seeds if self.heldout is not None and x in self.heldout)
        if bad:
            raise ConfigError(explain(f"training group {group.group_id}", expected="an env seed outside the held-out "
                                      f"seeds {self.heldout.start}..{self.heldout.stop - 1}", received=bad, fix=
                                      "raise --eval.seed-base above every seed training reaches (run.seed + the "
                                      "groups it admits)"))
        self.seeds |= seeds
        self.rewards.append(float(np.mean(group.rewards)))
        calls = group_tool_calls(group)
        self.tool_calls += calls
        self.episodes += group_episodes(group)
        self.totals["episodes"] += len(calls)
        self.totals["with_tool_call"] += sum(c > 0 for c in calls)
        self.totals["tool_calls"] += sum(calls)

    def pop(self) -> dict[str, float]:
        from gymllm.rollout.evaluation import episode_figures

        out: dict[str, float] = {}
        if self.rewards:
            out.update(rollout_reward_mean=float(np.mean(self.rewards)), rollout_groups=len(self.rewards))
        if self.tool_calls:
            calls = np.asarray(self.tool_calls, np.float64)
            out.update(rollout_episodes=int(calls.size), tool_calls_per_episode=float(calls.mean()),
                       tool_call_share=float((calls > 0).mean()))
        out.update(episode_figures(self.episodes))
        self.rewards.clear()
        self.tool_calls.clear()
        self.episodes.clear()
        return out


def training_seed_bound(cfg: TrainConfig) -> int:
    """How many env seeds (``run.seed`` upwards) training reaches unless groups go stale or fail:
    ``num_steps * groups_per_step`` trained groups, up to ``patience - 1`` zero-variance groups filtered
    before each kept one (:func:`_group_filter` keeps the ``patience``-th), plus the groups still open
    or queued when the run stops. Stale-dropped and failed groups have no static bound: the run checks
    each group's seed as it completes (:class:`RolloutTally`)."""
    gps = cfg.learner.groups_per_step
    patience = max(8, 4 * gps) if cfg.loss.shaping.filter_zero_variance else 1
    open_groups = 2 * -(-cfg.rollout.max_concurrency // cfg.rollout.group_size) + 1
    return cfg.learner.num_steps * gps * patience + open_groups + max(8, 2 * gps)


def check_heldout_seeds(cfg: TrainConfig) -> range | None:
    """The held-out seeds (``eval.seed_base ..``), after checking that they cannot meet a training seed
    (:func:`training_seed_bound`); None when evaluation is off. Raises :class:`ConfigError`."""
    e = cfg.eval
    if not e.every:
        return None
    if cfg.rollout.mode == "proxy":
        raise ConfigError(explain("eval.every", expected="0 with rollout.mode='proxy' (the agent program picks its own "
                                  "tasks, so held-out seeds cannot be checked)", received=e.every,
                                  fix="evaluate the run directory afterwards: gymllm eval ENV --checkpoint RUN_DIR"))
    heldout = range(e.seed_base, e.seed_base + e.seeds)
    train = range(cfg.run.seed, cfg.run.seed + training_seed_bound(cfg))
    if heldout.start < train.stop and train.start < heldout.stop:
        raise ConfigError(explain("eval.seed_base", expected=f"held-out seeds disjoint from the training seeds "
                                  f"{train.start}..{train.stop - 1} (run.seed + up to {len(train)} groups)",
                                  received=f"seeds {heldout.start}..{heldout.stop - 1}", fix=f"--eval.seed-base "
                                  f"{max(1_000_000, train.stop)} (or fewer steps / a lower run.seed)"))
    return heldout


def _group_filter(cfg: TrainConfig, decided: dict[str, bool], filtered: set[str], seen: RolloutTally | None = None):
    """Drop groups whose (overlong-shaped) rewards are all equal, if the loss asks; replayed groups
    keep the decision recorded before the checkpoint (so admission accounting matches).

    A task the policy always fails (or always solves) would filter every group and the run would
    never take a step: after ``patience`` filtered groups in a row the next one is kept (marked
    ``info["kept_zero_variance"]``; its advantages are zero, so it moves no weights) and the run says so.
    ``seen`` tallies every newly decided group, filtered or not (the unbiased ``rollout_reward_mean``
    and the tool-call figures of the step metrics; it also rejects a held-out seed).
    """
    import logging

    from gymllm.algos.shaping import nonzero_variance, overlong_penalty

    sh = cfg.loss.shaping
    patience = max(8, 4 * cfg.learner.groups_per_step)
    streak = [0]

    def keep(group) -> bool:
        if group.group_id in decided:
            return decided[group.group_id]
        if seen is not None:
            seen.add(group)
        if not sh.filter_zero_variance:
            return True
        r = group.rewards
        if sh.overlong_buffer:
            lengths = np.array([t.num_sampled for t in group.trajectories])
            r = r + np.asarray(overlong_penalty(lengths, max_len=sh.overlong_max_len or cfg.sampling.max_tokens,
                                                buffer=sh.overlong_buffer))
        ok = bool(nonzero_variance(r[None])[0])
        if ok:
            streak[0] = 0
            return True
        streak[0] += 1
        if streak[0] >= patience:
            streak[0] = 0
            group.info["kept_zero_variance"] = True
            logging.getLogger("gymllm.algos").warning(
                "%d groups in a row had equal rewards (%.3g): keeping one so the run still steps; "
                "the task may be too hard or too easy for this policy", patience, float(r[0]))
            return True
        filtered.add(group.group_id)
        return False

    return keep


def _trajectory_records(step: int, groups: list[Any], tokenizer: Any) -> list[dict[str, Any]]:
    out = []
    for g in groups:
        for t in g.trajectories:
            m = np.asarray(t.loss_mask, bool)
            out.append({"step": step, "group_id": g.group_id, "trajectory_id": t.trajectory_id, "task_id": t.task_id,
                        "reward": float(t.reward), "finish_reason": t.finish_reason, "num_tokens": len(t.token_ids),
                        "num_sampled": int(m.sum()), "versions": sorted({int(v) for v in np.asarray(t.versions)[m]}),
                        "response": tokenizer.decode([int(i) for i in np.asarray(t.token_ids)[m]]),
                        "token_ids": [int(i) for i in np.asarray(t.token_ids)], "sampled_spans": mask_spans(m)})
    return out


def mask_spans(mask: np.ndarray) -> list[list[int]]:
    """``[[start, end), ...]`` of the True runs of a 1-D bool mask (the sampled tokens of a trajectory)."""
    m = np.concatenate([[False], np.asarray(mask, bool), [False]]).astype(np.int8)
    edges = np.flatnonzero(np.diff(m))
    return [[int(a), int(b)] for a, b in zip(edges[::2], edges[1::2])]




class Components(Protocol):
    """What a :class:`Run` is assembled from. Each method builds one part for the (effective) config;
    ``close`` releases whatever the components started (actors, a Ray connection)."""

    def make_learner(self, cfg: TrainConfig, lm: Any) -> Any:
        """The learner: ``submit``, ``policy_params``, ``version``, ``consumed_groups``, ``counts``,
        ``groups_in_step``, ``warmup`` (a StreamingLearner or an object with its interface)."""

    def make_checkpointer(self, cfg: TrainConfig, learner: Any) -> Any:
        """``save(step, learner, extra=)``, ``restore_latest(learner)``, ``latest_step()``, ``close()``."""

    def make_engine(self, cfg: TrainConfig, lm: Any, version: int) -> Any:
        """An Engine (see :mod:`gymllm.inference.protocol`) starting at policy ``version``."""

    def make_pusher(self, cfg: TrainConfig, engine: Any, lm: Any, learner: Any) -> Any:
        """``push(flat_params, version) -> seconds``: the learner's weights to the engine."""

    def make_envs(self, cfg: TrainConfig) -> Any:
        """The barrier-free vector env of ``cfg.env.num_envs`` sub-envs."""

    def close(self) -> None: ...


class LocalComponents:
    """Every part in this process: what ``train`` uses with ``cluster.backend="none"``."""

    def __init__(self) -> None:
        self.gather = False

    def make_learner(self, cfg: TrainConfig, lm: Any) -> Any:
        from gymllm.algos.learner import StreamingLearner
        from gymllm.algos.sharding import make_mesh

        mesh = make_mesh(cfg.sharding)
        self.gather = mesh is not None
        return StreamingLearner(lm.config, lm.model.flat_params(), loss=cfg.loss, optimizer=cfg.optimizer,
                                config=cfg.learner, lora=cfg.lora, mesh=mesh, pad_id=int(lm.tokenizer.pad_token_id or 0))

    def make_checkpointer(self, cfg: TrainConfig, learner: Any) -> Any:
        from gymllm.algos.checkpoint import Checkpointer

        return Checkpointer(pathlib.Path(cfg.run.run_dir) / "checkpoints", max_to_keep=cfg.run.keep_checkpoints)

    def make_engine(self, cfg: TrainConfig, lm: Any, version: int) -> Any:
        from gymllm.inference.jax_engine import JaxEngine

        return JaxEngine(lm.model, lm.tokenizer, version=version, config=cfg.engine)

    def make_pusher(self, cfg: TrainConfig, engine: Any, lm: Any, learner: Any) -> Any:
        from gymllm.algos.weight_sync import WeightPusher

        return WeightPusher(engine, lm.config, gather=self.gather)

    def make_envs(self, cfg: TrainConfig) -> Any:
        import gymllm

        return gymllm.make_vec(cfg.env.id, cfg.env.num_envs, **cfg.env.kwargs)

    def close(self) -> None:
        pass


class LearnerStepError(GymLLMError, RuntimeError):
    """A learner step raised: the run stops (the learner may be half-updated, so it is never saved or
    retried); the last checkpoint (``last_checkpoint``, None if none) stays the resume point."""

    def __init__(self, step: int, group_ids: list[str], cause: BaseException, last_checkpoint: int | None):
        super().__init__(explain(f"learner step {step} (groups {', '.join(group_ids)})", expected="an update",
                                 received=f"{type(cause).__name__}: {cause}", fix="fix the cause above and run again: "
                                 f"it resumes from the last checkpoint (step {last_checkpoint}), which this failure "
                                 "did not touch" if last_checkpoint else "fix the cause above and run again (no "
                                 "checkpoint yet: set run.checkpoint_every to keep progress)"))
        self.step, self.group_ids, self.cause, self.last_checkpoint = step, group_ids, cause, last_checkpoint


class AgentProgramError(GymLLMError, RuntimeError):
    """The agent program of a proxy-mode run exited with an error or closed no session in time."""


class AgentPrograms:
    """``processes`` copies of an agent program (a command line, see ``RolloutConfig.agent_program``)
    as subprocesses of this one, each in its own process group, output to ``run_dir/agent_<i>.log``.

    ``start()``; ``await watch(source)`` until a program fails (the source is then closed, so the
    trainer's wait ends) or all exited cleanly; ``raise_error()`` raises what ``watch`` found;
    ``stop()`` terminates them (SIGTERM to the group, then SIGKILL after ``grace_s``) and reaps them."""

    def __init__(self, command: str, *, base_url: str, run_dir: pathlib.Path, processes: int = 1, group_size: int = 1,
                 seed: int = 0, start_timeout_s: float = 300.0, api_key: str = "unused", model: str = "policy",
                 grace_s: float = 5.0, poll_s: float = 0.1):
        self.command, self.base_url, self.run_dir = command, base_url, pathlib.Path(run_dir)
        self.processes, self.group_size, self.seed = processes, group_size, seed
        self.start_timeout_s, self.api_key, self.model = start_timeout_s, api_key, model
        self.grace_s, self.poll_s = grace_s, poll_s
        self.procs: list[Any] = []
        self.logs: list[pathlib.Path] = []
        self.error: str | None = None

    def argv(self, index: int) -> list[str]:
        import shlex
        import sys

        try:
            line = self.command.format(base_url=self.base_url, python=sys.executable, model=self.model,
                                       group_size=self.group_size, seed=self.seed + 1_000_000 * index,
                                       api_key=self.api_key)
        except (KeyError, IndexError, ValueError) as e:
            raise ConfigError(explain("rollout.agent_program", expected="a command line whose {placeholders} are "
                                      "base_url, python, model, group_size, seed, api_key", received=self.command,
                                      fix=f"remove or fix the placeholder ({type(e).__name__}: {e}); write literal "
                                      "braces as {{ }}")) from e
        return shlex.split(line)

    def start(self) -> None:
        import os
        import subprocess

        env = {**os.environ, "OPENAI_BASE_URL": self.base_url, "OPENAI_API_KEY": self.api_key,
               "GYMLLM_PROXY_MODEL": self.model}
        for i in range(self.processes):
            argv = self.argv(i)
            log = self.run_dir / f"agent_{i}.log"
            self.logs.append(log)
            with open(log, "ab") as out:
                try:
                    self.procs.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                                       stderr=subprocess.STDOUT, env=env, start_new_session=True))
                except OSError as e:
                    self.stop()
                    raise AgentProgramError(explain("rollout.agent_program", expected="a program that starts",
                                                    received=f"{argv}: {e}", fix="check the command line")) from e

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def exit_codes(self) -> list[int | None]:
        return [p.returncode for p in self.procs]

    def tail(self, index: int, lines: int = 15) -> str:
        try:
            text = self.logs[index].read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])

    async def watch(self, source: Any) -> None:
        t0 = time.monotonic()
        while True:
            codes = [p.poll() for p in self.procs]
            for i, rc in enumerate(codes):
                if rc not in (None, 0):
                    self.error = explain(f"agent program {i} (pid {self.procs[i].pid})", expected="it keeps playing "
                                         "episodes until the run stops it", received=f"exit status {rc}; the end of "
                                         f"{self.logs[i]}:\n{self.tail(i)}", fix="fix the program (run the command "
                                         "by hand against `gymllm serve --training`)")
            if self.error is None and not source.counts["sessions"] and time.monotonic() - t0 > self.start_timeout_s:
                self.error = explain("agent program", expected=f"a closed session (a reward posted to {self.base_url}"
                                     f"/sessions/ID/reward) within rollout.agent_start_timeout_s "
                                     f"({self.start_timeout_s} s)", received=f"none; the end of {self.logs[0]}:\n"
                                     f"{self.tail(0)}", fix="check that the program uses the base URL and posts "
                                     "rewards, or raise agent_start_timeout_s")
            if self.error is not None or all(rc == 0 for rc in codes):
                source.close()  # the trainer's wait ends: drained groups, then QueueClosed
                return
            await asyncio.sleep(self.poll_s)

    def raise_error(self) -> None:
        if self.error is not None:
            raise AgentProgramError(self.error)

    def stop(self) -> None:
        import os
        import signal
        import subprocess

        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=self.grace_s)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(timeout=30)


class _StopRollout(Exception):
    """Raised from the synchronous baseline's batch callback once enough steps are trained."""


class Run:
    """The state of one ``train`` call: the parts (see :class:`Components`) and the per-step handling.

    ``max_steps``: stop after that many optimizer steps in this run (the run's step count stays
    ``learner.num_steps``). ``on_step``: callables given each step's metrics record (``{"step": k, ...}``)
    after it is logged, in the run's event loop (awaited when it returns an awaitable)."""

    def __init__(self, cfg: TrainConfig, max_steps: int | None = None, *,
                 on_step: Sequence[Callable[[dict[str, Any]], None]] = ()):
        self.cfg, self.max_steps = cfg, max_steps
        self.history: list[dict[str, Any]] = []
        self.trained_ids: list[list[str]] = []
        self.steps_here = 0
        self.step_groups: list[Any] = []
        self.wait_s, self.t_step, self.gen_tokens = 0.0, time.perf_counter(), 0
        self.filtered: set[str] = set()
        self.tally = RolloutTally(check_heldout_seeds(cfg))  # every completed group since the last step
        self.evals: list[dict[str, Any]] = []  # held-out rows (step, env, pass@1, mean_reward, seeds, ...)
        self.pending_eval: dict[str, float] = {}  # the eval metrics of the step being logged
        self.heldout: Any = None  # HeldOutEvaluator when eval.every > 0
        self.profiler = ProfileWindow(pathlib.Path(cfg.run.run_dir) / "profile", None)  # setup: run.profile_steps
        self.decided: dict[str, bool] = {}
        self.resumed_from: int | None = None
        self.rewound: dict[str, Any] = {}  # log file -> RewindReport of the records set aside at resume
        self.version_listeners: list[Callable[[int], None]] = []
        self.step_listeners: list[Callable[[dict[str, Any]], None]] = list(on_step)
        self.orch: Any = None  # the RolloutOrchestrator while run_async streams
        self.components: Components | None = None
        self.watchdog = Watchdog(WatchdogConfig(stall_s=cfg.run.stall_timeout_s))  # started by setup, stopped by close

    def done(self) -> bool:
        return (self.learner.version >= self.cfg.learner.num_steps
                or (self.max_steps is not None and self.steps_here >= self.max_steps))

    def setup(self, components: Components | None = None) -> None:
        """Build the parts with ``components`` (default :class:`LocalComponents`), restore the latest
        checkpoint if ``run.resume``, and open the run directory's logs."""
        from gymllm.rollout import ModelAgent, ToolAgent
        from gymllm.telemetry.sinks import MetricsLogger, parse_step_window

        cfg = self.cfg
        self.components = parts = components if components is not None else LocalComponents()
        self.run_dir = run_dir = pathlib.Path(cfg.run.run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.json").write_text(cfg.to_json())
        lm = load_model(cfg.model)
        self.tok = tok = lm.tokenizer
        self.learner = parts.make_learner(cfg, lm)
        self.ckpt = parts.make_checkpointer(cfg, self.learner)
        self.rng = np.random.default_rng(cfg.run.seed)
        meta = self.ckpt.restore_latest(self.learner) if cfg.run.resume else None
        if meta is not None:
            self.resumed_from = self.learner.version
            self.rng.bit_generator.state = meta["rng"]
            self.filtered = set(meta.get("filtered_groups", []))
            self.decided = {g: True for g in self.learner.consumed_groups} | {g: False for g in self.filtered}
        self.engine = parts.make_engine(cfg, lm, self.learner.version)
        self.pusher = parts.make_pusher(cfg, self.engine, lm, self.learner)
        if self.resumed_from is not None:
            self.pusher.push(self.learner.policy_params(), self.learner.version)
        if cfg.run.warmup:
            self.engine.warmup()
            self.learner.warmup(group_size=cfg.rollout.group_size)
        stop_id = int(tok.eos_token_id if tok.eos_token_id is not None else 0)
        self.gen_engine = _SkipConsumed(self.engine, set(self.decided), stop_id) if self.decided else self.engine
        self.envs = parts.make_envs(cfg) if cfg.rollout.mode != "proxy" else None  # proxy: the program plays
        agent_cls = ToolAgent if cfg.env.agent == "tool" else ModelAgent
        self.agent = agent_cls(tok, system_prompt=cfg.env.system_prompt or None)
        self.sampling, self.rcfg = cfg.sampling, cfg.rollout
        if cfg.run.resume:  # a killed run's records past the restored checkpoint are a lost lineage: set aside
            from gymllm.telemetry.run_log import rewind_jsonl

            self.rewound = {name: rewind_jsonl(run_dir / name, step=self.resumed_from or 0)
                            for name in ("metrics.jsonl", "trajectories.jsonl")}
        self.logger = MetricsLogger(run_dir, total_steps=cfg.learner.num_steps, console=cfg.run.console)
        self.profiler = ProfileWindow(run_dir / "profile", parse_step_window(cfg.run.profile_steps))
        if cfg.eval.every:
            self.heldout = self.make_heldout()
        self.traj_log = open(run_dir / "trajectories.jsonl", "a") if cfg.run.log_trajectories else None
        self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gymllm-learner")
        self.watchdog.start()

    def make_heldout(self) -> Any:
        """The :class:`~gymllm.rollout.evaluation.HeldOutEvaluator` of ``cfg.eval``: the training env (its
        kwargs and the run's agent) unless ``eval.envs`` names others (each with the agent its reset asks for)."""
        from gymllm.rollout.evaluation import EvalConfig, HeldOutEvaluator, agent_for

        cfg, e = self.cfg, self.cfg.eval
        specs = ([(cfg.env.id, dict(cfg.env.kwargs), self.agent)] if not e.envs else
                 [(i, dict(cfg.env.kwargs), self.agent) if i == cfg.env.id else (i, {}, agent_for(i, self.tok))
                  for i in e.envs])
        config = EvalConfig(num_seeds=e.seeds, k=1, seed_base=e.seed_base, temperature=e.temperature,
                            max_tokens=e.max_tokens or cfg.sampling.max_tokens, max_turns=cfg.rollout.max_model_calls,
                            max_concurrency=cfg.rollout.max_concurrency)
        return HeldOutEvaluator(specs, config=config, num_envs=cfg.env.num_envs)

    async def evaluate(self, step: int) -> dict[str, float]:
        """Held-out evaluation on the run's engine at policy ``step`` (live on it): rows into ``evals``,
        ``eval/<env>/...`` metrics returned. The time it takes is left out of the step's wall time."""
        from gymllm.rollout.evaluation import eval_metrics

        t = time.perf_counter()
        self.watchdog.begin("rollout", f"held-out evaluation at step {step}")
        try:
            rows = await self.heldout.evaluate(self.engine, step)
        finally:
            self.watchdog.end("rollout")
        dt = time.perf_counter() - t
        self.t_step += dt
        self.evals += rows
        out = {k: v for row in rows for k, v in eval_metrics(row).items()}
        out["eval_s"] = dt
        return out

    def eval_due(self, step: int) -> bool:
        every = self.cfg.eval.every
        return bool(every) and (step % every == 0 or self.done())

    async def begin(self) -> None:
        """Before any rollout: the held-out evaluation at the starting policy (a fresh run's step 0; a
        resumed run evaluated that step before it stopped) and the profile window's start at step 1."""
        version = self.learner.version
        if self.heldout is not None and self.resumed_from is None:
            self.logger.log(version, {**await self.evaluate(version), "pipeline": {}})
        self.profiler.after_step(version)
        self.t_step = time.perf_counter()

    def save(self) -> None:
        self.watchdog.begin("checkpoint", f"save step {self.learner.version}")
        self.ckpt.save(self.learner.version, self.learner,
                       extra={"rng": self.rng.bit_generator.state, "filtered_groups": sorted(self.filtered)})
        self.watchdog.end("checkpoint")

    async def consume(self, groups: list[Any]) -> None:
        """Train on complete groups (in a worker thread, so rollouts keep running) and handle the
        updates they complete: push weights, advance the policy version, log, checkpoint.

        Groups go to the learner one step's worth at a time (oldest version first), so a finished
        update is pushed and admits new groups (the staleness bound counts versions) before the
        groups of the next step are trained, not after."""
        fresh = [g for g in groups if g.group_id not in self.learner.consumed_groups]
        self.learner.counts["resume_skipped"] += len(groups) - len(fresh)
        gps = self.cfg.learner.groups_per_step  # never train past num_steps: take only the groups still needed
        fresh.sort(key=lambda g: (g.min_version, g.admitted_version))
        fresh = fresh[:max(0, (self.cfg.learner.num_steps - self.learner.version) * gps - self.learner.groups_in_step)]
        loop = asyncio.get_running_loop()
        while fresh:
            n = max(1, gps - self.learner.groups_in_step)  # the groups that complete the current step
            chunk, fresh = fresh[:n], fresh[n:]
            self.gen_tokens += sum(t.num_sampled for g in chunk for t in g.trajectories)
            self.step_groups += chunk
            self.watchdog.begin("learner", f"step {self.learner.version + 1}: training {len(chunk)} group(s)")
            try:  # a step that raised may have half-updated the learner: stop, never save or retry it
                reps = await loop.run_in_executor(self.pool, self.learner.submit, chunk)
            except Exception as e:
                self.watchdog.end("learner")  # failed, not stalled
                raise LearnerStepError(self.learner.version + 1, [g.group_id for g in chunk], e,
                                       self.ckpt.latest_step()) from e
            self.watchdog.end("learner")
            for rep in reps:
                await self.finish_step(rep, loop)

    async def finish_step(self, rep: Any, loop: asyncio.AbstractEventLoop) -> None:
        """Push the update's weights, advance the policy version, log, checkpoint."""
        self.watchdog.begin("weight_sync", f"push weights of step {rep.step}")
        sync_s = await loop.run_in_executor(self.pool, self.pusher.push, self.learner.policy_params(), rep.step)
        self.watchdog.end("weight_sync")
        self.set_version(rep.step)
        self.steps_here += 1
        if self.heldout is not None and self.eval_due(rep.step):  # at the policy just pushed
            self.pending_eval = await self.evaluate(rep.step)
        self.log_step(rep, sync_s)
        self.profiler.after_step(rep.step)
        every = self.cfg.run.checkpoint_every
        if every and rep.step % every == 0:
            self.save()
        for listener in self.step_listeners:
            out = listener(self.history[-1] if self.history else {"step": rep.step})
            if inspect.isawaitable(out):
                await out
        self.wait_s, self.t_step, self.gen_tokens = 0.0, time.perf_counter(), 0

    def set_version(self, version: int) -> None:
        """Update ``version`` is live on the engine: tell every version listener (admission control)."""
        for listener in self.version_listeners:
            listener(version)

    def log_step(self, rep: Any, sync_s: float) -> None:
        wall = time.perf_counter() - self.t_step
        m = dict(rep.metrics)
        stats = self.orch.stats() if self.orch is not None else {}
        m.update(weight_sync_s=sync_s, step_wall_s=wall, trainer_wait_s=self.wait_s,
                 trainer_idle_fraction=min(1.0, self.wait_s / wall) if wall > 0 else 0.0,
                 tokens_per_s_generated=self.gen_tokens / wall if wall > 0 else 0.0,
                 engine_busy_fraction=float(stats.get("engine_busy_fraction", 0.0)),
                 groups_filtered_rollout=float(len(self.filtered)),
                 groups_stale_rollout=float(stats.get("stale_dropped", 0)))
        if "concurrency_limit" in stats:
            m["rollout_concurrency"] = float(stats["concurrency_limit"])
        m.update(self.tally.pop())  # over every group completed since the last step, filtered ones included
        m.update(self.pending_eval)
        self.pending_eval = {}
        self.history.append({"step": rep.step, **m})
        self.trained_ids.append(rep.sample_ids)
        self.logger.log(rep.step, m)
        if self.traj_log is not None:
            used = set(rep.sample_ids)
            mine = [g for g in self.step_groups if any(t.trajectory_id in used for t in g.trajectories)]
            for rec in _trajectory_records(rep.step, mine, self.tok):
                self.traj_log.write(json.dumps(rec) + "\n")
            self.traj_log.flush()
            self.step_groups = [g for g in self.step_groups if g not in mine]

    async def run_async(self) -> dict[str, Any]:
        """Barrier-free: the orchestrator streams groups; the learner consumes them as they complete
        (``rollout.mode="proxy"``: :meth:`run_proxy`)."""
        from gymllm.rollout import QueueClosed, RolloutOrchestrator

        if self.cfg.rollout.mode == "proxy":
            return await self.run_proxy()
        self.orch = orch = RolloutOrchestrator(self.envs, self.gen_engine, self.agent, sampling=self.sampling,
                                               config=self.rcfg, group_filter=_group_filter(
                                                   self.cfg, self.decided, self.filtered, self.tally))
        self.version_listeners.append(orch.set_policy_version)
        await self.begin()  # step 1's wall time starts with the rollouts, not the setup or the evaluation
        async with orch:
            while not self.done():
                t = time.perf_counter()
                try:
                    self.watchdog.begin("rollout", "waiting for the next complete group")
                    batch = [await orch.get_group()]
                    self.watchdog.end("rollout")  # a group arrived
                    while orch.ready_groups > 0:  # everything already complete: oldest first
                        batch.append(await orch.get_group())
                except QueueClosed:
                    break
                self.wait_s += time.perf_counter() - t
                await self.consume(batch)
        return {**orch.counts, "rollout_errors": list(orch.errors)}  # errors: "<trajectory or group id>: <cause>"

    async def run_proxy(self) -> dict[str, Any]:
        """An agent program plays (``rollout.mode="proxy"``): the engine is served in training mode on
        127.0.0.1 (a free port); ``rollout.agent_processes`` copies of ``rollout.agent_program`` talk
        to it; closed sessions become groups (:class:`~gymllm.rollout.proxy_source.ProxyGroupSource`)
        consumed as the orchestrator's are: the learner trains on exactly the recorded token ids.
        The programs and the server are stopped at the end; a program that exits with an error, or
        no session closed within ``rollout.agent_start_timeout_s``, fails the run
        (:class:`AgentProgramError`, with the program's log tail)."""
        from gymllm.inference.proxy import SessionRecorder
        from gymllm.inference.server import ServerThread, build_app
        from gymllm.rollout import QueueClosed
        from gymllm.rollout.proxy_source import ProxyGroupSource, ProxySourceConfig

        cfg = self.cfg
        self.orch = source = ProxyGroupSource(ProxySourceConfig(
            group_size=cfg.rollout.group_size, max_queued_groups=self.rcfg.queue_size, max_staleness=cfg.rollout.max_staleness))
        keep = _group_filter(cfg, self.decided, self.filtered, self.tally)
        recorder = SessionRecorder(self.tok, on_closed=source.add)
        app = build_app(self.gen_engine, self.tok, "policy", recorder=recorder, admission=source.wait_for_room)
        server = ServerThread(app).start()
        programs = AgentPrograms(cfg.rollout.agent_program, base_url=server.url + "/v1", run_dir=self.run_dir,
                                 processes=cfg.rollout.agent_processes, group_size=cfg.rollout.group_size,
                                 seed=cfg.run.seed, start_timeout_s=cfg.rollout.agent_start_timeout_s)
        self.proxy_url, self.agent_pids = server.url, []
        self.version_listeners.append(source.set_policy_version)
        monitor = None
        try:
            programs.start()
            self.agent_pids = programs.pids
            monitor = asyncio.create_task(programs.watch(source))
            self.t_step = time.perf_counter()
            async with source:
                while not self.done():
                    t = time.perf_counter()
                    try:
                        self.watchdog.begin("rollout", "waiting for the agent program's next complete group")
                        batch = [await source.get_group()]
                        self.watchdog.end("rollout")
                        while source.ready_groups > 0:
                            batch.append(await source.get_group())
                    except QueueClosed:
                        break
                    self.wait_s += time.perf_counter() - t
                    await self.consume([g for g in batch if keep(g)])
            programs.raise_error()
            if not self.done():
                import logging

                logging.getLogger("gymllm.algos").warning(
                    "the agent program(s) exited (status 0) after %d closed sessions: the run stops at step %d of %d",
                    source.counts["sessions"], self.learner.version, cfg.learner.num_steps)
        finally:
            if monitor is not None:
                monitor.cancel()
            self.watchdog.end("rollout")
            source.close()
            programs.stop()
            server.stop()
        return {**source.stats(), "agent_exit_codes": programs.exit_codes(), "agent_pids": programs.pids,
                "proxy_url": server.url, "rollout_errors": []}

    async def run_sync(self) -> dict[str, Any]:
        """The synchronous baseline: roll out a whole step's groups, then train on them, repeat.
        Filtered groups (zero variance) do not count towards a step, so batches continue until the
        step count is reached."""
        from gymllm.rollout import sync_rollout

        if self.decided:
            raise ConfigError(explain("rollout.mode", expected="'async' to resume a run", received="sync",
                                      fix="resume with mode='async' (eta=0 is synchronous) or use a fresh run_dir"))
        B = self.cfg.learner.groups_per_step
        rcfg = dataclasses.replace(self.rcfg, num_groups=10**9)  # batches run until on_batch says stop
        await self.begin()
        t_batch = [time.perf_counter()]
        self.t_step = t_batch[0]

        async def on_batch(groups: list[Any]) -> None:
            self.wait_s += time.perf_counter() - t_batch[0]
            for g in groups:  # every rollout of the batch counts, whatever the learner keeps
                self.tally.add(g)
            await self.consume(groups)
            if self.done():
                raise _StopRollout
            t_batch[0] = time.perf_counter()

        try:
            await sync_rollout(self.envs, self.gen_engine, self.agent, sampling=self.sampling, config=rcfg,
                               batch_groups=B, on_batch=on_batch)
        except _StopRollout:
            pass
        return {}

    async def close(self) -> None:
        """Stop the learner thread, the engine and the envs, close the logs, then the components."""
        try:
            self.pool.shutdown(wait=True)
            self.profiler.close(self.learner.version)
            if self.heldout is not None:
                self.heldout.close()
            await self.engine.close()
            close = getattr(self.envs, "close", None)
            if close is not None:
                close()
            if self.traj_log is not None:
                self.traj_log.close()
            self.logger.close()
            self.ckpt.close()
        finally:
            self.watchdog.stop()
            if self.components is not None:
                self.components.close()
