"""The host-side scheduler: length buckets and the slot table's placement and prefix bookkeeping."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gymllm.inference.scheduler import (
    SlotTable,
    common_prefix_len,
    halving_buckets,
    pick_bucket,
    power_of_two_buckets,
)


def test_buckets():
    assert power_of_two_buckets(100, 16) == (16, 32, 64, 100)
    assert power_of_two_buckets(64, 16) == (16, 32, 64)
    assert power_of_two_buckets(4, 1) == (1, 2, 4)
    assert [pick_bucket(n, (16, 32, 64)) for n in (1, 16, 17, 64)] == [16, 16, 32, 64]
    assert halving_buckets(128, 4) == (16, 32, 64, 128)  # decode cache lengths
    assert halving_buckets(96, 3) == (24, 48, 96)
    assert halving_buckets(64, 1) == (64,)
    assert halving_buckets(3, 4) == (1, 2, 3)  # ceil halving, duplicates merged


def test_session_reuses_its_slot_and_prefix():
    t = SlotTable(2)
    a = t.acquire([1, 2, 3], "s")
    assert a.reuse_len == 0
    t.release(a.slot, [1, 2, 3, 9])  # prompt + sampled ids fed back
    other = t.acquire([7, 7, 7], None)
    assert other.slot != a.slot  # the pinned session slot is not taken while another is free
    nxt = t.acquire([1, 2, 3, 9, 4, 5], "s")
    assert nxt.slot == a.slot and nxt.reuse_len == 4
    t.release(nxt.slot, [1, 2, 3, 9, 4, 5])
    again = t.acquire([1, 2, 3, 9, 4, 5], "s")  # identical prompt: the last token is prefilled again
    assert again.reuse_len == 5


def test_prefix_is_reused_only_under_the_version_that_computed_it():
    t = SlotTable(1)
    a = t.acquire([1, 2, 3], "s", version=0)
    t.release(a.slot, [1, 2, 3, 4], version=0)
    assert t.acquire([1, 2, 3, 4, 5], "s", version=1).reuse_len == 0  # new weights: re-prefill
    t.release(a.slot, [1, 2, 3, 4, 5], version=None)  # a row whose k/v span versions
    assert t.acquire([1, 2, 3, 4, 5, 6], "s", version=1).reuse_len == 0
    t.release(a.slot, [1, 2, 3, 4, 5, 6], version=1)
    assert t.acquire([1, 2, 3, 4, 5, 6, 7], "s", version=1).reuse_len == 6


def test_full_table_and_eviction():
    t = SlotTable(1)
    a = t.acquire([1, 2], "a")
    assert t.acquire([3], "b") is None
    t.release(a.slot, [1, 2, 5])
    b = t.acquire([3, 4], "b")  # evicts a's pinned prefix: nothing else is free
    assert b.slot == a.slot and b.reuse_len == 0 and "a" not in t.sessions


ops = st.lists(
    st.tuples(st.sampled_from(["acquire", "release"]), st.lists(st.integers(0, 3), min_size=1, max_size=6),
              st.sampled_from([None, "s0", "s1", "s2"])),
    max_size=40,
)


@settings(max_examples=50, deadline=None)
@given(ops=ops, num_slots=st.integers(1, 4))
def test_slot_table_invariants(ops, num_slots):
    t = SlotTable(num_slots)
    content = {i: [] for i in range(num_slots)}  # what each row really holds
    busy: dict[int, list[int]] = {}
    for op, prompt, sid in ops:
        if op == "acquire":
            pl = t.acquire(prompt, sid)
            if pl is None:
                assert len(busy) == num_slots
                continue
            assert pl.slot not in busy  # never hand out a busy row
            assert 0 <= pl.reuse_len <= len(prompt) - 1
            assert content[pl.slot][: pl.reuse_len] == prompt[: pl.reuse_len]  # reuse only what is cached
            if sid is not None:
                assert t.sessions[sid] == pl.slot
            busy[pl.slot] = prompt
        elif busy:
            slot = sorted(busy)[0]
            ids = busy.pop(slot) + prompt[:2]
            content[slot] = ids
            t.release(slot, ids)
        assert t.num_free == num_slots - len(busy)
        assert len(set(t.sessions.values())) == len(t.sessions)  # one session per slot


def test_common_prefix_len():
    assert common_prefix_len([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix_len([], [1]) == 0
    assert common_prefix_len([1, 2], [1, 2]) == 2


def test_compaction_moves_busy_rows_into_free_unpinned_low_rows():
    t = SlotTable(16)
    for i in range(16):
        t.acquire([i], session_id=f"s{i}" if i in (1, 2) else None)
    for i in range(16):
        if i not in (12, 14):
            t.release(i, [i])
    t.end_session("s2")  # row 1 stays pinned by s1; row 2 is free and unpinned
    moves = t.compaction((8, 16))
    assert moves == [(12, 0), (14, 2)]  # row 1 is pinned: skipped
    for a, b in moves:
        t.move(a, b)
    assert [s.index for s in t.slots if s.busy] == [0, 2] and t.compaction((8, 16)) == []
    with pytest.raises(ValueError, match="free unpinned"):
        t.move(0, 1)  # row 1 is pinned by s1


def test_a_moved_row_keeps_its_session():
    t = SlotTable(16)
    for i in range(9):
        t.acquire([i])
    for i in range(8):
        t.release(i, [i])
    t.release(8, [8])
    t.acquire([8, 9], session_id="a")  # takes row 8 again (its prefix [8])
    assert t.sessions["a"] == 8
    (a, b), = t.compaction((8, 16))
    t.move(a, b)
    assert t.sessions["a"] == b < 8 and t.slots[b].session_id == "a" and t.slots[8].session_id is None
