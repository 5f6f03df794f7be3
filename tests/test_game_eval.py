"""``gymllm eval game``: the Elo math against reference formulas and a synthetic tournament, the match
runner on tic-tac-toe (scripted players with a forced outcome, a crashing player, seats balanced, games
interleaved on an engine) and the command line end to end with a tiny model."""

from __future__ import annotations

import asyncio
import functools
import collections
import json
import math
import types

import numpy as np
import pytest

from gymllm.errors import ConfigError
from gymllm.inference.completion import Completion
from gymllm.suites.games import MatchConfig, Player, opponent_player, resolve_game, run_matches
from gymllm.utils.elo import (
    bootstrap_ratings,
    elo_ratings,
    expected_score,
    fit_bradley_terry,
    pairwise_matrices,
    rating_gap,
    wilson_interval,
)

# --- the Elo math ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("p", [0.6, 0.75, 0.9])
def test_two_players_with_win_rate_p_are_400_log10_odds_apart(p):
    n = 1000
    wins = round(p * n)
    games = [("a", "b", 1.0)] * wins + [("a", "b", 0.0)] * (n - wins)
    r = elo_ratings(games, prior_draws=0.0)
    assert r["a"] - r["b"] == pytest.approx(400 * math.log10(p / (1 - p)), abs=1e-6)
    assert r["a"] - r["b"] == pytest.approx(rating_gap(p), abs=1e-6)
    assert (r["a"] + r["b"]) / 2 == pytest.approx(1000.0)  # no anchor: the mean is 1000
    # draws count half: 50 wins and 100 draws out of 200 is a score of 0.5 + ... = (50 + 50) / 200
    half = [("a", "b", 1.0)] * 50 + [("a", "b", 0.5)] * 100 + [("a", "b", 0.0)] * 50
    assert elo_ratings(half, prior_draws=0.0)["a"] == pytest.approx(1000.0, abs=1e-6)


def test_a_synthetic_tournament_recovers_its_ratings():
    true = {"p": 1000.0, "q": 1200.0, "r": 1400.0, "s": 900.0}
    rng = np.random.default_rng(0)
    games = []
    for a, b in [("p", "q"), ("p", "r"), ("p", "s"), ("q", "r"), ("q", "s"), ("r", "s")]:
        e = expected_score(true[a], true[b])
        games += [(a, b, float(x)) for x in rng.random(1500) < e]
    got = elo_ratings(games, anchor="p", prior_draws=0.0)
    assert got["p"] == 1000.0
    for k in true:
        assert abs(got[k] - true[k]) < 30, (k, got[k])
    ci = bootstrap_ratings(
        games, rng=np.random.default_rng(1), anchor="p", prior_draws=0.0, num_resamples=200
    )
    assert ci["p"] == (1000.0, 1000.0)  # the anchor's interval is a point
    for k in ("q", "r", "s"):
        lo, hi = ci[k]
        assert lo < got[k] < hi and lo - 15 < true[k] < hi + 15 and hi - lo < 80


def test_the_fit_is_the_likelihood_maximum_and_refuses_what_has_none():
    scores, counts = pairwise_matrices(
        [
            ("a", "b", 1.0),
            ("a", "b", 0.0),
            ("b", "c", 1.0),
            ("b", "c", 0.5),
            ("a", "c", 0.0),
            ("a", "c", 1.0),
            ("a", "c", 1.0),
        ],
        ["a", "b", "c"],
    )
    r = fit_bradley_terry(scores, counts)
    theta = r * math.log(10) / 400
    p = 1 / (1 + np.exp(-(theta[:, None] - theta[None, :])))
    np.testing.assert_allclose(
        scores.sum(1), (counts * p).sum(1), atol=1e-8
    )  # the score equations hold
    with pytest.raises(
        ValueError, match="prior_draws > 0"
    ):  # a perfect record: infinite without a prior
        elo_ratings([("a", "b", 1.0)] * 3, prior_draws=0.0)
    r = elo_ratings([("a", "b", 1.0)] * 3, prior_draws=1.0)  # one virtual draw: a scores 3.5 of 4
    assert r["a"] - r["b"] == pytest.approx(rating_gap(3.5 / 4), abs=1e-6)
    with pytest.raises(ValueError, match="not all connected"):
        elo_ratings([("a", "b", 1.0), ("c", "d", 0.5)])


def test_wilson_interval_matches_the_formula():
    lo, hi = wilson_interval(5, 10)
    assert (lo, hi) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson_interval(0, 20)[0] == 0.0 and wilson_interval(20, 20)[1] == 1.0
    z2 = 1.959963984540054**2
    assert wilson_interval(0, 20)[1] == pytest.approx(z2 / (20 + z2))  # the closed form at k = 0
    assert wilson_interval(0, 0) == (0.0, 1.0)


