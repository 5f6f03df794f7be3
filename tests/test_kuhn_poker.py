"""Kuhn poker from TextArena: the PettingZoo env, Kuhn's payoffs, the equilibrium demos and the recipe.

The equilibrium is checked against reference math written here from the rules (the 6 deals, the
payoff of every betting line, brute force over every pure strategy), not against the solver's code.
"""

import itertools
import json
import pathlib
import re
from fractions import Fraction

import numpy as np
import pytest

pytest.importorskip("textarena")  # the catalogue extra

from gymllm.envs.kuhn_poker import (
    KUHN_CARDS,
    KUHN_GAME_VALUE,
    KUHN_MOVES,
    KuhnPokerAEC,
    KuhnPokerConfig,  # noqa: E402
    kuhn_equilibrium,
    kuhn_poker,
    replay_chips,
)
from gymllm.errors import ConfigError  # noqa: E402

DEALS = list(
    itertools.permutations(range(3), 2)
)  # (first actor's card, second actor's card): the 6 deals
FIRST_SETS = [
    ((), "check", "bet"),
    (("check", "bet"), "call", "fold"),
]  # the first actor's decisions
SECOND_SETS = [(("check",), "check", "bet"), (("bet",), "call", "fold")]


def payoff(c1: int, c2: int, line: tuple[str, ...]) -> int:
    """The first actor's chips for a finished betting line (ante 1, bet 1), from the rules."""
    show = 1 if c1 > c2 else -1
    return {
        ("check", "check"): show,
        ("check", "bet", "fold"): -1,
        ("check", "bet", "call"): 2 * show,
        ("bet", "fold"): 1,
        ("bet", "call"): 2 * show,
    }[line]


def value(first, second) -> Fraction:
    """The first actor's expected chips: ``first`` / ``second`` map (card, history) -> P(the aggressive move)."""
    total = Fraction(0)
    for c1, c2 in DEALS:
        b1 = first(c1, ())
        b2c, c2b = second(c2, ("check",)), second(c2, ("bet",))
        c1c = first(c1, ("check", "bet"))
        v = (1 - b1) * (
            (1 - b2c) * payoff(c1, c2, ("check", "check"))
            + b2c
            * (
                c1c * payoff(c1, c2, ("check", "bet", "call"))
                + (1 - c1c) * payoff(c1, c2, ("check", "bet", "fold"))
            )
        )
        v += b1 * (
            c2b * payoff(c1, c2, ("bet", "call")) + (1 - c2b) * payoff(c1, c2, ("bet", "fold"))
        )
        total += Fraction(v) / 6
    return total


def strategy(alpha: Fraction):
    """``kuhn_equilibrium`` as (card, history) -> P(bet or call), in exact fractions."""

    def p(card: int, history: tuple[str, ...]) -> Fraction:
        probs = kuhn_equilibrium(KUHN_CARDS[card], history, float(alpha))
        aggressive = probs.get("[bet]", probs.get("[call]"))
        assert abs(sum(probs.values()) - 1.0) < 1e-12 and all(0 <= x <= 1 for x in probs.values())
        return Fraction(aggressive).limit_denominator(1000)

    return p


def pure_strategies():
    """Every pure strategy of one seat: a choice (0 or 1) per card at each of its two decisions."""
    for bits in itertools.product((0, 1), repeat=6):
        table = {(c, i): bits[2 * c + i] for c in range(3) for i in range(2)}
        yield table


@pytest.mark.parametrize("alpha", [Fraction(0), Fraction(1, 6), Fraction(1, 3)])
def test_equilibrium_has_the_game_value_and_no_pure_strategy_beats_it(alpha):
    eq = strategy(alpha)
    assert value(eq, eq) == Fraction(-1, 18) and KUHN_GAME_VALUE == pytest.approx(-1 / 18)
    hist1 = {(): 0, ("check", "bet"): 1}
    hist2 = {("check",): 0, ("bet",): 1}
    best_first = max(
        value(lambda c, h, t=t: Fraction(t[(c, hist1[h])]), eq) for t in pure_strategies()
    )
    best_second = min(
        value(eq, lambda c, h, t=t: Fraction(t[(c, hist2[h])])) for t in pure_strategies()
    )
    assert best_first == Fraction(-1, 18) and best_second == Fraction(
        -1, 18
    )  # exploitability 0 for both seats


