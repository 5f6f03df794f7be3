"""Fault drill: one short ``train()`` run per injected fault; each must finish, or stop with a clear error
naming the fault, within a stated bound; the faulty trajectory or group is recorded with its reason;
nothing else is lost (every other group up to the last trained one is trained).

Faults, each injected through a public surface (envs registered here, tools, an engine and a learner
wrapped by a :class:`~gymllm.train.components.LocalComponents` subclass, a real HTTP client):

- ``env_hang``: ``drill/Faulty-v0``'s step for seed 1 sleeps 60 s; ``rollout.group_timeout_s`` = 10 s
  bounds it. Expected: finished; g1 timed out (in ``counts["rollout_errors"]``); the watchdog names
  the stalled "rollout" stage while the trainer waits.
- ``env_raises``: every 7th env step raises. Finished; the failed groups recorded with the error.
- ``tool_hang``: ``drill/ToolFault-v0`` with a tool that sleeps 60 s under ``ToolUse(timeout_s=1)``.
  Finished; every call a "timeout" result.
- ``tool_flood``: a tool returning 100 MB under ``ToolUse(max_result_chars=4096)``. Finished; every
  result cut to 4096 characters (+ a note).
- ``engine_raises``: the engine wrapper's 3rd ``generate`` raises EngineError. Finished; its group failed.
- ``learner_raises``: a learner step hook raises in step 3 after half of its groups were consumed.
  Stopped: ``LearnerStepError`` names step 3 and the cause; checkpoint 2 is intact and a resumed run
  reaches the end with every step logged once and no group trained twice.
- ``reward_nan`` / ``reward_text``: seed 1's reward is NaN / the string "0.5". Finished; g1 failed
  with RewardError.
- ``server_disconnect``: a streaming client of the OpenAI server closes after its first token. The
  engine request is cancelled (stops short of its 40 tokens) and the next request is served (same
  text as the engine in process).

The tool faults force one tool call per model call (``ForceToolCall``: a random tiny model never
writes a tool call itself); the server is a real uvicorn server on loopback (``ServerThread``, in
this process so the engine under it can be watched).

    python benchmarks/drill_faults.py            # 6 steps a run
    python benchmarks/drill_faults.py --quick    # 3 steps a run

Ends with ``RESULT {json}``: per fault ``{"outcome": "finished"|"stopped", "bound_s", "took_s",
"recorded", "lost_other", "ok", "detail"}``, and ``faults_ok`` (faults meeting their bound and
expectations) / ``faults_total``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import math
import pathlib
import platform
import tempfile
import threading
import time
from typing import Any, Callable

import gymnasium as gym

from gymllm.algos import config as C
from gymllm.train.components import LocalComponents
from gymllm.algos.learner_config import LearnerConfig
from gymllm.algos.optim import OptimizerConfig
from gymllm.train.run import LearnerStepError
from gymllm.train.trainer import train
from gymllm.inference.config import EngineConfig
from gymllm.train.train_config import EnvSection, ModelSection, RunSection, TrainConfig
from gymllm.rollout.config import RolloutConfig
from gymllm.inference.params import SamplingParams
from gymllm.envs.tiny_tasks import TinyRepeatEnv
from gymllm.errors import EngineError
from gymllm.registration import register
from gymllm.rollout.engine_wrappers import EngineWrapper
from gymllm.tools import tool
from gymllm.wrappers import ToolUse

FAULTS = (
    "env_hang",
    "env_raises",
    "tool_hang",
    "tool_flood",
    "engine_raises",
    "learner_raises",
    "reward_nan",
    "reward_text",
    "server_disconnect",
)
HANG_S = 60.0  # how long a hung env step or tool would take: every bound below is shorter
FLOOD_CHARS = 100 * 2**20  # 100 MB of tool output
MAX_RESULT_CHARS = 4096


# ---------------------------------------------------------------------------------------------- faults
class FaultyRepeatEnv(TinyRepeatEnv):
    """TinyRepeat with injected faults: ``hang_seeds``' steps sleep ``hang_s`` (a stuck env),
    every ``raise_every``-th step (counted over every env of this class: ``steps_taken``) raises, ``bad_rewards`` maps seeds to the reward returned
    instead (NaN, a string: a buggy reward function)."""

    def __init__(
        self,
        *,
        hang_seeds=(),
        hang_s: float = HANG_S,
        raise_every: int = 0,
        bad_rewards: dict | None = None,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.hang_seeds, self.hang_s, self.raise_every = (
            set(hang_seeds),
            float(hang_s),
            int(raise_every),
        )
        self.bad_rewards = {int(k): v for k, v in (bad_rewards or {}).items()}
        self.seed_: int | None = None

    steps_taken = 0  # over every instance (the drill resets it before a run)

    def _reset(self, *, seed, options):
        self.seed_ = seed
        return super()._reset(seed=seed, options=options)

    async def _astep(self, action: str):
        FaultyRepeatEnv.steps_taken += 1
        n = FaultyRepeatEnv.steps_taken
        if self.raise_every and n % self.raise_every == 0:
            raise RuntimeError(f"drill: injected env fault at step {n}")
        if self.seed_ in self.hang_seeds:
            await asyncio.sleep(self.hang_s)
        obs, reward, done, info = await super()._astep(action)
        if self.seed_ in self.bad_rewards:
            reward = self.bad_rewards[self.seed_]
        return obs, reward, done, info


@tool(name="hang")
async def hang_tool() -> str:
    """A tool that does not answer for a minute (a stuck service)."""
    await asyncio.sleep(HANG_S)
    return "late"


@tool(name="flood")
def flood_tool() -> str:
    """A tool that returns 100 MB of output."""
    return "x" * FLOOD_CHARS


TOOLS = {"hang": hang_tool, "flood": flood_tool}
TOOL_RESULTS: list[
    dict[str, Any]
] = []  # one record per forced call: ok, error kind, chars returned


class ForceToolCall(gym.Wrapper):
    """Before each action reaches the env, one call of ``tool`` runs through the ToolUse below it, as if
    the model had written it; its result is recorded in ``TOOL_RESULTS`` and the step's info."""

    def __init__(self, env: ToolUse, tool_name: str):
        super().__init__(env)
        self.call = '<tool_call>{"name": "%s", "arguments": {}}</tool_call>' % tool_name

    def reset(self, *, seed=None, options=None):
        return self.env.reset(seed=seed, options=options)

    async def areset(self, *, seed=None, options=None):
        return await self.env.areset(seed=seed, options=options)

    def _record(self, obs: list, info: dict) -> dict:
        (call,) = info["tool_calls"]
        rec = {"ok": call["ok"], "error": call.get("error"), "chars": len(obs[0]["content"])}
        TOOL_RESULTS.append(rec)
        return rec

    def step(self, action: str):
        obs, _, _, _, info = self.env.step(self.call)
        rec = self._record(obs, info)
        obs, reward, term, trunc, info = self.env.step(action)
        return obs, reward, term, trunc, {**info, "forced_tool_call": rec}

    async def astep(self, action: str):
        obs, _, _, _, info = await self.env.astep(self.call)
        rec = self._record(obs, info)
        obs, reward, term, trunc, info = await self.env.astep(action)
        return obs, reward, term, trunc, {**info, "forced_tool_call": rec}


