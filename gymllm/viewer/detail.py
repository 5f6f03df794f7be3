"""One trajectory, turn by turn and token by token, for the viewer's trajectory page.

:func:`trajectory_detail` reads one row of a :class:`~gymllm.viewer.index.LogIndex` by byte range and
returns the turns (observation, action, tool calls and results, reward) and the per-token arrays the
page colours: ``sampled`` (the loss mask), ``logprob``, ``version`` and ``advantage``; an array is
``None`` when the log does not hold it, with a note saying why.

* A ``gymllm.trajectory/1`` log (:class:`~gymllm.wrappers.TrajectoryLogger`): the episode comes back
  through :func:`~gymllm.trajectories.reader.episodes_from_records`, its token arrays through
  :func:`~gymllm.trajectories.reader.read_tokens` (token ids, loss mask, behaviour logprobs,
  policy versions); an advantage is shown when the writer attached one to a step with
  ``annotate(advantage=...)``.
* A training run's ``trajectories.jsonl``: token ids and the sampled spans are per token; the run
  logs the *set* of policy versions of a trajectory, so versions are per token only when the set has
  one member (or the record carries ``token_versions``); logprobs only when the record carries
  ``logprobs``. The advantage is recomputed from the rewards of the trajectory's group with the
  run's own estimator (``config.json`` ``loss.advantage``, :data:`gymllm.algos.advantages.ESTIMATORS`),
  the value GRPO broadcasts to every sampled token, unless the record carries ``advantage``.

Token text comes from the run's tokenizer (``config.json`` ``model``: a ``tiny-<family>`` model's
built-in tokenizer, or a local model directory's ``tokenizer.json``); without one the page shows ids.
"""

from __future__ import annotations

import inspect
import json
import pathlib
from typing import Any

import numpy as np

from gymllm.viewer.index import LogIndex
from gymllm.viewer.runs import ViewedRun
from gymllm.trajectories.reader import episodes_from_records, read_tokens

__all__ = ["trajectory_detail", "run_tokenizer", "token_texts"]


def run_tokenizer(run: ViewedRun) -> tuple[Any, str | None]:
    """The run's tokenizer bundle (cached on the run) and, when there is none, why."""
    if "bundle" in run.tokenizer_cache:
        return run.tokenizer_cache["bundle"], run.tokenizer_cache["why"]
    conf, _ = run.config()
    model = (conf or {}).get("model") or {}
    name = str(model.get("name") or "")
    bundle, why = None, None
    try:
        if name.startswith("tiny-"):
            from gymllm.models.tiny import tiny_tokenizer

            bundle = tiny_tokenizer(int(model.get("vocab_size") or 512))
        elif name and (pathlib.Path(name) / "tokenizer.json").is_file():
            from gymllm.models.tokenizer import TokenizerBundle

            bundle = TokenizerBundle.from_dir(name)
        else:
            why = (
                f"token text: the run's model {name!r} has no local tokenizer.json; tokens are shown as ids"
                if name
                else "token text: no config.json model to take a tokenizer from; tokens are shown as ids"
            )
    except (
        ImportError,
        OSError,
        ValueError,
    ) as e:  # a broken or missing tokenizer: show ids, say why
        why = f"token text: the tokenizer of {name!r} could not be loaded ({e}); tokens are shown as ids"
    run.tokenizer_cache.update(bundle=bundle, why=why)
    return bundle, why


def token_texts(bundle: Any, ids: list[int]) -> list[str]:
    """Each token's own text (special tokens kept), or ``#<id>`` without a tokenizer."""
    if bundle is None or not ids:
        return [f"#{i}" for i in ids]
    return list(bundle.tokenizer.decode_batch([[int(i)] for i in ids], skip_special_tokens=False))


def _decode(bundle: Any, ids: list[int]) -> str:
    if bundle is None:
        return " ".join(f"#{i}" for i in ids)
    return bundle.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)


def _text(x: Any) -> str:
    if isinstance(x, str):
        return x
    if isinstance(x, list) and all(isinstance(m, dict) and "role" in m for m in x):
        return "\n".join(f"[{m['role']}] {m.get('content', '')}" for m in x)
    return json.dumps(x, ensure_ascii=False, indent=1, default=repr)


