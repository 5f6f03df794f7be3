"""Demonstrations: solved episodes of an env, as chat JSONL for supervised fine-tuning (``gymllm sft``).

    records = demonstrations("gymllm/TicTacToe-v0", n=200)                  # wins and draws, searched
    records = demonstrations("gymllm/CalcMath-v0", n=500, env_kwargs={"digits": 1, "simple": True})
    write_demos("calc.jsonl", records)                                     # then: gymllm sft calc.jsonl

Where an env can solve its own task (:data:`SOLVERS`; the solvers are in
:mod:`gymllm.envs.demos_solvers`): tic-tac-toe by minimax, connect four by depth-limited alpha-beta
search, FrozenLake by a shortest path (non-slippery maps only; a slippery one is refused with the
fix), arithmetic by computing the answer, calculator math (ArithmeticTool, CalcMath) with the
tool call in the env's tool-call format, the tool's reply, then the final answer, and Kuhn poker
(TextArena) by its closed-form Nash equilibrium (every hand kept: chance decides the result).

``policy="uniform"`` plays :func:`gymllm.envs.demos_solvers.uniform_legal_player` instead of the
solver, on any game seat (an env whose info holds an ``action_mask``): a uniformly random legal move
at every decision, every episode kept. Those records teach the move syntax and the legal moves, not a
strategy (a self-play run's warm start whose strategy the run must find itself). ``policy="first"``
(:func:`gymllm.envs.demos_solvers.first_legal_player`) plays the first legal move in the game's move
order every time: the syntax and one fixed, state-blind strategy (Kuhn poker: check, else call).

Every episode is played through the real env: ``env.reset(seed=s)``, then ``env.step(action)`` with
each demonstrated action text, and the env's reward decides what is kept: games keep wins and draws
against the scripted opponent (reward >= 0: a draw is the best play against a perfect opponent),
every other env keeps solved episodes (reward >= 1). So fewer than ``n`` records may come back (the
count is what the env confirmed).

Messages are what a rollout agent (``gymllm.rollout.agents``) sees, built by :func:`initial_messages`
and :func:`observation_messages` (the same rules as ``Agent.initial_messages`` /
``Agent.observation_messages``; tests compare them): the reset observation (a ``str`` = one user
message, or the env's message list), the system prompt first when given and the env has none, then
for every turn the assistant's exact action text and the observation that follows, except after the
last step (as in a rollout: the terminal observation is never shown to the model).

Record (one JSON object per line, the contract ``gymllm sft`` reads)::

    {"messages": [{"role": ..., "content": ...}, ...], "tools": [...JSON schemas...],
     "env_id": "gymllm/CalcMath-v0", "seed": 12, "reward": 1.0}

``tools`` only when the env offers tools (``info["tools"]`` at reset) and ``agent="tool"`` (what
``ToolAgent`` gives the chat template); ``agent="model"`` leaves it out, as ``ModelAgent`` does
(``env.agent = "model"`` in a run: the env still runs the calls it parses from the text).

Seeds: episode ``i`` uses seed ``seed + i`` (``seed .. seed + n - 1``). Held-out evaluation uses
seeds from :data:`HELD_OUT_SEED_BASE` (1,000,000) up, so ``seed + n`` above it is refused.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
from typing import Any, Callable

from gymllm.atomic import atomic_write
from gymllm.envs import demos_solvers as solvers
from gymllm.errors import ConfigError, explain
from gymllm.validation import is_int, require, require_one_of
from gymllm.types import as_messages
from gymllm.utils.seeds import HELD_OUT_SEED_BASE

__all__ = [
    "SOLVERS",
    "Solver",
    "DemoConfig",
    "demonstrations",
    "play_demo",
    "write_demos",
    "read_demos",
    "initial_messages",
    "observation_messages",
    "supported_ids",
    "solver_for",
    "full_id",
    "POLICIES",
    "UNIFORM",
]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Solver:
    """How one env is solved. make_policy: ``(env, reset observation, reset info) -> policy`` with
    ``policy(observation, info) -> action text``; min_reward: an episode is kept when its summed
    reward is at least this; max_steps: a guard against a policy that never ends; kept: in words."""

    make_policy: Callable[[Any, Any, dict], solvers.Policy]
    min_reward: float
    kept: str
    max_steps: int = 200

    def __call__(self, env: Any, observation: Any, info: dict) -> solvers.Policy:
        return self.make_policy(env, observation, info)


_GAME = dict(min_reward=0.0, kept="wins and draws against the scripted opponent")
_SOLVED = dict(min_reward=1.0, kept="solved episodes")

#: env id -> its solver
SOLVERS: dict[str, Solver] = {
    "gymllm/TicTacToe-v0": Solver(make_policy=solvers.tictactoe_solver, **_GAME),
    "gymllm/ConnectFour-v0": Solver(make_policy=solvers.connect_four_solver, **_GAME),
    "gymllm/FrozenLake-v0": Solver(make_policy=solvers.frozenlake_solver, **_SOLVED),
    "gymllm/FrozenLake8x8-v0": Solver(make_policy=solvers.frozenlake_solver, **_SOLVED),
    "gymllm/Arithmetic-v0": Solver(make_policy=solvers.arithmetic_solver, **_SOLVED),
    "gymllm/ArithmeticTool-v0": Solver(make_policy=solvers.calculator_solver, **_SOLVED),
    "gymllm/CalcMath-v0": Solver(make_policy=solvers.calculator_solver, **_SOLVED),
    # chance decides a hand, so every hand is kept: filtering on the result would skew the mixed strategy
    "gymllm/ta-KuhnPoker-v0": Solver(
        make_policy=solvers.kuhn_poker_solver,
        min_reward=-math.inf,
        kept="every hand (the equilibrium strategy; keeping only won hands would skew it)",
    ),
}


#: policy="uniform": any game seat, every episode kept (a filter on the result would teach a strategy)
UNIFORM = Solver(
    make_policy=solvers.uniform_legal_player,
    min_reward=-math.inf,
    kept="every episode (uniformly random legal moves: the move syntax, not a strategy)",
)

#: policy="first": any game seat, the first legal move every time, every episode kept (a state-blind strategy)
FIRST = Solver(
    make_policy=solvers.first_legal_player,
    min_reward=-math.inf,
    kept="every episode (the first legal move every time: the move syntax and a state-blind strategy)",
)

#: the ``policy`` names of :func:`demonstrations`
POLICIES = ("solver", "uniform", "first")


def solver_for(env_id: str, policy: str = "solver") -> Solver:
    """The :class:`Solver` that plays ``env_id``'s demonstrations under ``policy``."""
    return {"uniform": UNIFORM, "first": FIRST}.get(policy) or SOLVERS[full_id(env_id)]