def make_tool_env(*, tool_name: str, timeout_s: float = 1.0, num_letters: int = 2) -> gym.Env:
    inner = TinyRepeatEnv(
        num_letters=num_letters
    )  # timeout_s: the hang's bound; generous for the flood
    return ForceToolCall(
        ToolUse(
            inner, tools=[TOOLS[tool_name]], timeout_s=timeout_s, max_result_chars=MAX_RESULT_CHARS
        ),
        tool_name,
    )


register("drill/Faulty-v0", FaultyRepeatEnv)
register("drill/ToolFault-v0", make_tool_env)


class FailOnceEngine(EngineWrapper):
    """Engine wrapper: the ``fail_at``-th ``generate`` call raises :class:`EngineError`; all else passes."""

    def __init__(self, engine: Any, fail_at: int):
        super().__init__(engine)
        self.fail_at, self.calls = fail_at, 0

    async def generate(self, prompt_ids, params, *, session_id=None):
        self.calls += 1
        if self.calls == self.fail_at:
            raise EngineError(
                f"drill: injected engine fault in request {self.calls} ({session_id})"
            )
        return await super().generate(prompt_ids, params, session_id=session_id)


class DrillComponents(LocalComponents):
    """The in-process parts, with an engine that fails one request and/or a learner step hook that
    raises once in step ``learner_fail_step``, after consuming half of the step's groups."""

    def __init__(self, *, engine_fail_at: int | None = None, learner_fail_step: int | None = None):
        super().__init__()
        self.engine_fail_at, self.learner_fail_step = engine_fail_at, learner_fail_step

    def make_engine(self, cfg, lm, version):
        engine = super().make_engine(cfg, lm, version)
        return FailOnceEngine(engine, self.engine_fail_at) if self.engine_fail_at else engine

    def make_learner(self, cfg, lm):
        learner = super().make_learner(cfg, lm)
        step, real, fired = self.learner_fail_step, learner.submit, []
        if step is None:
            return learner

        def submit(groups):
            groups = list(groups)
            if not fired and learner.version + 1 == step:
                fired.append(True)
                if len(groups) > 1:
                    real(groups[:1])  # the learner is now half-way through the step
                raise RuntimeError(f"drill: injected learner fault in step {step}")
            return real(groups)

        learner.submit = submit
        return learner


