"""Packing prompt chunks into prefill calls of a fixed token budget (the JAX engine's fixed shapes).

With ``EngineConfig.shapes="fixed"`` the engine prefills through one packed program
(:mod:`gymllm.models.packed_prefill`): up to ``segments`` prompt pieces laid end to end in ``budget``
tokens. :func:`pack_pieces` plans the calls of one admission round: requests in order, each call filled
until its budget or its segment count runs out; a chunk that does not fit continues in the next call
(that piece reads the first from the cache, which the earlier call wrote). A request samples its first
token in the call holding its last piece (``Piece.final``). Pure Python, tested directly.
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
        check_range("pack_pieces", "chunks[i]", n, lo=1, integer=True, fix="every request prefills at least one token")
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
