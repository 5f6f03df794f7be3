"""OpenEnv both ways, over real servers on 127.0.0.1: `gymllm serve-env` processes read by OpenEnv's own
client, and `from_openenv` reading envs written with OpenEnv's API (served by OpenEnv's own app in a
uvicorn thread). Killed servers, bad messages, reaped sessions and the barrier-free vector env over
remote envs are exercised on the real thing; orderings are forced with gates the test holds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

pytest.importorskip("openenv", reason="the openenv extra (pip install 'gymllm[openenv]')")

import gymllm  # noqa: E402
from gymllm.core import TextEnv  # noqa: E402
from gymllm.envs.openenv_adapter import from_openenv  # noqa: E402
from gymllm.envs.openenv_config import OpenEnvError, import_openenv  # noqa: E402
from gymllm.envs.openenv_server import ServeEnvConfig, ServerThread, build_app  # noqa: E402
from gymllm.errors import ConfigError, EnvError, EnvTimeoutError, InvalidActionError  # noqa: E402
from gymllm.spaces import Chat, Text  # noqa: E402
from gymllm.utils import check_env  # noqa: E402
from gymllm.utils.serving import stop_process  # noqa: E402

core = import_openenv("openenv.core")
generic = import_openenv("openenv.core.generic_client")
ws_sync = pytest.importorskip("websockets.sync.client")
TESTS = Path(__file__).resolve().parent


# ------------------------------------------------------------------------------------------- a gymllm env
class ProbeEnv(TextEnv):
    """Chat observations at reset, text after; 'boom' raises; 'end' terminates; numpy in info."""

    def __init__(self, max_turns: int = 3):
        super().__init__(max_turns=max_turns)
        self.action_space = Text(max_length=64)
        self.observation_space = Chat()

    def _reset(self, *, seed, options):
        word = str(self.np_random.integers(1000))
        self._word = word
        return (
            [
                {"role": "system", "content": "be brief ✓"},
                {"role": "user", "content": f"say {word}"},
            ],
            {"answer": word, "options": options or {}, "arr": np.arange(2)},
        )

    def _step(self, action):
        if action == "boom":
            raise ValueError("boom requested")
        reward = np.float32(1.0 if action == self._word else 0.0)
        return (
            [{"role": "user", "content": f"you said {action}"}],
            reward,
            action == "end",
            {"n": np.int64(self.turn + 1)},
        )


def make_probe_env() -> ProbeEnv:
    return ProbeEnv()


def _start(*args: str) -> subprocess.Popen:
    """`gymllm serve-env ARGS --port 0` (this test module importable, for its env factories)."""
    env = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen(
        [sys.executable, "-m", "gymllm.cli.main", "serve-env", *args, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def _wait_url(proc: subprocess.Popen) -> str:
    lines = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("serving "):
            threading.Thread(
                target=proc.stdout.read, daemon=True
            ).start()  # keep draining its output
            return line.split(" on ")[1].split()[0]
    proc.kill()
    raise AssertionError("serve-env did not start:\n" + "".join(lines))


def _stop(proc: subprocess.Popen) -> None:
    stop_process(proc, sig=signal.SIGINT, timeout_s=3)


@pytest.fixture(scope="module")
def servers():
    """`gymllm serve-env` processes (the probe env; an Echo to kill); an Echo and a reaping probe server in threads."""
    proc = _start("test_openenv:make_probe_env", "--max-message-mb", "0.05")
    victim = _start("gymllm/Echo-v0")  # killed by test_kill_9_mid_episode_fails_that_episode_only
    echo = ServerThread(build_app(ServeEnvConfig(env="gymllm/Echo-v0")))
    reap = ServerThread(
        build_app(
            ServeEnvConfig(env="test_openenv:make_probe_env", max_sessions=1, session_timeout_s=0.5)
        )
    )
    try:
        yield {
            "probe": (proc, _wait_url(proc)),
            "victim": (victim, _wait_url(victim)),
            "echo_a": (None, echo.url),
            "reap": (None, reap.url),
        }
    finally:
        for p in (proc, victim):
            _stop(p)
        echo.close()
        reap.close()


# ------------------------------------------------------------------------------------------- serve side
def test_openenv_client_against_serve_env(servers):
    """OpenEnv's GenericEnvClient resets, steps and reads state; everything matches the env in process."""
    url = servers["probe"][1]
    schema = httpx.get(url + "/schema").json()
    assert schema["action"]["properties"]["text"]["maxLength"] == 64
    assert schema["observation"]["x-gymllm-observation"] == "chat"
    local = make_probe_env()
    with generic.GenericEnvClient(base_url=url).sync() as client:
        for seed in (7, 7, 8):  # seeds pass through: the same seed gives the same episode
            r = client.reset(seed=seed, level="hard")
            obs, info = local.reset(seed=seed, options={"level": "hard"})
            assert r.observation["messages"] == obs and r.done is False and r.reward is None
            assert r.metadata["info"] == {
                "options": {"level": "hard"},
                "arr": [0, 1],
            }  # the gold "answer" withheld
            assert "answer" in info
            r = client.step({"text": "héllo ✓"})
            want = local.step("héllo ✓")
            assert r.observation["messages"] == want[0] and r.reward == 0.0 and r.done is False
            assert r.metadata == {"terminated": False, "truncated": False, "info": {"n": 1}}
        state = client.state()
        assert (
            state["step_count"] == 1
            and state["turn"] == 1
            and state["env_id"] == "test_openenv:make_probe_env"
        )
        with pytest.raises(RuntimeError, match=r"ValueError: boom requested.*EXECUTION_ERROR"):
            client.step({"text": "boom"})  # an env error comes back as OpenEnv's error ...
        r = client.step({"text": "again"})  # ... and the session goes on
        assert r.metadata["info"] == {"n": 2}
        r = client.step({"text": "x"})  # max_turns=3: truncated, and OpenEnv's done
        assert (
            r.done is True and r.metadata["truncated"] is True and r.metadata["terminated"] is False
        )
        with pytest.raises(RuntimeError, match="ResetNeededError"):
            client.step({"text": "late"})
        r = client.reset(seed=1)
        assert client.step({"text": "end"}).metadata["terminated"] is True