# ---------------------------------------------------------------------------------------------- runs
def small_config(
    run_dir: pathlib.Path,
    *,
    steps: int,
    env_id: str = "drill/Faulty-v0",
    kwargs: dict | None = None,
    group_timeout_s: float | None = None,
    checkpoint_every: int = 0,
    stall_timeout_s: float = 2.0,
) -> TrainConfig:
    """tests/test_checkpoint.py's small config (compiles once per process for every fault)."""
    return TrainConfig(
        model=ModelSection(
            name="tiny-qwen3", vocab_size=300, hidden_size=32, intermediate_size=64, num_layers=1
        ),
        env=EnvSection(id=env_id, kwargs={"num_letters": 2, **(kwargs or {})}, num_envs=8),
        engine=EngineConfig(
            num_slots=8,
            max_len=64,
            min_bucket=64,
            idle_wait_s=0.002,
            decode_chunk=8,
            prefix_reuse=False,
        ),
        sampling=SamplingParams(max_tokens=4),
        rollout=RolloutConfig(
            group_size=4,
            max_concurrency=8,
            max_staleness=0,
            max_model_calls=1,
            group_timeout_s=group_timeout_s,
        ),
        loss=dataclasses.replace(C.async_agentic(), shaping=C.ShapingConfig()),
        optimizer=OptimizerConfig(learning_rate=1e-2),
        learner=LearnerConfig(
            groups_per_step=2,
            micro_batch_size=8,
            num_steps=steps,
            max_len=64,
            min_bucket=64,
            fast_compile=True,
        ),
        run=RunSection(
            run_dir=str(run_dir),
            console=False,
            report=False,
            checkpoint_every=checkpoint_every,
            stall_timeout_s=stall_timeout_s,
        ),
    )


def _gid(entry: str) -> str:
    """ "g3/m1/a0: RuntimeError(...)" or "g3: timed out ..." -> "g3"."""
    return entry.split(":", 1)[0].split("/", 1)[0]


def trained_groups(trained_ids: list[list[str]]) -> list[str]:
    """Every trained group id, once per step it was trained in."""
    return [g for ids in trained_ids for g in sorted({_gid(t) for t in ids})]


def lost_groups(trained: list[str], failed: set[str], faulty: set[str] = frozenset()) -> list[str]:
    """Groups up to the last trained one that were neither trained nor recorded as failed (nor targeted)."""
    if not trained:
        return []
    top = max(int(g[1:]) for g in trained)
    return [f"g{k}" for k in range(top + 1) if f"g{k}" not in set(trained) | failed | faulty]


