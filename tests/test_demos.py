"""Demonstrations (``gymllm.envs.demos``, ``gymllm demos``): every written episode replays through the
real env to its recorded reward, with the messages a real rollout agent builds; the game solvers never
lose (tic-tac-toe: against every opponent reply, exhaustively); FrozenLake paths are shortest (an
independent BFS over the Gymnasium env's own transition table); the calculator call parses back and
the ToolAgent executes it; the JSONL shape and the CLI; clear errors."""

from __future__ import annotations

import collections
import json

import pytest

import gymllm
from gymllm.cli.main import main
from gymllm.envs import demos_solvers as S
from gymllm.envs.demos import SOLVERS, demonstrations, initial_messages, read_demos, write_demos
from gymllm.utils.seeds import HELD_OUT_SEED_BASE
from gymllm.errors import ConfigError
from gymllm.models import tiny
from gymllm.rollout.agents import ModelAgent, ToolAgent
from gymllm.tools.parsers import parse_tool_calls

NO_SLIP = {"is_slippery": False}
CASES = [
    ("gymllm/TicTacToe-v0", {}, 12),
    ("gymllm/ConnectFour-v0", {}, 3),
    ("gymllm/FrozenLake-v0", NO_SLIP, 4),
    ("gymllm/FrozenLake8x8-v0", NO_SLIP, 4),
    ("gymllm/FrozenLake-v0", {**NO_SLIP, "desc": ["SFF", "FHF", "FFG"]}, 3),
    ("gymllm/Arithmetic-v0", {}, 6),
    ("gymllm/ArithmeticTool-v0", {"digits": 1}, 6),
    ("gymllm/CalcMath-v0", {}, 6),
    ("gymllm/CalcMath-v0", {"digits": 1, "simple": True}, 12),
]


def _tok():
    return tiny.tiny_tokenizer(512)


def replay(rec: dict, env_kwargs: dict, system_prompt: str = "") -> float:
    """Plays the record's assistant turns through a fresh env with a real rollout agent; asserts every
    message is the one the agent builds and that the episode ends exactly after the last turn."""
    agent = ToolAgent(_tok(), system_prompt=system_prompt or None)
    env = gymllm.make(rec["env_id"], **env_kwargs)
    obs, info = env.reset(seed=rec["seed"])
    msgs = rec["messages"]
    start = agent.initial_messages(obs, info)
    assert msgs[: len(start)] == json.loads(json.dumps(start, default=lambda o: o.tolist()))
    assert ("tools" in rec) == bool(agent.tools(info)) and rec.get("tools", None) in (
        None,
        agent.tools(info),
    )
    i, total, done = len(start), 0.0, False
    while i < len(msgs):
        assert not done and msgs[i]["role"] == "assistant"
        mask = info.get("action_mask")
        if mask is not None:  # board games: the move is one of the legal moves shown
            names = env.unwrapped.env.config.move_names
            assert mask[names.index(msgs[i]["content"])] == 1
            assert msgs[i]["content"] in str(msgs[i - 1]["content"]).split("Legal moves:")[1]
        obs, r, term, trunc, info = env.step(msgs[i]["content"])
        assert info.get("invalid_action", False) is False and not info.get("num_tool_errors", 0)
        total += r
        i += 1
        done = term or trunc
        if not done:
            delta = agent.observation_messages(obs)
            assert msgs[i : i + len(delta)] == delta
            i += len(delta)
    assert done
    env.close()
    return total


@pytest.mark.parametrize(
    "env_id,kwargs,n", CASES, ids=[f"{c[0].split('/')[1]}-{i}" for i, c in enumerate(CASES)]
)
def test_every_solver_replays_through_the_env_to_its_recorded_reward(env_id, kwargs, n):
    recs = demonstrations(env_id, n=n, seed=5, env_kwargs=kwargs)
    assert recs, "no episode solved"
    assert [r["seed"] for r in recs] == sorted(r["seed"] for r in recs) and all(
        5 <= r["seed"] < 5 + n for r in recs
    )
    for rec in recs:
        assert rec["env_id"] == env_id and rec["reward"] >= SOLVERS[env_id].min_reward
        assert replay(rec, kwargs) == pytest.approx(rec["reward"])
    if SOLVERS[env_id].min_reward >= 1.0:
        assert len(recs) == n  # these solvers solve every episode of these settings


