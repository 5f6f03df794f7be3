"""Host side of the learner: groups -> training rows -> fixed-shape micro-batches (length buckets).

A row is one trajectory, shifted for next-token prediction: inputs ``ids[:-1]``, targets ``ids[1:]``,
and every per-token array aligned on the targets (mask, the sampler's logprobs ``mu``, versions).
Micro-batches have ``micro_batch_size`` rows and a length from a small fixed set of buckets (powers
of two from ``min_bucket`` up to ``max_len``, optionally with evenly spaced lengths in between), so
the learner compiles at most one program per bucket. Padding rows and padding tokens have mask 0
and contribute exactly nothing.

Packing (``LearnerConfig.packing``): the model runs on the micro-batch's rows packed end to end
into fewer rows of the same length (first-fit decreasing), each sequence its own segment (segment
ids: attention stays inside a segment; positions restart at 0), so no FLOP goes to padding rows or
to the tails of short rows. The loss still sees the padded ``[batch_size, length]`` layout: the
per-token log-probabilities are gathered back with one index array
(:func:`gymllm.algos.batching.pack_rows`), so every per-row quantity (advantages, sequence means,
sequence-level ratios) is computed exactly as without packing.

Loss positions (``LearnerConfig.loss_positions_only``): a row's loss reads the log-probabilities of its
policy-sampled targets only (mask > 0), at most the response budget of them. :func:`loss_positions`
picks a fixed number of positions per row (every masked one, then unmasked fillers), so the learner
runs the vocab projection and the log-softmax on those alone (static shape), not on the prompt;
:func:`on_loss_positions` gives the loss its per-token arrays on those positions ([B, K]): every
per-row quantity is a masked sum or mean over a row, the same over the K positions as over T.

Shared prefix (``LearnerConfig.shared_prefix``): rows whose prompts (every input before the first
policy-sampled target, :func:`prompt_length`) are the same token ids, or that belong to one GRPO group, are
laid out as Gp shared prefixes (a cluster's common prefix: :func:`prefix_clusters`) and S continuations each
(:func:`shared_prefix_layout`) for :func:`gymllm.models.shared_prefix.shared_prefix_hidden`, which runs each
prefix once; the loss again reads the padded layout through one index array
(``sp_gather``), like packing's ``gather``. Applies to the padded layout only (packed rows keep
their own path): the learner runs whichever of the two runs fewer positions.

Fixed shared prefix (``LearnerConfig.fixed_shapes``): one layout for the whole run, whatever the rows:
``slots`` prompt slots of ``prefix_len`` tokens and ``batch_size`` continuation rows of ``length -
prefix_len``, each row naming its slot (:func:`fixed_prefix_slots` assigns rows to slots and passes,
:func:`fixed_prefix_arrays` lays one pass out); a slot holds its rows' common prefix (at most
``prefix_len`` tokens), so any row fits, alone if need be.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from gymllm.errors import ConfigError, explain
from gymllm.validation import require
from gymllm.types import Trajectory


@dataclasses.dataclass
class Row:
    """One trajectory ready for the learner (arrays have length ``n = len(token_ids) - 1``)."""

    inputs: np.ndarray  # [n] int32
    targets: np.ndarray  # [n] int32
    mask: np.ndarray  # [n] float32
    mu: np.ndarray  # [n] float32
    versions: np.ndarray  # [n] int32
    advantage: float
    group_tokens: float
    sample_id: str
    group_index: int = -1

    @property
    def length(self) -> int:
        return len(self.inputs)


def row_from_trajectory(
    t: Trajectory,
    *,
    advantage: float,
    group_tokens: float,
    sample_id: str,
    group_index: int = -1,
    max_len: int | None = None,
) -> Row:
    """``t`` as a training row; with ``max_len``, a longer one is cut to its first ``max_len`` positions
    (what a truncated episode appends past the engine's context: the last observation, mask 0; see
    :func:`dropped_sampled_tokens` for sampled tokens lost that way)."""
    end = None if max_len is None else max_len + 1
    ids = np.asarray(t.token_ids, np.int32)[:end]
    return Row(
        inputs=ids[:-1],
        targets=ids[1:],
        mask=np.asarray(t.loss_mask[1:end], np.float32),
        mu=np.asarray(t.behaviour_logprobs[1:end], np.float32),
        versions=np.asarray(t.versions[1:end], np.int32),
        advantage=float(advantage),
        group_tokens=float(group_tokens),
        sample_id=sample_id,
        group_index=group_index,
    )


def dropped_sampled_tokens(t: Trajectory, max_len: int) -> int:
    """Sampled (loss-mask 1) tokens of ``t`` past a row of ``max_len`` positions."""
    return int(np.asarray(t.loss_mask[max_len + 1 :]).sum())


def buckets(min_bucket: int, max_len: int, per_octave: int = 1) -> tuple[int, ...]:
    """Powers of two from ``min_bucket`` to ``max_len`` (``max_len`` itself is always the last), each
    octave ``[b, 2b)`` cut into ``per_octave`` even steps: ``buckets(64, 128, 4) == (64, 80, 96, 112, 128)``.
    Finer buckets pad less (a 76-token row costs 80, not 128) for a few more compiled shapes."""
    out, b = [], min_bucket
    while b < max_len:
        for i in range(per_octave):
            x = b + (b * i) // per_octave
            if x < max_len and (not out or x > out[-1]):
                out.append(x)
        b *= 2
    return (*out, max_len)


def pick_bucket(length: int, table: Sequence[int]) -> int:
    for b in table:
        if length <= b:
            return b
    raise ConfigError(
        explain(
            "trajectory length",
            expected=f"at most {table[-1]} tokens (LearnerConfig.max_len)",
            received=f"{length + 1} tokens",
            fix="raise LearnerConfig.max_len or lower max_tokens",
        )
    )


@dataclasses.dataclass
class MicroBatch:
    """Arrays of one fixed-shape micro-batch ([B, L] each; ``advantages`` / ``group_tokens`` [B])."""

    tokens: np.ndarray
    positions: np.ndarray
    targets: np.ndarray
    mask: np.ndarray
    mu: np.ndarray
    versions: np.ndarray
    advantages: np.ndarray
    group_tokens: np.ndarray
    sample_ids: list[str]

    @property
    def shape(self) -> tuple[int, int]:
        return self.tokens.shape  # type: ignore[return-value]

    def arrays(self) -> dict[str, np.ndarray]:
        return {
            k: getattr(self, k)
            for k in ("tokens", "positions", "targets", "mask", "mu", "advantages", "group_tokens")
        }


def make_micro_batch(
    rows: Sequence[Row], batch_size: int, length: int, pad_id: int = 0
) -> MicroBatch:
    """Right-pad ``rows`` (at most ``batch_size``) to ``[batch_size, length]``."""
    b, L = batch_size, length
    tok = np.full((b, L), pad_id, np.int32)
    tgt = np.full((b, L), pad_id, np.int32)
    mask, mu = np.zeros((b, L), np.float32), np.zeros((b, L), np.float32)
    ver = np.full((b, L), -1, np.int32)
    adv, gt = np.zeros(b, np.float32), np.ones(b, np.float32)
    for i, r in enumerate(rows):
        n = r.length
        tok[i, :n], tgt[i, :n], mask[i, :n], mu[i, :n], ver[i, :n] = (
            r.inputs,
            r.targets,
            r.mask,
            r.mu,
            r.versions,
        )
        adv[i], gt[i] = r.advantage, r.group_tokens
    pos = np.broadcast_to(np.arange(L, dtype=np.int32), (b, L)).copy()
    return MicroBatch(tok, pos, tgt, mask, mu, ver, adv, gt, [r.sample_id for r in rows])


def pack(
    rows: Sequence[Row], batch_size: int, table: Sequence[int], pad_id: int = 0
) -> list[MicroBatch]:
    """Sort by length, cut into runs of ``batch_size`` rows, each padded to its longest row's bucket."""
    ordered = sorted(rows, key=lambda r: (r.length, r.sample_id))
    out = []
    for i in range(0, len(ordered), batch_size):
        chunk = ordered[i : i + batch_size]
        out.append(
            make_micro_batch(
                chunk, batch_size, pick_bucket(max(r.length for r in chunk), table), pad_id
            )
        )
    return out