# --- scripted players on tic-tac-toe ---------------------------------------------------------------------

LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]


@functools.lru_cache(maxsize=None)
def _negamax(mine: tuple, theirs: tuple) -> tuple[int, int]:
    """(value for the side to move, best square) of a tic-tac-toe position."""
    free = [i for i in range(9) if not mine[i] and not theirs[i]]
    best = (-2, free[0] if free else -1)
    for i in free:
        m = tuple(1 if j == i else v for j, v in enumerate(mine))
        if any(all(m[k] for k in line) for line in LINES):
            return 1, i
        value = 0 if len(free) == 1 else -_negamax(theirs, m)[0]
        if value > best[0]:
            best = (value, i)
    return best


def perfect(observation, agent):
    """A perfect tic-tac-toe player (negamax) on PettingZoo's observation: it never loses."""
    board = observation["observation"]
    return _negamax(
        tuple(int(x) for x in board[:, :, 0].reshape(9)),
        tuple(int(x) for x in board[:, :, 1].reshape(9)),
    )[1]


def first_legal(observation, agent):
    """Always the first legal square."""
    return int(np.flatnonzero(observation["action_mask"])[0])


CRASHES = {"calls": 0}


def crashes_every_third(observation, agent):
    """Raises on every third call, else plays the first legal square."""
    CRASHES["calls"] += 1
    if CRASHES["calls"] % 3 == 0:
        raise RuntimeError("deliberate crash")
    return first_legal(observation, agent)


FAST = dict(num_resamples=200)


def _rows(out):
    return [json.loads(line) for line in (out / "games.jsonl").read_text().splitlines()]


def test_a_perfect_player_never_loses_and_tops_the_ratings_with_rates_summing_to_one_and_seats_balanced(
    tmp_path,
):
    players = [
        opponent_player("random"),
        opponent_player("test_game_eval:perfect", label="perfect"),
        opponent_player("test_game_eval:first_legal"),
    ]
    summary = run_matches(
        resolve_game("tic-tac-toe"), players, tmp_path, config=MatchConfig(games=8, **FAST)
    )
    rows = _rows(tmp_path)
    assert len(rows) == 3 * 8 and summary["games"] == 24 and summary["errors"] == 0
    assert {r["error"] for r in rows} == {None}
    for line in summary["pairings"]:
        assert line["win"] + line["draw"] + line["loss"] == pytest.approx(1.0)
        assert line["games"] == 8 and line["seats"] == {
            "player_1": 4,
            "player_2": 4,
        }  # each seat equally
        for k in ("win", "draw", "loss"):
            lo, hi = line[f"{k}_ci"]
            assert lo <= line[k] <= hi
        if line["player"] == "perfect":
            assert line["loss"] == 0.0
    vs_first = next(
        x
        for x in summary["pairings"]
        if (x["player"], x["opponent"]) == ("perfect", "test_game_eval:first_legal")
    )
    assert vs_first["win"] == 1.0  # first-legal walks into a forced loss from both seats
    ratings = json.loads((tmp_path / "ratings.json").read_text())
    assert ratings == summary["ratings"] and ratings["anchor"] == "random = 1000"
    order = [r["player"] for r in ratings["ratings"]]
    assert order[0] == "perfect" and set(order) == {
        "random",
        "perfect",
        "test_game_eval:first_legal",
    }
    best = ratings["ratings"][0]
    assert best["elo"] > 1000 and best["ci"][0] <= best["elo"] <= best["ci"][1]
    assert next(r for r in ratings["ratings"] if r["player"] == "random")["elo"] == 1000.0
    # the rows record who sat where and the moves
    for r in rows:
        assert sorted(r["players"].values()) == sorted(r["pairing"]) and r["moves"]
        assert (r["winner"] is None) == r["draw"]
    assert json.loads((tmp_path / "summary.json").read_text())["pairings"] == summary["pairings"]


