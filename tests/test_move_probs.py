"""Move probabilities at a game's decision points (gymllm.suites.move_probs), on Kuhn poker with a tiny model:
the prompt is the one the chat template renders for the seat's conversation, the scores are the model's
log-probabilities checked against NumPy, and the decision table deals each card to the probed seat."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("textarena")  # the catalogue extra (Kuhn poker)

from gymllm.envs.kuhn_poker import KUHN_CARDS, KUHN_MOVES, kuhn_poker  # noqa: E402
from gymllm.errors import ConfigError  # noqa: E402
from gymllm.models.tiny import make_tiny  # noqa: E402
from gymllm.suites.move_probs import decision_table, move_probabilities, reply_ids  # noqa: E402

SYSTEM = "You play Kuhn poker. Reply with one legal action in brackets."


@pytest.fixture(scope="module")
def loaded():
    return make_tiny("llama", num_layers=2)


def observations(seed: int, moves: list[str]) -> tuple[str, list[str]]:
    """The probed seat and the texts of its observations, played by hand."""
    game = kuhn_poker()
    game.reset(seed=seed)
    seen: dict[str, list[str]] = {}
    script = list(moves)
    while True:
        seat = game.agent_selection
        seen.setdefault(seat, []).append(game.last()[0]["observation"])
        if not script:
            return seat, seen[seat]
        game.step(script.pop(0))


def numpy_logprob(loaded, prompt: list[int], reply: list[int]) -> float:
    ids = np.asarray([*prompt, *reply], np.int32)[None]
    logits, _ = loaded.model(jnp.asarray(ids), jnp.asarray(np.arange(ids.shape[1])[None]))
    x = np.asarray(logits[0], np.float64)
    logz = np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1)) + x.max(-1)
    return float(sum(x[t - 1, ids[0, t]] - logz[t - 1] for t in range(len(prompt), ids.shape[1])))


def test_the_first_decision_is_the_chat_templates_prompt_and_the_models_probabilities(loaded):
    out = move_probabilities(
        loaded, kuhn_poker(), seed=0, moves=[], move_names=KUHN_MOVES, system_prompt=SYSTEM
    )
    seat, obs = observations(0, [])
    assert out["seat"] == seat == "player_1" and out["info"]["card"] in KUHN_CARDS
    want = loaded.tokenizer.apply_chat_template(
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": obs[0]}],
        add_generation_prompt=True,
        tokenize=True,
    )
    assert out["prompt_ids"] == list(want)
    assert set(out["moves"]) == {"[check]", "[bet]"}  # the legal ones, from the mask
    assert sum(out["moves"].values()) == pytest.approx(1.0)
    for move, lp in out["logprobs"].items():
        ref = numpy_logprob(loaded, out["prompt_ids"], reply_ids(loaded.tokenizer, move))
        assert lp == pytest.approx(ref, abs=2e-4)
    lp = np.array([out["logprobs"]["[check]"], out["logprobs"]["[bet]"]])
    assert out["legal_mass"] == pytest.approx(np.exp(lp).sum(), rel=1e-6)
    assert out["moves"]["[bet]"] == pytest.approx(1 / (1 + np.exp(lp[0] - lp[1])), rel=1e-6)


def test_a_later_decision_carries_the_seats_own_earlier_reply(loaded):
    out = move_probabilities(
        loaded,
        kuhn_poker(),
        seed=1,
        moves=["[check]", "[bet]"],
        move_names=KUHN_MOVES,
        system_prompt=SYSTEM,
    )
    seat, obs = observations(1, ["[check]", "[bet]"])
    assert out["seat"] == seat == "player_1" and len(obs) == 2
    want = loaded.tokenizer.apply_chat_template(
        [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": obs[0]},
            {"role": "assistant", "content": "[check]"},
            {"role": "user", "content": obs[1]},
        ],
        add_generation_prompt=True,
        tokenize=True,
    )
    assert out["prompt_ids"] == list(want)
    assert set(out["moves"]) == {"[call]", "[fold]"}


def test_the_decision_table_deals_each_card_to_the_probed_seat(loaded):
    """A scorer that prefers the first legal move by log 2 when the prompt shows a K: only the K rows move."""
    tok = loaded.tokenizer

    def score(prompt, replies):
        k = "Your card is: 'K'" in tok.decode(prompt)
        return [np.log(2.0) if (k and i == 0) else 0.0 for i in range(len(replies))]

    situations = {"first": [], "after a check": ["[check]"], "facing a bet": ["[bet]"]}
    table = decision_table(
        loaded,
        kuhn_poker(),
        situations=situations,
        key="card",
        values=KUHN_CARDS,
        move_names=KUHN_MOVES,
        score=score,
    )
    assert list(table) == list(situations)
    for name, row in table.items():
        assert list(row) == list(KUHN_CARDS)
        first = "[call]" if name == "facing a bet" else "[check]"
        assert row["K"][first] == pytest.approx(2 / 3)
        assert row["J"][first] == row["Q"][first] == pytest.approx(1 / 2)


def test_probes_past_the_game_or_without_move_names_are_refused(loaded):
    with pytest.raises(ConfigError, match="move_names"):
        move_probabilities(loaded, kuhn_poker(), seed=0, moves=[])
    with pytest.raises(ConfigError, match="game"):
        move_probabilities(
            loaded, kuhn_poker(), seed=0, moves=["[bet]", "[fold]"], move_names=KUHN_MOVES
        )
    with pytest.raises(ConfigError, match="no|none"):
        decision_table(
            loaded,
            kuhn_poker(),
            situations={"first": []},
            key="card",
            values=["A"],
            move_names=KUHN_MOVES,
            seeds=range(3),
        )
