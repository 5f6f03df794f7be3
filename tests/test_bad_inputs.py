"""The bad-input table (docs/bad-input.md), row by row: each bad input gets the error the table names,
with a message that says what was expected and how to fix it, and nothing else is lost. A row of the
table without a case here (or a case without a row) fails ``test_every_row_of_the_readme_table_is_checked``."""

from __future__ import annotations

import asyncio
import pathlib
import re

import pytest

import gymllm
from gymllm.core import TextEnv
from gymllm.errors import ConfigError, InvalidActionError, RewardError
from gymllm.spaces import Text

ROOT = pathlib.Path(__file__).resolve().parents[1]
CASES: dict[str, object] = {}


def case(key: str):
    def register(fn):
        CASES[key] = fn
        return fn

    return register


def _readme_keys() -> list[str]:
    table = (
        ROOT.joinpath("docs", "bad-input.md")
        .read_text()
        .split("# Bad input", 1)[1]
        .split("\n## ", 1)[0]
    )
    return re.findall(r"^\| `([a-z0-9_]+)` \|", table, flags=re.M)


@case("malformed_tool_call")
def _malformed_tool_call():
    from gymllm.tools import calculator
    from gymllm.wrappers import ToolUse

    env = ToolUse(gymllm.make("gymllm/Arithmetic-v0"), tools=[calculator])
    env.reset(seed=0)
    obs, reward, term, trunc, info = env.step("<tool_call>{not json</tool_call>")
    assert info["tool_calls"][0]["error"] == "parse" and obs[0]["content"].startswith("Error: ")
    assert not term and not trunc  # the episode goes on: the model can try again


@case("invalid_utf8_action")
def _invalid_utf8_action():
    env = gymllm.make("gymllm/Arithmetic-v0")
    env.reset(seed=0)
    with pytest.raises(InvalidActionError, match="lone surrogate"):
        env.step("\ud800")
    with pytest.raises(InvalidActionError, match="type bytes"):
        env.step(b"\xff")
    assert env.step("\\boxed{0}")[2]  # the env is intact: the next valid action is graded


@case("oversized_action")
def _oversized_action():
    env = gymllm.make("gymllm/Arithmetic-v0")
    env.reset(seed=0)
    with pytest.raises(InvalidActionError, match="max_length=1048576"):
        env.step("x" * (2**20 + 1))
    env.step("x" * 2**20)  # exactly 1 MiB of characters is accepted


@case("unknown_env_id")
def _unknown_env_id(capsys):
    from gymllm.cli.main import main

    with pytest.raises(ConfigError, match="expected a registered env id.*did you mean"):
        gymllm.make("gymllm/NoSuchEnv-v0")
    assert main(["check", "gymllm/NoSuchEnv-v0"]) == 2
    err = capsys.readouterr().err
    assert (
        len(err.strip().splitlines()) == 2 and "gymllm envs" in err
    )  # one line + a hint, no traceback


@case("bad_config")
def _bad_config(capsys):
    from gymllm.cli.main import main
    from gymllm.rollout import RolloutConfig

    with pytest.raises(
        ConfigError, match=r"RolloutConfig.group_size: expected an int >= 1, received 0. Fix"
    ):
        RolloutConfig(group_size=0)
    assert (
        main(["train", "--preset", "tiny", "--rollout.group-size", "zero"]) == 2
    )  # tyro's usage error
    assert "Traceback" not in capsys.readouterr().err


@case("bad_reward")
def _bad_reward():
    class NaNReward(TextEnv):
        def _reset(self, *, seed, options):
            return "q", {}

        def _step(self, action):
            return "done", float("nan"), True, {}

    env = NaNReward()
    env.reset(seed=0)
    with pytest.raises(RewardError, match="finite real number"):
        env.step("a")


@case("observation_outside_space")
def _observation_outside_space():
    from gymllm.utils import check_env
    from gymllm.utils.env_checker import EnvCheckError

    class IntObs(TextEnv):
        observation_space = Text()

        def _reset(self, *, seed, options):
            return "q", {}

        def _step(self, action):
            return 123, 0.0, True, {}

    with pytest.raises(EnvCheckError, match="observation_space"):
        check_env(IntObs())


@case("no_progress")
def _no_progress():
    from test_rollout_orchestrator import SAMPLING, ScriptedEngine, consume_all, tok

    from gymllm.rollout import ModelAgent, RolloutConfig, RolloutOrchestrator, RolloutStalledError

    envs = [gymllm.make("gymllm/Failing-v0") for _ in range(2)]
    orch = RolloutOrchestrator(
        envs,
        ScriptedEngine(),
        ModelAgent(tok()),
        sampling=SAMPLING,
        config=RolloutConfig(group_size=2, max_concurrency=2, max_failed_streak=4),
    )
    with pytest.raises(RolloutStalledError, match="4 failed attempts in a row"):
        asyncio.run(consume_all(orch, timeout=60))


@pytest.fixture(scope="module")
def client():
    from fastapi.testclient import TestClient

    from gymllm.inference import EngineConfig, JaxEngine
    from gymllm.inference.session_recorder import SessionRecorder
    from gymllm.inference.server import build_app
    from gymllm.models import make_tiny

    lm = make_tiny("qwen3")  # requests below are refused before any device step: nothing compiles
    engine = JaxEngine.from_loaded(lm, config=EngineConfig(num_slots=2, max_len=64, min_bucket=64))
    app = build_app(engine, lm.tokenizer, "tiny", recorder=SessionRecorder(lm.tokenizer))
    with TestClient(app) as c:
        yield c
    engine.shutdown()


@case("oversized_request")
def _oversized_request(client):
    msgs = [{"role": "user", "content": "hi"}]
    r = client.post(
        "/v1/chat/completions",
        content=b'{"model": "tiny", "prompt": "' + b"x" * 1_100_000 + b'"}',
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 413
    r = client.post("/v1/chat/completions", json={"model": "tiny", "messages": msgs, "n": 1000})
    assert r.status_code == 400 and "n" in r.text
    r = client.post(
        "/v1/chat/completions", json={"model": "tiny", "messages": msgs, "max_tokens": 10**6}
    )
    assert r.status_code == 400 and "max_tokens" in r.text
    r = client.post(
        "/v1/completions",
        content=b'{"model": "tiny", "prompt": "\\ud800"}',  # JSON-escaped
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400
    assert client.get("/health").status_code == 200  # still serving


@case("unknown_session")
def _unknown_session(client):
    r = client.post("/v1/sessions/no-such-session/reward", json={"reward": 1.0})
    assert r.status_code == 404 and "no-such-session" in r.text


@pytest.mark.parametrize("key", sorted(CASES))
def test_bad_input(key, request):
    fn = CASES[key]
    args = [request.getfixturevalue(n) for n in fn.__code__.co_varnames[: fn.__code__.co_argcount]]
    fn(*args)


def test_every_row_of_the_readme_table_is_checked():
    assert sorted(_readme_keys()) == sorted(CASES)