class LogCapture(logging.Handler):
    """Collects the WARNING lines of the ``gymllm`` loggers while a run is drilled."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.name}: {record.getMessage()}")

    @contextlib.contextmanager
    def attached(self):
        lg = logging.getLogger("gymllm")
        lg.addHandler(self)
        try:
            yield self
        finally:
            lg.removeHandler(self)


def _timed_train(cfg: TrainConfig, **kw: Any) -> tuple[Any, BaseException | None, float, list[str]]:
    cap = LogCapture()
    t = time.perf_counter()
    with cap.attached():
        try:
            return train(cfg, **kw), None, time.perf_counter() - t, cap.lines
        except Exception as e:  # the drill reports the error; the test asserts on it
            return None, e, time.perf_counter() - t, cap.lines


def _outcome(
    res: Any,
    err: BaseException | None,
    took: float,
    bound: float,
    *,
    recorded: bool,
    lost: list[str],
    steps: int,
    expect: str = "finished",
    **detail: Any,
) -> dict[str, Any]:
    outcome = "finished" if err is None else "stopped"
    finished_ok = err is None and res is not None and res.steps == steps
    ok = (
        (outcome == expect)
        and took <= bound
        and recorded
        and not lost
        and (finished_ok or expect == "stopped")
    )
    if err is not None:
        detail["error"] = f"{type(err).__name__}: {err}"[:600]
    return {
        "outcome": outcome,
        "bound_s": bound,
        "took_s": round(took, 2),
        "recorded": bool(recorded),
        "lost_other": len(lost),
        "ok": bool(ok),
        "detail": detail,
    }


def _rollout_fault(
    root: pathlib.Path,
    name: str,
    steps: int,
    bound: float,
    *,
    kwargs: dict | None = None,
    env_id: str = "drill/Faulty-v0",
    group_timeout_s: float | None = None,
    faulty: set[str] = frozenset(),
    cause: str = "",
    components: Any = None,
) -> dict[str, Any]:
    cfg = small_config(
        root / name, steps=steps, env_id=env_id, kwargs=kwargs, group_timeout_s=group_timeout_s
    )
    res, err, took, lines = _timed_train(cfg, components=components)
    errors = list(res.counts.get("rollout_errors", [])) if res is not None else []
    failed = {_gid(e) for e in errors}
    trained = trained_groups(res.trained_ids) if res is not None else []
    recorded = bool(errors) and all(cause in e for e in errors) and (not faulty or faulty <= failed)
    finite = res is not None and all(math.isfinite(h["reward_mean"]) for h in res.history)
    out = _outcome(
        res,
        err,
        took,
        bound,
        recorded=recorded and (res is None or finite),
        lost=lost_groups(trained, set() if faulty else failed, faulty),
        steps=steps,
        groups_failed=res.counts.get("groups_failed", 0) if res is not None else None,
        group_timeouts=res.counts.get("group_timeouts", 0) if res is not None else None,
        errors=errors[:3],
        trained_twice=len(trained) - len(set(trained)),
        watchdog=[ln for ln in lines if ln.startswith("gymllm.watchdog")][:2],
    )
    out["ok"] = out["ok"] and len(trained) == len(set(trained))
    return out


def drill_env_hang(root: pathlib.Path, steps: int) -> dict[str, Any]:
    from gymllm.telemetry import get_tracer

    cursor = get_tracer().cursor()
    out = _rollout_fault(
        root,
        "env_hang",
        steps,
        bound=HANG_S * 0.75,
        kwargs={"hang_seeds": [1]},
        group_timeout_s=10.0,
        faulty={"g1"},
        cause="timed out",
    )
    traced = {
        e["args"]["stage"]
        for e in get_tracer().events_since(cursor)
        if e["ph"] == "X" and e["name"] == "stall" and e["track"] == "watchdog"
    }
    named = (
        any("no progress in rollout" in ln for ln in out["detail"]["watchdog"])
        and "rollout" in traced
    )
    out["detail"]["watchdog_named_rollout"] = named
    out["detail"]["stalls_in_trace"] = sorted(traced)
    out["ok"] = out["ok"] and named
    return out


def drill_env_raises(root: pathlib.Path, steps: int) -> dict[str, Any]:
    FaultyRepeatEnv.steps_taken = 0
    return _rollout_fault(
        root, "env_raises", steps, bound=60.0, kwargs={"raise_every": 7}, cause="injected env fault"
    )


def _tool_fault(
    root: pathlib.Path,
    name: str,
    steps: int,
    tool_name: str,
    bound: float,
    check: Callable[[dict], bool],
    timeout_s: float,
) -> dict[str, Any]:
    TOOL_RESULTS.clear()
    cfg = small_config(
        root / name,
        steps=steps,
        env_id="drill/ToolFault-v0",
        kwargs={"tool_name": tool_name, "timeout_s": timeout_s},
    )
    res, err, took, _ = _timed_train(cfg)
    trained = trained_groups(res.trained_ids) if res is not None else []
    recorded = bool(TOOL_RESULTS) and all(check(r) for r in TOOL_RESULTS)
    return _outcome(
        res,
        err,
        took,
        bound,
        recorded=recorded,
        lost=lost_groups(trained, set()),
        steps=steps,
        tool_calls=len(TOOL_RESULTS),
        first_result=TOOL_RESULTS[0] if TOOL_RESULTS else None,
    )


def drill_tool_hang(root: pathlib.Path, steps: int) -> dict[str, Any]:
    return _tool_fault(
        root,
        "tool_hang",
        steps,
        "hang",
        HANG_S * 0.75,
        lambda r: not r["ok"] and r["error"] == "timeout",
        timeout_s=1.0,
    )


def drill_tool_flood(root: pathlib.Path, steps: int) -> dict[str, Any]:
    return _tool_fault(
        root,
        "tool_flood",
        steps,
        "flood",
        90.0,
        lambda r: r["ok"] and r["chars"] <= MAX_RESULT_CHARS + 100,
        timeout_s=30.0,
    )


def drill_engine_raises(root: pathlib.Path, steps: int) -> dict[str, Any]:
    return _rollout_fault(
        root,
        "engine_raises",
        steps,
        bound=60.0,
        cause="injected engine fault",
        components=DrillComponents(engine_fail_at=3),
    )


def drill_reward(root: pathlib.Path, steps: int, value: Any, name: str) -> dict[str, Any]:
    return _rollout_fault(
        root,
        name,
        steps,
        bound=60.0,
        kwargs={"bad_rewards": {1: value}},
        faulty={"g1"},
        cause="RewardError",
    )


def drill_learner_raises(root: pathlib.Path, steps: int) -> dict[str, Any]:
    """Step 3 raises: the run stops naming it; checkpoint 2 is intact and resumes to the end, each group once."""
    from gymllm.algos.checkpoint import Checkpointer
    from gymllm.telemetry.run_log import read_jsonl

    steps = max(steps, 4)
    cfg = small_config(root / "learner_raises", steps=steps, kwargs={}, checkpoint_every=1)
    res, err, took, _ = _timed_train(cfg, components=DrillComponents(learner_fail_step=3))
    ck = Checkpointer(pathlib.Path(cfg.run.run_dir) / "checkpoints")
    kept = ck.latest_step()
    ck.close()
    named = (
        isinstance(err, LearnerStepError)
        and err.step == 3
        and "injected learner fault in step 3" in str(err)
    )
    rest, rerr, _, _ = _timed_train(cfg)  # resume without the fault
    rows, torn = read_jsonl(pathlib.Path(cfg.run.run_dir) / "trajectories.jsonl")
    by_step: dict[int, set[str]] = {}
    for r in rows:
        by_step.setdefault(int(r["step"]), set()).add(r["group_id"])
    trained = [g for s in sorted(by_step) for g in sorted(by_step[s])]
    resumed_ok = (
        rerr is None
        and rest is not None
        and rest.resumed_from == 2
        and rest.steps == steps
        and sorted(by_step) == list(range(1, steps + 1))
        and not torn
        and len(trained) == len(set(trained))
    )
    out = _outcome(
        res,
        err,
        took,
        60.0,
        recorded=named and kept == 2,
        lost=lost_groups(trained, set()),
        steps=steps,
        expect="stopped",
        checkpoint_kept=kept,
        resumed_ok=resumed_ok,
        resume_error=repr(rerr)[:300] if rerr else None,
    )
    out["ok"] = out["ok"] and resumed_ok
    return out


def drill_server_disconnect(root: pathlib.Path, steps: int) -> dict[str, Any]:
    """A streaming client closes after its first token: the engine request is cancelled (it stops short of
    its 40 tokens) and the next request is served, equal to the engine's own answer in process."""
    import httpx

    from gymllm.train.components import load_model
    from gymllm.inference import JaxEngine, SamplingParams, ServerThread, build_app

    cfg = small_config(
        root / "server", steps=steps
    )  # the drilled runs' model and engine: compiled shapes shared
    lm = load_model(cfg.model)
    engine = JaxEngine.from_loaded(lm, config=cfg.engine, stop_token_ids=())
    closed, hold_after_first = threading.Event(), threading.Event()

    class Watched:
        """The served engine, unchanged, except that the end of each token stream is signalled, and that
        the engine is held (no decode step starts) from the stream's first token until the stream ends:
        the disconnect is seen before the request could finish, however fast the engine decodes."""

        def __getattr__(self, name: str) -> Any:
            return getattr(engine, name)

        async def stream(self, *args: Any, **kwargs: Any):
            hold = None
            try:
                async for item in engine.stream(*args, **kwargs):
                    if hold is None and hold_after_first.is_set():
                        hold = engine.paused()
                        hold.__enter__()  # waits for the running iteration (at most one decode chunk)
                    yield item
            finally:
                closed.set()
                if hold is not None:
                    hold.__exit__(None, None, None)

    body = {
        "model": "tiny-qwen3",
        "prompt": [5, 6, 7, 8],
        "max_tokens": 40,
        "temperature": 0.0,
        "stream": True,
    }
    served = cancelled = False
    detail: dict[str, Any] = {}
    t = time.perf_counter()
    try:
        with (
            ServerThread(build_app(Watched(), lm.tokenizer, "tiny-qwen3")) as server,
            httpx.Client(base_url=server.url, timeout=600) as http,
        ):
            for warm in (
                body,
                {**body, "stream": False, "max_tokens": 6},
            ):  # compiles: not part of the bound
                with http.stream("POST", "/v1/completions", json=warm) as resp:
                    resp.read()
            closed.clear()
            hold_after_first.set()
            detail["warmup_s"] = round(time.perf_counter() - t, 2)
            t = time.perf_counter()
            before = engine.stats["generated_tokens"]
            with http.stream("POST", "/v1/completions", json=body) as resp:
                first = next(line for line in resp.iter_lines() if line.startswith("data: "))
                with (
                    engine.paused()
                ):  # no decode step runs until the server has seen the disconnect
                    resp.close()
                    cancelled = closed.wait(20.0)
            hold_after_first.clear()
            nxt = http.post("/v1/completions", json={**body, "stream": False, "max_tokens": 6})
            got = nxt.json()["choices"][0]["text"] if nxt.status_code == 200 else None
            ref = asyncio.run(
                engine.generate([5, 6, 7, 8], SamplingParams(temperature=0.0, max_tokens=6))
            )
            served = nxt.status_code == 200 and got == lm.tokenizer.decode(
                [int(i) for i in ref.token_ids]
            )
            used = engine.stats["generated_tokens"] - before - 12  # minus the two 6-token requests
            detail = {
                "first_event": first[:80],
                "disconnected_request_tokens": used,
                "next_status": nxt.status_code,
            }
            cancelled = cancelled and used < 40
    finally:
        engine.shutdown()
    took = time.perf_counter() - t
    ok = served and cancelled and took <= 30.0
    return {
        "outcome": "finished",
        "bound_s": 30.0,
        "took_s": round(took, 2),
        "recorded": bool(cancelled),
        "lost_other": 0 if served else 1,
        "ok": bool(ok),
        "detail": detail,
    }


