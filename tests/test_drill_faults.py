"""The fault drill (benchmarks/drill_faults.py) in the default tier: one short train() run per injected
fault on the small tiny config (the compiled shapes are shared by every run in the process). Each
asserts the outcome, that the fault was recorded with its reason, and that no other group was lost;
bounds are asserted loosely (a run bounded by a 10 s group timeout stops well before the 60 s hang)."""

from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
import drill_faults  # noqa: E402

STEPS = 3


@pytest.fixture(scope="module", autouse=True)
def compiled(tmp_path_factory):
    """Compile once for every drilled run (so no bound below includes a compile)."""
    drill_faults.warm_up(tmp_path_factory.mktemp("warm"))


def _check(r: dict, outcome: str = "finished") -> None:
    assert r["outcome"] == outcome, r
    assert r["recorded"], r
    assert r["lost_other"] == 0, r


def test_an_env_step_that_never_returns_is_bounded_by_the_group_timeout_and_named_by_the_watchdog(
    tmp_path,
):
    r = drill_faults.drill_env_hang(tmp_path, STEPS)
    _check(r)
    assert (
        r["took_s"] < drill_faults.HANG_S
    )  # stopped waiting long before the hung step would have returned
    assert r["detail"]["group_timeouts"] >= 1 and any(
        "g1: timed out" in e for e in r["detail"]["errors"]
    )
    assert r["detail"]["watchdog_named_rollout"], r["detail"]


def test_an_env_that_raises_every_kth_step_fails_only_those_groups(tmp_path):
    r = drill_faults.drill_env_raises(tmp_path, STEPS)
    _check(r)
    assert r["detail"]["groups_failed"] >= 1 and r["detail"]["trained_twice"] == 0
    assert all("injected env fault" in e for e in r["detail"]["errors"])


def test_a_hanging_tool_times_out_and_the_run_finishes(tmp_path):
    r = drill_faults.drill_tool_hang(tmp_path, STEPS)
    _check(r)
    assert r["took_s"] < drill_faults.HANG_S and r["detail"]["first_result"]["error"] == "timeout"


def test_a_tool_flooding_100_mb_is_cut_to_max_result_chars(tmp_path):
    r = drill_faults.drill_tool_flood(tmp_path, STEPS)
    _check(r)
    assert r["detail"]["first_result"]["chars"] <= drill_faults.MAX_RESULT_CHARS + 100


def test_an_engine_request_that_raises_fails_its_group_only(tmp_path):
    r = drill_faults.drill_engine_raises(tmp_path, STEPS)
    _check(r)
    assert r["detail"]["groups_failed"] == 1 and "EngineError" in r["detail"]["errors"][0]


@pytest.mark.parametrize("name,value", [("reward_nan", float("nan")), ("reward_text", "0.5")])
def test_a_bad_reward_fails_its_group_with_reward_error(tmp_path, name, value):
    r = drill_faults.drill_reward(tmp_path, STEPS, value, name)
    _check(r)
    assert r["detail"]["groups_failed"] == 1 and all(
        "RewardError" in e for e in r["detail"]["errors"]
    )


def test_a_learner_step_that_raises_stops_the_run_naming_it_and_the_checkpoint_resumes(tmp_path):
    r = drill_faults.drill_learner_raises(tmp_path, STEPS)
    _check(r, outcome="stopped")
    err = r["detail"]["error"]
    assert (
        err.startswith("LearnerStepError: learner step 3")
        and "injected learner fault in step 3" in err
    )
    assert "last checkpoint (step 2)" in err and r["detail"]["checkpoint_kept"] == 2
    assert r["detail"]["resumed_ok"], r["detail"]


def test_a_streaming_client_that_disconnects_does_not_stop_the_server(tmp_path):
    r = drill_faults.drill_server_disconnect(tmp_path, STEPS)
    _check(r)
    assert r["detail"]["next_status"] == 200 and r["detail"]["disconnected_request_tokens"] < 40