def test_chips_against_random_of_the_warm_starts_and_of_what_self_play_can_learn():
    """The exact chips a hand against the uniformly random legal player, seat-averaged, that
    docs/multiagent.md's Kuhn goal analysis quotes: a policy maps (card, history) -> P(bet or call)."""
    rnd = lambda c, h: Fraction(1, 2)  # noqa: E731 - every decision has two legal moves

    def vs_random(p) -> Fraction:
        return (value(p, rnd) - value(rnd, p)) / 2

    def pure(bet: str, call: str):
        return lambda c, h: Fraction(KUHN_CARDS[c] in (bet if h in ((), ("check",)) else call))

    greedy_eq = lambda c, h: Fraction(strategy(Fraction(1, 3))(c, h) > Fraction(1, 2))  # noqa: E731
    assert vs_random(pure("", "")) == Fraction(-1, 2)  # check, else fold
    assert vs_random(pure("", "JQK")) == 0  # check, else call: the 'first' demos' policy
    assert vs_random(pure("JQK", "")) == Fraction(1, 8)  # bet, else fold
    assert vs_random(greedy_eq) == Fraction(1, 8)
    assert vs_random(strategy(Fraction(1, 3))) == Fraction(1, 6)  # where self-play heads
    assert vs_random(pure("K", "QK")) == Fraction(5, 24)  # bet a K, fold a J to a bet
    assert vs_random(pure("JQK", "JQK")) == Fraction(3, 8)  # bet or call with every card
    best = max(
        vs_random(lambda c, h, t=t: Fraction(t[(c, 0 if h in ((), ("check",)) else 1)]))
        for t in pure_strategies()
    )
    assert best == Fraction(
        11, 24
    )  # the best response to random (seat-specific moves do no better)


def test_equilibrium_frequencies_are_kuhns():
    eq = kuhn_equilibrium
    assert eq("J", ()) == pytest.approx({"[check]": 2 / 3, "[bet]": 1 / 3})  # bluff a J 1/3
    assert eq("Q", ()) == {"[check]": 1.0, "[bet]": 0.0}
    assert eq("K", ()) == {"[check]": 0.0, "[bet]": 1.0}  # 3 alpha = 1
    assert eq("Q", ("check", "bet")) == pytest.approx(
        {"[call]": 2 / 3, "[fold]": 1 / 3}
    )  # alpha + 1/3
    assert eq("J", ("bet",)) == {"[call]": 0.0, "[fold]": 1.0}
    assert eq("Q", ("bet",)) == pytest.approx({"[call]": 1 / 3, "[fold]": 2 / 3})
    assert eq("J", ("check",)) == pytest.approx({"[check]": 2 / 3, "[bet]": 1 / 3})
    assert eq("K", ("check",))["[bet]"] == 1.0 and eq("K", ("bet",))["[call]"] == 1.0
    with pytest.raises(ConfigError, match="one of"):
        eq("A", ())
    with pytest.raises(ConfigError, match=r"\[0, 1/3\]"):
        eq("J", (), alpha=0.5)
    with pytest.raises(ConfigError, match="history"):
        eq("J", ("bet", "call"))


def test_the_game_passes_pettingzoo_api_test_raw_and_as_text():
    from gymllm.multiagent import text_api_test

    text_api_test(KuhnPokerAEC(), num_cycles=30)
    text_api_test(kuhn_poker(), num_cycles=30)
    with pytest.raises(ConfigError, match="max_rounds"):
        KuhnPokerConfig(max_rounds=0)
    with pytest.raises(ConfigError, match="move_names"):
        kuhn_poker(move_names=("a", "b", "c", "d"))


@pytest.mark.parametrize("max_rounds", [1, 3])
def test_rewards_are_kuhns_chips_with_bets_in_the_pot(max_rounds):
    """Random legal play on 40 seeds: the reward is the net chips by the rules (TextArena 0.7.4 alone
    would leave bets out of the pot), zero-sum, and the seat's outcome follows its sign."""
    game = kuhn_poker(max_rounds=max_rounds)
    rng = np.random.default_rng(0)
    seen = set()
    for seed in range(40):
        game.reset(seed=seed)
        expected = {"player_0": 0, "player_1": 0}
        hand: list[tuple[str, str]] = []
        cards = None
        while game.agents:
            agent = game.agent_selection
            obs, reward, term, trunc, info = game.last()
            if term:
                assert reward == expected[agent] and info["chips"] == expected[agent]
                game.step(None)
                continue
            card, history = game.env.decision_state(agent)
            if not history:  # a new hand: the first actor's and the other's cards
                other = "player_1" if agent == "player_0" else "player_0"
                cards = {
                    agent: KUHN_CARDS.index(card),
                    other: KUHN_CARDS.index(game.env.decision_state(other)[0]),
                }
                hand, first = [], agent
            legal = [m for m, ok in zip(KUHN_MOVES, obs["action_mask"]) if ok]
            assert f"Legal moves: {', '.join(legal)}." in obs["observation"]
            move = legal[int(rng.integers(len(legal)))]
            hand.append((agent, move.strip("[]")))
            game.step(move)
            line = tuple(m for _, m in hand)
            if line in {
                ("check", "check"),
                ("check", "bet", "fold"),
                ("check", "bet", "call"),
                ("bet", "fold"),
                ("bet", "call"),
            }:
                second = next(a for a in cards if a != first)
                won = payoff(cards[first], cards[second], line)
                expected[first] += won
                expected[second] -= won
                seen.add(line)
        assert expected["player_0"] == -expected["player_1"]
    assert len(seen) == 5  # every betting line was played


