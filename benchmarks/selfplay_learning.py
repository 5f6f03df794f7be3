"""Does self-play learn? Each self-play recipe end to end, then its checkpoints measured on held-out games.

For each recipe (``tictactoe_selfplay``, ``kuhn_poker_selfplay``):

1. ``gymllm train RECIPE --run-dir DIR`` (demos -> SFT at ``DIR/sft`` -> self-play GRPO at ``DIR``), timed as
   a whole (goal: <= 20 minutes on the 2-core CPU); its learning curve is read from ``DIR/metrics.jsonl``
   (``eval/vs/<opponent>/...`` at every evaluation step, :mod:`gymllm.suites.game_eval`).
2. ``gymllm eval game`` with each checkpoint (``sft``, ``selfplay``) against fixed players neither
   trained against: ``random`` and a scripted heuristic (tic-tac-toe: ``tictactoe_one_ply``, take a win,
   block a loss; Kuhn poker: ``kuhn_card_player``, bet/call a K, check/fold a J), ``--games`` greedy games
   a pairing (default 128), seats swapped, held-out seeds (``RUN/eval/<label>``; one already there is reused).
   A game that ended in an error (an engine failure, a move past the watchdog) stops the benchmark with
   the most frequent error, nothing recorded; the games are set aside in ``RUN/eval/<label>.failed``.
3. The paired comparison (:mod:`gymllm.suites.game_stats`: self-play minus SFT per seed, Student's t 95%
   interval) and, for Kuhn poker, the action table by card (:func:`gymllm.envs.kuhn_poker.kuhn_action_table`)
   and each checkpoint's exact probability of every legal move in each of the game's four decisions, by card
   (``move_probs``, :func:`kuhn_move_probs`: the policy as it samples, without sampling noise).
4. When the run kept its best in-run checkpoint (``DIR/best``, ``--multiagent.eval-keep-best``:
   :mod:`gymllm.train.best`), that checkpoint too (label ``best``), reported beside the final one: ``best_step``
   and ``best_score`` (from ``DIR/best.json``), ``best_rates`` (``best_vs_<opponent>``) and ``best_paired``
   (best minus SFT, paired by seed, as ``paired``); none of these keys when there is no ``DIR/best``.

Reported per recipe, with each issue-44 goal and whether it is met: tic-tac-toe ``win_or_draw`` of both
checkpoints against random and the one-ply heuristic, the paired gain over SFT and its interval (goals:
>= 0.85 against random after self-play, a gain with its interval above 0, and a rise against the
heuristic); Kuhn poker chips a game against random of both and the paired gain (goal: interval above 0),
and the bet share (where it may bet) and call share (facing a bet) of each card (goal: K above J within a
decision, :func:`k_over_j`), from the greedy games (``shares``) and from the exact probabilities
(``shares_probs``, the goal key ending ``_probs``). ``--eval-only`` measures existing run
directories (``--run-root``) without training; ``--quick`` is a smoke run (2 GRPO steps, 16 games: its
figures do not measure the goals). Extra arguments after ``--`` go to every ``gymllm train``;
``--recipe-set SECTION.KEY=VALUE`` trains from a copy of the recipe with that value
(``RUN_ROOT/<recipe>.toml``, which the evaluation reads too), e.g. the warm start's ``sft.num_steps=12``
or ``sft.demo_policy='"first"'``, which have no ``gymllm train`` flag.

    python benchmarks/selfplay_learning.py --recipe tictactoe_selfplay --run-root runs/selfplay_learning
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import subprocess
import sys
import time
import tomllib

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

REPO = pathlib.Path(__file__).resolve().parents[1]
RECIPES = {
    "tictactoe_selfplay": {
        "game": "tic-tac-toe",
        "heuristic": "gymllm.envs.games:tictactoe_one_ply",
    },
    "kuhn_poker_selfplay": {
        "game": "kuhn-poker",
        "heuristic": "gymllm.envs.kuhn_poker:kuhn_card_player",
    },
}
BUDGET_S = 20 * 60


def run(cmd: list[str], log: pathlib.Path) -> float:
    """Run ``cmd`` (output to ``log``); its wall seconds. A failure raises with the log's tail."""
    t = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{log.read_text()[-3000:]}")
    return time.perf_counter() - t


