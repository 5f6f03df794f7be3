"""Chrome trace-event JSON export (opens in ui.perfetto.dev and chrome://tracing) and its reader.

Layout of the exported trace:
- one *process* per track family (the part of the track before "/"): "engine" (pid 1),
  "trainer" (2), "rollout" (3), "env" (4), "tool" (5), then any other family (pid 10, 11, ...);
- one *thread* per track ("engine", "env/3", ...). Spans on one track that overlap without
  nesting (concurrent asyncio tasks) are laid out on extra lanes named "<track> #2", "#3", ...,
  so every thread holds properly nested spans only, which Perfetto requires;
- ``process_name`` / ``thread_name`` and sort-index metadata ("M" events) for every pid and tid;
- every event carries its track in ``cat``, spans are "X" events and counters "C" events; ``ts``
  and ``dur`` are microseconds since the tracer started, and ``otherData.t0_unix`` anchors them;
- a span's args hold its tags plus ``span_id`` and ``parent_span_id`` (the tracer's nesting,
  also across tracks and tasks), which the reader moves back to ``id`` / ``parent``.

:func:`load_chrome_trace` reads such a file back into the event dicts that
:func:`gymllm.telemetry.metrics.pipeline_metrics` takes (name, ph, ts, dur, track, args).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import pathlib
from typing import Any, Iterable

KNOWN_FAMILIES = ("engine", "trainer", "rollout", "env", "tool")
SPAN_ID, PARENT_ID = "span_id", "parent_span_id"  # span args carrying the nesting (popped on load)
_EPS_US = 1e-3  # 1 ns: float rounding slack when comparing span ends


def family_of(track: str) -> str:
    """The process a track belongs to: "env/3" -> "env"."""
    return track.split("/", 1)[0]


def assign_lanes(spans: list[dict[str, Any]]) -> list[int]:
    """Lane index per span (same order as given) so that the spans of each lane nest properly.

    Greedy: in order of start time (longest first on ties), a span goes to the first lane whose
    open spans all contain it.
    """
    order = sorted(range(len(spans)), key=lambda i: (spans[i]["ts"], -spans[i]["dur"]))
    stacks: list[list[float]] = []  # per lane: end times of the open spans, innermost last
    lanes = [0] * len(spans)
    for i in order:
        start, end = spans[i]["ts"], spans[i]["ts"] + spans[i]["dur"]
        for lane, stack in enumerate(stacks):
            while stack and stack[-1] <= start + _EPS_US:
                stack.pop()
            if not stack or stack[-1] + _EPS_US >= end:
                stack.append(end)
                lanes[i] = lane
                break
        else:
            stacks.append([end])
            lanes[i] = len(stacks) - 1
    return lanes


def _with_ids(e: dict[str, Any]) -> dict[str, Any]:
    """The span's tags plus its span id and parent id (so nesting survives the round trip)."""
    if e.get("id") is None:
        return e.get("args", {})
    return {**e.get("args", {}), SPAN_ID: e["id"], PARENT_ID: e.get("parent")}


def _counter_value(v: Any) -> float | int | None:
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _pids(tracks: Iterable[str]) -> dict[str, int]:
    pids = {f: i + 1 for i, f in enumerate(KNOWN_FAMILIES)}
    for t in tracks:
        pids.setdefault(family_of(t), 10 + len(pids) - len(KNOWN_FAMILIES))
    return pids


