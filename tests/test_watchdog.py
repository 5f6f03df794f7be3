"""The stall watchdog: a fake clock forces every stall (no sleeps racing the thread)."""

from __future__ import annotations

import logging
import threading

import pytest

from gymllm.errors import ConfigError
from gymllm.telemetry import Tracer, set_tracer
from gymllm.telemetry.export import load_chrome_trace
from gymllm.telemetry.watchdog import StageStalledError, Watchdog, WatchdogConfig


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def tracer():
    tr = Tracer()
    prev = set_tracer(tr)
    yield tr
    set_tracer(prev)


def test_a_silent_stage_is_named_in_the_log_and_the_trace(tracer, caplog, tmp_path):
    clock = Clock()
    wd = Watchdog(WatchdogConfig(stall_s=10.0), clock=clock)
    wd.begin("learner", "step 3: 2 groups")
    wd.begin("rollout", "waiting for a group")
    clock.t += 6
    wd.beat("rollout", "group g4 arrived")
    assert wd.check() == []
    clock.t += 5  # learner silent 11 s, rollout 5 s
    with caplog.at_level(logging.WARNING, logger="gymllm.watchdog"):
        (stall,) = wd.check()
    assert stall.stage == "learner" and stall.idle_s == pytest.approx(11.0) and stall.count == 1
    msg = caplog.records[-1].getMessage()
    assert (
        msg.startswith("stalled: no progress in learner for 11.0 s")
        and "doing: step 3: 2 groups" in msg
    )
    assert "last beat 11.0 s ago: began: step 3: 2 groups" in msg
    assert wd.check() == []  # reported once per stall_s of silence, not on every check
    (marker,) = [e for e in tracer.events() if e["ph"] == "X" and e["track"] == "watchdog"]
    assert (
        marker["name"] == "stall" and marker["args"]["stage"] == "learner" and marker["dur"] < 1e3
    )
    (count,) = [e for e in tracer.events() if e["ph"] == "C" and e["track"] == "watchdog"]
    assert count["args"] == {"stalls": 1}
    back = load_chrome_trace(
        tracer.export_chrome_trace(tmp_path / "trace.json")
    )  # survives Perfetto export
    assert [e["args"]["stage"] for e in back if e["name"] == "stall"] == ["learner"]


def test_repeated_reports_then_stop_callback_once():
    clock, seen, stops = Clock(), [], []
    wd = Watchdog(
        WatchdogConfig(stall_s=2.0, stop_after=3),
        clock=clock,
        on_stall=seen.append,
        on_stop=stops.append,
    )
    wd.begin("weight_sync", "push v4")
    for _ in range(8):
        clock.t += 1
        wd.check()
    assert [s.count for s in seen] == [1, 2, 3, 4]  # at 2, 4, 6, 8 s of silence
    (err,) = stops
    assert (
        isinstance(err, StageStalledError)
        and err.stall.stage == "weight_sync"
        and "push v4" in str(err)
    )
    assert "expected progress within 2 s" in str(err)


def test_beat_resets_and_end_unwatches():
    clock, seen = Clock(), []
    wd = Watchdog(WatchdogConfig(stall_s=2.0), clock=clock, on_stall=seen.append)
    wd.begin("checkpoint", "save step 2")
    clock.t += 3
    assert len(wd.check()) == 1
    wd.beat("checkpoint", "wrote arrays")
    clock.t += 1.5
    assert wd.check() == []
    wd.end("checkpoint")
    assert wd.watched() == []
    clock.t += 100
    assert wd.check() == [] and len(seen) == 1
    wd.beat("rollout", "g1")  # a first beat starts watching
    assert wd.watched() == ["rollout"]


def test_stage_context_watches_the_block_and_closes_it_on_an_exception():
    clock, seen = Clock(), []
    wd = Watchdog(WatchdogConfig(stall_s=2.0), clock=clock, on_stall=seen.append)
    with wd.stage("weight_sync", "push weights of step 4"):
        assert wd.watched() == ["weight_sync"]
        clock.t += 2.5
        (stall,) = (
            wd.check()
        )  # recorded while inside: a stall names the stage and what it was doing
    assert stall.stage == "weight_sync" and stall.doing == "push weights of step 4"
    assert wd.watched() == []
    with pytest.raises(RuntimeError, match="push failed"):
        with wd.stage("learner", "step 5: 2 groups"):
            assert wd.watched() == ["learner"]
            raise RuntimeError("push failed")
    assert wd.watched() == []  # closed by the exception: a failed stage is not reported as stalled
    clock.t += 100
    assert wd.check() == [] and len(seen) == 1


def test_off_is_a_no_op_and_config_is_validated():
    wd = Watchdog(WatchdogConfig(stall_s=0))
    wd.begin("learner")
    wd.start()
    assert not wd.running and wd.watched() == [] and wd.check() == []
    wd.stop()
    for bad in (
        {"stall_s": -1},
        {"stall_s": float("nan")},
        {"check_every_s": 0},
        {"stop_after": 0},
        {"stall_s": True},
    ):
        with pytest.raises(ConfigError, match="WatchdogConfig"):
            WatchdogConfig(**bad)


def test_the_thread_reports_through_check():
    """The thread calls check() on its period; the fake clock makes the stall certain, an Event ends the wait."""
    clock, hit = Clock(), threading.Event()
    wd = Watchdog(
        WatchdogConfig(stall_s=1.0, check_every_s=0.01), clock=clock, on_stall=lambda s: hit.set()
    )
    with wd:
        wd.begin("rollout", "waiting")
        clock.t += 5
        assert hit.wait(30)
    assert not wd.running and wd.stalls[0].stage == "rollout"


def test_the_run_section_bound_is_validated():
    from gymllm.train.train_config import RunSection

    assert (
        RunSection().stall_timeout_s == 300.0 and RunSection(stall_timeout_s=0).stall_timeout_s == 0
    )
    with pytest.raises(ConfigError, match="stall_timeout_s"):
        RunSection(stall_timeout_s=-1.0)