def test_from_openenv_round_trips_serve_env_chat(servers):
    env = from_openenv(servers["probe"][1])
    assert isinstance(env.observation_space, Chat) and env.action_space.max_length == 64
    local = make_probe_env()
    obs, info = env.reset(seed=3)
    assert (
        obs == local.reset(seed=3)[0] and "answer" not in info
    )  # the server withholds the gold answer
    assert (
        env.step(local._word)[:4]
        == local.step(local._word)[:4]
        == ([{"role": "user", "content": f"you said {local._word}"}], 1.0, False, False)
    )
    with pytest.raises(InvalidActionError):
        env.step("x" * 65)  # checked against the declared space before it is sent
    with pytest.raises(OpenEnvError, match="ValueError: boom requested") as e:
        env.step("boom")
    assert e.value.code == "EXECUTION_ERROR"
    check_env(env, policy=lambda t: ["a", "end", "b"][t % 3])
    env.close()


def _ws(url: str, query: str = "") -> Any:
    return ws_sync.connect(url.replace("http://", "ws://") + "/ws" + query, open_timeout=10)


def _first_reply(url: str, msg: Any) -> dict:
    """Open a session, send ``msg`` and return the first reply (a refused session answers before closing)."""
    with _ws(url) as c:
        try:
            c.send(json.dumps(msg))
        except Exception:  # noqa: BLE001 - closed already: its error frame is still queued
            pass
        return json.loads(c.recv(timeout=10))


def _ask(conn: Any, msg: Any) -> dict:
    conn.send(msg if isinstance(msg, (str, bytes)) else json.dumps(msg))
    return json.loads(conn.recv(timeout=10))