@pytest.mark.parametrize("errors", ["loss", "exclude"])
def test_a_crashing_player_gives_error_rows_and_the_other_games_go_on(tmp_path, errors):
    CRASHES["calls"] = 0
    players = [
        opponent_player("random"),
        opponent_player("test_game_eval:crashes_every_third", label="flaky"),
        opponent_player("test_game_eval:first_legal", label="first"),
    ]
    summary = run_matches(
        resolve_game("tic-tac-toe"),
        players,
        tmp_path,
        config=MatchConfig(games=6, errors=errors, **FAST),
    )
    rows = _rows(tmp_path)
    assert len(rows) == 18  # nothing dropped
    bad = [r for r in rows if r["error"]]
    assert bad and all(r["crashed"] == "flaky" and "deliberate crash" in r["error"] for r in bad)
    assert all(r["error"] is None for r in rows if "flaky" not in r["pairing"])
    for r in bad:
        assert r["scored"] == (errors == "loss")
        assert r["winner"] == (
            next(p for p in r["pairing"] if p != "flaky") if errors == "loss" else None
        )
    line = next(
        x for x in summary["pairings"] if (x["player"], x["opponent"]) == ("flaky", "random")
    )
    flaky_bad = sum(1 for r in bad if "random" in r["pairing"])
    texts = collections.Counter(r["error"] for r in bad if "random" in r["pairing"])
    assert line["top_error"] == {"error": texts.most_common(1)[0][0], "rows": max(texts.values())}
    assert "deliberate crash" in line["top_error"]["error"]
    clean = next(
        x for x in summary["pairings"] if (x["player"], x["opponent"]) == ("first", "random")
    )
    assert clean["errors"] == 0 and clean["top_error"] is None
    assert line["errors"] == flaky_bad and line["games"] == (
        6 if errors == "loss" else 6 - flaky_bad
    )
    if line["games"]:
        assert line["win"] + line["draw"] + line["loss"] == pytest.approx(1.0)
    assert {r["player"] for r in summary["ratings"]["ratings"]} | set(
        summary["ratings"]["unrated"]
    ) == {"random", "flaky", "first"}


def test_a_pettingzoo_game_named_by_module_factory_is_played(tmp_path):
    """The race game written in the seat tests (a raw PettingZoo AEC env, not one of ours) as MODULE:FACTORY."""
    summary = run_matches(
        resolve_game("test_multiagent_seats:race"),
        [
            opponent_player("random"),
            opponent_player("test_game_eval:first_legal", label="plus_one"),
        ],
        tmp_path,
        config=MatchConfig(games=4, **FAST),
    )
    rows = _rows(tmp_path)
    assert len(rows) == 4 and all(
        r["error"] is None and not r["draw"] for r in rows
    )  # a race always has a winner
    assert {r["players"]["first"] for r in rows} == {"random", "plus_one"}
    assert summary["pairings"][0]["seats"] == {"first": 2, "second": 2}


def test_bad_names_and_schedules_are_config_errors_naming_the_fix():
    with pytest.raises(ConfigError, match="tic-tac-toe"):
        resolve_game("chess")
    with pytest.raises(ConfigError, match="--opponent random"):
        opponent_player("rnd")
    with pytest.raises(ConfigError, match="even"):
        MatchConfig(games=3)
    with pytest.raises(ConfigError, match="distinct"):
        run_matches(
            resolve_game("tic-tac-toe"),
            [opponent_player("random"), opponent_player("random")],
            "/nonexistent",
        )


# --- a model player on an engine: games interleave ----------------------------------------------------------


