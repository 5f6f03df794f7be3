"""The sub-commands of ``gymllm``. Heavy layers (JAX, models, engine) are imported inside each."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
import subprocess
import sys
import time
from typing import Annotated, Callable, Sequence

import tyro

from gymllm.atomic import atomic_write_text
from gymllm.cli.eval_args import EngineShape, ModelChoice
from gymllm.cli.tables import print_table
from gymllm.cli.train_args import parse_train_plan
from gymllm.validation import require

# --------------------------------------------------------------------------------------- dispatch


def dispatch(name: str, fn: Callable[..., object], args: Sequence[str]) -> object:
    if name == "train":
        return _train_dispatch(list(args))
    if getattr(
        fn, "takes_argv", False
    ):  # a command that parses its own argv with tyro: eval, sft, compare
        return fn(list(args))
    return tyro.cli(fn, prog=f"gymllm {name}", args=list(args))


STAGES_FILE = (
    "stages.json"  # RUN_DIR/stages.json: the finished demos and SFT stages of a staged run
)


def run_stages(cfg: object, stage: object, *, log: Callable[[str], None] = print) -> object:
    """Run a staged recipe's first two stages and return the GRPO config, warm-started from their weights.

    1. demos: ``gymllm.envs.demos.demonstrations`` of ``cfg.env`` (its id, kwargs, system prompt and
       agent) -> ``RUN_DIR/demos.jsonl`` (written whole, then renamed: a killed write leaves none);
    2. SFT: :func:`gymllm.train.sft.run_sft` on them (``RUN_DIR/sft``: config, metrics, checkpoints;
       the config from :func:`gymllm.cli.recipes.sft_config_for`);
    3. the returned config: ``cfg`` with ``model.checkpoint = RUN_DIR/sft``.

    A stage whose output exists is skipped: demos when ``demos.jsonl`` is there, SFT when
    ``RUN_DIR/stages.json`` records it finished (a killed SFT resumes from its last checkpoint). GRPO
    itself resumes from ``RUN_DIR/checkpoints`` as any run does (``run.resume``). Delete a stage's
    output to redo it. A ``cfg`` that already names ``model.checkpoint`` is returned unchanged: the
    warm start is given, so no stage runs."""

    if cfg.model.checkpoint:
        log(
            f"[stages] model.checkpoint={cfg.model.checkpoint!r} given: demos and SFT skipped, GRPO warm-starts from it"
        )
        return cfg
    run_dir = pathlib.Path(cfg.run.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    stages_path = run_dir / STAGES_FILE
    done = json.loads(stages_path.read_text()) if stages_path.is_file() else {}

    def record(name: str, entry: dict) -> None:
        done[name] = entry
        atomic_write_text(stages_path, json.dumps(done, indent=2))

    demos_path = run_dir / "demos.jsonl"
    if demos_path.is_file() and demos_path.stat().st_size > 0:
        count = sum(1 for line in demos_path.read_text().splitlines() if line.strip())
        log(f"[stages] demos: {demos_path} exists ({count} episodes): skipped")
    else:
        from gymllm.envs.demos import demonstrations, write_demos

        t0 = time.perf_counter()
        demo_env = stage.demo_env or cfg.env.id
        records = demonstrations(
            demo_env,
            n=stage.demos,
            seed=stage.demo_seed,
            env_kwargs=dict(cfg.env.kwargs),
            system_prompt=cfg.env.system_prompt,
            agent="tool" if cfg.env.agent == "tool" else "model",
            policy=stage.demo_policy,
        )
        require(
            bool(records),
            "recipe [sft].demos",
            expected=f"solved episodes of {demo_env}",
            received=f"none on seeds {stage.demo_seed}..{stage.demo_seed + stage.demos - 1}",
            fix="check env.kwargs (e.g. a map whose goal can be reached)",
        )
        write_demos(demos_path, records)  # atomic: a killed stage leaves no half-written demos
        mean = sum(r["reward"] for r in records) / len(records)
        record(
            "demos",
            {
                "episodes": len(records),
                "played": stage.demos,
                "mean_reward": mean,
                "wall_s": round(time.perf_counter() - t0, 1),
            },
        )
        log(
            f"[stages] demos: {len(records)} of {stage.demos} episodes kept (mean reward {mean:.3f}) -> {demos_path}"
        )

    sft_dir = run_dir / "sft"
    if "sft" in done:
        log(f"[stages] sft: {sft_dir} finished (step {done['sft'].get('step')}): skipped")
    else:
        from gymllm.train.sft import run_sft
        from gymllm.cli.recipes import sft_config_for

        sft_cfg = sft_config_for(stage, cfg, data=str(demos_path), run_dir=str(sft_dir))
        log(f"[stages] sft: {sft_cfg.model.name} on {demos_path} -> {sft_dir}")
        result = run_sft(sft_cfg)
        log(result.summary())
        record(
            "sft",
            {
                "step": result.step,
                "rows": result.rows,
                "tokens": result.tokens,
                "final_loss": result.losses[-1] if result.losses else None,
                "first_loss": result.losses[0] if result.losses else None,
                "wall_s": round(result.wall_s, 1),
            },
        )
    log(f"[stages] grpo: warm start from {sft_dir} -> {run_dir}")
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, checkpoint=str(sft_dir)))


def _train_dispatch(args: list[str]) -> object:
    """``gymllm train [RECIPE] [--preset NAME] [--field.sub value ...]``: see :func:`parse_train_args`;
    a recipe with an ``[sft]`` table runs demos -> SFT -> GRPO (:func:`run_stages`)."""
    from gymllm.train import trainer as trainer_mod

    cfg, stage = parse_train_plan(args, description=train.__doc__)
    if stage is not None:
        cfg = run_stages(cfg, stage)
    result = trainer_mod.train(cfg)
    _print_train_summary(cfg, result)
    return 0


def _print_train_summary(cfg: object, result: object) -> None:
    summary = getattr(result, "summary", None)
    if callable(summary):
        print(summary())
    elif result is not None:
        print(result)


# ------------------------------------------------------------------------------------ commands


def train() -> None:
    """Run barrier-free GRPO; with no recipe, the embedded default (real small model, tool math).

    Usage: `gymllm train [RECIPE] [--preset default|tiny] [--loss-preset grpo|dapo|dr_grpo|gspo|async_agentic]
    [--run-dir DIR] [--section.field VALUE ...]`.
    RECIPE is a TOML file or the name of a recipe gymllm ships (gymllm/recipes/, e.g. `gymllm train calc_math`);
    a recipe with an [sft] table runs demonstrations -> SFT -> GRPO from the SFT weights (RUN_DIR/demos.jsonl,
    RUN_DIR/sft; a finished stage is skipped on a rerun). The run directory
    gets config.json, metrics.jsonl, TensorBoard events, a trajectory log, trace.json (open it in
    ui.perfetto.dev), checkpoints and a reward-curve PNG; `gymllm train RUN_DIR/config.json` repeats
    (or, with the same run directory, resumes) that run.
    The sections are the components' own configs (--engine.*, --sampling.*, --rollout.*, --learner.*,
    ...). Each setting has one flag: a value two components share is given once (--run.seed seeds the
    rollout and the engine, --learner.groups-per-step paces the rollout too, --sampling.temperature is
    the learner's as well).
    """


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServeEngine(EngineShape):
    """The served engine (``--engine.*``, the :class:`~gymllm.inference.EngineConfig` fields of the same names)."""

    min_bucket: int | None = None
    """Smallest prefill length bucket (the engine's default if unset; = max_len: one prefill shape)."""
    decode_lengths: int | None = None
    """Cache lengths the decode step picks from (the engine's default if unset; 1: one shape). Fewer compiled
    shapes start faster and cost speed on mixed lengths."""


def serve(
    model: ModelChoice = ModelChoice(),
    engine: ServeEngine = ServeEngine(),
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    max_n: int = 16,
    max_body_bytes: int = 1_000_000,
    training: bool = False,
    groups_out: str | None = None,
    group_size: int = 1,
    max_queued_groups: int = 8,
    max_sessions: int = 4096,
) -> int:
    """Serve a model over an OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions).

    Args:
        model: The model to serve (a name, a local checkpoint directory, or `tiny-<family>` for a random tiny
            model) and the trained weights of a `gymllm train` run to serve instead of its base weights.
        engine: The continuous-batching engine: its rows (concurrent sequences) and their context length.
        host: Bind address (loopback by default; any other address needs an API key).
        port: TCP port.
        api_key: Required as `Authorization: Bearer KEY` on /v1/* (default: $GYMLLM_API_KEY).
        max_n: Most samples per prompt (`n`) one request may ask for.
        max_body_bytes: Larger request bodies get a 413.
        training: Training mode: record each session's (X-Session-Id header or `user` field) token ids
            exactly; POST /v1/sessions/{id}/reward closes it; complete groups (X-Group-Id) are written
            to --groups-out as JSON lines, one trajectory each.
        groups_out: Where training mode appends its trajectories (needed with --training).
        group_size: Sessions per group in training mode.
        max_queued_groups: Complete groups waiting to be written before new sessions are held back.
        max_sessions: Sessions recording at once in training mode (more get a 429).
    """
    import os

    from gymllm.inference.server import check_bind
    from gymllm.inference.server_models import ServerConfig

    api_key = api_key or os.environ.get("GYMLLM_API_KEY") or None
    check_bind(host, api_key)  # before loading anything: a clear error at once
    config = ServerConfig(api_key=api_key, max_n=max_n, max_body_bytes=max_body_bytes)
    if training and not groups_out:
        raise ValueError(
            "--training: expected --groups-out PATH (where the recorded trajectories go), received "
            "none. Fix: add --groups-out groups.jsonl, or run the proxy source inside the trainer"
        )

    from gymllm.cli.evaluate import DEFAULT_MODEL, load_model
    from gymllm.inference import EngineConfig, JaxEngine
    from gymllm.inference.server import serve as serve_fn, tool_format_for

    loaded = load_model(model.name, checkpoint=model.checkpoint)
    served = model.name or model.checkpoint or DEFAULT_MODEL  # the model id clients name
    shapes = {
        k: getattr(engine, k)
        for k in ("min_bucket", "decode_lengths")
        if getattr(engine, k) is not None
    }
    jax_engine = JaxEngine.from_loaded(
        loaded, config=EngineConfig(num_slots=engine.num_slots, max_len=engine.max_len, **shapes)
    )
    fmt = tool_format_for(loaded.tokenizer, getattr(loaded.config, "family", None))
    app_kwargs: dict = {}
    if training:
        import asyncio
        import threading

        from gymllm.inference.session_recorder import ProxyConfig, SessionRecorder
        from gymllm.rollout.proxy_source import ProxyGroupSource, ProxySourceConfig

        source = ProxyGroupSource(
            ProxySourceConfig(group_size=group_size, max_queued_groups=max_queued_groups)
        )
        recorder = SessionRecorder(
            loaded.tokenizer,
            on_closed=source.add,
            config=ProxyConfig(max_open_sessions=max_sessions),
        )
        app_kwargs = {"recorder": recorder, "admission": source.wait_for_room}

        async def write_groups() -> None:
            from gymllm.trajectories.writers import TrajectoryRecordWriter

            with TrajectoryRecordWriter(
                groups_out, per_token=True
            ) as w:  # the one trajectory record format
                async for group in source.groups():
                    w.write(group.trajectories)

        threading.Thread(
            target=asyncio.run, args=(write_groups(),), name="gymllm-groups-out", daemon=True
        ).start()
    mode = f"; training mode, groups -> {groups_out}" if training else ""
    print(
        f"serving {served} on http://{host}:{port}/v1 (OpenAI-compatible; tool calls: {fmt}{mode})",
        flush=True,
    )
    serve_fn(
        jax_engine,
        loaded.tokenizer,
        served,
        host=host,
        port=port,
        config=config,
        tool_format=fmt,
        **app_kwargs,
    )
    return 0


def envs(pattern: str = "", spaces: bool = True) -> int:
    """List the registered gymllm envs with their observation and action spaces.

    Args:
        pattern: Only ids containing this substring.
        spaces: Instantiate each env to show its spaces (slower).
    """
    import gymnasium

    import gymllm.registration  # noqa: F401 - registers every gymllm env

    rows = []
    for env_id in sorted(k for k in gymnasium.registry if k.startswith("gymllm/") and pattern in k):
        row = {"id": env_id}
        if spaces:
            try:
                env = gymnasium.make(env_id).unwrapped
                row["observation_space"], row["action_space"] = (
                    str(env.observation_space),
                    str(env.action_space),
                )
                env.close()
            except Exception as e:  # noqa: BLE001 - an optional extra may be missing; say so, keep listing
                row["observation_space"], row["action_space"] = (
                    f"(unavailable: {type(e).__name__})",
                    "",
                )
        rows.append(row)
    print_table(rows, ["id", "observation_space", "action_space"] if spaces else ["id"])
    print(f"{len(rows)} envs")
    return 0


def check(
    env_id: Annotated[str, tyro.conf.Positional], /, vector: bool = False, num_envs: int = 4
) -> int:
    """Run the conformance checkers on a registered env (Gymnasium's check_env plus text checks).

    Args:
        env_id: A registered env id, e.g. gymllm/Arithmetic-v0.
        vector: Also check the barrier-free vector env (async == sync per env).
        num_envs: Sub-envs for the vector check.
    """
    import gymllm
    from gymllm.utils import check_env, check_vector_env

    env = gymllm.make(env_id)
    check_env(env)
    print(f"check_env({env_id}): ok")
    if vector:
        check_vector_env(lambda: gymllm.make_vec(env_id, num_envs=num_envs))
        print(f"check_vector_env({env_id}, num_envs={num_envs}): ok")
    return 0


def replay(log: Annotated[str, tyro.conf.Positional], /, max_episodes: int | None = None) -> int:
    """Re-execute logged episodes (same env, seed and actions) and report any observation or reward that differs.

    Args:
        log: A trajectory log written by TrajectoryLogger (a JSONL file or its run directory).
        max_episodes: Replay at most this many episodes.
    """
    from gymllm.trajectories import replay as replay_fn

    report = replay_fn(log, max_episodes=max_episodes)
    print(report.summary() if hasattr(report, "summary") else report)
    return 0 if getattr(report, "ok", True) else 1


def report(run_dir: Annotated[str, tyro.conf.Positional], /) -> int:
    """Write plots (reward/length curves, pipeline timeline, idle fractions, staleness) and a summary for a run.

    Args:
        run_dir: A run directory written by `gymllm train`.
    """
    from gymllm.telemetry.report import write_report

    path = pathlib.Path(run_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"run directory {run_dir!r} does not exist")
    for p in write_report(path):
        print(p)
    summary = path / "summary.txt"
    if summary.exists():
        print(summary.read_text())
    return 0


SOURCE_BENCHMARKS_DIR = (
    pathlib.Path(__file__).resolve().parents[2] / "benchmarks"
)  # a source checkout's


def benchmarks_dir_for(benchmarks_dir: str | None) -> pathlib.Path:
    """Where ``gymllm bench`` finds its scripts: ``benchmarks_dir``, else ``./benchmarks``, else the source
    checkout's ``benchmarks/`` (an editable install). The benchmarks are not package data: they are
    measurement scripts of the source repository (several compare against the test extra's torch and
    transformers references), so an installed wheel has none; the error says so and where they live."""
    if benchmarks_dir is not None:
        bdir = pathlib.Path(benchmarks_dir)
        if not bdir.is_dir():
            raise FileNotFoundError(
                f"--benchmarks-dir {benchmarks_dir!r}: expected a directory of benchmark scripts, "
                "received a path that is not one. Fix: pass the repository's benchmarks/ directory"
            )
        return bdir
    for bdir in (pathlib.Path.cwd() / "benchmarks", SOURCE_BENCHMARKS_DIR):
        if bdir.is_dir() and any(bdir.glob("*.py")):
            return bdir
    raise FileNotFoundError(
        "the benchmarks are not package data: they are the scripts in the benchmarks/ directory of the gymllm "
        "source repository (not in ./benchmarks, nor next to this install: "
        f"{SOURCE_BENCHMARKS_DIR}). Fix: clone the repository, install its test extra, and run "
        "`gymllm bench --benchmarks-dir PATH/TO/gymllm/benchmarks` (or run `gymllm bench` from its root)"
    )


def bench(
    names: Annotated[tuple[str, ...], tyro.conf.Positional] = (),
    /,
    quick: bool = True,
    benchmarks_dir: str | None = None,
) -> int:
    """Run the benchmark suite (each script side by side in one process) and print its RESULT table.

    Args:
        names: Benchmarks to run (vector_env, models, engine, rollout, train, telemetry); all by default.
        quick: Pass --quick (about two minutes each).
        benchmarks_dir: Where the benchmark scripts are (default: ./benchmarks, else the source checkout's
            benchmarks/; they are not package data, see `benchmarks_dir_for`).
    """
    bdir = benchmarks_dir_for(benchmarks_dir)
    scripts = sorted(bdir.glob("*.py"))
    if names:
        unknown = sorted(set(names) - {s.stem for s in scripts})
        if unknown:
            raise ValueError(
                f"benchmark(s) {unknown} not in {bdir}: expected some of {[s.stem for s in scripts]}"
            )
        scripts = [s for s in scripts if s.stem in names]
    rows = []
    for script in scripts:
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, str(script), *(["--quick"] if quick else [])],
            capture_output=True,
            text=True,
        )
        found = re.findall(r"^RESULT (\{.*\})\s*$", proc.stdout, flags=re.M)
        result = (
            json.loads(found[-1])
            if found
            else {"error": (proc.stderr.strip().splitlines() or ["no RESULT line"])[-1]}
        )
        rows.append(
            {
                "benchmark": script.stem,
                "seconds": round(time.perf_counter() - t0, 1),
                "result": json.dumps(result),
            }
        )
        print(f"{script.stem}: {rows[-1]['result']}", flush=True)
    print_table(rows, ["benchmark", "seconds", "result"])
    return 0


__all__ = [
    "train",
    "serve",
    "ServeEngine",
    "envs",
    "check",
    "replay",
    "report",
    "bench",
    "dispatch",
]
