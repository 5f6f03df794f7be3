"""The host-side scheduler: length buckets and the slot table's placement and prefix bookkeeping."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gymllm.inference.slot_table import (
    Placement,
    SlotTable,
    common_prefix_len,
    decode_widths,
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
    assert decode_widths(128) == (8, 16, 24, 32, 48, 64, 96, 128)
    assert (
        decode_widths(12) == (8, 12)
        and decode_widths(32) == (8, 16, 24, 32)
        and decode_widths(4) == (4,)
    )
    assert decode_widths(40) == (8, 16, 24, 32, 40)


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
    again = t.acquire(
        [1, 2, 3, 9, 4, 5], "s"
    )  # identical prompt: the last token is prefilled again
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
    st.tuples(
        st.sampled_from(["acquire", "release", "compact"]),
        st.lists(st.integers(0, 3), min_size=1, max_size=6),
        st.sampled_from([None, "s0", "s1", "s2"]),
    ),
    max_size=40,
)


def _compact(t: SlotTable, widths, content: dict, busy: dict) -> None:
    """Apply the table's compaction as the engine does (rows' k/v swapped), checking its promises."""
    swaps = t.compaction(widths)
    target = pick_bucket(len(busy), widths) if busy else 0
    for a, b in swaps:
        assert a in busy and b not in busy and b < target <= a
        content[a], content[b] = content[b], content[a]
        busy[b] = busy.pop(a)
        t.swap(a, b)
    if busy:
        assert pick_bucket(max(busy) + 1, widths) == pick_bucket(
            len(busy), widths
        )  # packed: the narrowest width


@settings(max_examples=80, deadline=None)
@given(ops=ops, num_slots=st.integers(1, 6))
def test_slot_table_invariants(ops, num_slots):
    t = SlotTable(num_slots)
    widths = power_of_two_buckets(num_slots, 1)
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
            assert (
                content[pl.slot][: pl.reuse_len] == prompt[: pl.reuse_len]
            )  # reuse only what is cached
            if sid is not None:
                assert t.sessions[sid] == pl.slot
            busy[pl.slot] = prompt
        elif op == "compact":
            _compact(t, widths, content, busy)
        elif busy:
            slot = sorted(busy)[prompt[0] % len(busy)]  # any busy row finishes
            ids = busy.pop(slot) + prompt[:2]
            content[slot] = ids
            t.release(slot, ids)
        assert t.num_free == num_slots - len(busy)
        assert len(set(t.sessions.values())) == len(t.sessions)  # one session per slot
        assert t.sessions == {x.session_id: x.index for x in t.slots if x.session_id is not None}
        assert {x.index for x in t.slots if x.busy} == set(busy)


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.booleans(), st.booleans(), st.lists(st.integers(0, 9), max_size=3)),
        min_size=1,
        max_size=24,
    )
)
def test_compaction_packs_busy_rows_and_every_row_keeps_its_contents(rows):
    """Any mix of busy, pinned and cached rows: after the swaps the busy rows fit the narrowest width, and
    every request, prefix and session is in exactly one row (the one its k/v were copied to)."""
    t = SlotTable(len(rows))
    for i, (busy, pinned, cached) in enumerate(rows):
        slot = t.slots[i]
        slot.busy, slot.cached, slot.last_used = busy, [i, *cached], i
        if pinned:
            slot.session_id = f"s{i}"
            t.sessions[slot.session_id] = i
    widths = decode_widths(len(rows), 2)
    content = {
        i: t.slots[i].cached for i in range(len(rows))
    }  # row i's k/v, tagged by its first id
    busy = {i: True for i, (b, _, _) in enumerate(rows) if b}
    _compact(t, widths, content, busy)
    assert sorted(content[i][0] for i in content) == list(
        range(len(rows))
    )  # nothing lost or duplicated
    for x in t.slots:
        assert x.cached == content[x.index] and x.busy == (x.index in busy)
        assert x.session_id in (None, f"s{x.cached[0]}")  # a session follows its own row's k/v
    assert t.sessions == {x.session_id: x.index for x in t.slots if x.session_id is not None}


def test_common_prefix_len():
    assert common_prefix_len([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix_len([], [1]) == 0
    assert common_prefix_len([1, 2], [1, 2]) == 2


def test_compaction_swaps_busy_rows_with_idle_low_rows_empty_first_then_unpinned_then_pinned():
    t = SlotTable(16)
    for i in range(16):
        t.acquire([i], session_id=f"s{i}" if i in (1, 2) else None)
    for i in range(16):
        if i not in (12, 14):
            t.release(i, [i])
    t.end_session("s2")  # row 1 stays pinned by s1; row 2 is idle and unpinned
    t.invalidate(5)  # row 5 holds nothing
    swaps = t.compaction((8, 16))
    assert swaps == [
        (14, 5),
        (12, 0),
    ]  # the highest busy row first; an empty row, then the oldest cached one
    for a, b in swaps:
        t.swap(a, b)
    assert [s.index for s in t.slots if s.busy] == [0, 5] and t.compaction((8, 16)) == []
    assert (
        t.slots[12].cached == [0] and not t.slots[12].busy
    )  # row 0's prefix moved up, out of the way


def test_compaction_trades_places_with_a_pinned_row_and_both_sessions_follow_their_rows():
    t = SlotTable(16)
    for i in range(16):
        t.acquire([i], session_id=f"s{i}")
    for i in range(16):
        if i != 9:
            t.release(i, [i])
    assert t.compaction((8, 16), limit=0) == []
    ((a, b),) = t.compaction((8, 16))
    assert a == 9 and b == 0  # every idle row is pinned: the least recently used one
    t.swap(a, b)
    assert t.sessions["s9"] == 0 and t.sessions["s0"] == 9
    assert (
        t.slots[0].busy
        and not t.slots[9].busy
        and t.slots[9].cached == [0]
        and t.slots[0].session_id == "s9"
    )
    t.release(0, [9, 10])
    assert t.acquire([0, 5], session_id="s0") == Placement(
        9, 1
    )  # s0 reuses its prefix in its new row


def test_a_moved_row_keeps_its_session():
    t = SlotTable(16)
    for i in range(9):
        t.acquire([i])
    for i in range(8):
        t.release(i, [i])
    t.release(8, [8])
    t.acquire([8, 9], session_id="a")  # takes row 8 again (its prefix [8])
    assert t.sessions["a"] == 8
    ((a, b),) = t.compaction((8, 16))
    t.swap(a, b)
    assert (
        t.sessions["a"] == b < 8 and t.slots[b].session_id == "a" and t.slots[8].session_id is None
    )