def test_a_seed_deals_the_same_cards_whatever_was_played_before():
    """TextArena shuffles its deck in place; the env restores it, so a seed alone decides the deal."""
    game = KuhnPokerAEC()
    deals = []
    for played in range(3):
        game.reset(seed=5)
        for _ in range(played):
            if game.agents:
                game.step(int(np.flatnonzero(game.observe(game.agent_selection)["action_mask"])[0]))
        game.reset(seed=1273345680)
        deals.append((game.decision_state("player_0"), game.decision_state("player_1")))
    assert deals[0] == deals[1] == deals[2]


def test_each_seat_sees_its_own_card_in_its_info_at_its_first_decision():
    """What ``--multiagent.baseline-key card`` keys on: the text game's ``last()`` info of each seat's first
    decision names that seat's card (and never the other's)."""
    game = kuhn_poker()
    for seed in range(6):
        game.reset(seed=seed)
        inner = game.env.unwrapped  # the KuhnPokerAEC under the text env
        for _ in range(2):  # the two seats' first decisions
            agent = game.agent_selection
            assert game.last()[4]["card"] == inner.decision_state(agent)[0]
            game.step("[check]")


def test_demos_are_legal_moves_and_follow_the_equilibrium(tmp_path):
    from gymllm.envs.demos import demonstrations

    recs = demonstrations(
        "gymllm/ta-KuhnPoker-v0", n=240, env_kwargs={"max_invalid": 2}, system_prompt="S"
    )
    assert len(recs) == 240 and recs[:16] == demonstrations(
        "gymllm/ta-KuhnPoker-v0", n=16, env_kwargs={"max_invalid": 2}, system_prompt="S"
    )  # the seed fixes each demo
    counts: dict[tuple[str, str], list[str]] = {}
    for rec in recs:
        assert rec["reward"] in (-2.0, -1.0, 1.0, 2.0)
        msgs = rec["messages"]
        assert msgs[0] == {"role": "system", "content": "S"} and msgs[-1]["role"] == "assistant"
        card = re.search(r"Your card is: '([JQK])'", msgs[1]["content"]).group(1)
        history: list[str] = []
        for prompt, reply in zip(msgs[1::2], msgs[2::2]):
            text = prompt["content"]
            assert "Invalid move" not in text
            legal = re.search(r"Legal moves: (.*)\.$", text).group(1).split(", ")
            assert reply["content"] in legal  # a legal move, in TextArena's syntax
            history += re.findall(
                r"submitted move: '\[(\w+)\]'", text
            )  # the moves since its last turn, its own too
            counts.setdefault((card, ",".join(history)), []).append(reply["content"])
    for (card, hist), moves in counts.items():
        probs = kuhn_equilibrium(card, tuple(h for h in hist.split(",") if h))
        for move, p in probs.items():
            freq = moves.count(move) / len(moves)
            if p in (0.0, 1.0):
                assert freq == p, (card, hist, move)
            else:  # 4 standard errors
                assert abs(freq - p) <= 4 * (p * (1 - p) / len(moves)) ** 0.5 + 1e-9, (
                    card,
                    hist,
                    move,
                    freq,
                    len(moves),
                )
    assert {k for k in counts} >= {(c, h) for c in "JQK" for h in ("", "check", "bet")}


def test_gymllm_eval_game_plays_it_and_scores_by_chips(tmp_path):
    from gymllm.suites.games import MatchConfig, Player, resolve_game, run_matches

    make = resolve_game("gymllm.envs.kuhn_poker:kuhn_poker", {"max_invalid": 2})
    players = [Player(label="a", random=True), Player(label="b", random=True)]
    summary = run_matches(make, players, tmp_path, config=MatchConfig(games=8, num_resamples=20))
    rows = [json.loads(x) for x in (tmp_path / "games.jsonl").read_text().splitlines()]
    assert summary["games"] == 8 and summary["errors"] == 0 and all(r["scored"] for r in rows)
    assert all(
        not r["draw"] and r["winner"] in ("a", "b") and r["moves"] for r in rows
    )  # one hand: no draws
    assert all(r["outcomes"][r["winner"]] == "win" for r in rows)
    for r in (
        rows
    ):  # the replayed chips: zero-sum, the winner's positive, a called bet doubles the stake
        chips = replay_chips(r, max_invalid=2)
        moves = [m for _, m in r["moves"]]
        assert chips["a"] == -chips["b"] and chips[r["winner"]] == (
            2.0 if "[call]" in moves else 1.0
        )
    with pytest.raises(ConfigError, match="finished game"):
        replay_chips({**rows[0], "error": "boom"})