def test_system_prompt_is_added_as_a_rollout_agent_adds_it():
    recs = demonstrations("TicTacToe-v0", n=2, system_prompt="Play well.")
    assert recs[0]["messages"][0] == {"role": "system", "content": "Play well."}
    assert replay(recs[0], {}, system_prompt="Play well.") == recs[0]["reward"]
    calc = demonstrations("CalcMath-v0", n=1, system_prompt="ignored: the env sends its own")
    assert (
        calc[0]["messages"][0]["role"] == "system"
        and "calculator" in calc[0]["messages"][0]["content"]
    )
    assert [m["role"] for m in calc[0]["messages"]].count("system") == 1
    agent = ModelAgent(_tok(), system_prompt="S")
    for obs in (
        "hi",
        [{"role": "user", "content": "x"}],
        [{"role": "system", "content": "own"}, {"role": "user", "content": "q"}],
    ):
        assert initial_messages(obs, "S") == agent.initial_messages(obs, {})


def test_tictactoe_never_loses_and_always_plays_legal_moves_against_the_scripted_opponent():
    recs = demonstrations("TicTacToe-v0", n=150, seed=1000)
    assert len(recs) == 150 and all(r["reward"] >= 0 for r in recs)  # no loss was dropped
    seats = collections.Counter(r["messages"][0]["content"].split("\n")[0] for r in recs)
    assert len(seats) == 2  # it played first and second
    assert sum(r["reward"] == 1.0 for r in recs) > 100  # a random opponent loses most games
    for rec in recs[:40]:
        assert replay(rec, {}) == rec["reward"]


def _ttt_winner(board):
    for a, b, c in S._TTT_LINES:
        if board[a] and board[a] == board[b] == board[c]:
            return board[a]
    return 0


def test_tictactoe_minimax_never_loses_against_any_opponent_reply():
    """Every game the solver can be drawn into, first or second, against every reply: no loss."""
    seen = [0]

    def solver_turn(board):  # the solver is 1, the opponent 2
        seen[0] += 1
        legal = [i for i in range(9) if board[i] == 0]
        move = S.tictactoe_best_move(board, legal)
        assert move in legal
        b = board[:move] + (1,) + board[move + 1 :]
        if _ttt_winner(b) == 1 or 0 not in b:
            return
        opponent_turn(b)

    def opponent_turn(board):
        for i in range(9):
            if board[i] == 0:
                b = board[:i] + (2,) + board[i + 1 :]
                assert _ttt_winner(b) != 2, f"lost: {b}"
                if 0 in b:
                    solver_turn(b)

    solver_turn((0,) * 9)
    opponent_turn((0,) * 9)
    assert seen[0] > 100


def test_connect_four_search_takes_wins_and_blocks_threats():
    def bits(cells):  # cells: (column, height) pairs
        return sum(1 << (c * 7 + h) for c, h in cells)

    me, opp = bits([(0, 0), (1, 0), (2, 0)]), bits([(0, 1), (1, 1), (6, 0)])
    assert S.connect_four_best_move(me, me | opp, list(range(7))) == 3  # complete the bottom row
    me, opp = bits([(6, 0), (6, 1), (5, 0)]), bits([(0, 0), (1, 0), (2, 0)])
    assert S.connect_four_best_move(me, me | opp, list(range(7))) == 3  # block the opponent's row
    me, opp = bits([(5, 0)]), bits([(3, 0), (3, 1), (3, 2)])
    assert S.connect_four_best_move(me, me | opp, list(range(7))) == 3  # block the column
    recs = demonstrations("ConnectFour-v0", n=6, seed=40)
    assert len(recs) == 6 and all(r["reward"] == 1.0 for r in recs)  # beats the random opponent


def _bfs_on_transitions(lake) -> int:
    """Independent shortest path: BFS over the Gymnasium env's own transition table ``P``."""
    start = 0
    dist, queue = {start: 0}, collections.deque([start])
    while queue:
        s = queue.popleft()
        for a in range(4):
            ((_, s2, reward, done),) = lake.P[s][a]
            if reward > 0:
                return dist[s] + 1
            if not done and s2 not in dist:
                dist[s2] = dist[s] + 1
                queue.append(s2)
    raise AssertionError("no path")


