"""One policy of a several-policy checkpoint (``--multiagent.policies``), named ``RUN#NAME``: the
checkpoint is written by the run's own writer (:class:`~gymllm.algos.checkpoint.Checkpointer` saving a
:class:`~gymllm.train.policies.PolicySet` built from a training config, with each policy's trained
arrays moved apart), then read back through the paths the commands take: ``gymllm.models.load``,
``gymllm eval env ENV --model.checkpoint``'s loader, a ``run:RUN#NAME`` opponent's engine and ``gymllm eval game``,
which enters every policy of a bare ``RUN`` as its own player."""

from __future__ import annotations

import asyncio
import hashlib
import json

import numpy as np
import pytest

from game_runs import run_to_end
from gymllm.errors import ConfigError
from gymllm.inference.completion import Completion

MAP = '{"player_1": "a", "player_2": "b"}'


def _cfg(run_dir, *extra):
    from gymllm.cli.train_args import parse_train_args

    return parse_train_args(
        [
            "--preset",
            "tiny",
            "--env.id",
            "tic-tac-toe",
            "--env-kwargs",
            "{}",
            "--run-dir",
            str(run_dir),
            "--engine.max-len",
            "256",
            *extra,
        ]
    )


def _save_policies(run_dir, weights: str):
    """A ``--multiagent.policies`` run's directory: its config.json and one checkpoint of a PolicySet
    whose policies' trained arrays were moved apart (seeded); returns the full weights each policy
    should load as (its adapters merged on the base, or its full weights)."""
    import jax.numpy as jnp

    from gymllm.algos.checkpoint import Checkpointer
    from gymllm.train.components import load_model
    from gymllm.train.policies import build_policy_set, policy_lora
    from gymllm.models.lora import merge

    cfg = _cfg(run_dir, "--multiagent.policies", MAP, "--multiagent.policy-weights", weights)
    lm = load_model(cfg.model)
    ps = build_policy_set(cfg, lm)
    expected = {}
    for i, (name, learner) in enumerate(ps.learners.items()):
        rng = np.random.default_rng(i)
        learner.trainable = {
            k: jnp.asarray(np.asarray(v) + 0.05 * rng.standard_normal(v.shape).astype(np.float32))
            for k, v in learner.trainable.items()
        }
        lora = policy_lora(cfg)
        flat = (
            merge(lora, lm.model.flat_params(), learner.trainable)
            if lora is not None
            else learner.trainable
        )
        expected[name] = {k: np.asarray(v) for k, v in flat.items()}
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(cfg.to_json())  # what Run.setup writes
    ckpt = Checkpointer(run_dir / "checkpoints")
    ckpt.save(3, ps)
    ckpt.close()
    return expected


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("policies") / "ttt"
    return run, _save_policies(run, "lora")


def _flat(loaded):
    return {k: np.asarray(v) for k, v in loaded.model.flat_params().items()}


def _hash(flat):
    h = hashlib.sha256()
    for name in sorted(flat):
        h.update(name.encode())
        h.update(np.asarray(flat[name]).tobytes())
    return h.hexdigest()


