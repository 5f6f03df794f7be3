"""A plain agent program written with the `openai` client, trained through gymllm's training proxy.

The agent knows nothing about gymllm's internals: it talks OpenAI chat (tool calls included) to a
server, runs its own calculator tool, and reports each episode's reward. The task and its verifier
come from the suite (``gymllm/Arithmetic-v0``: the reset gives the problem, ``step(answer)`` scores
it). Against ``gymllm serve`` in training mode every episode is a session (``X-Session-Id``), the
``group_size`` episodes of one problem share a group (``X-Group-Id``), and the reward closes the
session, so the server turns the episodes into GRPO groups of exactly the sampled tokens.

    gymllm serve --model tiny-qwen3 --training --groups-out groups.jsonl --group-size 4 &
    python examples/openai_agent.py --base-url http://127.0.0.1:8000/v1 --problems 4 --group-size 4

In a trainer the same server runs in process over the training policy and the learner consumes
``gymllm.rollout.proxy_source.ProxyGroupSource`` as it consumes the orchestrator's groups.
"""

from __future__ import annotations

import argparse
import json
import uuid

import httpx
import openai

import gymllm
from gymllm.tools.calculator import calculator

SYSTEM = ("You are a careful math assistant. Use the calculator tool when it helps. "
          "Give the final answer as an integer inside \\boxed{}.")
TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression exactly.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]


def run_tool(call) -> str:
    """The agent's own tool runner: the calculator, or an error message the model can read."""
    try:
        args = json.loads(call.function.arguments or "{}")
        if call.function.name != "calculator":
            return f"error: unknown tool {call.function.name!r}"
        return calculator(str(args.get("expression", "")))
    except Exception as exc:  # a bad call is the model's mistake: tell it, keep the episode going
        return f"error: {exc}"


def run_episode(client: openai.OpenAI, base_url: str, *, model: str, seed: int, group_id: str,
                max_turns: int = 4, max_tokens: int = 48, temperature: float = 1.0) -> dict:
    """One episode: problem ``seed`` of the task, up to ``max_turns`` model calls, then the reward."""
    env = gymllm.make("gymllm/Arithmetic-v0")
    try:
        problem, info = env.reset(seed=seed)
        session = f"{group_id}-{uuid.uuid4().hex[:8]}"
        headers = {"X-Session-Id": session, "X-Group-Id": group_id, "X-Task-Id": str(info.get("task_id", seed))}
        messages: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": problem}]
        answer, tool_calls = "", 0
        for _ in range(max_turns):
            r = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=max_tokens,
                                               temperature=temperature, extra_headers=headers)
            message = r.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                answer = message.content or ""
                break
            for call in message.tool_calls:
                tool_calls += 1
                messages.append({"role": "tool", "tool_call_id": call.id, "content": run_tool(call)})
        _, reward, *_ = env.step(answer)
    finally:
        env.close()
    done = httpx.post(f"{base_url.rstrip('/')}/sessions/{session}/reward", json={"reward": float(reward)},
                      headers={"Authorization": f"Bearer {client.api_key}"}, timeout=60)
    done.raise_for_status()
    return {"session": session, "reward": float(reward), "tool_calls": tool_calls, **done.json()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--model", default="tiny-qwen3")
    parser.add_argument("--api-key", default="unused")
    parser.add_argument("--problems", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=2)
    rewards = []
    for k in range(args.problems):
        for _ in range(args.group_size):
            ep = run_episode(client, args.base_url, model=args.model, seed=args.seed + k, group_id=f"p{args.seed + k}")
            rewards.append(ep["reward"])
            print(json.dumps(ep), flush=True)
    print(f"mean reward {sum(rewards) / max(len(rewards), 1):.3f} over {len(rewards)} episodes")


if __name__ == "__main__":
    main()