def to_chrome_trace(
    events: list[dict[str, Any]], *, t0_unix: float | None = None, dropped: int = 0
) -> dict[str, Any]:
    """Build the trace-event JSON object for ``events`` (dicts as from ``Tracer.events()``);
    ``dropped`` (older events the ring buffer let go) is kept in ``otherData.dropped_events``."""
    spans = [e for e in events if e["ph"] == "X"]
    counters = [e for e in events if e["ph"] == "C"]
    tracks = sorted({e["track"] for e in events}, key=lambda t: (family_of(t), len(t), t))
    pids = _pids(tracks)
    by_track: dict[str, list[dict[str, Any]]] = {}
    for e in spans:
        by_track.setdefault(e["track"], []).append(e)

    out: list[dict[str, Any]] = []
    tids: dict[tuple[str, int], int] = {}
    for track in tracks:
        group = by_track.get(track, [])
        for e, lane in zip(group, assign_lanes(group)):
            tid = tids.setdefault((track, lane), len(tids) + 1)
            out.append(
                {
                    "name": e["name"],
                    "cat": track,
                    "ph": "X",
                    "ts": e["ts"],
                    "dur": e["dur"],
                    "pid": pids[family_of(track)],
                    "tid": tid,
                    "args": _with_ids(e),
                }
            )
        if not group:
            tids.setdefault((track, 0), len(tids) + 1)
    for e in counters:
        ((key, value),) = (
            e["args"].items() if len(e["args"]) == 1 else [(e["name"], e["args"].get(e["name"]))]
        )
        value = _counter_value(value)
        if value is None:  # Perfetto plots numbers only; a None / NaN / text level is left out
            continue
        label = key if e["track"] == family_of(e["track"]) else f"{e['track']}/{key}"
        out.append(
            {
                "name": label,
                "cat": e["track"],
                "ph": "C",
                "ts": e["ts"],
                "pid": pids[family_of(e["track"])],
                "args": {key: value},
            }
        )
    out.sort(key=lambda e: e["ts"])

    used_families = {family_of(t) for t in tracks}
    meta: list[dict[str, Any]] = []
    for fam, pid in pids.items():
        if fam in used_families:
            meta.append(
                {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": fam}}
            )
            meta.append(
                {
                    "name": "process_sort_index",
                    "ph": "M",
                    "pid": pid,
                    "tid": 0,
                    "args": {"sort_index": pid},
                }
            )
    for (track, lane), tid in tids.items():
        label = track if lane == 0 else f"{track} #{lane + 1}"
        pid = pids[family_of(track)]
        meta.append(
            {
                "name": "thread_name",
                "ph": "M",
                "pid": pid,
                "tid": tid,
                "args": {"name": label, "track": track},
            }
        )
        meta.append(
            {
                "name": "thread_sort_index",
                "ph": "M",
                "pid": pid,
                "tid": tid,
                "args": {"sort_index": tid},
            }
        )
    other: dict[str, Any] = {"generator": "gymllm.telemetry", "dropped_events": int(dropped)}
    if t0_unix is not None:
        other["t0_unix"] = t0_unix
    return {"traceEvents": meta + out, "displayTimeUnit": "ms", "otherData": other}


def write_chrome_trace(
    path: str | os.PathLike,
    events: list[dict[str, Any]],
    *,
    t0_unix: float | None = None,
    dropped: int = 0,
) -> pathlib.Path:
    """Write ``events`` as a trace file; gzip-compressed when ``path`` ends in ".gz".

    Tag values become plain JSON: NumPy scalars and arrays are converted, NaN / inf become null,
    anything else unknown is written as its ``str``.
    """
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(
        jsonable(to_chrome_trace(events, t0_unix=t0_unix, dropped=dropped)), allow_nan=False
    )
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt") as f:
        f.write(data)
    return path


def jsonable(obj: Any) -> Any:
    """A copy of ``obj`` that strict JSON accepts (dict keys become str, NaN / inf become None)."""
    if isinstance(obj, (str, bool, int)) or obj is None:
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if hasattr(obj, "tolist"):  # NumPy / JAX scalars and arrays
        return jsonable(obj.tolist())
    return str(obj)


def load_chrome_trace(
    path: str | os.PathLike, *, meta: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Read a trace file (ours or any Chrome trace JSON) back into event dicts.

    Returns spans and counters sorted by ts, each with name, ph, ts, dur (spans), track and args,
    and for our spans id and parent. The track is taken from ``cat`` when present, else from the
    thread's name. ``meta``, if given, receives the file's ``otherData`` (t0_unix, dropped_events).
    """
    path = pathlib.Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data = json.load(f)
    raw = data["traceEvents"] if isinstance(data, dict) else data
    if meta is not None and isinstance(data, dict):
        meta.update(data.get("otherData", {}))
    names = {
        (e.get("pid"), e.get("tid")): e["args"].get("track", e["args"].get("name"))
        for e in raw
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    out = []
    for e in raw:
        ph = e.get("ph")
        if ph not in ("X", "C"):
            continue
        track = e.get("cat") or names.get((e.get("pid"), e.get("tid")), "main")
        ev = {
            "name": e["name"],
            "ph": ph,
            "ts": float(e["ts"]),
            "track": track,
            "args": dict(e.get("args", {})),
        }
        if ph == "X":
            ev["dur"] = float(e.get("dur", 0.0))
            if SPAN_ID in ev["args"]:
                ev["id"] = ev["args"].pop(SPAN_ID)
                ev["parent"] = ev["args"].pop(PARENT_ID, None)
        elif len(ev["args"]) == 1:
            ev["name"] = next(iter(ev["args"]))
        out.append(ev)
    out.sort(key=lambda e: e["ts"])
    return out