def test_bad_messages_get_clear_errors_and_the_server_stays_up(servers):
    url = servers["probe"][1]
    with _ws(url) as c:
        assert _ask(c, "{not json")["data"]["code"] == "INVALID_JSON"
        assert _ask(c, {"type": "teleport"})["data"]["code"] == "UNKNOWN_TYPE"
        err = _ask(c, {"type": "step", "data": {"text": "early"}})[
            "data"
        ]  # protocol misuse: step before reset
        assert (
            err["code"] == "EXECUTION_ERROR"
            and "ResetNeededError" in err["message"]
            and "reset() first" in err["message"]
        )
        assert _ask(c, {"type": "reset", "data": {"seed": 1}})["type"] == "observation"
        err = _ask(c, {"type": "step", "data": {"text": 5}})["data"]
        assert err["code"] == "VALIDATION_ERROR" and err["errors"][0]["type"] == "string_type"
        err = _ask(c, {"type": "step", "data": {"txt": "typo"}})["data"]
        assert err["code"] == "VALIDATION_ERROR" and {e["type"] for e in err["errors"]} == {
            "missing",
            "extra_forbidden",
        }
        err = _ask(c, {"type": "step", "data": {"text": "y" * 65}})[
            "data"
        ]  # oversized for the env's action space
        assert err["code"] == "VALIDATION_ERROR" and err["errors"][0]["ctx"] == {"max_length": 64}
        assert (
            _ask(c, {"type": "step", "data": {"text": "fine"}})["type"] == "observation"
        )  # the session goes on
    with _ws(url) as c:  # a frame over --max-message-mb closes that connection (1009) ...
        c.send(json.dumps({"type": "step", "data": {"text": "z" * 100_000}}))
        with pytest.raises(Exception) as e:
            c.recv(timeout=10)
        assert getattr(getattr(e.value, "rcvd", None), "code", None) == 1009, e.value
    with _ws(url, "?session_id=no-such-session") as c:  # unknown session
        err = json.loads(c.recv(timeout=10))["data"]
        assert (
            err["code"] == "SESSION_ERROR"
            and "Unknown session_id: no-such-session" in err["message"]
        )
    with _ws(url) as c:  # ... and the server serves the next session
        assert _ask(c, {"type": "reset", "data": {"seed": 2}})["type"] == "observation"
        assert _ask(c, {"type": "step", "data": {"text": "ok"}})["data"]["done"] is False
    # OpenEnv's stateless HTTP endpoints (a fresh env per request)
    r = httpx.post(url + "/step", json={"action": {"text": "x"}})
    assert (
        r.status_code == 409 and "ResetNeededError" in r.json()["detail"]
    )  # the order of calls: a 4xx
    assert httpx.post(url + "/step", json={"action": {"text": 3}}).status_code == 422
    assert (
        httpx.post(url + "/reset", json={"seed": 1}).json()["observation"]["messages"][0]["role"]
        == "system"
    )
    assert servers["probe"][0].poll() is None


def test_idle_sessions_are_reaped(servers):
    url = servers["reap"][1]  # --max-sessions 1 --session-timeout-s 0.5
    idle = _ws(url)
    assert _ask(idle, {"type": "reset", "data": {}})["type"] == "observation"
    assert _first_reply(url, {"type": "reset", "data": {}})["data"]["code"] == "CAPACITY_REACHED"
    deadline = time.monotonic() + 30  # OpenEnv's reaper runs every 5 s at the shortest
    while (reply := _first_reply(url, {"type": "reset", "data": {}}))["type"] != "observation":
        assert reply["data"]["code"] == "CAPACITY_REACHED" and time.monotonic() < deadline, reply
        time.sleep(0.2)
    err = _ask(idle, {"type": "step", "data": {"text": "late"}})["data"]
    assert err["code"] == "EXECUTION_ERROR" and "reaped" in err["message"]
    idle.close()


def test_kill_9_mid_episode_fails_that_episode_only(servers):
    proc, url = servers["victim"]
    urls = [url, servers["echo_a"][1]]
    vec = gymllm.make_vec([lambda u=u: from_openenv(u, timeout_s=20) for u in urls])
    ref = gymllm.make_vec(["gymllm/Echo-v0"] * 2)
    obs, _ = vec.reset(seed=4)
    assert list(obs) == list(ref.reset(seed=4)[0])
    assert list(vec.step(["a", "b"])[0]) == list(ref.step(["a", "b"])[0])
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    obs, rew, term, trunc, infos = vec.step(["c", "d"])
    err = infos["error"][0]
    assert (
        obs[0] is None
        and trunc[0]
        and "lost" in str(err)
        and "reset() opens a new session" in str(err)
    )
    assert (
        obs[1] == ref.step(["c", "d"])[0][1] and not infos["_error"][1]
    )  # the other episode goes on
    with pytest.raises(
        EnvError, match="2 failed attempts"
    ) as e:  # one reconnect, then a clear failure
        vec.reset_env(0, seed=1)
    assert isinstance(e.value.cause, OpenEnvError) and e.value.env_id == 0
    vec.send(["e"], env_ids=[1])
    ref.send(["e"], env_ids=[1])
    assert vec.recv()[0][0] == ref.recv()[0][0]
    vec.close()
    ref.close()