def recipe_copy(recipe: str, sets: list[str], run_root: pathlib.Path) -> pathlib.Path:
    """``RUN_ROOT/<recipe>.toml``: the shipped recipe with each ``--recipe-set SECTION.KEY=VALUE`` applied
    (VALUE in TOML: ``12``, ``2e-5``, ``"first"``; a key the section lacks is added to it), read back to
    check each value took; the file the run trains from and its evaluation reads."""
    lines = (REPO / "gymllm" / "recipes" / f"{recipe}.toml").read_text().splitlines()
    parsed = []  # (the item as given, section, key, value), each item split once
    for item in sets:
        name, _, value = item.partition("=")
        section, _, key = name.strip().rpartition(".")
        if not (section and key and value.strip()):
            raise SystemExit(f"--recipe-set: expected SECTION.KEY=VALUE, received {item!r}")
        parsed.append((item, section, key, value.strip()))
    for item, section, key, value in parsed:
        start = next((i for i, x in enumerate(lines) if x.strip() == f"[{section}]"), None)
        if start is None:
            raise SystemExit(f"--recipe-set {item!r}: the recipe {recipe} has no [{section}] table")
        end = next(
            (i for i in range(start + 1, len(lines)) if lines[i].startswith("[")), len(lines)
        )
        at = next((i for i in range(start + 1, end) if lines[i].split("=")[0].strip() == key), None)
        if at is None:
            lines.insert(start + 1, f"{key} = {value}")
        else:
            lines[at] = f"{key} = {value}"
    path = run_root / f"{recipe}.toml"
    path.write_text("\n".join(lines) + "\n")
    table = tomllib.loads(path.read_text())
    for item, section, key, value in parsed:
        got, want = table.get(section, {}).get(key), tomllib.loads(f"v = {value}")["v"]
        if got != want:
            raise SystemExit(f"--recipe-set {item!r}: {path} reads {section}.{key} = {got!r}")
    return path


def recipe_table(recipe: str, run_dir: pathlib.Path) -> dict:
    """The recipe ``run_dir`` was trained from: its copy beside the run (:func:`recipe_copy`), else the
    shipped one (a run trained before the copy existed)."""
    copy = run_dir.parent / f"{recipe}.toml"
    path = copy if copy.exists() else REPO / "gymllm" / "recipes" / f"{recipe}.toml"
    return tomllib.loads(path.read_text())