@pytest.mark.parametrize(
    "env_id,kwargs,known",
    [
        ("gymllm/FrozenLake-v0", NO_SLIP, 6),
        ("gymllm/FrozenLake8x8-v0", NO_SLIP, 14),
        ("gymllm/FrozenLake-v0", {**NO_SLIP, "desc": ["SFF", "FHF", "FFG"]}, 4),
    ],
)
def test_frozenlake_paths_are_shortest(env_id, kwargs, known):
    env = gymllm.make(env_id, **kwargs)
    shortest = _bfs_on_transitions(env.unwrapped.inner.unwrapped)
    env.close()
    assert shortest == known
    for rec in demonstrations(env_id, n=3, env_kwargs=kwargs):
        moves = [m["content"] for m in rec["messages"] if m["role"] == "assistant"]
        assert (
            len(moves) == shortest
            and set(moves) <= {"LEFT", "DOWN", "RIGHT", "UP"}
            and rec["reward"] == 1.0
        )


def test_slippery_frozenlake_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match="is_slippery"):
        demonstrations("FrozenLake-v0", n=1)


def test_an_unreachable_goal_is_left_out():
    assert demonstrations("FrozenLake-v0", n=2, env_kwargs={**NO_SLIP, "desc": ["SH", "HG"]}) == []


@pytest.mark.parametrize(
    "env_id,kwargs",
    [
        ("gymllm/ArithmeticTool-v0", {}),
        ("gymllm/CalcMath-v0", {}),
        ("gymllm/CalcMath-v0", {"simple": True, "digits": 2}),
    ],
)
def test_the_calculator_call_parses_back_and_the_tool_agent_executes_it(env_id, kwargs):
    t = _tok()
    for rec in demonstrations(env_id, n=4, seed=77, env_kwargs=kwargs):
        env = gymllm.make(env_id, **kwargs)
        obs, info = env.reset(seed=rec["seed"])
        roles = [m["role"] for m in rec["messages"]]
        assert roles == ["system", "user", "assistant", "tool", "assistant"]
        call_text = rec["messages"][2]["content"]
        (call,) = parse_tool_calls(call_text, "hermes")
        assert call.name == "calculator" and set(call.arguments) == {"expression"}
        from gymllm.tools.calculator import evaluate

        assert str(evaluate(call.arguments["expression"])) == info["answer"]
        agent = ToolAgent(t)  # parser "auto", as the SmolLM2 runs use it
        msg, action = agent.act(t.encode(call_text) + [t.eos_token_id], "stop")
        assert action == call_text and msg == rec["messages"][2]
        assert [(c.name, c.arguments) for c in agent.last_tool_calls] == [
            ("calculator", call.arguments)
        ]
        tool_obs, r, term, trunc, step_info = env.step(action)
        assert step_info["tool_turn"] and agent.observation_messages(tool_obs) == [
            rec["messages"][3]
        ]
        assert rec["messages"][3]["content"] == info["answer"]
        assert rec["messages"][4]["content"] == f"\\boxed{{{info['answer']}}}"
        env.close()


def test_the_call_follows_the_envs_tool_call_format():
    rec = demonstrations("ArithmeticTool-v0", n=1, env_kwargs={"parser": "llama3"})[0]
    text = rec["messages"][2]["content"]
    assert "<tool_call>" not in text and parse_tool_calls(text, "llama3")[0].name == "calculator"


def test_jsonl_shape_and_agent_model_leaves_tools_out(tmp_path):
    recs = demonstrations("CalcMath-v0", n=3, env_kwargs={"digits": 1, "simple": True})
    plain = demonstrations("Arithmetic-v0", n=2)
    bare = demonstrations(
        "CalcMath-v0", n=1, env_kwargs={"digits": 1, "simple": True}, agent="model"
    )
    path = write_demos(tmp_path / "sub" / "d.jsonl", recs + plain + bare)
    lines = path.read_text().splitlines()
    assert len(lines) == 6 and read_demos(path) == recs + plain + bare
    for line in lines:
        rec = json.loads(line)
        assert set(rec) - {"tools"} == {"messages", "env_id", "seed", "reward"}
        assert isinstance(rec["seed"], int) and isinstance(rec["reward"], float)
        assert all(
            set(m) >= {"role", "content"} and isinstance(m["content"], str) for m in rec["messages"]
        )
        assert rec["messages"][-1]["role"] == "assistant"
    assert all(r["tools"][0]["function"]["name"] == "calculator" for r in recs)
    assert all("tools" not in r for r in plain + bare)
    assert bare[0]["messages"] == recs[0]["messages"]
    with pytest.raises(ConfigError, match="messages"):
        write_demos(tmp_path / "x.jsonl", [{"env_id": "x"}])