def test_the_recipe_builds_valid_train_and_sft_configs(tmp_path):
    from gymllm.train.sft import SFTConfig
    from gymllm.cli.train_args import train_config_from
    from gymllm.cli.recipes import load_recipe, sft_config_for, sft_stage_from
    from gymllm.envs.demos import SOLVERS
    from gymllm.multiagent.factory import game_factory

    recipe = load_recipe("kuhn_poker_selfplay")
    assert "docs/multiagent.md" in recipe["description"]  # where its measured figures are
    docs = pathlib.Path(__file__).resolve().parents[1] / "docs" / "multiagent.md"
    assert "Kuhn poker" in docs.read_text()
    cfg = train_config_from("kuhn_poker_selfplay", None, None, str(tmp_path))
    assert (
        cfg.multiagent.opponent == "frozen" and cfg.multiagent.league_size >= 1
    )  # a league of earlier snapshots
    assert (
        cfg.multiagent.baseline == "role_ema"
        and "gymllm.envs.kuhn_poker:kuhn_card_player" in cfg.multiagent.eval_opponents
    )
    assert game_factory(cfg.env.id, dict(cfg.env.kwargs)) is not None
    stage = sft_stage_from(recipe["sft"])
    assert stage.demo_env in SOLVERS and stage.demo_policy == "uniform"  # random legal moves
    assert cfg.multiagent.baseline_key == "card" and cfg.multiagent.game_seeds == "game"
    assert cfg.learner.prefix_len == 256 and cfg.learner.micro_batch_size == cfg.rollout.group_size
    sft = sft_config_for(stage, cfg, data="d.jsonl", run_dir=str(tmp_path / "sft"))
    assert isinstance(sft, SFTConfig) and sft.sft.system_prompt == cfg.env.system_prompt
    assert sft.learner.num_steps == recipe["sft"]["num_steps"] and sft.sft.epochs == 0


@pytest.mark.slow
def test_the_recipe_runs_demos_sft_and_one_self_play_step(tmp_path, capsys):
    """The shipped recipe end to end (demos, SFT, GRPO self-play) for one step each, with the tiny model
    (its byte-level tokenizer needs longer rows: 1024 tokens in place of 448 / 512)."""
    from gymllm.cli.main import main
    from gymllm.cli.recipes import RECIPES_DIR

    run_dir = tmp_path / "run"
    text = (RECIPES_DIR / "kuhn_poker_selfplay.toml").read_text()
    for old, new in (
        ("max_len = 512", "max_len = 1024"),
        ("min_bucket = 512", "min_bucket = 1024"),
        ("max_len = 448", "max_len = 1024"),
        ("min_bucket = 448", "min_bucket = 1024"),
        ("num_steps = 4", "num_steps = 1"),
        ("num_steps = 12", "num_steps = 1"),
        ("demos = 256", "demos = 8"),
        ("every = 6", "every = 1"),
        ("prefix_len = 256", "prefix_len = 512"),
        ('run_dir = "runs/kuhn_poker_selfplay"', f'run_dir = "{run_dir}"'),
        ('preset = "default"', 'preset = "default"\n[model]\nname = "tiny-qwen3"'),
    ):
        assert old in text, old
        text = text.replace(old, new)
    recipe = tmp_path / "kuhn.toml"
    recipe.write_text(text)
    assert (
        main(
            [
                "train",
                str(recipe),
                "--run.no-console",
                "--run.no-report",
                "--env.num-envs",
                "4",
                "--engine.num-slots",
                "4",
                "--rollout.group-size",
                "2",
                "--rollout.max-concurrency",
                "4",
            ]
        )
        == 0
    )
    stages = json.loads((run_dir / "stages.json").read_text())
    assert stages["demos"]["episodes"] == 8 and stages["sft"]["step"] == 1
    grpo = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in grpo if "reward_mean" in r] == [1]
    assert any(
        k.startswith("seat/player_0/") for r in grpo for k in r
    )  # both seats were played (self-play)