def curve(run_dir: pathlib.Path) -> list[dict]:
    """The run's learning curve: every step record with ``eval/vs/...`` figures."""
    path = run_dir / "metrics.jsonl"
    rows = (
        [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    )
    return [
        {"step": r["step"], **{k[len("eval/vs/") :]: r[k] for k in r if k.startswith("eval/vs/")}}
        for r in rows
        if any(k.startswith("eval/vs/") for k in r)
    ]


def evaluate(
    recipe: str,
    run_dir: pathlib.Path,
    label: str,
    checkpoint: pathlib.Path,
    games: int,
    slots: int = 16,
    temperature: float = 0.0,
) -> list[dict]:
    """``gymllm eval game`` of one checkpoint against the fixed players into ``run_dir/eval/<label>``
    (``<label>-t<temperature>`` when it samples; kept: a directory whose summary has the same games is
    reused); its rows."""
    spec = RECIPES[recipe]
    table = recipe_table(recipe, run_dir)
    out_dir = run_dir / "eval" / (label if temperature == 0 else f"{label}-t{temperature:g}")
    done = out_dir / "summary.json"
    if not (done.exists() and json.loads(done.read_text())["config"]["games"] == games):
        cmd = [
            sys.executable,
            "-m",
            "gymllm.cli.main",
            "eval",
            "game",
            spec["game"],
            "--model.checkpoint",
            str(checkpoint),
            "--model.label",
            label,
            "--opponent",
            "random",
            "--opponent",
            spec["heuristic"],
            "--env-kwargs",
            json.dumps(table["env"].get("kwargs", {})),
            "--eval.games",
            str(games),
            "--sampling.temperature",
            str(temperature),
            "--sampling.max-tokens",
            str(table.get("sampling", {}).get("max_tokens", 6)),
            "--engine.max-len",
            "1024",
            "--engine.num-slots",
            str(slots),
            "--eval.num-resamples",
            "200",
            "--out",
            str(out_dir),
        ]
        run(cmd, run_dir / f"eval_{label}.log")
    rows = [json.loads(x) for x in (out_dir / "games.jsonl").read_text().splitlines() if x.strip()]
    problem = errored(rows, label)
    if problem:
        # set aside (a rerun evaluates again) and stop: no figure is recorded from these games
        failed = out_dir.with_name(out_dir.name + ".failed")
        shutil.rmtree(failed, ignore_errors=True)
        out_dir.rename(failed)
        raise SystemExit(
            f"{problem}; the rows are in {failed / 'games.jsonl'}, the log in {run_dir / f'eval_{label}.log'}"
        )
    return rows


def errored(rows: list[dict], label: str) -> str | None:
    """None when no game of ``rows`` ended in an error; else what went wrong, with the most frequent
    error. A game that errored is scored as the failing side's loss, so rates from such rows would
    measure the failure, not the checkpoint's play: the benchmark records nothing from them."""
    from gymllm.suites.game_tables import top_error

    top = top_error(rows)
    if top is None:
        return None
    bad = sum(r.get("error") is not None for r in rows)
    return (
        f"checkpoint {label!r}: {bad} of {len(rows)} evaluation games ended in an error "
        f"({top['rows']} with: {top['error'][:300]})"
    )


def measure(
    recipe: str, run_dir: pathlib.Path, games: int, slots: int = 16, temperature: float = 0.0
) -> dict:
    """Step 2 and 3 of the module doc on a finished run directory. Each checkpoint is evaluated by its
    own command (the schedule and the random player's draws depend only on the seeds and the games, so
    both meet the same games, as in one command with ``--no-model-pairs``); the rows are then compared."""
    from gymllm.suites.game_stats import paired_comparisons
    from gymllm.suites.game_tables import summarize_games

    spec = RECIPES[recipe]
    kwargs = recipe_table(recipe, run_dir)["env"].get("kwargs", {})
    best = run_dir / "best"
    t = time.perf_counter()
    rows = evaluate(recipe, run_dir, "sft", run_dir / "sft", games, slots, temperature) + evaluate(
        recipe, run_dir, "selfplay", run_dir, games, slots, temperature
    )
    if best.is_dir():  # the best in-run checkpoint (--multiagent.eval-keep-best)
        rows += evaluate(recipe, run_dir, "best", best, games, slots, temperature)
    eval_s = time.perf_counter() - t
    h = spec["heuristic"]
    labels = ["sft", "selfplay", "best", "random", h]
    rates = {
        f"{x['player']}_vs_{x['opponent'].rsplit(':', 1)[-1]}": {
            k: x[k] for k in ("games", "win", "draw", "loss")
        }
        for x in summarize_games(rows, labels)
        if x["player"] in ("sft", "selfplay", "best")
    }
    for v in rates.values():
        v["win_or_draw"] = v["win"] + v["draw"] if v["win"] is not None else None

    def paired_with_sft(player: str) -> dict:
        return {
            f"{d['metric']}_vs_{d['opponent'].rsplit(':', 1)[-1]}": {
                k: d[k] for k in ("n", "mean_a", "mean_b", "diff", "lo", "hi")
            }
            for d in paired_comparisons(rows, ["sft", player], ["random", h])
        }

    paired = paired_with_sft("selfplay")
    out = {
        "eval_s": eval_s,
        "games": games,
        "rates": {k: v for k, v in rates.items() if not k.startswith("best_")},
        "paired": paired,
    }
    if best.is_dir():
        record = json.loads((run_dir / "best.json").read_text())
        out.update(
            best_step=record["step"],
            best_score=record["score"],
            best_rates={k: v for k, v in rates.items() if k.startswith("best_")},
            best_paired=paired_with_sft("best"),
        )
    h = spec["heuristic"].rsplit(":", 1)[-1]
    if recipe == "tictactoe_selfplay":
        wd = paired.get("win_or_draw_vs_random", {})
        out["goals"] = {
            "selfplay_win_or_draw_vs_random>=0.85": rates["selfplay_vs_random"]["win_or_draw"]
            >= 0.85,
            "gain_over_sft_vs_random_interval_above_0": wd.get("lo", -1) > 0,
            f"win_or_draw_vs_{h}_rises": paired.get(f"win_or_draw_vs_{h}", {}).get("diff", 0) > 0,
        }
    else:
        from gymllm.envs.kuhn_poker import kuhn_action_table

        actions = {p: kuhn_action_table(rows, p, **kwargs) for p in ("sft", "selfplay")}
        out["actions"] = {
            p: {
                c: {
                    k: t[k]
                    for k in ("decisions", "aggressive", "[bet]", "[check]", "[call]", "[fold]")
                }
                for c, t in tab.items()
            }
            for p, tab in actions.items()
        }
        out["shares"] = {p: situation_shares(tab) for p, tab in actions.items()}
        t = time.perf_counter()
        out["move_probs"] = {
            label: kuhn_move_probs(run_dir, path, recipe)
            for label, path in (("sft", run_dir / "sft"), ("selfplay", run_dir))
        }
        out["probs_s"] = time.perf_counter() - t
        out["shares_probs"] = {p: prob_shares(tab) for p, tab in out["move_probs"].items()}
        chips = paired.get("reward_vs_random", {})
        out["goals"] = {
            "chips_gain_over_sft_vs_random_interval_above_0": chips.get("lo", -1) > 0,
            "selfplay_bets_or_calls_K_more_than_J": k_over_j(out["shares"]["selfplay"]),
            "selfplay_bets_or_calls_K_more_than_J_probs": k_over_j(out["shares_probs"]["selfplay"]),
        }
    return out


#: Kuhn poker's four decisions, by the moves before them (hand 1: player_1 acts first)
KUHN_SITUATIONS = {
    "first to act": [],
    "second, after a check": ["[check]"],
    "second, facing a bet": ["[bet]"],
    "first, facing a bet after checking": ["[check]", "[bet]"],
}


def kuhn_move_probs(run_dir: pathlib.Path, checkpoint: pathlib.Path, recipe: str) -> dict:
    """The checkpoint's probability of each legal move in each of Kuhn poker's decisions, by card, scored
    exactly (:func:`gymllm.suites.move_probs.decision_table`; the prompt as training builds it)."""
    from gymllm.cli.evaluate import load_model
    from gymllm.envs.kuhn_poker import KUHN_CARDS, KUHN_MOVES, kuhn_poker
    from gymllm.suites.move_probs import decision_table

    env = recipe_table(recipe, run_dir)["env"]
    return decision_table(
        load_model(None, checkpoint=str(checkpoint)),
        kuhn_poker(**env.get("kwargs", {})),
        situations=KUHN_SITUATIONS,
        key="card",
        values=KUHN_CARDS,
        move_names=KUHN_MOVES,
        system_prompt=env.get("system_prompt"),
    )


def prob_shares(table: dict) -> dict:
    """:func:`situation_shares` from exact probabilities: per card, the mean probability of a bet over the
    decisions where it may bet, and of a call over those facing a bet."""
    out: dict = {}
    for card in next(iter(table.values())):
        bets = [row[card]["[bet]"] for row in table.values() if "[bet]" in row[card]]
        calls = [row[card]["[call]"] for row in table.values() if "[call]" in row[card]]
        out[card] = {"bet": sum(bets) / len(bets), "call": sum(calls) / len(calls)}
    return out


def situation_shares(table: dict) -> dict:
    """Per card, the share of its bets where it may bet (``bet``: bet / (bet + check)) and of its calls
    facing a bet (``call``: call / (call + fold)); None where the card met no such decision. A policy's
    overall bet-or-call share also depends on how often each card meets each decision, so card dependence
    is read within a decision."""

    def share(a: int, b: int) -> float | None:
        return a / (a + b) if a + b else None

    return {
        c: {"bet": share(t["[bet]"], t["[check]"]), "call": share(t["[call]"], t["[fold]"])}
        for c, t in table.items()
    }


def k_over_j(shares: dict) -> bool:
    """Issue 44's card dependence: within each decision the K bets (or calls) at least as often as the J, and
    more often in one of them (a decision neither card met is left out)."""
    pairs = [
        (shares["K"][d], shares["J"][d])
        for d in ("bet", "call")
        if shares["K"][d] is not None and shares["J"][d] is not None
    ]
    return bool(pairs) and all(k >= j for k, j in pairs) and any(k > j for k, j in pairs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--recipe", action="append", choices=sorted(RECIPES), help="repeatable (default: both)"
    )
    ap.add_argument(
        "--run-root",
        default="runs/selfplay_learning",
        help="run directories go under it, one per recipe",
    )
    ap.add_argument(
        "--games", type=int, default=128, help="games a pairing in the final evaluation (even)"
    )
    ap.add_argument(
        "--eval-slots",
        type=int,
        default=16,
        help="rows each evaluation engine decodes together (gymllm eval's default 16; an accelerator "
        "decodes 64 rows about as fast as 16); every checkpoint of a run is evaluated with the same",
    )
    ap.add_argument(
        "--eval-temperature",
        type=float,
        default=0.0,
        help="sampling temperature of the final evaluation: 0 plays each checkpoint's most likely move "
        "(greedy), 1 plays the policy as the mixed strategy it samples (a poker equilibrium is mixed)",
    )
    ap.add_argument(
        "--recipe-set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="train from a copy of the recipe with this value (TOML: 12, 2e-5, '\"first\"'), e.g. the warm "
        "start's sft.num_steps=12 or sft.demo_policy='\"first\"', which have no gymllm train flag; "
        "repeatable; the copy is RUN_ROOT/<recipe>.toml",
    )
    ap.add_argument(
        "--eval-only", action="store_true", help="measure existing run directories, no training"
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 2 GRPO steps, 16 games (not the goals' figures)",
    )
    ap.add_argument("extra", nargs="*", help="arguments for gymllm train (after --)")
    args = ap.parse_args()
    from gymllm.utils.host import describe_cpu, loadavg

    cpu, load0 = describe_cpu(), loadavg()
    print(f"CPU: {cpu}; load average {load0}", flush=True)
    games = 16 if args.quick else args.games
    extra = [*args.extra, *(["--learner.num-steps", "2"] if args.quick else [])]
    result: dict = {"cpu": cpu, "quick": args.quick}
    for recipe in args.recipe or sorted(RECIPES):
        run_dir = (REPO / args.run_root / recipe).resolve()
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        fig: dict = {}
        if not args.eval_only:
            fig["train_s"] = run(
                [
                    sys.executable,
                    "-m",
                    "gymllm.cli.main",
                    "train",
                    str(recipe_copy(recipe, args.recipe_set, run_dir.parent)),
                    "--run-dir",
                    str(run_dir),
                    *extra,
                ],
                run_dir.parent / f"{recipe}.train.log",
            )
            fig["within_20_min"] = fig["train_s"] <= BUDGET_S
        stages = (
            json.loads((run_dir / "stages.json").read_text())
            if (run_dir / "stages.json").exists()
            else {}
        )
        fig["sft_s"] = stages.get("sft", {}).get("wall_s")
        fig["curve"] = curve(run_dir)
        fig["eval_temperature"] = args.eval_temperature
        fig.update(measure(recipe, run_dir, games, args.eval_slots, args.eval_temperature))
        print(f"{recipe}: {json.dumps(fig)}", flush=True)
        result[recipe] = fig
    result["loadavg"] = {"start": load0, "end": loadavg()}
    from results import emit_result
    from results.device import child_device_info

    # the device `gymllm train` and `gymllm eval` ran on (this process never imports JAX)
    emit_result("selfplay_learning", result, device=child_device_info())


if __name__ == "__main__":
    main()