def supported_ids() -> list[str]:
    return sorted(SOLVERS)


def full_id(env_id: str) -> str:
    """``env_id`` as the demos name it: "TicTacToe-v0" is "gymllm/TicTacToe-v0"; a namespaced or
    ``module:factory`` id is kept."""
    return env_id if "/" in env_id or ":" in env_id else f"gymllm/{env_id}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class DemoConfig:
    """env_id: a :data:`SOLVERS` id ("TicTacToe-v0" means "gymllm/TicTacToe-v0"; with
    ``policy="uniform"`` any game seat's id); n: episodes to play (seeds ``seed .. seed + n - 1``, all
    below :data:`HELD_OUT_SEED_BASE`); env_kwargs: passed to ``gymllm.make``; system_prompt: the
    rollout's system prompt ("" = none); agent: "tool" (records carry the env's tool schemas) or
    "model" (no ``tools``); policy: "solver" (the env's solver), "uniform" (uniformly random legal
    moves, every episode kept) or "first" (the first legal move every time, every episode kept)."""

    env_id: str
    n: int
    seed: int = 0
    env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    system_prompt: str = ""
    agent: str = "tool"
    policy: str = "solver"

    def __post_init__(self) -> None:
        require_one_of(
            self.policy,
            POLICIES,
            "demonstrations(policy)",
            fix="policy='solver' plays the env's solver, 'uniform' random legal moves, 'first' the first legal move",
        )
        require(
            isinstance(self.env_id, str)
            and (self.policy != "solver" or full_id(self.env_id) in SOLVERS),
            "demonstrations(env_id)",
            expected=f"an env with a solver: {', '.join(supported_ids())}",
            received=self.env_id,
            fix="pick one of those ids (`gymllm envs` lists every env), or policy='uniform' for a game "
            "without a solver",
        )
        object.__setattr__(self, "env_id", full_id(self.env_id))
        for name, lo in (("n", 1), ("seed", 0)):
            v = getattr(self, name)
            require(
                is_int(v) and v >= lo,
                f"demonstrations({name})",
                expected=f"an int >= {lo}",
                received=v,
                fix=f"pass {name}={lo}" if name == "n" else "pass seed=0",
            )
        require(
            self.seed + self.n <= HELD_OUT_SEED_BASE,
            "demonstrations(seed, n)",
            expected=f"seed + n <= {HELD_OUT_SEED_BASE} (demos use seeds seed .. seed + n - 1; "
            f"held-out evaluation uses seeds from {HELD_OUT_SEED_BASE} up)",
            received=f"seed={self.seed}, n={self.n}",
            fix=f"lower seed or n (e.g. seed=0, n={min(self.n, HELD_OUT_SEED_BASE)})",
        )
        for name, kind, expected, fix in (
            (
                "env_kwargs",
                dict,
                "a dict of env constructor arguments",
                "e.g. env_kwargs={'digits': 1}",
            ),
            ("system_prompt", str, "a str", 'pass system_prompt="" for none'),
        ):
            v = getattr(self, name)
            require(
                isinstance(v, kind),
                f"demonstrations({name})",
                expected=expected,
                received=v,
                fix=fix,
            )
        require_one_of(
            self.agent,
            ("tool", "model"),
            "demonstrations(agent)",
            fix="agent='tool' writes the env's tool schemas, 'model' leaves them out",
        )