def first_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Bins (lists of indices into ``lengths``) of total length <= ``capacity``, longest first."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        n = lengths[i]
        require(
            n <= capacity,
            "row length",
            expected=f"at most the packed length {capacity}",
            received=n,
            fix="pack into a bucket at least as long as the longest row",
        )
        for b, r in enumerate(room):
            if n <= r:
                bins[b].append(i)
                room[b] -= n
                break
        else:
            bins.append([i])
            room.append(capacity - n)
    return bins


def packed_rows_count(num_bins: int, quantum: int) -> int:
    """Packed rows actually run: ``num_bins`` rounded up to a multiple of ``quantum`` (few compiled shapes)."""
    return -(-max(num_bins, 1) // quantum) * quantum


def packed_row_counts(batch_size: int, quantum: int) -> tuple[int, ...]:
    """Every packed row count a micro-batch of ``batch_size`` rows can run (those below ``batch_size``)."""
    return tuple(range(quantum, batch_size, quantum))


def empty_packed(rows: int, batch_size: int, length: int, pad_id: int = 0) -> dict[str, np.ndarray]:
    """All-padding packed arrays of ``rows`` packed rows (to compile a packed shape ahead of time)."""
    z = np.zeros((rows, length), np.int32)
    return {
        "packed_tokens": z + pad_id,
        "packed_positions": z.copy(),
        "packed_targets": z + pad_id,
        "segment_ids": z.copy(),
        "gather": np.zeros((batch_size, length), np.int32),
    }


def pack_rows(
    rows: Sequence[Row], batch_size: int, length: int, quantum: int, pad_id: int = 0
) -> dict[str, np.ndarray] | None:
    """The model-side arrays of ``rows`` packed into ``[P, length]`` (``P`` a multiple of ``quantum``):
    ``packed_tokens``, ``packed_positions`` (restarting at 0 in every segment), ``packed_targets``,
    ``segment_ids`` (1, 2, ... per sequence in a packed row; 0 on padding) and ``gather`` [batch_size,
    length]: the flat index into ``P * length`` of each position of the padded layout (0 where the
    padded layout is padding: its mask is 0). None when packing would not run fewer rows than
    ``batch_size`` (then the padded micro-batch is as cheap)."""
    bins = first_fit_decreasing([r.length for r in rows], length)
    p = packed_rows_count(len(bins), quantum)
    if p >= batch_size:
        return None
    tok = np.full((p, length), pad_id, np.int32)
    tgt = np.full((p, length), pad_id, np.int32)
    pos = np.zeros((p, length), np.int32)
    seg = np.zeros((p, length), np.int32)
    gather = np.zeros((batch_size, length), np.int32)
    for b, members in enumerate(bins):
        off = 0
        for s, i in enumerate(members, start=1):
            r, n = rows[i], rows[i].length
            tok[b, off : off + n], tgt[b, off : off + n] = r.inputs, r.targets
            pos[b, off : off + n] = np.arange(n, dtype=np.int32)
            seg[b, off : off + n] = s
            gather[i, :n] = b * length + off + np.arange(n, dtype=np.int32)
            off += n
    return {
        "packed_tokens": tok,
        "packed_positions": pos,
        "packed_targets": tgt,
        "segment_ids": seg,
        "gather": gather,
    }


def loss_positions(
    mask: np.ndarray, count: int, gather: np.ndarray | None = None
) -> dict[str, np.ndarray] | None:
    """The ``count`` positions of each row whose log-probabilities the loss needs, for running the
    vocab projection on them alone: ``select`` [B, count], sorted, distinct indices into the padded
    layout's T axis (every position with ``mask > 0``, then the first unmasked ones to fill the row up), and
    ``select_flat`` [B, count], the same positions' flat index into the rows the model runs (``b * T + t``
    for padded rows; ``gather[b, t]`` for packed ones, :func:`pack_rows`). None when that would save
    nothing (``count >= T``) or a row has more than ``count`` positions with ``mask > 0`` (then the caller
    projects every position)."""
    b, t = mask.shape
    on = np.asarray(mask) > 0
    if count >= t or int(on.sum(axis=1).max(initial=0)) > count:
        return None
    first = np.argsort(~on, axis=1, kind="stable")[
        :, :count
    ]  # masked positions first, each part in order
    select = np.sort(first, axis=1).astype(np.int32)
    flat = (
        np.arange(b)[:, None] * t + select
        if gather is None
        else np.take_along_axis(gather, select, axis=1)
    )
    return {"select": select, "select_flat": flat.astype(np.int32)}


def on_loss_positions(
    arrays: dict[str, np.ndarray], selection: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """``arrays`` (a micro-batch's, padded, packed or shared-prefix) for the LM head on the loss positions
    only: the per-token loss arrays (``mask``, ``mu``, a shared-prefix layout's ``sp_targets``) taken at
    ``selection["select"]`` ([B, K]), plus
    ``select_flat`` (the model side's flat index of each; :func:`loss_positions`)."""
    sel = selection["select"]
    out = {
        k: v for k, v in arrays.items() if k != "sp_gather"
    }  # shared prefix: select_flat replaces it
    for k in ("mask", "mu", "sp_targets"):
        if k in out:
            out[k] = np.take_along_axis(out[k], sel, axis=1)
    out["select_flat"] = selection["select_flat"]
    return out


def prompt_length(row: Row) -> int:
    """The inputs of ``row`` before its first policy-sampled target: ``i + 1`` for the first ``i`` with
    ``mask[i] > 0`` (input ``i`` predicts the first sampled token, which is not itself an input of the
    prompt); the whole row when nothing is sampled."""
    on = np.flatnonzero(np.asarray(row.mask) > 0)
    return int(on[0]) + 1 if on.size else row.length


def prefix_clusters(rows: Sequence[Row], by_group: bool = True) -> list[tuple[int, list[int]]]:
    """``rows`` grouped for the shared-prefix layout, each cluster ``(n, [row indices])`` in order of its first
    row: rows join one cluster when their prompts (:func:`prompt_length`) are the same token ids or, with
    ``by_group``, they belong to one GRPO group (the same ``group_index`` >= 0: a game's seat over several
    deals); ``n`` is the cluster's common prefix, what every member's inputs share, cut to its shortest
    prompt (so a cluster of one prompt shares exactly that prompt)."""
    parent = list(range(len(rows)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    lens = [prompt_length(r) for r in rows]
    first: dict[object, int] = {}
    for i, r in enumerate(rows):
        keys = [("prompt", r.inputs[: lens[i]].tobytes())]
        if by_group and r.group_index >= 0:
            keys.append(("group", r.group_index))
        for key in keys:
            j = first.setdefault(key, i)
            parent[root(i)] = root(j)
    members: dict[int, list[int]] = {}
    for i in range(len(rows)):
        members.setdefault(root(i), []).append(i)
    out = []
    for idx in sorted(members.values(), key=lambda m: m[0]):
        lead = rows[idx[0]].inputs
        n = min(min(lens[i], common_prefix(lead, rows[i].inputs)) for i in idx)
        out.append((n, idx))
    return out


def shared_prefix_layout(
    rows: Sequence[Row],
    batch_size: int,
    length: int,
    table: Sequence[int],
    pad_id: int = 0,
    max_positions: int | None = None,
) -> dict[str, np.ndarray] | None:
    """The model-side arrays of ``rows`` (at most ``batch_size``, padded layout ``[batch_size, length]``)
    as Gp shared prefixes with S continuations each, for
    :func:`gymllm.models.shared_prefix.shared_prefix_hidden`: rows are clustered by
    :func:`prefix_clusters` (the same prompt ids, or one GRPO group: its common prefix; or, when that runs
    fewer positions, by the same prompt ids alone), S is the largest cluster, Gp the number of clusters. Tp,
    the prefixes' padded length, is a ``table`` length (few compiled shapes): the longest shared prefix
    rounded up, or a shorter one with every prefix cut to it (the rest of it runs once per row), whichever
    runs fewer positions; Ts is the longest continuation rounded up to ``table``.

    ``sp_prefix_tokens`` [Gp, Tp], ``sp_prefix_lens`` [Gp], ``sp_suffix_tokens`` [Gp, S, Ts],
    ``sp_targets`` [batch_size, length] (the padded layout's targets) and ``sp_gather``
    [batch_size, length]: each padded position's flat index into the prefixes' then the continuations'
    positions (``g * Tp + t`` for shared tokens, ``Gp * Tp + (g * S + j) * Ts + t - n`` after them; 0 on
    padding, whose mask is 0). None when the layout would run at least as many positions as the padded
    micro-batch (e.g. no two rows share a prefix), or as ``max_positions``."""
    if not rows:
        return None
    best = None
    grouped = any(r.group_index >= 0 for r in rows)  # else both clusterings are the prompt ids'
    for by_group in (True, False) if grouped else (False,):
        clusters = prefix_clusters(rows, by_group)
        gp, s = len(clusters), max(len(m) for _, m in clusters)
        longest = max(n for n, _ in clusters)
        for tp in sorted({t for t in table if t < longest} | {pick_bucket(max(longest, 1), table)}):
            cut = [min(n, tp) for n, _ in clusters]
            rest = max(rows[i].length - c for c, (_, idx) in zip(cut, clusters) for i in idx)
            ts = pick_bucket(max(rest, 1), table)
            positions = gp * tp + gp * s * ts
            if s >= 2 and (best is None or positions < best[0]):
                best = (positions, tp, ts, cut, clusters, gp, s)
    if best is None or best[0] >= min(batch_size * length, max_positions or batch_size * length):
        return None
    _, tp, ts, cut, clusters, gp, s = best
    pre = np.full((gp, tp), pad_id, np.int32)
    plen = np.zeros(gp, np.int32)
    suf = np.full((gp, s, ts), pad_id, np.int32)
    tgt = np.full((batch_size, length), pad_id, np.int32)
    gather = np.zeros((batch_size, length), np.int32)
    for g, (n, (_, idx)) in enumerate(zip(cut, clusters)):
        pre[g, :n], plen[g] = rows[idx[0]].inputs[:n], n
        for j, i in enumerate(idx):
            r = rows[i]
            m = r.length - n
            suf[g, j, :m] = r.inputs[n:]
            tgt[i, : r.length] = r.targets
            gather[i, :n] = g * tp + np.arange(n)
            gather[i, n : r.length] = gp * tp + (g * s + j) * ts + np.arange(m)
    return {
        "sp_prefix_tokens": pre,
        "sp_prefix_lens": plen,
        "sp_suffix_tokens": suf,
        "sp_targets": tgt,
        "sp_gather": gather,
    }


def shared_prefix_table(max_len: int) -> tuple[int, ...]:
    """The lengths a shared-prefix layout rounds prompts and continuations up to: powers of two from 16
    (a prompt or continuation is often shorter than a row's smallest bucket) and ``max_len``; coarse, as
    every (prompt length, continuation length, row bucket) met is a compiled shape."""
    return buckets(min(16, max_len), max_len, 1)


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading entries ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


def fixed_prefix_slots(
    rows: Sequence[Row], batch_size: int, length: int, prefix_len: int, slots: int
) -> list[list[tuple[int, list[int]]]]:
    """``rows`` (each at most ``length`` long) assigned, in order and first fit, to passes of the fixed
    shared-prefix layout (:func:`fixed_prefix_arrays`): a pass has at most ``batch_size`` rows and ``slots``
    prompt slots, each slot ``(n, [row indices])``: its rows share their first ``n <= prefix_len`` inputs
    (the common prefix of their inputs: a GRPO group's prompt, and more when its samples begin alike), and
    every row's rest fits the ``length - prefix_len`` continuation. A row joins the first slot whose shared
    prefix, cut to what it has in common with the row, still leaves every member fitting; else it opens a
    slot of its own (``n = min(prefix_len, row length)``, which always fits), or, when the pass is full, a
    new pass. So any rows fit; rows that share a prompt of at least ``prefix_len`` tokens run in
    ``ceil(prompts / slots)`` passes."""
    ts = length - prefix_len
    passes: list[list[list]] = [[]]
    count = 0
    for i, r in enumerate(rows):
        require(
            r.length <= length,
            "row length",
            expected=f"at most the fixed length {length}",
            received=r.length,
            fix="cut rows to LearnerConfig.max_len (row_from_trajectory(max_len=...))",
        )
        cur = passes[-1]
        if count == batch_size:
            cur, count = [], 0
            passes.append(cur)
        for slot in cur:
            n = min(slot[0], common_prefix(rows[slot[1][0]].inputs, r.inputs))
            if all(rows[j].length - n <= ts for j in (*slot[1], i)):
                slot[0] = n
                slot[1].append(i)
                break
        else:
            if len(cur) == slots:
                cur, count = [], 0
                passes.append(cur)
            cur.append([min(prefix_len, r.length), [i]])
        count += 1
    return [[(n, members) for n, members in p] for p in passes]


def fixed_prefix_arrays(
    rows: Sequence[Row],
    slot_rows: list[tuple[int, list[int]]],
    batch_size: int,
    length: int,
    prefix_len: int,
    slots: int,
    pad_id: int = 0,
) -> dict[str, np.ndarray]:
    """The model-side arrays of one pass (:func:`fixed_prefix_slots`) in the fixed shared-prefix layout, for
    :func:`gymllm.models.shared_prefix.shared_prefix_rows_hidden`; the pass's rows are numbered in slot
    order (the order :func:`fixed_prefix_rows` gives them). Shapes depend only on the arguments, never on
    the rows: ``sp_prefix_tokens`` [slots, prefix_len], ``sp_prefix_lens`` [slots] (0 for an unused slot),
    ``sp_suffix_tokens`` [batch_size, length - prefix_len], ``sp_suffix_prefix`` [batch_size] (each row's
    slot), ``sp_targets`` and ``sp_gather`` [batch_size, length] (as :func:`shared_prefix_layout`'s:
    ``g * prefix_len + t`` on the shared part, ``slots * prefix_len + b * Ts + t - n`` after it)."""
    tp, ts = prefix_len, length - prefix_len
    pre = np.full((slots, tp), pad_id, np.int32)
    plen = np.zeros(slots, np.int32)
    suf = np.full((batch_size, ts), pad_id, np.int32)
    owner = np.zeros(batch_size, np.int32)
    tgt = np.full((batch_size, length), pad_id, np.int32)
    gather = np.zeros((batch_size, length), np.int32)
    b = 0
    for g, (n, members) in enumerate(slot_rows):
        pre[g, :n], plen[g] = rows[members[0]].inputs[:n], n
        for i in members:
            r, m = rows[i], rows[i].length
            suf[b, : m - n], owner[b] = r.inputs[n:], g
            tgt[b, :m] = r.targets
            gather[b, :n] = g * tp + np.arange(n)
            gather[b, n:m] = slots * tp + b * ts + np.arange(m - n)
            b += 1
    return {
        "sp_prefix_tokens": pre,
        "sp_prefix_lens": plen,
        "sp_suffix_tokens": suf,
        "sp_suffix_prefix": owner,
        "sp_targets": tgt,
        "sp_gather": gather,
    }


def fixed_prefix_rows(rows: Sequence[Row], slot_rows: list[tuple[int, list[int]]]) -> list[Row]:
    """The rows of one pass in the order :func:`fixed_prefix_arrays` lays them out (slot by slot)."""
    return [rows[i] for _, members in slot_rows for i in members]


def cap_sampled(row: Row, budget: int) -> int:
    """Zero ``row``'s mask past its first ``budget`` sampled targets (in place), so the LM head's fixed
    ``budget`` loss positions hold every one it keeps; returns how many it dropped."""
    on = np.flatnonzero(row.mask > 0)
    if on.size <= budget:
        return 0
    row.mask = row.mask.copy()
    row.mask[on[budget:]] = 0.0
    return int(on.size - budget)