def warm_up(root: pathlib.Path) -> float:
    """One fault-free step of the small config: the compiles every drilled run shares (not part of any bound)."""
    t = time.perf_counter()
    train(small_config(root / "warm_up", steps=1, stall_timeout_s=0))
    return time.perf_counter() - t


def run_fault(name: str, root: pathlib.Path, steps: int) -> dict[str, Any]:
    table: dict[str, Callable[[], dict[str, Any]]] = {
        "env_hang": lambda: drill_env_hang(root, steps),
        "env_raises": lambda: drill_env_raises(root, steps),
        "tool_hang": lambda: drill_tool_hang(root, steps),
        "tool_flood": lambda: drill_tool_flood(root, steps),
        "engine_raises": lambda: drill_engine_raises(root, steps),
        "learner_raises": lambda: drill_learner_raises(root, steps),
        "reward_nan": lambda: drill_reward(root, steps, float("nan"), "reward_nan"),
        "reward_text": lambda: drill_reward(root, steps, "0.5", "reward_text"),
        "server_disconnect": lambda: drill_server_disconnect(root, steps),
    }
    return table[name]()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 steps a run instead of 6")
    ap.add_argument("--faults", nargs="*", default=list(FAULTS), choices=FAULTS)
    args = ap.parse_args()
    steps = 3 if args.quick else 6
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="gymllm-drill-") as tmp:
        out["warm_up_s"] = round(warm_up(pathlib.Path(tmp)), 1)
        for name in args.faults:
            out[name] = r = run_fault(name, pathlib.Path(tmp), steps)
            print(
                f"{name:18s} {r['outcome']:8s} took {r['took_s']:6.1f} s (bound {r['bound_s']:g} s) "
                f"recorded={r['recorded']} lost_other={r['lost_other']} ok={r['ok']}",
                flush=True,
            )
    out["faults_ok"] = sum(1 for n in args.faults if out[n]["ok"])
    out["faults_total"] = len(args.faults)
    out["steps_per_run"] = steps
    out["machine"] = platform.machine()
    from results import emit_result  # the RESULT line, and its record in benchmarks/results/

    emit_result("drill_faults", out)


if __name__ == "__main__":
    main()