def test_bad_ids_and_arguments_give_clear_errors():
    with pytest.raises(ConfigError, match="an env with a solver: gymllm/Arithmetic-v0.*TicTacToe"):
        demonstrations("gymllm/Echo-v0", n=1)
    with pytest.raises(ConfigError, match="held-out evaluation uses seeds from 1000000"):
        demonstrations("Arithmetic-v0", n=2, seed=HELD_OUT_SEED_BASE - 1)
    assert (
        len(demonstrations("Arithmetic-v0", n=1, seed=HELD_OUT_SEED_BASE - 1)) == 1
    )  # the last allowed seed
    for bad in (
        {"n": 0},
        {"n": 1, "seed": -1},
        {"n": True},
        {"n": 1, "agent": "robot"},
        {"n": 1, "env_kwargs": [1]},
    ):
        with pytest.raises(ConfigError, match="expected"):
            demonstrations("Arithmetic-v0", **bad)


def _replay(env, rec: dict, draw: bool = False) -> list[tuple[str, dict]]:
    """``rec``'s replies stepped through ``env`` from its seed: (reply, the info it answered) each; the
    episode must end with the recorded reward. ``draw``: first take the uniform player's draw of its own
    generator's seed from the env, as it did."""
    _, info = env.reset(seed=rec["seed"])
    if draw:
        env.unwrapped.np_random.integers(2**63 - 1)
    moves, total = [], 0.0
    for reply in (m["content"] for m in rec["messages"] if m["role"] == "assistant"):
        moves.append((reply, info))
        _, r, term, trunc, info = env.step(reply)
        total += r
    assert term or trunc
    assert total == rec["reward"]
    return moves


@pytest.mark.parametrize(
    "env_id, kwargs",
    [("gymllm/TicTacToe-v0", {}), ("gymllm/ta-KuhnPoker-v0", {"max_rounds": 1, "max_invalid": 2})],
)
def test_uniform_policy_plays_only_legal_moves_uniformly_and_keeps_every_episode(env_id, kwargs):
    """policy="uniform": each reply is a legal move by the env's own mask (replayed through a fresh
    env to the recorded reward), every episode is kept whatever its result, the moves
    spread over the legal ones (Kuhn: the opening [bet] within 35-65% of the openings; tic-tac-toe:
    more than four different first moves), and a seed fixes its episode."""
    n = 120 if "Kuhn" in env_id else 40
    recs = demonstrations(env_id, n=n, seed=7, env_kwargs=kwargs, policy="uniform")
    assert [r["seed"] for r in recs] == list(range(7, 7 + n))  # none left out
    assert min(r["reward"] for r in recs) < 0  # losses kept: no filter on the result
    env = gymllm.make(env_id, **kwargs)
    names = env.unwrapped.env.config.move_names
    first = collections.Counter()
    for rec in recs:
        for k, (reply, info) in enumerate(_replay(env, rec, draw=True)):
            legal = {names[i] for i, ok in enumerate(info["action_mask"]) if ok}
            assert reply in legal, (reply, legal)
            if k == 0 and (legal == {"[check]", "[bet]"} or "Kuhn" not in env_id):
                first[reply] += 1
    env.close()
    if "Kuhn" in env_id:
        assert set(first) == {"[check]", "[bet]"}
        assert 0.35 <= first["[bet]"] / sum(first.values()) <= 0.65, first
    else:
        assert len(first) > 4, first
    again = demonstrations(env_id, n=5, seed=7, env_kwargs=kwargs, policy="uniform")
    assert again == recs[:5]