class GatedEngine:
    """Test double of the Engine protocol replying tic-tac-toe squares in turn; the first request of
    game 0 waits until two replies of other games have been given (lock-step turns would deadlock)."""

    def __init__(self, tok):
        self.tok, self.calls, self.max_len = tok, [], 4096
        self.others = asyncio.Event()
        self.closed = False

    async def generate(self, prompt_ids, params, *, session_id=None):
        self.calls.append(session_id)
        if session_id.startswith("g0/m0/") and len(self.calls) == 1:
            await asyncio.wait_for(self.others.wait(), 10)
        elif sum(not s.startswith("g0/m0/") for s in self.calls) >= 2:
            self.others.set()
        text = "abc"[len(self.calls) % 3] + "123"[(len(self.calls) // 3) % 3]
        ids = self.tok.encode(text) + [self.tok.eos_token_id]
        return Completion(
            token_ids=ids,
            logprobs=[-0.5] * len(ids),
            finish_reason="stop",
            versions=[0] * len(ids),
            prompt_len=len(prompt_ids),
        )

    def end_session(self, session_id):
        pass

    async def close(self):
        self.closed = True


def test_games_of_a_model_player_interleave_on_its_engine(tmp_path):
    from gymllm.models.tiny import tiny_tokenizer

    tok = tiny_tokenizer(512)
    engine = GatedEngine(tok)
    model = Player(
        label="m", loaded=types.SimpleNamespace(tokenizer=tok), make_engine=lambda: engine
    )
    summary = run_matches(
        resolve_game("tic-tac-toe"),
        [model, opponent_player("random")],
        tmp_path,
        config=MatchConfig(games=4, **FAST),
    )
    first = engine.calls.index(next(s for s in engine.calls if s.startswith("g0/m0/")))
    assert first == 0 and engine.closed
    # game 0's first reply came back only after other games had moved: they did not wait for it
    answered_before = [s for s in engine.calls[1:] if not s.startswith("g0/m0/")]
    assert len(answered_before) >= 2 and len({s.split("/")[1] for s in engine.calls}) >= 3
    assert summary["games"] == 4 and summary["errors"] == 0
    line = summary["pairings"][0]
    assert line["player"] == "m" and line["seats"] == {"player_1": 2, "player_2": 2}
    assert line["win"] + line["draw"] + line["loss"] == pytest.approx(1.0)


# --- the command line, end to end with a tiny model ---------------------------------------------------------


def test_gymllm_eval_game_writes_games_summary_and_ratings(tmp_path, capsys):
    from gymllm.cli.main import main

    out = tmp_path / "ttt"
    rc = main(
        [
            "eval",
            "game",
            "tic-tac-toe",
            "--model.name",
            "tiny-qwen3",
            "--opponent",
            "random",
            "--opponent",
            "test_game_eval:first_legal",
            "--eval.games",
            "2",
            "--sampling.max-tokens",
            "4",
            "--engine.max-len",
            "512",
            "--engine.num-slots",
            "4",
            "--eval.num-resamples",
            "100",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    assert {p.name for p in out.iterdir()} == {"games.jsonl", "summary.json", "ratings.json"}
    rows = _rows(out)
    assert len(rows) == 3 * 2
    summary = json.loads((out / "summary.json").read_text())
    assert [p["label"] for p in summary["players"]] == [
        "tiny-qwen3",
        "random",
        "test_game_eval:first_legal",
    ]
    for line in summary["pairings"]:
        assert line["win"] + line["draw"] + line["loss"] == pytest.approx(1.0)
        assert line["seats"] == {"player_1": 1, "player_2": 1}
    model_rows = [r for r in rows if "tiny-qwen3" in r["pairing"]]
    assert len(model_rows) == 4
    for r in (
        model_rows
    ):  # the model moved (a random model: illegally, until it forfeits or runs out of context)
        seat = next(s for s, label in r["players"].items() if label == "tiny-qwen3")
        assert any(s == seat for s, _ in r["moves"]) and r["winner"] != "tiny-qwen3"
    ratings = json.loads((out / "ratings.json").read_text())
    assert {r["player"] for r in ratings["ratings"]} == {
        "tiny-qwen3",
        "random",
        "test_game_eval:first_legal",
    }
    printed = capsys.readouterr().out
    assert "tiny-qwen3" in printed and "Elo (random = 1000" in printed
    # an unknown game or opponent is one error line naming the fix (checked before any model loads)
    assert (
        main(["eval", "game", "chess", "--model.name", "tiny-qwen3", "--out", str(tmp_path / "x")])
        == 2
    )
    assert "tic-tac-toe, connect-four, or MODULE:FACTORY" in capsys.readouterr().err
    assert (
        main(
            [
                "eval",
                "game",
                "tic-tac-toe",
                "--model.name",
                "tiny-qwen3",
                "--opponent",
                "nobody",
                "--out",
                str(tmp_path / "x"),
            ]
        )
        == 2
    )
    assert "--opponent random" in capsys.readouterr().err


def test_players_from_flags_label_checkpoints_like_the_suite_and_keep_their_system_prompt(
    tmp_path, monkeypatch
):
    from gymllm import models
    from gymllm.cli import evaluate
    from gymllm.cli.game_cli import players_from_flags

    run = tmp_path / "ttt-run"
    run.mkdir()
    (run / "config.json").write_text(
        json.dumps({"env": {"id": "tic-tac-toe", "system_prompt": "Play well."}})
    )
    tiny = models.make_tiny("qwen3")
    loads = []
    monkeypatch.setattr(
        evaluate,
        "load_model",
        lambda name, checkpoint=None: loads.append((name, checkpoint)) or tiny,
    )
    players = players_from_flags(["tiny-qwen3"], [str(run / "checkpoints")], [], ["random"])
    assert [p.label for p in players] == ["tiny-qwen3", "ttt-run", "random"]
    assert [p.kind for p in players] == ["model", "model", "random"]
    assert (
        players[0].system_prompt is None and players[1].system_prompt == "Play well."
    )  # the run's, read from RUN
    assert loads == [("tiny-qwen3", None), (None, str(run / "checkpoints"))]
    given = players_from_flags(
        ["tiny-qwen3"], [str(run)], [], [], system_prompt="Reply with a move."
    )
    assert [p.system_prompt for p in given] == [
        "Reply with a move.",
        "Play well.",
    ]  # --model.name's; the run keeps its own
    with pytest.raises(ConfigError, match="--model.label"):
        players_from_flags(["tiny-qwen3"], [], ["a", "b"], [])
    loads.clear()
    with pytest.raises(ConfigError, match="--opponent"):
        players_from_flags(["tiny-qwen3"], [], [], ["nobody"])
    assert loads == []  # a bad opponent is refused before any model loads
