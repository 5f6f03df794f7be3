"""The one trained-trajectory record: one writer (TrajectoryRecordWriter / trajectory_record), one reader
(read_trajectory_records / trajectory_from_record). Lines in the layouts written before it (a run's
trajectories.jsonl, `gymllm serve --groups-out`) and an episode log in today's format, frozen here as
text, still read; a run directory written by the new writer is what SFT's --from-run reads token-exact."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gymllm.train.sft_data import rows_from_run
from gymllm.types import Trajectory
from gymllm.trajectories.writers import TrajectoryRecordWriter
from gymllm.trajectories.reader import read_log, read_trajectory_records, trajectory_from_record
from gymllm.trajectories.format import trajectory_record

# the ids, mask, log-probs and versions every frozen line below was written from
IDS = [5, 6, 7, 8, 9, 10, 11]
MASK = [0, 0, 1, 1, 0, 1, 0]
LOGPROBS = [0.0, 0.0, -0.5, -0.25, 0.0, -1.0, 0.0]
VERSIONS = [-1, -1, 2, 2, -1, 3, -1]

# a line of a run's trajectories.jsonl before the one format (run.py's records: no "type")
OLD_RUN_LINE = (
    '{"step": 4, "group_id": "g1", "trajectory_id": "g1/m0/a1", "task_id": "t7", "reward": 1.0, '
    '"finish_reason": "terminated", "num_tokens": 7, "num_sampled": 3, "versions": [2, 3], '
    '"response": "xy z", "token_ids": [5, 6, 7, 8, 9, 10, 11], "sampled_spans": [[2, 4], [5, 6]]}'
)
# a line of `gymllm serve --groups-out` before the one format (per-token arrays, "versions" per token)
OLD_SERVE_LINE = (
    '{"group_id": "g1", "task_id": "t7", "trajectory_id": "g1/m0/a1", "reward": 1.0, "row_index": 0, '
    '"token_ids": [5, 6, 7, 8, 9, 10, 11], "loss_mask": [0, 0, 1, 1, 0, 1, 0], '
    '"behaviour_logprobs": [0.0, 0.0, -0.5, -0.25, 0.0, -1.0, 0.0], '
    '"versions": [-1, -1, 2, 2, -1, 3, -1], "turn_boundaries": [[2, 4], [5, 6]], "info": {"k": 1}}'
)


class Decoder:
    """A stand-in tokenizer: token i decodes to chr(ord('a') + i - 5)... enough to check ``response``."""

    def decode(self, ids):
        return "".join(chr(ord("a") + i - 5) for i in ids)


def trajectory() -> Trajectory:
    return Trajectory(
        token_ids=np.asarray(IDS, np.int32),
        loss_mask=np.asarray(MASK, np.int8),
        behaviour_logprobs=np.asarray(LOGPROBS, np.float32),
        versions=np.asarray(VERSIONS, np.int32),
        reward=1.0,
        trajectory_id="g1/m0/a1",
        group_id="g1",
        task_id="t7",
        turn_boundaries=[(2, 4), (5, 6)],
        info={"k": 1},
    )


def same_trajectory(a: Trajectory, b: Trajectory, *, per_token: bool = True) -> None:
    for f in ("token_ids", "loss_mask") + (("behaviour_logprobs", "versions") if per_token else ()):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)
    assert (a.reward, a.trajectory_id, a.group_id, a.task_id) == (
        b.reward,
        b.trajectory_id,
        b.group_id,
        b.task_id,
    )


def test_writer_and_reader_round_trip_every_array(tmp_path):
    t = trajectory()
    with TrajectoryRecordWriter(
        tmp_path / "run" / "trajectories.jsonl", tokenizer=Decoder(), per_token=True
    ) as w:
        written = w.write([t], step=4)
    got = read_trajectory_records(tmp_path / "run")  # a run directory reads its trajectories.jsonl
    assert got == written and got[0]["type"] == "trajectory" and got[0]["step"] == 4
    assert (
        got[0]["sampled_spans"] == [[2, 4], [5, 6]]
        and got[0]["versions"] == [2, 3]
        and got[0]["response"] == "cdf"
    )
    back = trajectory_from_record(got[0])
    same_trajectory(back, t)
    assert back.turn_boundaries == [(2, 4), (5, 6)] and back.info == {"k": 1}


def test_the_new_record_holds_every_field_of_the_old_run_line_with_the_same_values():
    old = json.loads(OLD_RUN_LINE)
    new = trajectory_record(trajectory(), step=4, tokenizer=Decoder())
    old["response"] = "cdf"  # the frozen line was decoded by another tokenizer
    assert {
        k: new[k] for k in old
    } == old  # so every reader of today's run records reads the new ones


def test_lines_in_the_layouts_before_the_one_format_still_read(tmp_path):
    p = tmp_path / "old.jsonl"
    p.write_text(
        OLD_RUN_LINE + "\n" + OLD_SERVE_LINE + "\n" + '{"step": 5, "trajectory_id": "g2/m0'
    )  # torn tail
    run_rec, serve_rec = read_trajectory_records(p)
    same_trajectory(trajectory_from_record(serve_rec), trajectory())  # every per-token array kept
    assert serve_rec["sampled_spans"] == run_rec["sampled_spans"] == [[2, 4], [5, 6]]
    assert serve_rec["versions"] == run_rec["versions"] == [2, 3] and serve_rec["num_sampled"] == 3
    from_run = trajectory_from_record(
        run_rec
    )  # no per-token log-probs in a run line: 0.0 / -1 (two versions)
    same_trajectory(from_run, trajectory(), per_token=False)
    assert not from_run.behaviour_logprobs.any() and (from_run.versions == -1).all()


def test_sft_from_run_reads_the_new_records_token_exact(tmp_path):
    run = tmp_path / "run"
    low = Trajectory(**{**trajectory().__dict__, "reward": 0.0, "trajectory_id": "g1/m0/a0"})
    with TrajectoryRecordWriter(run / "trajectories.jsonl") as w:
        w.write([low, trajectory()], step=1)
    rows = rows_from_run(run, min_reward=0.5)
    assert len(rows) == 1 and rows[0].reward == 1.0
    np.testing.assert_array_equal(rows[0].token_ids, IDS)
    np.testing.assert_array_equal(rows[0].loss_mask, np.asarray(MASK, bool))


def test_a_closed_writer_says_so(tmp_path):
    w = TrajectoryRecordWriter(tmp_path / "t.jsonl")
    w.close()
    with pytest.raises(Exception, match="closed"):
        w.write([trajectory()])


# An episode log as TrajectoryLogger writes it today (header, reset, two steps, end; a second episode cut by
# a crash), frozen as text: the reader must keep reading logs already on disk.
TODAY_LOG = "\n".join(
    [
        '{"type":"header","format":"gymllm.trajectory/1","writer":"episodes","env_id":"gymllm/Guess-v0","env_kwargs":{},'
        '"wrappers":[],"versions":{"python":"3.11.0"},"pid":1,"time":1.0,"resumed":false,"torn_lines":0}',
        '{"type":"reset","episode":"episodes-000000-abcd1234","index":0,"seed":7,"options":null,"env_id":"gymllm/Guess-v0",'
        '"env_kwargs":{},"wrappers":[],"observation":"guess","info":{"task_id":"t1"},"time":1.0}',
        '{"type":"step","episode":"episodes-000000-abcd1234","step":1,"action":"1","observation":"higher","reward":0.0,'
        '"terminated":false,"truncated":false,"info":{},"tool_calls":[],"timing":{"step_s":0.001}}',
        '{"type":"step","episode":"episodes-000000-abcd1234","step":2,"action":"2","observation":"yes","reward":1.0,'
        '"terminated":true,"truncated":false,"info":{},"tool_calls":[],"timing":{"step_s":0.001}}',
        '{"type":"end","episode":"episodes-000000-abcd1234","steps":2,"return":1.0,"terminated":true,"truncated":false,'
        '"time":2.0}',
        '{"type":"reset","episode":"episodes-000001-ef567890","index":1,"seed":8,"options":null,"env_id":"gymllm/Guess-v0",'
        '"env_kwargs":{},"wrappers":[],"observation":"guess","info":{"task_id":"t2"},"time":3.0}',
        '{"type":"step","episode":"episodes-000001-ef56',
    ]
)


def test_an_episode_log_in_todays_format_still_reads(tmp_path):
    (tmp_path / "episodes.jsonl").write_text(TODAY_LOG)
    (done,) = read_log(tmp_path)
    assert (done.seed, done.actions, done.rewards, done.episode_return) == (
        7,
        ["1", "2"],
        [0.0, 1.0],
        1.0,
    )
    assert done.key == (7, "t1") and done.messages()[-1] == {"role": "user", "content": "yes"}
    assert [e.complete for e in read_log(tmp_path, include_incomplete=True)] == [True, False]