def _advantage_for(run: ViewedRun, ix: LogIndex, row: dict[str, Any]) -> tuple[float | None, str]:
    """The trajectory's advantage recomputed from its group's logged rewards with the run's estimator."""
    conf, _ = run.config()
    adv_conf = ((conf or {}).get("loss") or {}).get("advantage") or {}
    name = adv_conf.get("estimator", "grpo")
    if name == "batch_std":
        return None, "advantage: batch_std normalises over the whole step; not recomputed per group"
    i = ix.by_id.get(row["id"], 0)
    window = ix.rows[max(0, i - 512) : i + 512]
    members = [
        r
        for r in window
        if r.get("group") == row.get("group")
        and r.get("step") == row.get("step")
        and r.get("reward") is not None
    ]
    if len(members) < 2:
        return None, "advantage: the group's other members are not in the log"
    from gymllm.algos.advantages import ESTIMATORS

    fn = ESTIMATORS[name]
    accepted = inspect.signature(fn).parameters
    kwargs = {k: v for k, v in adv_conf.items() if k in accepted and k != "rewards"}
    rewards = np.array([[float(r["reward"]) for r in members]], np.float32)
    adv = np.asarray(fn(rewards, **kwargs))[0]
    k = next(j for j, r in enumerate(members) if r["id"] == row["id"])
    return float(adv[k]), (
        f"advantage: recomputed from the {len(members)} logged rewards of group "
        f"{row.get('group')} with loss.advantage.estimator={name!r} (reward shaping not applied)"
    )


def _train_detail(
    run: ViewedRun, ix: LogIndex, row: dict[str, Any], rec: dict[str, Any]
) -> dict[str, Any]:
    bundle, why = run_tokenizer(run)
    notes = [why] if why else []
    ids = [int(i) for i in rec.get("token_ids") or []]
    n = len(ids)
    sampled = [0] * n
    spans = [(int(a), int(b)) for a, b in rec.get("sampled_spans") or []]
    for a, b in spans:
        for t in range(max(0, a), min(n, b)):
            sampled[t] = 1
    versions = None
    if isinstance(rec.get("token_versions"), list) and len(rec["token_versions"]) == n:
        versions = [
            int(v) if s and int(v) >= 0 else None for v, s in zip(rec["token_versions"], sampled)
        ]
    elif len(rec.get("versions") or []) == 1:
        versions = [int(rec["versions"][0]) if s else None for s in sampled]
    else:
        notes.append(
            f"version: this log keeps the set of policy versions per trajectory "
            f"({rec.get('versions')}), not one per token"
        )
    logprob = None
    if isinstance(rec.get("logprobs"), list) and len(rec["logprobs"]) == n:
        logprob = [float(v) if s else None for v, s in zip(rec["logprobs"], sampled)]
    else:
        notes.append(
            "logprob: this run's trajectories.jsonl has no per-token logprobs (written before they were recorded)"
        )
    if rec.get("advantage") is not None:
        adv, note = float(rec["advantage"]), "advantage: as logged"
    else:
        adv, note = _advantage_for(run, ix, row)
    notes.append(note)
    advantage = None if adv is None else [adv if s else None for s in sampled]
    turns, prev = [], 0
    for a, b in spans:
        if a > prev:
            turns.append({"kind": "observation", "text": _decode(bundle, ids[prev:a])})
        turns.append({"kind": "action", "text": _decode(bundle, ids[a:b]), "tokens": [a, b]})
        prev = b
    if prev < n:
        turns.append({"kind": "observation", "text": _decode(bundle, ids[prev:])})
    turns.append(
        {"kind": "reward", "reward": rec.get("reward"), "finish_reason": rec.get("finish_reason")}
    )
    meta = {
        k: rec.get(k)
        for k in (
            "step",
            "group_id",
            "task_id",
            "reward",
            "finish_reason",
            "num_tokens",
            "num_sampled",
            "versions",
        )
    }
    return {
        "turns": turns,
        "meta": meta,
        "response": rec.get("response"),
        "tokens": {
            "ids": ids,
            "text": token_texts(bundle, ids),
            "sampled": sampled,
            "logprob": logprob,
            "version": versions,
            "advantage": advantage,
        },
        "notes": notes,
    }


