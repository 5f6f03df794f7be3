"""Every XLA compile of the process as it happens: which program, how long, compiled or loaded from the
persistent compilation cache.

    log = CompileLog(path=run_dir / "compiles.jsonl").start()    # or: with CompileLog() as log:
    ...                                                          # anything that compiles
    log.stop()
    log.summary()   # {"programs": 5, "programs_loaded": 0, "programs_all": 31, "compile_s": 40.2, ...}
    log.counts()    # Counter({"jit(prefill_jit)": 3, "jit(decode_chunk)": 3, "jit(grad)": 2, ...})

Where the figures come from: JAX reports each backend compile through :mod:`jax.monitoring` (the event
``/jax/core/compile/backend_compile_duration``, kwarg ``fun_name``, e.g. ``'jit(prefill_jit)'``). When
the persistent cache holds the program, JAX loads it inside that same event and reports
``/jax/compilation_cache/cache_hits`` just before it, in the same thread: such a compile is recorded
with ``cache_hit=True`` (its seconds are the load) and the persistent-cache ``key`` it was loaded
from; a compile JAX then stores reports ``/jax/compilation_cache/cache_misses`` as it writes, and is
recorded with the key it was stored under (``key`` None: the cache is off or JAX did not store
it). Lowering to StableHLO
(``/jax/core/compile/jaxpr_to_mlir_module_duration``, before every compile and every cache load: the
cache key is the lowered module) is kept per compile as ``lower_s``.

Kinds. ``"program"``: a jit of a function written outside JAX (gymllm's prefill and decode steps, the
learner's gradient step and optimizer update, the engine's row copy, a user's function): what a run
compiles on purpose, the "model programs" a benchmark counts. ``"op"``: a single primitive run eagerly
(``'jit(convert_element_type)'``, ``'jit(broadcast_in_dim)'``) or a ``jax.numpy`` function called
outside any jit (``'jit(maximum)'``). Told apart by the compile's own call stack: an eager primitive
compiles under ``jax._src.dispatch.apply_primitive``, and the jitted function's source file
(``fun_sourceinfo`` of the jit) lies inside the ``jax`` package for both kinds of op. A program that
takes the model's weights is a ``"program"``; ``in_bytes`` (its inputs' total size, from the avals it
was lowered for) tells those apart from small ones (a weights-taking program's inputs hold the
weights: megabytes, where an op's hold a few scalars). When the stack cannot be read (a JAX version
that moved these frames), a compile counts as a ``"program"`` with ``in_bytes`` None: counted, never hidden.

Recording. JAX's listeners are process-wide and cannot be removed in every JAX version: the module
registers its two listeners once (the first :meth:`CompileLog.start`) and hands each compile to every
log active at that moment (thread-safe; compiles arrive on whichever thread compiled). A log:

* keeps :class:`CompileRecord` s (:attr:`CompileLog.records`);
* records a span per compile on the tracer's ``"compile"`` track (the process-wide tracer when
  ``tracer`` is None), named by the program (``jit(prefill_jit)``), tags ``kind``, ``cache_hit``,
  ``lower_s``, ``in_bytes``: it opens in the Perfetto trace a run writes (``trace.json``) on its own row;
* appends each record to ``path`` (JSON lines, flushed per line) when given: a run's
  ``compiles.jsonl``, read back by :func:`read_compiles` and :func:`summarize`.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import pathlib
import sys
import threading
import time
from typing import Any, Iterable, Mapping

from gymllm.telemetry import tracer as _tracer_mod

__all__ = [
    "CompileRecord",
    "CompileLog",
    "read_compiles",
    "summarize",
    "summary_line",
    "COMPILE_TRACK",
    "BACKEND_COMPILE_EVENT",
    "CACHE_HIT_EVENT",
]

COMPILE_TRACK = "compile"
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
LOWER_EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
CACHE_REQUEST_EVENT = "/jax/compilation_cache/compile_requests_use_cache"
CACHE_WRITE_EVENT = "/jax/compilation_cache/cache_misses"  # JAX reports it when it writes an entry


@dataclasses.dataclass(frozen=True)
class CompileRecord:
    """One backend compile (or persistent-cache load) of one program.

    Attributes:
        name: The program as JAX names it (``'jit(prefill_jit)'``).
        seconds: The backend compile's wall time (the load's, when ``cache_hit``).
        cache_hit: True when the persistent compilation cache supplied the executable.
        kind: ``"program"`` (a jit of a function written outside JAX) or ``"op"`` (an eager primitive or
            ``jax.numpy`` function); module docstring.
        end: Unix time the compile finished.
        lower_s: Seconds lowering it to StableHLO just before (None when JAX did not report it).
        in_bytes: Total size of its inputs (None when unknown).
        thread: Name of the thread that compiled it.
        key: The persistent-cache key it was loaded from or stored under (None: the cache is off, or JAX
            did not store it); one key per distinct program, shapes and compile options.
    """

    name: str
    seconds: float
    cache_hit: bool
    kind: str
    end: float
    lower_s: float | None = None
    in_bytes: int | None = None
    thread: str = ""
    key: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class CompileLog:
    """The compiles of the process while the log is active (module docstring).

    Args:
        path: Append each record to this JSON-lines file (created with its folder); None: memory only.
        tracer: Record a span per compile here (None: the process-wide tracer at each compile);
            ``trace=False`` records none.
        trace: Record spans on the ``"compile"`` track.
    """

    def __init__(
        self,
        path: str | os.PathLike | None = None,
        *,
        tracer: _tracer_mod.Tracer | None = None,
        trace: bool = True,
    ):
        self.path = pathlib.Path(path) if path is not None else None
        self.tracer, self.trace = tracer, trace
        self.records: list[CompileRecord] = []
        self._lock = threading.Lock()
        self._file = None

    # ------------------------------------------------------------------ lifetime

    def start(self) -> CompileLog:
        """Begin recording (idempotent); returns the log."""
        _install()
        if self.path is not None and self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")
        with _ACTIVE_LOCK:
            global _ACTIVE
            if self not in _ACTIVE:
                _ACTIVE = (*_ACTIVE, self)
        return self

    def stop(self) -> None:
        """Stop recording and close the file (idempotent); the records stay readable."""
        with _ACTIVE_LOCK:
            global _ACTIVE
            _ACTIVE = tuple(x for x in _ACTIVE if x is not self)
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    @property
    def active(self) -> bool:
        return self in _ACTIVE

    def __enter__(self) -> CompileLog:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ------------------------------------------------------------------ recording

    def span_tracer(self) -> _tracer_mod.Tracer | None:
        """The tracer this log records its spans in now (None: ``trace=False``)."""
        if not self.trace:
            return None
        return self.tracer if self.tracer is not None else _tracer_mod.get_tracer()

    def add(self, rec: CompileRecord, *, span: bool = True) -> None:
        """Keep ``rec`` (the listener calls this for every compile; tests may call it directly) and, with
        ``span``, record its span (the listener passes False when another active log already put this
        compile's span in the same tracer: one compile, one span)."""
        with self._lock:
            self.records.append(rec)
            if self._file is not None:
                self._file.write(json.dumps(rec.to_json()) + "\n")
                self._file.flush()
        tr = self.span_tracer() if span else None
        if tr is not None:
            tr.add_span(
                rec.name,
                rec.seconds,
                track=COMPILE_TRACK,
                kind=rec.kind,
                cache_hit=rec.cache_hit,
                lower_s=rec.lower_s,
                in_bytes=rec.in_bytes,
            )

    # ------------------------------------------------------------------ reading

    def cursor(self) -> int:
        """A position for :meth:`since` (the number of records so far)."""
        return len(self.records)

    def since(self, cursor: int) -> list[CompileRecord]:
        """The records added at or after ``cursor``."""
        with self._lock:
            return self.records[cursor:]

    def counts(
        self, kind: str | None = "program", *, cache_hit: bool | None = None
    ) -> collections.Counter:
        """Compiles per program name, of ``kind`` (None: every kind), only hits or misses when ``cache_hit``
        is given."""
        return collections.Counter(
            r.name
            for r in self.since(0)
            if (kind is None or r.kind == kind) and (cache_hit is None or r.cache_hit == cache_hit)
        )

    def seconds(self, kind: str | None = None) -> float:
        """Seconds spent compiling (cache loads included), of ``kind`` (None: every kind)."""
        return sum(r.seconds for r in self.since(0) if kind is None or r.kind == kind)

    def summary(self) -> dict[str, Any]:
        """:func:`summarize` of this log's records."""
        return summarize(self.since(0))


def summarize(records: Iterable[CompileRecord | Mapping[str, Any]]) -> dict[str, Any]:
    """Figures over compile records (objects or their JSON dicts):

    ``programs`` (program compiles that compiled: not from the cache), ``programs_loaded`` (program
    compiles the persistent cache supplied), ``programs_distinct`` (distinct program names),
    ``programs_all`` / ``loaded_all`` (the same over every kind, ops included), ``compile_s``
    (seconds in every compile and load), ``compile_s_programs`` (programs only), ``load_s`` (of which
    cache loads), ``lower_s`` (lowering before them), ``slowest`` (name, seconds) of the slowest
    program compile and ``by_name`` ({name: {"n", "s", "hits", "kind"}})."""
    recs = [r.to_json() if isinstance(r, CompileRecord) else dict(r) for r in records]
    prog = [r for r in recs if r.get("kind", "program") == "program"]
    by_name: dict[str, dict[str, Any]] = {}
    for r in recs:
        e = by_name.setdefault(
            r["name"], {"n": 0, "s": 0.0, "hits": 0, "kind": r.get("kind", "program")}
        )
        e["n"] += 1
        e["s"] += float(r["seconds"])
        e["hits"] += bool(r.get("cache_hit"))
    slow = max(prog, key=lambda r: r["seconds"], default=None)
    return {
        "programs": sum(not r.get("cache_hit") for r in prog),
        "programs_loaded": sum(bool(r.get("cache_hit")) for r in prog),
        "programs_distinct": len({r["name"] for r in prog}),
        "programs_all": sum(not r.get("cache_hit") for r in recs),
        "loaded_all": sum(bool(r.get("cache_hit")) for r in recs),
        "compile_s": sum(float(r["seconds"]) for r in recs),
        "compile_s_programs": sum(float(r["seconds"]) for r in prog),
        "load_s": sum(float(r["seconds"]) for r in recs if r.get("cache_hit")),
        "lower_s": sum(float(r.get("lower_s") or 0.0) for r in recs),
        "slowest": (slow["name"], float(slow["seconds"])) if slow else None,
        "by_name": by_name,
    }


def summary_line(s: Mapping[str, Any], share: float | None = None) -> str:
    """One line for summary.txt from :func:`summarize`'s figures. ``share``: the part of the run's wall
    with a compile under way (``compile_fraction`` of :func:`gymllm.telemetry.metrics.pipeline_metrics`;
    compiles on two threads at once overlap, so the seconds may add up to more than the wall)."""
    during = (
        f" ({100 * share:.0f}% of the run's wall had a compile under way)"
        if share is not None
        else ""
    )
    line = (
        f"compile: {s['compile_s']:.1f} s{during}; {s['programs']} program compile(s) "
        f"({s['programs_distinct']} distinct), {s['programs_loaded']} loaded from the persistent cache; "
        f"{s['programs_all'] + s['loaded_all']} compiles in all, eager ops included"
    )
    if s.get("slowest"):
        line += f"; slowest {s['slowest'][0]} {s['slowest'][1]:.1f} s"
    return line


def read_compiles(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a ``compiles.jsonl`` (a torn last line is skipped); [] when the file is missing."""
    p = pathlib.Path(path)
    if not p.is_file():
        return []
    out = []
    for line in p.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and "name" in rec and "seconds" in rec:
            out.append(rec)
    return out


# ---------------------------------------------------------------------------- the process-wide listener

_ACTIVE: tuple[CompileLog, ...] = ()
_ACTIVE_LOCK = threading.Lock()


def active_logs() -> tuple[CompileLog, ...]:
    """The compile logs recording now (started, not stopped)."""
    return _ACTIVE


_INSTALLED = False
_LOCAL = threading.local()  # per thread: a cache hit / lowering time waiting for its compile event
_JAX_DIR: str | None = None


def _install() -> None:
    global _INSTALLED, _JAX_DIR
    with _ACTIVE_LOCK:
        if _INSTALLED:
            return
        import jax

        _JAX_DIR = os.path.dirname(os.path.abspath(jax.__file__)) + os.sep
        jax.monitoring.register_event_listener(_on_event)
        jax.monitoring.register_event_duration_secs_listener(_on_duration)
        _INSTALLED = True


def _on_event(event: str, **kwargs: Any) -> None:
    try:
        if event == CACHE_REQUEST_EVENT:
            _LOCAL.hit, _LOCAL.key = False, None
        elif event in (CACHE_HIT_EVENT, CACHE_WRITE_EVENT):
            _LOCAL.hit = _LOCAL.hit or event == CACHE_HIT_EVENT
            _LOCAL.key = _cache_key(sys._getframe(2))
    except Exception:  # noqa: BLE001 - a listener must never break a compile
        pass


def _cache_key(frame: Any, depth: int = 4) -> str | None:
    """The persistent-cache key a cache read or write is for (a local of JAX's caller frames)."""
    while frame is not None and depth > 0:
        key = (
            frame.f_locals.get("cache_key")
            if frame.f_code.co_filename.startswith(_JAX_DIR or "\0")
            else None
        )
        if isinstance(key, str):
            return key
        frame, depth = frame.f_back, depth - 1
    return None


def _on_duration(event: str, duration: float, **kwargs: Any) -> None:
    try:
        if event == LOWER_EVENT:
            _LOCAL.lower_s = (getattr(_LOCAL, "lower_s", None) or 0.0) + float(duration)
        elif event == BACKEND_COMPILE_EVENT:
            _on_compile(float(duration), str(kwargs.get("fun_name", "?")))
    except Exception:  # noqa: BLE001 - a listener must never break a compile (the record is lost, not the run)
        pass


def _on_compile(seconds: float, name: str) -> None:
    hit, lower_s, key = (
        getattr(_LOCAL, "hit", False),
        getattr(_LOCAL, "lower_s", None),
        getattr(_LOCAL, "key", None),
    )
    _LOCAL.hit, _LOCAL.lower_s, _LOCAL.key = False, None, None
    logs = _ACTIVE
    if not logs:
        return
    try:
        kind, in_bytes = _inspect_stack(sys._getframe(2))
    except Exception:  # noqa: BLE001 - frames JAX moved: counted as a program, never hidden
        kind, in_bytes = "program", None
    rec = CompileRecord(
        name=name,
        seconds=seconds,
        cache_hit=bool(hit),
        kind=kind,
        end=time.time(),
        lower_s=lower_s,
        in_bytes=in_bytes,
        thread=threading.current_thread().name,
        key=key,
    )
    traced: set[int] = set()  # tracers that already have this compile's span
    for log in logs:
        tr = log.span_tracer()
        log.add(rec, span=tr is not None and id(tr) not in traced)
        if tr is not None:
            traced.add(id(tr))


def _inspect_stack(frame: Any, depth: int = 40) -> tuple[str, int | None]:
    """(kind, input bytes) of the compile whose listener runs above ``frame`` (module docstring)."""
    kind, in_bytes, src = "program", None, None
    while frame is not None and depth > 0:
        code = frame.f_code
        if code.co_filename.startswith(_JAX_DIR or "\0"):
            if code.co_name == "apply_primitive":
                kind = "op"
            elif code.co_name == "from_hlo" and in_bytes is None:
                avals = frame.f_locals.get("global_in_avals") or ()
                in_bytes = int(sum(a.size * a.dtype.itemsize for a in avals if hasattr(a, "dtype")))
            elif code.co_name == "cache_miss" and src is None:
                src = getattr(frame.f_locals.get("jit_info"), "fun_sourceinfo", None)
        frame, depth = frame.f_back, depth - 1
    if (
        isinstance(src, str)
        and " at " in src
        and src.rsplit(" at ", 1)[1].startswith(_JAX_DIR or "\0")
    ):
        kind = "op"
    return kind, in_bytes