# ------------------------------------------------------------------------------------------ messages


def observation_messages(observation: Any) -> list[dict[str, Any]]:
    """The messages an observation adds to the conversation: a ``str`` is one user message, a list
    of message dicts is taken as is (copied). The rule of ``gymllm.rollout.agents.Agent``
    (:func:`gymllm.types.as_messages`)."""
    messages = as_messages(observation)
    if messages is not None:
        return messages
    raise ConfigError(
        explain(
            "demonstration observation",
            expected="a str (user message) or a list of message dicts",
            received=type(observation).__name__,
            fix="use an env with str or list[Message] observations",
        )
    )


def initial_messages(observation: Any, system_prompt: str = "") -> list[dict[str, Any]]:
    """The conversation's start: the reset observation's messages, after a system message holding
    ``system_prompt`` when it is non-empty and the env sent no system message of its own."""
    msgs = observation_messages(observation)
    if system_prompt and not (msgs and msgs[0].get("role") == "system"):
        msgs = [{"role": "system", "content": system_prompt}, *msgs]
    return msgs


# ------------------------------------------------------------------------------------------ episodes


def _jsonable(value: Any) -> Any:
    return json.loads(
        json.dumps(value, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))
    )


def play_demo(
    env: Any, solver: Solver, *, seed: int, system_prompt: str = "", with_tools: bool = True
) -> dict | None:
    """One episode of ``solver`` through ``env`` from ``reset(seed=seed)``: the record (without
    ``env_id``), or None when the solver found it unsolvable or it ended without ending (max_steps)."""
    obs, info = env.reset(seed=seed)
    messages = initial_messages(obs, system_prompt)
    tools = info.get("tools") if isinstance(info, dict) else None
    total = 0.0
    try:
        policy = solver(env, obs, info)
        for _ in range(solver.max_steps):
            action = policy(obs, info)
            messages.append({"role": "assistant", "content": action})
            obs, reward, terminated, truncated, info = env.step(action)
            total += float(reward)
            if terminated or truncated:
                break
            messages.extend(observation_messages(obs))
        else:
            return None
    except solvers.Unsolvable:
        return None
    record: dict[str, Any] = {"messages": _jsonable(messages)}
    if tools and with_tools:
        record["tools"] = _jsonable(list(tools))
    record.update(seed=int(seed), reward=total)
    return record


def demonstrations(
    env_id: str,
    *,
    n: int,
    seed: int = 0,
    env_kwargs: dict[str, Any] | None = None,
    system_prompt: str = "",
    agent: str = "tool",
    policy: str = "solver",
) -> list[dict]:
    """Solved episodes of ``env_id`` on seeds ``seed .. seed + n - 1`` (see the module doc): a list of
    records ``{"messages", "tools" (when offered), "env_id", "seed", "reward"}``, in seed order, only
    those the env's reward confirms (:attr:`Solver.min_reward`). ``policy="uniform"``: uniformly
    random legal moves of a game seat instead of the solver, every episode kept; ``"first"``: its first
    legal move every time, every episode kept."""
    from gymllm.registration import make

    cfg = DemoConfig(
        env_id=env_id,
        n=n,
        seed=seed,
        env_kwargs={} if env_kwargs is None else env_kwargs,
        system_prompt=system_prompt,
        agent=agent,
        policy=policy,
    )
    solver = solver_for(cfg.env_id, cfg.policy)
    env = make(cfg.env_id, **dict(cfg.env_kwargs))
    out = []
    try:
        for s in range(cfg.seed, cfg.seed + cfg.n):
            rec = play_demo(
                env, solver, seed=s, system_prompt=cfg.system_prompt, with_tools=cfg.agent == "tool"
            )
            if (
                rec is not None
                and math.isfinite(rec["reward"])
                and rec["reward"] >= solver.min_reward
            ):
                out.append(
                    {
                        "messages": rec["messages"],
                        **({"tools": rec["tools"]} if "tools" in rec else {}),
                        "env_id": cfg.env_id,
                        "seed": rec["seed"],
                        "reward": rec["reward"],
                    }
                )
    finally:
        env.close()
    return out


def write_demos(path: str | os.PathLike, records: list[dict]) -> pathlib.Path:
    """Write ``records`` as JSONL (one object per line, UTF-8), creating parent directories; returns the path."""
    for i, rec in enumerate(records):
        if (
            not isinstance(rec, dict)
            or not isinstance(rec.get("messages"), list)
            or not rec["messages"]
        ):
            raise ConfigError(
                explain(
                    f"write_demos(records[{i}])",
                    expected="a dict with a non-empty 'messages' list",
                    received=type(rec).__name__ if not isinstance(rec, dict) else sorted(rec),
                    fix="pass records from demonstrations()",
                )
            )
    p = pathlib.Path(path)
    with atomic_write(p) as f:
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    return p


def read_demos(path: str | os.PathLike) -> list[dict]:
    """The records of a demonstrations JSONL file (one JSON object per non-empty line)."""
    with pathlib.Path(path).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
