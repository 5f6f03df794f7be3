"""``rollout.mode = "proxy"``: ``train()`` serves its engine in training mode on loopback, runs a real
agent program (examples/openai_agent.py, a plain `openai`-client loop, as a subprocess) against it
and trains on the recorded sessions. Checked against what the engine was asked and sampled (a spy
around the real engine), and against what the program itself printed for each episode."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import sys

import httpx
import numpy as np
import pytest

from gymllm.train.components import LocalComponents
from gymllm.train.train_config import RunSection, preset
from gymllm.rollout.config import RolloutConfig
from gymllm.train.trainer import train
from gymllm.errors import ConfigError
from gymllm.rollout.agent_programs import AgentProgramError

ROOT = pathlib.Path(__file__).resolve().parents[1]
AGENT = (
    f"{{python}} {ROOT / 'examples' / 'openai_agent.py'} --base-url {{base_url}} --model {{model}} "
    "--task gymllm/TinyRepeat-v0 --env-kwargs '{{\"num_letters\": 2}}' --no-tools --problems 0 "
    "--group-size {group_size} --seed {seed} --max-tokens 4 --max-turns 1 --concurrency 4"
)


class Spy:
    """The real engine; every (session id, prompt ids, Completion) it served is kept."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    async def generate(self, prompt, params, *, session_id=None):
        c = await self.engine.generate(prompt, params, session_id=session_id)
        self.calls.append((session_id, [int(i) for i in prompt], c))
        return c


class SpyComponents(LocalComponents):
    """Local components whose engine is wrapped in a :class:`Spy` and whose learner's submitted
    groups are kept (``trained``)."""

    def __init__(self):
        super().__init__()
        self.spy, self.trained = None, []

    def make_engine(self, cfg, lm, version):
        self.spy = Spy(super().make_engine(cfg, lm, version))
        return self.spy

    def make_learner(self, cfg, lm):
        learner = super().make_learner(cfg, lm)
        submit = learner.submit

        def keep(groups):
            self.trained += groups
            return submit(groups)

        learner.submit = keep
        return learner


def config(run_dir, agent_program=AGENT, **rollout):
    cfg = preset("tiny")
    return dataclasses.replace(
        cfg,
        env=dataclasses.replace(cfg.env, num_envs=4),
        engine=dataclasses.replace(cfg.engine, num_slots=8, max_len=96),
        sampling=dataclasses.replace(cfg.sampling, max_tokens=4),
        rollout=dataclasses.replace(
            cfg.rollout, mode="proxy", agent_program=agent_program, group_size=4, **rollout
        ),
        learner=dataclasses.replace(
            cfg.learner, groups_per_step=2, num_steps=2, micro_batch_size=8, max_len=96
        ),
        run=RunSection(run_dir=str(run_dir), console=False, report=False),
    )


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_proxy_mode_trains_on_exactly_the_recorded_sessions(tmp_path):
    pytest.importorskip("openai")
    parts = SpyComponents()
    result = train(config(tmp_path), components=parts)
    assert result.steps == 2
    # step 1 trains at the version that sampled: the learner's logprobs of the rows are the engine's
    assert result.history[0]["mismatch_abs_logprob"] < 1e-3, result.history[0]
    calls = {sid: (prompt, c) for sid, prompt, c in parts.spy.calls}
    trajs = [t for g in parts.trained for t in g.trajectories]
    assert len(trajs) == 2 * 2 * 4 and all(len(g.trajectories) == 4 for g in parts.trained)
    for (
        t
    ) in trajs:  # one model call per episode: the row is the prompt (context) then the sampled ids
        prompt, c = calls[t.info["session_id"]]
        sampled = np.asarray(c.token_ids).tolist()
        assert t.token_ids.tolist() == prompt + sampled
        assert t.loss_mask.tolist() == [0] * len(prompt) + [1] * len(sampled)
        np.testing.assert_array_equal(
            t.behaviour_logprobs[len(prompt) :], np.asarray(c.logprobs, np.float32)
        )
        assert t.versions[len(prompt) :].tolist() == np.asarray(c.versions).tolist()
    # what the program printed (one JSON line per episode) matches what was trained and logged
    printed = {}
    for line in (tmp_path / "agent_0.log").read_text().splitlines():
        e = json.loads(line) if line.startswith("{") else {}
        if (
            e.get("event") == "reward"
        ):  # printed before the reward is posted, so every closed session has one
            printed[e["session"]] = e
    logged = [json.loads(x) for x in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    assert len(logged) == len(trajs)
    for rec in logged:
        sid = rec["trajectory_id"].split("/", 1)[1]
        assert (
            printed[sid]["group_id"] == rec["group_id"] and printed[sid]["reward"] == rec["reward"]
        )
    assert {t.trajectory_id for t in trajs} == {r["trajectory_id"] for r in logged}
    # the program and the server are gone
    assert result.counts["agent_exit_codes"] and all(
        rc is not None for rc in result.counts["agent_exit_codes"]
    )
    assert all(gone(pid) for pid in result.counts["agent_pids"])
    with pytest.raises(httpx.TransportError):
        httpx.get(result.counts["proxy_url"] + "/health", timeout=5)


def test_an_agent_program_that_fails_fails_the_run_clearly(tmp_path):
    bad = f"{sys.executable} -c \"import sys; print('agent: cannot reach the task'); sys.exit(3)\""
    with pytest.raises(AgentProgramError) as info:
        train(config(tmp_path, agent_program=bad.replace("{", "{{").replace("}", "}}")))
    msg = str(info.value)
    assert "exit status 3" in msg and "cannot reach the task" in msg and "agent_0.log" in msg


def test_a_program_that_never_closes_a_session_fails_within_the_bound(tmp_path):
    idle = f'{sys.executable} -c "import time; time.sleep(600)"'
    with pytest.raises(AgentProgramError, match="agent_start_timeout_s"):
        train(config(tmp_path, agent_program=idle, agent_start_timeout_s=1.0))


def test_proxy_mode_needs_a_program():
    with pytest.raises(ConfigError, match="agent_program"):
        RolloutConfig(mode="proxy")
    with pytest.raises(ConfigError, match="agent_program"):
        RolloutConfig(mode="async", agent_program="python agent.py")
    with pytest.raises(
        ConfigError, match="placeholders"
    ):  # caught at config time, before any compile
        RolloutConfig(mode="proxy", agent_program="python agent.py --kwargs '{\"a\": 1}'")


@pytest.mark.slow  # another ~50 s of compile on 2 cores
def test_a_program_that_finishes_ends_the_run_with_what_it_played(tmp_path, caplog):
    pytest.importorskip("openai")
    finite = AGENT.replace("--problems 0", "--problems 2")  # 2 groups of 4: one step's worth
    result = train(config(tmp_path, agent_program=finite))
    assert result.steps == 1 and result.counts["agent_exit_codes"] == [0]
    assert "exited (status 0) after 8 closed sessions" in caplog.text
