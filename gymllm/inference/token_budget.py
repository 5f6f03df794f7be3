"""Packing prompt chunks into prefill calls of a fixed token budget (the JAX engine's fixed shapes).

With ``EngineConfig.shapes="fixed"`` the engine prefills through one packed program
(:mod:`gymllm.models.packed_prefill`): up to ``segments`` prompt pieces laid end to end in ``budget``
tokens. :func:`pack_pieces` plans the calls of one admission round: requests in order, each call filled
until its budget or its segment count runs out; a chunk that does not fit continues in the next call
(that piece reads the first from the cache, which the earlier call wrote). A request samples its first
token in the call holding its last piece (``Piece.final``). With a second, smaller budget
(``EngineConfig.prefill_tokens_small``) :func:`plan_calls` picks, per round, the plan that processes
fewer tokens. Pure Python, tested directly.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from gymllm.validation import check_range


@dataclasses.dataclass(frozen=True)
class Piece:
    index: int  # the request (its place in the round's list)
    offset: int  # the piece's first token, counted from the start of the request's chunk
    length: int  # tokens in this piece (>= 1)
    final: bool  # the chunk's last piece: the request samples its first token here


def pack_pieces(chunks: Sequence[int], budget: int, segments: int) -> list[list[Piece]]:
    """The calls that prefill chunks of ``chunks[i]`` tokens (each >= 1), every call at most ``budget``
    tokens in at most ``segments`` pieces, every token exactly once and in order."""
    check_range("pack_pieces", "budget", budget, lo=1, integer=True, fix="use e.g. 128")
    check_range("pack_pieces", "segments", segments, lo=1, integer=True, fix="use e.g. 4")
    for n in chunks:
        check_range(
            "pack_pieces",
            "chunks[i]",
            n,
            lo=1,
            integer=True,
            fix="every request prefills at least one token",
        )
    calls: list[list[Piece]] = []
    i, off = 0, 0
    while i < len(chunks):
        call: list[Piece] = []
        room = budget
        while i < len(chunks) and room > 0 and len(call) < segments:
            take = min(chunks[i] - off, room)
            call.append(Piece(i, off, take, off + take == chunks[i]))
            room -= take
            off += take
            if off == chunks[i]:
                i, off = i + 1, 0
        calls.append(call)
    return calls


def plan_calls(
    chunks: Sequence[int], budgets: Sequence[int], segments: int
) -> list[tuple[int, list[Piece]]]:
    """The packed calls of one round when the engine has programs of several token ``budgets``: each call
    as ``(budget, pieces)``. Two plans: :func:`pack_pieces` at the largest budget, each call then run by
    the smallest program that holds it; and :func:`pack_pieces` at the smallest budget (short pieces in
    more, smaller calls). Each is weighed by the tokens its programs process (padding included) plus,
    for every call, the smallest budget's worth (a call reads every weight, whatever it holds: a long
    prompt is not cut into many small calls), the fewer calls breaking a tie."""
    budgets = sorted(budgets)
    if len(budgets) > 1 and not all(isinstance(b, int) and b >= 1 for b in budgets):
        raise ValueError(f"plan_calls: expected budgets of at least one token, received {budgets}")

    def fit(used: int) -> int:
        return next(b for b in budgets if used <= b)

    wide = [
        (fit(sum(p.length for p in call)), call)
        for call in pack_pieces(chunks, budgets[-1], segments)
    ]
    if len(budgets) == 1:
        return wide
    narrow = [(budgets[0], call) for call in pack_pieces(chunks, budgets[0], segments)]
    cost = lambda plan: (sum(b for b, _ in plan) + budgets[0] * len(plan), len(plan))  # noqa: E731
    return narrow if cost(narrow) < cost(wide) else wide