def _assert_weights(got, want):
    assert set(got) == set(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_the_checkpoint_has_the_layout_a_policies_run_writes(lora_run):
    from gymllm.models.trained import checkpoint_policies, policy_refs, split_policy

    run, _ = lora_run
    assert (run / "checkpoints" / "3" / "state").is_dir() and (
        run / "checkpoints" / "3" / "meta"
    ).is_dir()
    assert checkpoint_policies(run) == ["a", "b"] and checkpoint_policies(run / "checkpoints") == [
        "a",
        "b",
    ]
    assert policy_refs(run) == [f"{run}#a", f"{run}#b"] and policy_refs(f"{run}#b") == [f"{run}#b"]
    assert split_policy(f"{run}#a") == (str(run), "a") and split_policy(str(run)) == (
        str(run),
        None,
    )
    assert split_policy("runs/x#a/b") == ("runs/x#a/b", None) and split_policy("runs/x#a b") == (
        "runs/x#a b",
        None,
    )


def test_each_policy_loads_its_own_lora_weights_through_every_loader(lora_run):
    from gymllm import models
    from gymllm.cli.evaluate import load_model

    run, expected = lora_run
    assert any(not np.allclose(expected["a"][k], expected["b"][k]) for k in expected["a"])
    a, b = _flat(models.load(f"{run}#a")), _flat(models.load(f"{run}#b"))
    _assert_weights(a, expected["a"])
    _assert_weights(b, expected["b"])
    assert _hash(a) != _hash(b)
    # gymllm eval env --model.checkpoint RUN#NAME (no --model.name: the model the run trained), and with a model name
    _assert_weights(_flat(load_model(None, checkpoint=f"{run}#b")), expected["b"])
    _assert_weights(
        _flat(load_model("tiny-qwen3", checkpoint=f"{run}/checkpoints#a")), expected["a"]
    )


def test_full_weight_policies_load_their_own_full_weights(tmp_path):
    from gymllm import models

    run = tmp_path / "full"
    expected = _save_policies(run, "full")
    for name in ("a", "b"):
        _assert_weights(_flat(models.load(f"{run}#{name}")), expected[name])
    assert _hash(expected["a"]) != _hash(expected["b"])


def test_bare_unknown_and_misplaced_policy_names_say_what_would_load(lora_run, tmp_path):
    from gymllm import models
    from gymllm.algos.checkpoint import Checkpointer
    from gymllm.train.components import load_model
    from gymllm.train.policies import build_policy_set
    import orbax.checkpoint as ocp

    from gymllm.models.trained import checkpoint_policies, policy_refs, restore_trained

    run, _ = lora_run
    with pytest.raises(ConfigError) as e:
        models.load(str(run))
    msg = str(e.value)
    assert (
        "several policies (a, b)" in msg
        and f"{run}#a" in msg
        and f"{run}#b" in msg
        and f"run:{run}#a" in msg
    )
    with pytest.raises(ConfigError) as e:
        restore_trained(f"{run}#zz")
    assert "'zz'" in str(e.value) and "holds a, b" in str(e.value) and f"{run}#a" in str(e.value)
    # a checkpoint of one policy: '#NAME' is refused, the bare directory loads
    one = tmp_path / "one"
    cfg = _cfg(one, "--multiagent.policies", MAP)
    ps = build_policy_set(cfg, load_model(cfg.model))
    ckpt = Checkpointer(one / "checkpoints")
    ckpt.save(1, ps.learners["a"])
    ckpt.close()
    with pytest.raises(ConfigError, match=f"a checkpoint of one policy. Fix: name it as {one}"):
        restore_trained(f"{one}#a")
    trained, step = restore_trained(one)
    assert step == 1 and all(k.endswith(("lora_a", "lora_b")) for k in trained)
    assert checkpoint_policies(one) == [] and policy_refs(one) == [str(one)]
    # without the run's JSON metadata the policies are read from the arrays' tree
    bare = tmp_path / "bare" / "checkpoints"
    manager = ocp.CheckpointManager(bare)
    manager.save(
        2,
        args=ocp.args.Composite(
            state=ocp.args.StandardSave(
                {"policies": {n: {"trainable": {"w": np.zeros(2, np.float32)}} for n in ("x", "y")}}
            )
        ),
    )
    manager.wait_until_finished()
    manager.close()
    assert checkpoint_policies(bare.parent) == ["x", "y"] and policy_refs(bare) == [
        f"{bare}#x",
        f"{bare}#y",
    ]


def test_a_run_opponent_names_one_policy_and_plays_with_its_weights(lora_run, tmp_path):
    import jax
    import jax.numpy as jnp

    from gymllm import models
    from gymllm.train.opponents import FrozenOpponent
    from gymllm.inference.params import SamplingParams
    from gymllm.models.transformer import Transformer

    run, expected = lora_run
    cfg = _cfg(tmp_path / "vs", "--multiagent.opponent", f"run:{run}#b", "--engine.num-slots", "2")
    opp = FrozenOpponent.build(cfg, None)
    prompt = [1, 5, 9, 13, 2]

    async def reply():
        try:
            return await opp.engine.generate(prompt, SamplingParams(temperature=0.0, max_tokens=1))
        finally:
            await opp.close()

    done = asyncio.run(reply())
    config = models.load(f"{run}#a").model.config
    assert opp.version == -1 and opp.weights_hash() == _hash(expected["b"]) != _hash(expected["a"])

    def logprob(flat):  # the reply's first token under those weights, by a plain forward pass
        model = Transformer(config, params={k: jnp.asarray(v) for k, v in flat.items()})
        logits, _ = model(jnp.asarray([prompt]), jnp.arange(len(prompt))[None])
        return float(jax.nn.log_softmax(logits[0, -1])[done.token_ids[0]])

    assert done.logprobs[0] == pytest.approx(logprob(expected["b"]), abs=1e-3)
    assert (
        abs(done.logprobs[0] - logprob(expected["a"])) > 1e-3
    )  # a's weights would have scored it otherwise
    other = _cfg(
        tmp_path / "vs2", "--model.name", "tiny-llama", "--multiagent.opponent", f"run:{run}#a"
    )
    with pytest.raises(ConfigError, match="a run of this run's model \\(tiny-llama\\)"):
        FrozenOpponent.build(other, None)


class SquareEngine:
    """Test double of the Engine protocol (standing in for a policy's JaxEngine, whose compile is the
    slow part): replies tic-tac-toe squares in reading order, one more per call."""

    def __init__(self, tok):
        self.tok, self.calls, self.max_len = tok, 0, 4096

    async def generate(self, prompt_ids, params, *, session_id=None):
        text = "abc"[self.calls % 3] + "123"[(self.calls // 3) % 3]
        self.calls += 1
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


def test_game_players_of_a_policies_run_are_its_policies_each_rated(lora_run, tmp_path):
    import dataclasses

    from gymllm.cli.game_cli import players_from_flags
    from gymllm.suites.games import MatchConfig, resolve_game, run_matches

    run, expected = lora_run
    players = players_from_flags([], [str(run)], [], ["random"])
    assert [p.label for p in players] == ["ttt#a", "ttt#b", "random"]
    for p, name in zip(
        players, "ab"
    ):  # each player is its policy: the run's model with that policy's weights
        _assert_weights(_flat(p.loaded), expected[name])
    assert [p.label for p in players_from_flags([], [str(run)], ["mine"], [])] == [
        "mine#a",
        "mine#b",
    ]
    assert [p.label for p in players_from_flags([], [f"{run}#b"], [], [])] == ["ttt#b"]
    engines = {p.label: SquareEngine(p.loaded.tokenizer) for p in players[:2]}
    players = [
        dataclasses.replace(p, make_engine=lambda e=engines[p.label]: e) for p in players[:2]
    ] + players[2:]
    summary = run_matches(
        resolve_game("tic-tac-toe"),
        players,
        tmp_path,
        config=MatchConfig(games=2, num_resamples=50),
    )
    assert {(r["player"], r["opponent"]) for r in summary["pairings"]} == {
        (a, b) for a in ("ttt#a", "ttt#b", "random") for b in ("ttt#a", "ttt#b", "random") if a != b
    }
    assert sorted(r["player"] for r in summary["ratings"]["ratings"]) == [
        "random",
        "ttt#a",
        "ttt#b",
    ]
    assert all(e.calls > 0 for e in engines.values())


@pytest.mark.slow  # two tiny engines compile and play (~10-25 s on a shared 2-core machine)
def test_gymllm_eval_game_of_a_policies_run_rates_every_policy(lora_run, tmp_path, capsys):
    from gymllm.cli.main import main

    run, _ = lora_run
    out = tmp_path / "games"
    rc = main(
        [
            "eval",
            "game",
            "tic-tac-toe",
            "--model.checkpoint",
            str(run),
            "--eval.games",
            "2",
            "--sampling.max-tokens",
            "4",
            "--engine.max-len",
            "512",
            "--engine.num-slots",
            "2",
            "--eval.num-resamples",
            "50",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert [p["label"] for p in summary["players"]] == [
        "ttt#a",
        "ttt#b",
    ]  # every policy of the run, a player each
    assert [(r["player"], r["opponent"], r["games"]) for r in summary["pairings"]] == [
        ("ttt#a", "ttt#b", 2),
        ("ttt#b", "ttt#a", 2),
    ]
    ratings = json.loads((out / "ratings.json").read_text())
    assert (
        sorted(r["player"] for r in ratings["ratings"]) == ["ttt#a", "ttt#b"]
        and ratings["games"] == 2
    )
    rows = [json.loads(line) for line in (out / "games.jsonl").read_text().splitlines()]
    assert all(r["moves"] and set(r["players"].values()) == {"ttt#a", "ttt#b"} for r in rows)
    assert "ttt#a" in capsys.readouterr().out


def test_env_eval_of_a_bare_policies_run_names_the_policy_forms(lora_run, capsys):
    from gymllm.cli.main import main

    run, _ = lora_run
    assert (
        main(
            [
                "eval",
                "env",
                "gymllm/TinyRepeat-v0",
                "--model.checkpoint",
                str(run),
                "--eval.seeds",
                "1",
                "--eval.k",
                "1",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert f"{run}#a" in err and f"{run}#b" in err


@pytest.mark.slow  # a tiny two-policy training run, then an env eval of one policy (~60 s on a shared 2-core machine)
def test_a_trained_policies_run_loads_each_policy_as_its_learner_left_it(tmp_path):
    from gymllm import models
    from gymllm.train.run import Run
    from gymllm.cli.evaluate import run_eval
    from gymllm.inference.params import SamplingParams
    from gymllm.rollout.evaluation import EvalConfig

    cfg = _cfg(
        tmp_path,
        "--rollout.group-size",
        "2",
        "--env.num-envs",
        "2",
        "--rollout.max-model-calls",
        "2",
        "--sampling.max-tokens",
        "4",
        "--learner.groups-per-step",
        "1",
        "--learner.num-steps",
        "2",
        "--learner.max-len",
        "256",
        "--rollout.max-staleness",
        "2",
        "--run.no-report",
        "--loss.shaping.no-filter-zero-variance",
        "--loss.entropy-coef",
        "0.01",
        "--run.checkpoint-every",
        "1",
        "--multiagent.policies",
        MAP,
    )
    run = Run(cfg)
    run_to_end(run)
    final = {
        n: {k: np.asarray(v) for k, v in lrn.policy_params().items()}
        for n, lrn in run.learner.learners.items()
    }
    assert _hash(final["a"]) != _hash(final["b"])  # each policy trained its own adapters
    for name in ("a", "b"):
        _assert_weights(_flat(models.load(f"{tmp_path}#{name}")), final[name])
    rows = run_eval(
        ["gymllm/TinyRepeat-v0"],
        checkpoint=f"{tmp_path}#b",
        config=EvalConfig(seeds=1, k=1, max_turns=1, sampling=SamplingParams(max_tokens=4)),
    )
    assert rows[0]["env"] == "gymllm/TinyRepeat-v0" and rows[0]["episodes"] == 1
