"""Registration: gymllm ids live in Gymnasium's registry; make / make_vec like Gymnasium's."""

import subprocess
import sys

import gymnasium as gym
import pytest
from gymnasium.wrappers import TimeLimit

import gymllm
from gymllm.envs.arithmetic import ArithmeticEnv, evaluate, extract_answer
from gymllm.envs.basic import EchoEnv
from gymllm.errors import ConfigError
from gymllm.registration import load_callable, registered_ids


def test_gymnasium_make_works_after_import_gymllm():
    env = gym.make("gymllm/Echo-v0")
    assert isinstance(
        env, EchoEnv
    )  # no checker/order wrappers: the TextEnv itself (async twins reachable)
    assert callable(env.astep)
    assert gym.spec("gymllm/Arithmetic-v0").entry_point == "gymllm.envs.arithmetic:ArithmeticEnv"


def test_import_gymllm_registers_without_importing_jax():
    code = (
        "import sys, gymnasium as gym, gymllm; gym.make('gymllm/Echo-v0'); "
        "import gymllm.vector, gymllm.utils.env_checker, gymllm.utils.vector_checker; "
        "gymllm.make_vec('gymllm/Echo-v0', 2).close(); "
        "assert 'jax' not in sys.modules, 'jax imported'; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_make_short_ids_kwargs_and_max_episode_steps():
    env = gymllm.make("Echo-v0", episode_length=5)
    assert env.episode_length == 5
    limited = gymllm.make("gymllm/Echo-v0", episode_length=100, max_episode_steps=2)
    assert isinstance(limited, TimeLimit)
    limited.reset(seed=0)
    assert limited.step("a")[3] is False and limited.step("a")[3] is True


def test_make_passes_through_other_namespaces_and_callables():
    assert gymllm.make("CartPole-v1").spec.id == "CartPole-v1"
    assert isinstance(gymllm.make(lambda **kw: EchoEnv(**kw), episode_length=2), EchoEnv)


def test_unknown_id_error_suggests_close_matches():
    with pytest.raises(
        ConfigError, match=r"received 'gymllm/Ecko-v0'.*did you mean gymllm/Echo-v0"
    ):
        gymllm.make("gymllm/Ecko-v0")
    with pytest.raises(ConfigError, match="expected a non-empty str"):
        gymllm.make("")


def test_register_custom_env_and_reregister_is_a_noop():
    gymllm.register("TestEcho-v9", "gymllm.envs.basic:EchoEnv", kwargs={"episode_length": 2})
    gymllm.register("TestEcho-v9", "gymllm.envs.basic:EchoEnv", kwargs={"episode_length": 2})
    assert "gymllm/TestEcho-v9" in registered_ids()
    env = gym.make("gymllm/TestEcho-v9")
    assert env.episode_length == 2
    del gym.registry["gymllm/TestEcho-v9"]


def test_make_vec_mixed_ids_and_vector_kwargs():
    vec = gymllm.make_vec(["gymllm/Echo-v0", "gymllm/Arithmetic-v0"], autoreset_mode="same_step")
    try:
        assert vec.num_envs == 2 and vec.config.autoreset_mode.name == "SAME_STEP"
        assert [type(e).__name__ for e in vec.envs] == ["EchoEnv", "ArithmeticEnv"]
        obs, infos = vec.reset(seed=0)
        assert obs[0].startswith("Repeat:") and obs[1].startswith("Compute")
    finally:
        vec.close()
    vec = gymllm.make_vec("Echo-v0", 3, vector_kwargs={"max_concurrency": 2}, episode_length=4)
    try:
        assert (
            vec.num_envs == 3
            and vec.config.max_concurrency == 2
            and vec.envs[0].episode_length == 4
        )
    finally:
        vec.close()


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_make_vec_rejects_bad_num_envs(bad):
    with pytest.raises(ConfigError, match="num_envs"):
        gymllm.make_vec("gymllm/Echo-v0", bad)


def test_make_vec_rejects_unknown_ids_and_bad_vector_options():
    with pytest.raises(ConfigError, match="did you mean"):
        gymllm.make_vec(["gymllm/Echo-v0", "gymllm/Ech-v0"])
    with pytest.raises(ConfigError, match="autoreset_mode"):
        gymllm.make_vec("gymllm/Echo-v0", 2, autoreset_mode="sometimes")
    with pytest.raises(ConfigError, match="backend"):
        gymllm.make_vec("gymllm/Echo-v0", 2, backend="gpu")


def test_arithmetic_answers_verify_against_python_eval():
    env = ArithmeticEnv(digits=4, num_operands=3)
    for seed in range(20):
        obs, info = env.reset(seed=seed)
        expr = obs.removeprefix("Compute ").split(".")[0]
        assert int(info["answer"]) == eval(expr)  # noqa: S307 - reference for our evaluator (digits/ops only)
        _, r, term, _, step_info = env.step(
            f"Thinking... so the answer is \\boxed{{{info['answer']}}}"
        )
        assert (r, term, step_info["correct"]) == (1.0, True, True)
    env.reset(seed=0)
    assert env.step("no idea")[1] == 0.0


def test_arithmetic_parsing_and_retries():
    assert extract_answer("1, 2 then \\boxed{ -1,234 }") == -1234
    assert extract_answer("it is 42.") == 42 and extract_answer("none") is None
    assert evaluate([2, 3, 4], ["+", "*"]) == 14 and evaluate([10, 3, 2], ["-", "-"]) == 5
    env = ArithmeticEnv(max_attempts=2)
    _, info = env.reset(seed=1)
    obs, r, term, _, _ = env.step("\\boxed{0}" if info["answer"] != "0" else "\\boxed{1}")
    assert (obs, r, term) == ("Incorrect. Try again.", 0.0, False)
    assert env.step(info["answer"])[1:3] == (1.0, True)
    with pytest.raises(ConfigError, match="ArithmeticEnv.ops"):
        ArithmeticEnv(ops="/")


def test_load_callable_resolves_dotted_names_and_explains_failures():
    kw = {"form": "MODULE:FN", "expected": "a callable fn", "fix": "name a function"}
    assert load_callable("gymllm.envs.basic:EchoEnv", "here", **kw) is EchoEnv
    assert load_callable("gymllm.envs.basic:EchoEnv.reset", "here", **kw) is EchoEnv.reset
    for spec, cause in (
        ("no_such_module_xyz:f", "ModuleNotFoundError"),
        ("gymllm.envs.basic:nope", "AttributeError"),
        (":f", "ValueError"),
    ):
        with pytest.raises(ConfigError, match=f"importable MODULE:FN.*{cause}"):
            load_callable(spec, "here", **kw)
    with pytest.raises(ConfigError, match="a callable fn.*= str"):
        load_callable("gymllm.registration:NAMESPACE", "here", **kw)