def _episode_detail(run: ViewedRun, ix: LogIndex, records: list[dict[str, Any]]) -> dict[str, Any]:
    eps = episodes_from_records(records, source=str(ix.path))
    if not eps:
        raise ValueError(f"{ix.path.name}: the episode's reset record is missing")
    ep = eps[0]
    bundle, why = run_tokenizer(run)
    notes = [why] if why else []
    turns: list[dict[str, Any]] = [{"kind": "observation", "text": _text(ep.observation)}]
    adv_by_step = {
        int(n.get("step", 0)): float(n["advantage"])
        for n in ep.notes
        if n.get("advantage") is not None
    }
    for s in ep.steps:
        turns.append({"kind": "action", "text": _text(s.get("action")), "step": s.get("step")})
        for call in s.get("tool_calls") or []:
            turns.append({"kind": "tool", "text": _text(call)})
        info = s.get("info") if isinstance(s.get("info"), dict) else {}
        turns.append(
            {"kind": "observation", "text": _text(s.get("observation")), "step": s.get("step")}
        )
        turns.append(
            {
                "kind": "reward",
                "reward": s.get("reward"),
                "step": s.get("step"),
                "terminated": s.get("terminated"),
                "truncated": s.get("truncated"),
                "error": info.get("error"),
            }
        )
    ids: list[int] = []
    sampled: list[int] = []
    logprob: list[float | None] = []
    version: list[int | None] = []
    advantage: list[float | None] = []
    for t in ep.tokens:
        arrays = read_tokens(ix.path, t)
        m = np.asarray(arrays.get("loss_mask", np.ones(len(arrays["token_ids"]))), bool)
        ids += [int(i) for i in arrays["token_ids"]]
        sampled += [int(x) for x in m]
        logprob += [
            float(v) if k else None for v, k in zip(arrays.get("logprobs", np.zeros(len(m))), m)
        ]
        version += [
            int(v) if k and int(v) >= 0 else None
            for v, k in zip(arrays.get("versions", -np.ones(len(m))), m)
        ]
        a = adv_by_step.get(int(t.get("step", 0)))
        advantage += [a if k and a is not None else None for k in m]
    if not ep.tokens:
        notes.append(
            "tokens: this episode has no token arrays (log them with TrajectoryLogger.record_tokens)"
        )
    if not adv_by_step:
        notes.append(
            "advantage: none attached to this episode's steps (TrajectoryLogger.annotate(advantage=...))"
        )
    meta = {
        "episode": ep.episode,
        "index": ep.index,
        "env_id": ep.env_id,
        "seed": ep.seed,
        "steps": len(ep.steps),
        "return": ep.episode_return,
        "complete": ep.complete,
        "aborted": ep.aborted,
        "info": ep.info,
    }
    any_adv = any(a is not None for a in advantage)
    return {
        "turns": turns,
        "meta": meta,
        "response": None,
        "notes": notes,
        "tokens": {
            "ids": ids,
            "text": token_texts(bundle, ids),
            "sampled": sampled,
            "logprob": logprob if ids else None,
            "version": version if any(v is not None for v in version) else None,
            "advantage": advantage if any_adv else None,
        },
    }


def trajectory_detail(run: ViewedRun, trajectory_id: str) -> dict[str, Any]:
    """The trajectory page's data for ``trajectory_id`` in ``run``.

    Raises:
        KeyError: no log of the run holds that id.
        ValueError: its records do not parse (a malformed or half-written log).
    """
    found = run.find(trajectory_id)
    if found is None:
        raise KeyError(
            f"trajectory {trajectory_id!r}: expected an id from the run's trajectory table, but no log of "
            f"run {run.name!r} holds it. Fix: pick one from the Trajectories tab"
        )
    ix, row = found
    records = ix.read_records(row)
    body = (
        _train_detail(run, ix, row, records[0])
        if ix.format == "train"
        else _episode_detail(run, ix, records)
    )
    public = {k: v for k, v in row.items() if k != "ranges"}
    return {
        "run": run.name,
        "id": trajectory_id,
        "file": ix.path.name,
        "format": ix.format,
        "row": public,
        **body,
    }
