"""A plain agent program written with the `openai` client, trained through gymllm's training proxy.

The agent knows nothing about gymllm's internals: it talks OpenAI chat (tool calls included) to a
server, runs its own calculator tool, and reports each episode's reward. The task and its verifier
come from the suite (``gymllm/Arithmetic-v0``: the reset gives the problem, ``step(answer)`` scores
it). Against ``gymllm serve`` in training mode every episode is a session (``X-Session-Id``), the
``group_size`` episodes of one problem share a group (``X-Group-Id``), and the reward closes the
session, so the server turns the episodes into GRPO groups of exactly the sampled tokens.

    gymllm serve --model.name tiny-qwen3 --training --groups-out groups.jsonl --group-size 4 &
    python examples/openai_agent.py --base-url http://127.0.0.1:8000/v1 --problems 4 --group-size 4

``--task gymllm/TinyRepeat-v0 --env-kwargs '{"num_letters": 2}' --no-tools`` plays the tiny task (no
system prompt, no tools: a random tiny model can learn it); ``--problems 0`` plays until stopped and
``--concurrency N`` runs N episodes at once (threads), as ``gymllm train`` with ``rollout.mode =
"proxy"`` runs it (``gymllm train proxy_tiny``).

In a trainer the same server runs in process over the training policy and the learner consumes
``gymllm.rollout.proxy_source.ProxyGroupSource`` as it consumes the orchestrator's groups.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import json
import threading
import uuid

import httpx
import openai

import gymllm
from gymllm.tools.calculator import calculator

SYSTEM = (
    "You are a careful math assistant. Use the calculator tool when it helps. "
    "Give the final answer as an integer inside \\boxed{}."
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression exactly.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]


def run_tool(call) -> str:
    """The agent's own tool runner: the calculator, or an error message the model can read."""
    try:
        args = json.loads(call.function.arguments or "{}")
        if call.function.name != "calculator":
            return f"error: unknown tool {call.function.name!r}"
        return calculator(str(args.get("expression", "")))
    except Exception as exc:  # a bad call is the model's mistake: tell it, keep the episode going
        return f"error: {exc}"


def run_episode(
    client: openai.OpenAI,
    base_url: str,
    *,
    model: str,
    seed: int,
    group_id: str,
    max_turns: int = 4,
    max_tokens: int = 48,
    temperature: float = 1.0,
    task: str = "gymllm/Arithmetic-v0",
    env_kwargs: dict | None = None,
    tools: bool = True,
    system: str | None = SYSTEM,
    report=None,
) -> dict:
    """One episode: problem ``seed`` of ``task``, up to ``max_turns`` model calls, then the reward
    (``report``, if given, is called with ``{"session", "group_id", "reward"}`` just before it is posted)."""
    env = gymllm.make(task, **(env_kwargs or {}))
    try:
        problem, info = env.reset(seed=seed)
        session = f"{group_id}-{uuid.uuid4().hex[:8]}"
        headers = {
            "X-Session-Id": session,
            "X-Group-Id": group_id,
            "X-Task-Id": str(info.get("task_id", seed)),
        }
        messages: list[dict] = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": problem}
        ]
        answer, tool_calls = "", 0
        extra = {"tools": TOOLS} if tools else {}
        for _ in range(max_turns):
            r = client.chat.completions.create(
                model=model,
                messages=messages,
                max_tokens=max_tokens,
                temperature=temperature,
                extra_headers=headers,
                **extra,
            )
            message = r.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                answer = message.content or ""
                break
            for call in message.tool_calls:
                tool_calls += 1
                messages.append(
                    {"role": "tool", "tool_call_id": call.id, "content": run_tool(call)}
                )
        _, reward, *_ = env.step(answer)
    finally:
        env.close()
    if report is not None:
        report(
            {"event": "reward", "session": session, "group_id": group_id, "reward": float(reward)}
        )
    done = httpx.post(
        f"{base_url.rstrip('/')}/sessions/{session}/reward",
        json={"reward": float(reward)},
        headers={"Authorization": f"Bearer {client.api_key}"},
        timeout=60,
    )
    done.raise_for_status()
    return {"session": session, "reward": float(reward), "tool_calls": tool_calls, **done.json()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--model", default="tiny-qwen3")
    parser.add_argument("--api-key", default="unused")
    parser.add_argument("--problems", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--task", default="gymllm/Arithmetic-v0")
    parser.add_argument(
        "--env-kwargs", default="{}", help="JSON of the task's constructor arguments"
    )
    parser.add_argument("--tools", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--system",
        default=None,
        help="system prompt (default: the math one with --tools, none without)",
    )
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--concurrency", type=int, default=1, help="episodes at once (threads)")
    args = parser.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=2)
    system = args.system if args.system is not None else (SYSTEM if args.tools else None)
    kw = dict(
        model=args.model,
        task=args.task,
        env_kwargs=json.loads(args.env_kwargs),
        tools=args.tools,
        system=system,
        max_tokens=args.max_tokens,
        max_turns=args.max_turns,
        temperature=args.temperature,
    )
    problems = (
        itertools.count(args.seed)
        if args.problems == 0
        else range(args.seed, args.seed + args.problems)
    )
    jobs = ((k, i) for k in problems for i in range(args.group_size))
    rewards, lock = [], threading.Lock()

    def say(record: dict) -> None:  # one whole line at a time from the episode threads
        with lock:
            print(json.dumps(record), flush=True)

    kw["report"] = say
    with concurrent.futures.ThreadPoolExecutor(max(1, args.concurrency)) as pool:
        pending: set = set()
        for k, _ in jobs:  # at most `concurrency` episodes in flight, problems in order
            pending.add(
                pool.submit(run_episode, client, args.base_url, seed=k, group_id=f"p{k}", **kw)
            )
            if len(pending) >= max(1, args.concurrency):
                finished, pending = concurrent.futures.wait(
                    pending, return_when=concurrent.futures.FIRST_COMPLETED
                )
                for f in finished:
                    rewards.append(f.result()["reward"])
                    say(f.result())
        for f in concurrent.futures.as_completed(pending):
            rewards.append(f.result()["reward"])
            say(f.result())
    print(f"mean reward {sum(rewards) / max(len(rewards), 1):.3f} over {len(rewards)} episodes")


if __name__ == "__main__":
    main()