def test_cli_demo_policy_uniform_keeps_every_episode(tmp_path, capsys):
    out = tmp_path / "kuhn.jsonl"
    args = [
        "demos",
        "gymllm/ta-KuhnPoker-v0",
        "--n",
        "6",
        "--out",
        str(out),
        "--demo-policy",
        "uniform",
    ]
    assert main([*args, "--env-kwargs", '{"max_rounds": 1}']) == 0
    printed = capsys.readouterr().out
    assert "wrote 6 of 6 episodes" in printed and "kept: every episode (uniformly random" in printed
    uniform = demonstrations(
        "gymllm/ta-KuhnPoker-v0", n=6, env_kwargs={"max_rounds": 1}, policy="uniform"
    )
    assert read_demos(out) == uniform  # the uniform player's episodes, not the solver's


@pytest.mark.parametrize(
    "env_id, kwargs",
    [("gymllm/TicTacToe-v0", {}), ("gymllm/ta-KuhnPoker-v0", {"max_rounds": 1, "max_invalid": 2})],
)
def test_first_policy_plays_the_first_legal_move_every_time_and_keeps_every_episode(env_id, kwargs):
    """policy="first": each reply is the first legal move in the game's move order by the env's own mask
    (replayed through a fresh env to the recorded reward; Kuhn poker: [check], else [call], whatever the
    card), every episode kept."""
    n = 24
    recs = demonstrations(env_id, n=n, seed=3, env_kwargs=kwargs, policy="first")
    assert [r["seed"] for r in recs] == list(range(3, 3 + n))
    assert min(r["reward"] for r in recs) < 0  # losses kept
    env = gymllm.make(env_id, **kwargs)
    names = env.unwrapped.env.config.move_names
    seen = collections.Counter()
    for rec in recs:
        for reply, info in _replay(env, rec):
            first = next(names[i] for i, ok in enumerate(info["action_mask"]) if ok)
            assert reply == first, (reply, first)
            seen[reply] += 1
    env.close()
    if "Kuhn" in env_id:
        assert set(seen) == {"[check]", "[call]"}, seen  # never a bet, never a fold
    assert demonstrations(env_id, n=4, seed=3, env_kwargs=kwargs, policy="first") == recs[:4]


def test_uniform_policy_needs_a_game_seat_and_names_the_policies():
    with pytest.raises(ConfigError, match="action_mask.*policy='solver'"):
        demonstrations("gymllm/Arithmetic-v0", n=1, policy="uniform")
    with pytest.raises(ConfigError, match="action_mask.*policy='solver'"):
        demonstrations("gymllm/Arithmetic-v0", n=1, policy="first")
    with pytest.raises(ConfigError, match="'solver'.*'uniform'.*'first'"):
        demonstrations("gymllm/TicTacToe-v0", n=1, policy="minimax")


def test_cli_writes_the_file_and_names_the_next_command(tmp_path, capsys):
    out = tmp_path / "ttt.jsonl"
    assert main(["demos", "gymllm/TicTacToe-v0", "--n", "5", "--seed", "3", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    recs = read_demos(out)
    assert f"wrote {len(recs)} of 5 episodes" in printed and "mean reward" in printed
    assert f"gymllm sft {out}" in printed and [r["seed"] for r in recs] == list(
        range(3, 3 + len(recs))
    )
    lake = tmp_path / "lake.jsonl"
    assert (
        main(
            [
                "demos",
                "FrozenLake-v0",
                "--n",
                "2",
                "--out",
                str(lake),
                "--env-kwargs",
                '{"is_slippery": false}',
                "--env.system-prompt",
                "Move.",
            ]
        )
        == 0
    )
    assert [r["messages"][0] for r in read_demos(lake)] == [
        {"role": "system", "content": "Move."}
    ] * 2
    capsys.readouterr()
    assert (
        main(["demos", "FrozenLake-v0", "--n", "2", "--out", str(lake), "--env-kwargs", "{bad"])
        == 2
    )
    assert "--env-kwargs: expected a JSON object" in capsys.readouterr().err
    assert main(["demos", "Echo-v0", "--n", "2", "--out", str(tmp_path / "e.jsonl")]) == 2
    assert "an env with a solver" in capsys.readouterr().err and not (tmp_path / "e.jsonl").exists()
    assert (
        main(
            [
                "demos",
                "FrozenLake-v0",
                "--n",
                "1",
                "--out",
                str(tmp_path / "u.jsonl"),
                "--env-kwargs",
                '{"is_slippery": false, "desc": ["SH", "HG"]}',
            ]
        )
        == 1
    )
    assert "no episode" in capsys.readouterr().err
