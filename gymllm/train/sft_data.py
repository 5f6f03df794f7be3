"""SFT data: chat JSONL, or a run's own trajectories, as token rows ``(token_ids [T], loss_mask [T])``.

Chat JSONL holds one conversation per line::

    {"messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."},
                  {"role": "assistant", "content": "<tool_call>\\n{...}\\n</tool_call>"},
                  {"role": "tool", "content": "42", "name": "calculator"},
                  {"role": "assistant", "content": "The answer is 42."}],
     "tools": [{"type": "function", "function": {...}}]}          # optional JSON schemas

An assistant ``content`` is the exact text the policy generates (tool calls written as text in the
policy's own format, as :class:`~gymllm.rollout.ToolAgent` keeps them in its history).

:func:`render_conversation` renders a conversation the way a rollout builds a trajectory: the
messages before the first assistant turn go through :meth:`Agent.initial_messages` (so an agent's
``system_prompt`` is added as in a run), the tools through :meth:`Agent.tools`, and the token ids
through the rollout's own :class:`~gymllm.rollout.token_buffer.TokenBuffer`: the prompt is the
chat template's rendering with the generation prompt, each assistant turn is "sampled" as
``encode(content) + [end-of-turn id]`` (mask True: what the policy samples, its stop token
included), and each following user / tool observation is the template's delta (mask False). So SFT
trains exactly the tokens a rollout would sample, and nothing the template or the env writes. A
template that is not prefix-preserving gives one row per assistant turn, as the rollout does.

:func:`rows_from_run` reads ``RUN/trajectories.jsonl`` (records with ``token_ids``,
``sampled_spans`` ``[[start, end), ...]`` and ``reward``) and keeps the rows whose reward is at least
``min_reward``: token-exact, mask = the sampled spans (rejection-sampling fine-tuning).

Bad input raises :class:`SFTDataError` naming the file and line, with expected / received / fix.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any, Iterator, Sequence

import numpy as np

from gymllm.errors import GymLLMError, explain

__all__ = [
    "SFTDataError",
    "SFTRow",
    "ROLES",
    "end_of_turn_id",
    "render_conversation",
    "rows_from_jsonl",
    "rows_from_run",
    "read_chat_jsonl",
]

ROLES = ("system", "user", "assistant", "tool")


class SFTDataError(GymLLMError, ValueError):
    """An SFT data file (chat JSONL or a run's trajectories.jsonl) holds something it cannot train on."""


@dataclasses.dataclass(frozen=True)
class SFTRow:
    """One training sequence: ``token_ids [T]`` int32, ``loss_mask [T]`` bool (True: trained on),
    ``source`` ("FILE:LINE") and, for rows from a run, the trajectory's ``reward``."""

    token_ids: np.ndarray
    loss_mask: np.ndarray
    source: str = ""
    reward: float | None = None

    def __len__(self) -> int:
        return int(len(self.token_ids))

    @property
    def num_trained(self) -> int:
        return int(self.loss_mask.sum())


def _fail(where: str, *, expected: str, received: Any, fix: str) -> SFTDataError:
    return SFTDataError(explain(where, expected=expected, received=received, fix=fix))


def _json_lines(p: pathlib.Path, *, fix: str) -> Iterator[tuple[int, str, Any]]:
    """``(line number, "FILE:LINE", record)`` of each non-blank line of a JSONL file; a line that is not
    JSON raises the SFT data error naming it (``fix`` says what to do)."""
    with open(p, encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{p}:{n}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise _fail(
                    where,
                    expected="one JSON object",
                    received=line.strip()[:80],
                    fix=f"{fix} ({e.msg} at column {e.colno})",
                ) from None
            yield n, where, rec


def read_chat_jsonl(path: str | os.PathLike) -> list[tuple[int, list[dict], list[dict] | None]]:
    """``[(line number, messages, tools or None), ...]`` of a chat JSONL file, checked (roles, contents,
    at least one assistant turn, no two assistant turns in a row, no structured ``tool_calls``)."""
    p = pathlib.Path(path)
    if not p.is_file():
        raise _fail(
            f"SFT data {str(p)!r}",
            expected='a chat JSONL file (one {"messages": [...]} object a line)',
            received="no such file",
            fix="check the path (e.g. write one with `gymllm demos ENV --out FILE`)",
        )
    out = [(n, *_check_record(where, rec)) for n, where, rec in _json_lines(p, fix="fix the JSON")]
    if not out:
        raise _fail(
            f"SFT data {str(p)!r}",
            expected="at least one conversation",
            received="an empty file",
            fix='write one {"messages": [...]} object per line',
        )
    return out


def _check_record(where: str, rec: Any) -> tuple[list[dict], list[dict] | None]:
    if not isinstance(rec, dict) or "messages" not in rec:
        got = sorted(rec) if isinstance(rec, dict) else type(rec).__name__
        raise _fail(
            where,
            expected='an object with a "messages" list (and optionally "tools")',
            received=got,
            fix='write {"messages": [{"role": "user", "content": ...}, {"role": "assistant", ...}]}',
        )
    msgs, tools = rec["messages"], rec.get("tools")
    if not isinstance(msgs, list) or not msgs:
        raise _fail(
            where,
            expected='"messages": a non-empty list',
            received=type(msgs).__name__,
            fix="give the conversation as a list of message objects",
        )
    if tools is not None and not (
        isinstance(tools, list) and all(isinstance(t, dict) for t in tools)
    ):
        raise _fail(
            where,
            expected='"tools": a list of JSON schemas (objects)',
            received=tools,
            fix='e.g. "tools": [{"type": "function", "function": {"name": ..., "parameters": {...}}}]',
        )
    prev = None
    for i, m in enumerate(msgs):
        role = m.get("role") if isinstance(m, dict) else None
        if role not in ROLES:
            raise _fail(
                f"{where}: message {i}",
                expected=f"a role among {list(ROLES)}",
                received=role if isinstance(m, dict) else m,
                fix="use the OpenAI chat roles system/user/assistant/tool",
            )
        if not isinstance(m.get("content"), str):
            raise _fail(
                f"{where}: message {i} ({role})",
                expected="a string content",
                received=type(m.get("content")).__name__,
                fix="write the message's text as a string",
            )
        if role == "assistant" and m.get("tool_calls"):
            raise _fail(
                f"{where}: message {i} (assistant)",
                expected="tool calls written as text inside content, in the policy's own format",
                received="a structured tool_calls field",
                fix="put the call text the policy would sample (e.g. <tool_call>\\n{json}\\n</tool_call>) in "
                "content and drop tool_calls",
            )
        if role == "assistant" and prev == "assistant":
            raise _fail(
                f"{where}: message {i}",
                expected="a user or tool message between two assistant turns",
                received="two assistant messages in a row",
                fix="merge them into one assistant message",
            )
        if role == "assistant" and i == 0:
            raise _fail(
                f"{where}: message 0",
                expected="a prompt (system/user) before the first assistant turn",
                received="assistant",
                fix="start the conversation with the user's message",
            )
        prev = role
    if "assistant" not in [m["role"] for m in msgs]:
        raise _fail(
            where,
            expected="at least one assistant message (the tokens SFT trains on)",
            received=[m["role"] for m in msgs],
            fix="add the assistant's reply",
        )
    return [dict(m) for m in msgs], (list(tools) if tools else None)


def end_of_turn_id(tokenizer: Any, tools: list | None = None) -> int:
    """The id the policy samples to end its turn: the first token of the text the chat template writes
    after an assistant message, when that is a stop token; else the eos id."""
    from gymllm.rollout.token_buffer import closing_text

    stops = {int(i) for i in (getattr(tokenizer, "stop_token_ids", None) or ())}
    closing = closing_text(tokenizer, tools)
    ids = tokenizer.encode(closing) if closing else []
    if ids and int(ids[0]) in stops:
        return int(ids[0])
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        raise _fail(
            "end of turn",
            expected="a chat template that closes assistant turns with a stop token, or an "
            "eos token",
            received=closing,
            fix="use a chat model's tokenizer",
        )
    return int(eos)


def render_conversation(
    tokenizer: Any,
    messages: Sequence[dict],
    tools: list | None = None,
    *,
    system_prompt: str | None = None,
) -> list[tuple[list[int], list[bool]]]:
    """The rows ``[(token_ids, loss_mask), ...]`` a rollout would build for ``messages`` (see the module
    docstring): one row, or one per assistant turn when the template is not prefix-preserving.
    Trailing messages after the last assistant turn are not rendered (a rollout never sends them)."""
    from gymllm.rollout.agents import ModelAgent, ToolAgent
    from gymllm.rollout.token_buffer import TokenBuffer, check_prefix_preserving

    agent = (ToolAgent if tools else ModelAgent)(tokenizer, system_prompt=system_prompt)
    info = {"tools": list(tools)} if tools else {}
    schemas = agent.tools(info)
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    eot = end_of_turn_id(tokenizer, schemas)
    buf = TokenBuffer(
        tokenizer,
        tools=schemas,
        stop_token_ids=sorted(agent.stop_token_ids),
        prefix_preserving=check_prefix_preserving(tokenizer, agent.observation_roles, schemas),
    )
    buf.start(agent.initial_messages([dict(m) for m in messages[:first]], info))
    pending: list[dict] = []
    for m in messages[first : last + 1]:
        if m["role"] != "assistant":
            pending.append(dict(m))
            continue
        if pending:
            buf.add_observation(agent.observation_messages(pending))
            pending = []
        ids = [*tokenizer.encode(m["content"]), eot]
        buf.add_sampled(
            ids, [0.0] * len(ids), [0] * len(ids), {"role": "assistant", "content": m["content"]}
        )
    return [
        (list(r.token_ids), [bool(x) for x in r.loss_mask]) for r in buf.rows if r.turn_boundaries
    ]


def _too_long(where: str, length: int, max_len: int) -> SFTDataError:
    return _fail(
        where,
        expected=f"a row of at most max_len = {max_len} tokens",
        received=f"{length} tokens",
        fix="raise --learner.max-len, or shorten / drop this example",
    )


def rows_from_jsonl(
    path: str | os.PathLike, tokenizer: Any, *, max_len: int, system_prompt: str | None = None
) -> list[SFTRow]:
    """Every conversation of a chat JSONL file as rows (see :func:`render_conversation`); a row longer
    than ``max_len`` tokens (``max_len + 1`` with the first, which is never a target) is an error."""
    rows = []
    for n, msgs, tools in read_chat_jsonl(path):
        where = f"{path}:{n}"
        try:
            rendered = render_conversation(tokenizer, msgs, tools, system_prompt=system_prompt)
        except SFTDataError:
            raise
        except Exception as e:  # a template that refuses this conversation: name the line
            raise _fail(
                where,
                expected="a conversation the model's chat template renders",
                received=f"{type(e).__name__}: {e}",
                fix="check the roles and order of its messages",
            ) from e
        for ids, mask in rendered:
            if len(ids) - 1 > max_len:
                raise _too_long(where, len(ids), max_len)
            rows.append(SFTRow(np.asarray(ids, np.int32), np.asarray(mask, bool), source=where))
    return rows


def rows_from_run(
    run_dir: str | os.PathLike, min_reward: float, *, max_len: int | None = None
) -> list[SFTRow]:
    """The logged rows of ``run_dir/trajectories.jsonl`` whose reward is >= ``min_reward``, token-exact:
    ``token_ids`` as logged, mask True on the ``sampled_spans``."""
    p = pathlib.Path(run_dir) / "trajectories.jsonl"
    if not p.is_file():
        raise _fail(
            f"--from-run {str(run_dir)!r}",
            expected="a run directory with trajectories.jsonl",
            received="no such file",
            fix="pass the --run-dir of a `gymllm train` run that logged "
            "trajectories (run.log_trajectories, on by default)",
        )
    rows, seen = [], 0
    for _, where, rec in _json_lines(p, fix="truncate the file after its last complete line"):
        if not isinstance(rec, dict) or "token_ids" not in rec or "sampled_spans" not in rec:
            got = sorted(rec) if isinstance(rec, dict) else type(rec).__name__
            raise _fail(
                where,
                expected="a trajectory record with token_ids and sampled_spans",
                received=got,
                fix="train the run again with this gymllm (older runs did not log token "
                "ids), or convert its conversations to chat JSONL",
            )
        seen += 1
        reward = float(rec.get("reward", float("nan")))
        if not reward >= min_reward:
            continue
        ids = np.asarray(rec["token_ids"], np.int32)
        mask = np.zeros(len(ids), bool)
        for a, b in rec["sampled_spans"]:
            if not 0 <= a <= b <= len(ids):
                raise _fail(
                    where,
                    expected=f"spans inside the {len(ids)} token ids",
                    received=[a, b],
                    fix="the record is corrupt: drop this line",
                )
            mask[a:b] = True
        if max_len is not None and len(ids) - 1 > max_len:
            raise _too_long(where, len(ids), max_len)
        if mask.any():
            rows.append(SFTRow(ids, mask, source=where, reward=reward))
    if not rows:
        raise _fail(
            f"--from-run {str(run_dir)!r}",
            expected=f"at least one trajectory with reward >= {min_reward}",
            received=f"none of {seen} records",
            fix="lower --min-reward or train the run longer",
        )
    return rows
