"""Training mode of the OpenAI-compatible server: exact per-session token records of agent programs.

    recorder = SessionRecorder(tokenizer, on_closed=source.add)        # source: rollout.ProxyGroupSource
    app = build_app(engine, tokenizer, "policy", recorder=recorder)    # gymllm serve --training

An agent program talks plain OpenAI chat to the server and names its episode with the
``X-Session-Id`` header (or the request's ``user`` field); ``X-Group-Id`` / ``X-Task-Id`` (or
``metadata.group_id`` / ``metadata.task_id``) name its GRPO group and task. For every request of a
session the server renders the chat template itself and keeps the ids:

* the first request's prompt is ``encode(render(messages, tools, add_generation_prompt=True))``;
* a later request whose ``messages`` extend the session's history (the previous request's messages
  plus the assistant message the server returned, compared field by field) is prompted with the
  session's previous ids **verbatim** (prompt ++ sampled ids) plus the chat-template delta of the new
  messages, computed as :class:`gymllm.rollout.token_buffer.TokenBuffer` does (the template's
  end-of-turn text after the assistant turn, not repeated when the model sampled it itself), so
  sampled ids are never decoded and re-encoded;
* otherwise, when the re-rendered prompt's ids still start with the session's previous ids the
  segment is extended by the extra ids; when they do not, a new segment (a new training row) starts
  and is counted in ``segments_started``.

``POST /v1/sessions/{id}/reward`` closes the episode (:meth:`SessionRecorder.close`: unknown id ->
:class:`UnknownSession` (404), already closed -> :class:`SessionAlreadyClosed` (409)) and hands a
:class:`ClosedSession` to ``on_closed``. The recorder is thread-safe: the server's event loop records,
any thread may close or read stats.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import threading
import time
from typing import Any, Callable, Sequence

from gymllm.errors import GymLLMError
from gymllm.models.tokenizer import stop_ids
from gymllm.validation import check_fields, require

_SENTINEL = "\u2063GYMLLM_PROXY_SENTINEL\u2063"


class SessionError(GymLLMError, LookupError):
    """A reward or request for a session in the wrong state; ``status`` is the HTTP answer."""

    status = 400


class UnknownSession(SessionError):
    status = 404


class SessionAlreadyClosed(SessionError):
    status = 409


class TooManySessions(SessionError):
    status = 429


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProxyConfig:
    """Training-mode settings. max_open_sessions: sessions recording at once (more get a 429);
    idle_timeout_s: a session without a request or reward for this long is dropped (counted);
    remember_closed: how many closed session ids are kept to answer a second reward with 409."""

    max_open_sessions: int = 4096
    idle_timeout_s: float = 3600.0
    remember_closed: int = 100_000

    def __post_init__(self) -> None:
        names = ("max_open_sessions", "remember_closed")
        check_fields("ProxyConfig", self, names, lo=1, integer=True, fix="pass e.g. {field}=1024")
        require(
            isinstance(self.idle_timeout_s, (int, float)) and self.idle_timeout_s > 0,
            "ProxyConfig.idle_timeout_s",
            expected="a number > 0",
            received=self.idle_timeout_s,
            fix="pass e.g. idle_timeout_s=3600",
        )


@dataclasses.dataclass
class Segment:
    """One training row in the making: ``pieces`` in order, each ``("context", ids)`` (template,
    prompt and observation ids: mask 0) or ``("sampled", ids, logprobs, versions)`` (mask 1)."""

    pieces: list[tuple] = dataclasses.field(default_factory=list)
    token_ids: list[int] = dataclasses.field(default_factory=list)  # everything so far, flat

    def add_context(self, ids: Sequence[int]) -> None:
        if ids:
            self.pieces.append(("context", [int(i) for i in ids]))
            self.token_ids.extend(int(i) for i in ids)

    def add_sampled(
        self, ids: Sequence[int], logprobs: Sequence[float], versions: Sequence[int]
    ) -> None:
        self.pieces.append(
            (
                "sampled",
                [int(i) for i in ids],
                [float(x) for x in logprobs],
                [int(v) for v in versions],
            )
        )
        self.token_ids.extend(int(i) for i in ids)

    @property
    def num_sampled(self) -> int:
        return sum(len(p[1]) for p in self.pieces if p[0] == "sampled")


@dataclasses.dataclass
class ClosedSession:
    """A finished episode: its segments (training rows), reward and bookkeeping."""

    session_id: str
    group_id: str
    task_id: str
    reward: float
    segments: list[Segment]
    model_calls: int
    segments_started: int  # segments beyond the first: requests that did not extend the history
    finish_reason: str  # the last model call's: "stop" | "length" | "tool_calls" | "abort"
    admitted_version: int
    info: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Plan:
    """What one request of a session sends to the engine: ``prompt_ids``, and where they go."""

    session_id: str
    prompt_ids: list[int]
    segment: Segment | None  # the segment it extends (None: a new one)
    base_len: int  # len(segment.token_ids) when planned
    context: list[int]  # ids to add before the sampled ones
    messages: list[dict] | None  # the request's normalised messages (chat) for the next match


@dataclasses.dataclass
class _Session:
    session_id: str
    group_id: str
    task_id: str
    admitted_version: int
    segments: list[Segment] = dataclasses.field(default_factory=list)
    history: list[dict] | None = (
        None  # normalised messages + the assistant reply, for chat matching
    )
    tools_key: str = ""
    model_calls: int = 0
    segments_started: int = 0
    last_finish: str = ""
    last_seen: float = 0.0


def normalise_message(m: dict) -> dict:
    """The fields of a chat message that matter for matching histories (tool-call arguments as
    objects, ids and empty fields dropped), so an echoed message equals the one the server sent."""
    content = m.get("content")
    if isinstance(content, list):
        content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    out: dict[str, Any] = {"role": m.get("role"), "content": content or ""}
    calls = []
    for c in m.get("tool_calls") or ():
        fn = c.get("function", c) if isinstance(c, dict) else {}
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                pass
        calls.append({"name": fn.get("name"), "arguments": args})
    if calls:
        out["tool_calls"] = calls
    for key in ("tool_call_id", "name"):
        if m.get(key):
            out[key] = m[key]
    return out


class SessionRecorder:
    """Per-session exact token records for training (see the module docstring)."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        on_closed: Callable[[ClosedSession], None] | None = None,
        config: ProxyConfig | None = None,
        stop_token_ids: Sequence[int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.tokenizer = tokenizer
        self.config = config or ProxyConfig()
        self.on_closed = on_closed
        self.stop_token_ids = stop_ids(tokenizer, stop_token_ids)
        self.clock = clock
        self._lock = threading.Lock()
        self._open: dict[str, _Session] = {}
        self._closed: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._closing: dict[str, str] = {}  # tools key -> the template's end-of-turn text
        self.counts = collections.Counter()

    # --- sessions --------------------------------------------------------------------------
    def is_open(self, session_id: str) -> bool:
        with self._lock:
            return session_id in self._open

    def _session(
        self, session_id: str, group_id: str | None, task_id: str | None, version: int
    ) -> _Session:
        if session_id in self._closed:
            raise SessionAlreadyClosed(
                f"session {session_id!r}: expected an open session, received a request for "
                "one already closed by its reward. Fix: start each episode with a new "
                "session id"
            )
        s = self._open.get(session_id)
        if s is None:
            self._reap()
            if len(self._open) >= self.config.max_open_sessions:
                raise TooManySessions(
                    f"training mode: expected at most {self.config.max_open_sessions} open "
                    f"sessions, received a new one ({session_id!r}). Fix: post rewards for "
                    "finished sessions or raise --max-sessions"
                )
            s = _Session(session_id, group_id or session_id, task_id or "", version)
            self._open[session_id] = s
            self.counts["sessions_started"] += 1
        s.last_seen = self.clock()
        return s

    def _reap(self) -> None:
        now = self.clock()
        for sid in [
            k for k, s in self._open.items() if now - s.last_seen > self.config.idle_timeout_s
        ]:
            del self._open[sid]
            self.counts["sessions_expired"] += 1

    # --- planning a request ---------------------------------------------------------------
    def plan_chat(
        self,
        session_id: str,
        messages: list[dict],
        tools: list | None,
        *,
        group_id: str | None = None,
        task_id: str | None = None,
        version: int = 0,
    ) -> Plan:
        """The prompt ids for a chat request of ``session_id`` (see the module docstring)."""
        norm = [normalise_message(m) for m in messages]
        tools_key = json.dumps(tools or [], sort_keys=True, default=str)
        with self._lock:
            s = self._session(session_id, group_id, task_id, version)
            seg = s.segments[-1] if s.segments else None
            hist = s.history
            extends = (
                seg is not None
                and hist is not None
                and tools_key == s.tools_key
                and len(norm) > len(hist)
                and norm[: len(hist)] == hist
                and norm[len(hist)]["role"] != "assistant"
            )
            base = list(seg.token_ids) if seg is not None else []
        if extends:
            delta = self._delta_ids(messages[: len(hist)], messages, tools, base)
            if delta is not None:
                return Plan(session_id, base + delta, seg, len(base), delta, norm)
        full = list(
            self.tokenizer.apply_chat_template(
                messages, tools=tools or None, add_generation_prompt=True, tokenize=True
            )
        )
        with self._lock:
            s.tools_key = tools_key
        return self._plan_ids(session_id, full, seg, base, norm)

    def plan_tokens(
        self,
        session_id: str,
        prompt_ids: Sequence[int],
        *,
        group_id: str | None = None,
        task_id: str | None = None,
        version: int = 0,
    ) -> Plan:
        """The prompt for a completions request of ``session_id``: the ids as sent (token-level rule)."""
        with self._lock:
            s = self._session(session_id, group_id, task_id, version)
            seg = s.segments[-1] if s.segments else None
            base = list(seg.token_ids) if seg is not None else []
        return self._plan_ids(session_id, [int(i) for i in prompt_ids], seg, base, None)

    @staticmethod
    def _plan_ids(
        session_id: str, ids: list[int], seg: Segment | None, base: list[int], norm
    ) -> Plan:
        if seg is not None and len(ids) > len(base) and ids[: len(base)] == base:
            return Plan(session_id, ids, seg, len(base), ids[len(base) :], norm)
        return Plan(session_id, ids, None, 0, ids, norm)

    def _delta_ids(
        self, prev_msgs: list[dict], all_msgs: list[dict], tools: list | None, base: list[int]
    ):
        """TokenBuffer's observation delta: closing text + what the new messages add; None when the
        template rewrote earlier turns (not prefix-preserving)."""
        tok = self.tokenizer
        prev = tok.apply_chat_template(prev_msgs, tools=tools or None, tokenize=False)
        full = tok.apply_chat_template(
            all_msgs, tools=tools or None, add_generation_prompt=True, tokenize=False
        )
        if not full.startswith(prev):
            return None
        ids = list(tok.encode(self._closing_text(tools) + full[len(prev) :]))
        last = base[-1] if base else None
        if ids and last is not None and last in self.stop_token_ids and ids[0] == last:
            ids = ids[1:]  # the model closed its own turn with the template's end-of-turn token
        return ids

    def _closing_text(self, tools: list | None) -> str:
        key = json.dumps(tools or [], sort_keys=True, default=str)
        if key not in self._closing:
            msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": _SENTINEL}]
            text = self.tokenizer.apply_chat_template(msgs, tools=tools or None, tokenize=False)
            i = text.rfind(_SENTINEL)
            self._closing[key] = text[i + len(_SENTINEL) :] if i >= 0 else ""
        return self._closing[key]

    # --- recording ------------------------------------------------------------------------
    def record(
        self,
        plan: Plan,
        completion: Any,
        reply: dict | None = None,
        finish_reason: str | None = None,
    ) -> None:
        """Append one model call: the plan's context ids (mask 0) then the sampled ids verbatim."""
        with self._lock:
            s = self._open.get(plan.session_id)
            if s is None:  # closed or reaped while the request ran: nothing to train on
                self.counts["orphan_calls"] += 1
                return
            seg = plan.segment
            if seg is None or seg not in s.segments or len(seg.token_ids) != plan.base_len:
                if (
                    s.segments
                ):  # a new row: the history did not extend the previous one (or raced it)
                    s.segments_started += 1
                    self.counts["segments_started"] += 1
                seg = Segment()
                s.segments.append(seg)
                seg.add_context(plan.prompt_ids)
            else:
                seg.add_context(plan.context)
            seg.add_sampled(completion.token_ids, completion.logprobs, completion.versions)
            s.model_calls += 1
            s.last_finish = finish_reason or str(completion.finish_reason)
            s.history = (
                (plan.messages + [normalise_message(reply)])
                if plan.messages is not None and reply
                else None
            )
            s.last_seen = self.clock()
            self.counts["model_calls"] += 1

    # --- closing ----------------------------------------------------------------------------
    def close(self, session_id: str, reward: float, info: dict | None = None) -> ClosedSession:
        """End ``session_id`` with ``reward``; the record goes to ``on_closed``."""
        with self._lock:
            if session_id in self._closed:
                raise SessionAlreadyClosed(
                    f"session {session_id!r}: expected one reward per session, received a "
                    "second one. Fix: post the reward once, when the episode ends"
                )
            s = self._open.pop(session_id, None)
            if s is None:
                raise UnknownSession(
                    f"session {session_id!r}: expected a session that made at least one request, "
                    "received an unknown id. Fix: send requests with the X-Session-Id header (or "
                    "the user field) first"
                )
            self._closed[session_id] = None
            while len(self._closed) > self.config.remember_closed:
                self._closed.popitem(last=False)
            self.counts["sessions_closed"] += 1
        closed = ClosedSession(
            session_id=s.session_id,
            group_id=s.group_id,
            task_id=s.task_id,
            reward=float(reward),
            segments=[g for g in s.segments if g.num_sampled],
            model_calls=s.model_calls,
            segments_started=s.segments_started,
            finish_reason=s.last_finish,
            admitted_version=s.admitted_version,
            info=dict(info or {}),
        )
        if self.on_closed is not None:
            self.on_closed(closed)
        return closed

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {**dict(self.counts), "open_sessions": len(self._open)}