# ------------------------------------------------------------------------------------------- consume side
GATES: dict[int, threading.Event] = {}


class GuessAction(core.Action):
    guess: str


class GuessObservation(core.Observation):
    prompt: str = ""
    legal: list[str] = []


class GuessEnvironment(core.Environment):
    """Written with OpenEnv's API: guess a seeded letter. A step of the episode seeded ``s`` waits
    for ``GATES[s]`` when the test has put one there."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._seed, self._steps, self._letter = 0, 0, "a"

    def reset(self, seed=None, episode_id=None, **kwargs):
        self._seed, self._steps = seed or 0, 0
        self._letter = "abcd"[(self._seed * 7 + 3) % 4]
        return GuessObservation(prompt=f"guess a letter (seed {self._seed})", legal=list("abcd"))

    def step(self, action, timeout_s=None, **kwargs):
        gate = GATES.get(self._seed)
        if gate is not None:
            assert gate.wait(timeout=30)
        self._steps += 1
        hit = action.guess == self._letter
        return GuessObservation(
            prompt=f"{action.guess}: {'yes' if hit else 'no'}",
            legal=list("abcd"),
            done=hit or self._steps >= 4,
            reward=1.0 if hit else 0.0,
            metadata={"steps": self._steps},
        )

    @property
    def state(self):
        return core.State(step_count=self._steps)


class TwoFieldAction(core.Action):
    guess: str
    note: str


@pytest.fixture(scope="module")
def guess_url():
    app = core.create_fastapi_app(
        GuessEnvironment, GuessAction, GuessObservation, max_concurrent_envs=8
    )
    with ServerThread(app) as server:
        yield server.url


def test_from_openenv_against_an_openenv_env(guess_url):
    env = from_openenv(guess_url)
    assert isinstance(env.action_space, Text) and isinstance(env.observation_space, Text)
    obs, info = env.reset(seed=1)
    assert obs == "guess a letter (seed 1)" and info["observation"] == {"legal": list("abcd")}
    assert env.step("a") == (
        "a: no",
        0.0,
        False,
        False,
        {"steps": 1, "observation": {"legal": list("abcd")}},
    )
    assert env.step("c")[1:3] == (1.0, True)  # the letter for seed 1 is "abcd"[10 % 4]
    check_env(
        env
    )  # deterministic remote env: Gymnasium's checks, determinism, unicode, async == sync
    env.close()
    reg = gymllm.make("gymllm/OpenEnv-v0", base_url=guess_url, reset_kwargs={"seed": 2})
    assert reg.reset()[0] == "guess a letter (seed 2)"
    reg.close()
    with pytest.raises(ConfigError, match="base_url"):
        gymllm.make("gymllm/OpenEnv-v0").reset()


def test_action_schema_with_two_text_fields_needs_a_field_or_a_function():
    app = core.create_fastapi_app(
        GuessEnvironment, TwoFieldAction, GuessObservation, max_concurrent_envs=2
    )
    with ServerThread(app) as server:
        with pytest.raises(ConfigError, match=r"one text field.*action_field"):
            from_openenv(server.url)
        env = from_openenv(server.url, action_fn=lambda text: {"guess": text[0], "note": text})
        env.reset(seed=1)
        assert env.step("c, surely")[0] == "c: yes"
        env.close()
        env = from_openenv(
            server.url, action_field="guess"
        )  # "note" stays required: the server says so
        env.reset(seed=1)
        with pytest.raises(OpenEnvError, match="VALIDATION_ERROR"):
            env.step("b")
        env.close()


def test_make_vec_over_remote_envs_is_barrier_free(guess_url):
    GATES[0] = (
        threading.Event()
    )  # the episode seeded 0 (sub-env 0) is held until the test lets it go
    vec = gymllm.make_vec([lambda: from_openenv(guess_url)] * 3)
    try:
        vec.reset(seed=0)  # sub-env i gets seed i
        vec.send(["a", "a", "a"])
        done: set[int] = set()
        while done != {1, 2}:
            *_, ids = vec.recv(min_ready=1, timeout=30)
            done |= set(int(i) for i in ids)
            assert 0 not in done
        GATES[0].set()
        obs, rew, term, trunc, infos, ids = vec.recv(min_ready=1, timeout=30)
        assert list(ids) == [0] and obs[0] == "a: no"
    finally:
        GATES.pop(0).set()
        vec.close()


def test_per_call_timeout(guess_url):
    GATES[5] = threading.Event()
    env = from_openenv(guess_url, timeout_s=0.3)
    try:
        env.reset(seed=5)
        with pytest.raises(EnvTimeoutError, match="timeout_s=0.3"):
            env.step("a")
        with pytest.raises(OpenEnvError, match="session lost"):  # that episode is over ...
            env.step("a")
        GATES[5].set()
        assert (
            env.reset(seed=6)[0] == "guess a letter (seed 6)"
        )  # ... the next one opens a new session
    finally:
        GATES.pop(5).set()
        env.close()


def test_a_gymnasium_env_served_in_process_and_tokens():
    with pytest.raises(ConfigError, match="token"):
        ServeEnvConfig(env="gymllm/Echo-v0", host="0.0.0.0")
    ServeEnvConfig(env="gymllm/Echo-v0", host="0.0.0.0", token="s3cret")  # allowed with a token
    with ServerThread(build_app(ServeEnvConfig(env="FrozenLake-v1", token="s3cret"))) as server:
        with pytest.raises(OpenEnvError, match="HTTP 401"):
            from_openenv(server.url)
        with pytest.raises(Exception, match="403"):
            _ws(server.url)
        env = from_openenv(server.url, token="s3cret")
        local = gymllm.envs.from_gymnasium("FrozenLake-v1")
        assert env.reset(seed=0) == local.reset(seed=0)
        for a in ("right", "down", "down"):
            assert env.step(a) == local.step(a)
        env.close()


def test_an_async_env_is_awaited_on_the_server_loop():
    from gymllm.envs.openenv_factory import is_async_native

    kwargs = {"median_s": 0.001, "p99_s": 0.005}
    local = gymllm.make("gymllm/AsyncLatency-v0", **kwargs)
    assert is_async_native(local) and not is_async_native(gymllm.make("gymllm/Echo-v0"))
    with ServerThread(
        build_app(ServeEnvConfig(env="gymllm/AsyncLatency-v0", env_kwargs=kwargs))
    ) as server:
        env = from_openenv(server.url)
        for seed in (0, 1):
            obs, info = local.reset(seed=seed)
            assert env.reset(seed=seed) == (
                obs,
                {k: v for k, v in info.items() if k != "answer"},
            )  # gold withheld
            for a in ("alpha", "zeta ✓"):
                *head, info = local.step(a)
                assert env.step(a) == (*head, {k: v for k, v in info.items() if k != "answer"})
        env.close()


class AsyncProbe(TextEnv):
    """Native async hooks that report the thread they run on."""

    async def _areset(self, *, seed, options):
        return "hi", {"thread": threading.current_thread().name}

    async def _astep(self, action):
        return action, 0.0, False, {"thread": threading.current_thread().name}


def test_async_hooks_run_on_the_server_event_loop_thread():
    with ServerThread(build_app(ServeEnvConfig(env="test_openenv:AsyncProbe"))) as server:
        env = from_openenv(server.url)
        assert env.reset()[1]["thread"] == env.step("x")[4]["thread"] == "gymllm-openenv-server"
        env.close()


def test_remote_envs_in_the_process_backend(guess_url):
    """Sub-envs built in forked worker processes (after this process started its own I/O loop)."""
    from_openenv(guess_url).reset(seed=1)  # this process's I/O loop exists before the fork
    vec = gymllm.make_vec(
        [lambda: from_openenv(guess_url)] * 2, backend="process", mp_context="fork"
    )
    try:
        obs, _ = vec.reset(seed=1)
        assert list(obs) == ["guess a letter (seed 1)", "guess a letter (seed 2)"]
        assert list(vec.step(["c", "a"])[1]) == [
            1.0,
            0.0,
        ]  # seed 1: "c"; seed 2: "abcd"[17 % 4] = "b"
    finally:
        vec.close()
