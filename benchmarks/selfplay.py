"""Self-play games per second: barrier-free games on one engine against lock-step turns.

Both sides play the same self-play games (the learner at every seat) of tic-tac-toe and connect-four
on one model, in one process, the same engine config, the same env seeds, the same sampling seeds and
the same moves' reply caps:

* ``barrier_free``: :class:`gymllm.rollout.seat_source.SeatGroupSource`, what ``gymllm train`` runs on a
  game: every game is its own coroutine and waits only for its own next mover, so moves of different
  games interleave in the engine's continuous batch; a batch of ``--group-size`` games from one seed
  is admitted as soon as that many of the ``--num-slots / 2`` in-flight places are free. Timed until
  ``--num-games`` games have ended (the batches still in flight are not counted).
* ``lockstep``: what a synchronous trainer writes over the same pieces (``SeatGamePlayer.new_game``,
  ``play_move``, :class:`~gymllm.rollout.episode.Episode`): a wave of ``--num-slots / 2`` games (the
  same batches, members and seeds) is reset together; each turn every live game's current mover is
  asked in one batched engine call (``asyncio.gather`` over the engine: the engine batches them), the
  next turn starts when all replies are back, a finished game leaves the wave, and the next wave
  starts when every game of this one has ended. Every game waits for the slowest mover of each turn.

Each game's two seats keep their own session (KV row between turns, their prefix reused), hence two
engine rows per game in flight: ``--num-slots`` rows hold ``--num-slots / 2`` games on both sides.
The replies of random weights never name a move, so the benchmark trains with
``multiagent.illegal_move = "random"`` (an illegal reply is replaced by a random legal move from the
game's own RNG, the same on both sides) and games run their natural length (tic-tac-toe 5-9 moves,
connect-four 7-42). A seat's moves past ``--max-model-calls`` (or its context) are random legal moves,
unrecorded, on both sides. Random weights also never stop early, so every reply would run to
``--max-tokens``; each move's reply cap is instead drawn from a lognormal (median ``--reply-median``,
99th percentile ``--reply-p99`` tokens, at most ``--max-tokens``) keyed on the move's session and
index (:class:`ReplyPlan`), a stand-in for a trained model's replies of varying length, identical on
both sides (``--reply-median 0``: every reply ``--max-tokens``).

Rounds: one untimed warm-up round of a wave per game and side (it compiles the shapes the games meet;
``--full-warmup`` compiles every shape first), then ``--rounds`` rounds, each game and side with a fresh
engine of the one config (an engine reused across sides would hand the second side the first's cached
prefixes: the prompts are the same), the side order alternating by round. Figures: games/s per side
(median over rounds, with the min-max spread), their ratio per game and over both games (total games
/ total seconds), ``games_match`` (the share of games whose seats' rewards agree on both sides:
batching may change the numerics, and with it a sampled token) and, per round, the programs compiled
inside it (``jax.monitoring``: a shape first met in a timed round; ``compiles`` in ``rounds``).

What the two sides cost (``--quick``, tiny model, a contended 2-core CPU): barrier-free runs about
2.2x fewer decode steps (each turn of a lock-step wave lasts as long as its longest reply) but they
are wider, and a CPU decode step costs about in proportion to its rows, so fewer wider steps save
little; and its moves reach the engine one by one, so it makes about 2.5x the prefill calls of
lock-step's whole-turn batches (345 against 140 on tic-tac-toe, counted by wrapping the engine's
device calls), each costing about the same there: about 1x on that CPU. On an accelerator a decode
step costs about the same from 1 to 128 rows, which is where the steps saved count;
``--piggyback-tokens 0,256`` also offers both sides the engine config whose new turns ride along
decode steps instead of prefill calls of their own, and ``--engine FIELD=VALUE`` sets any other
:class:`~gymllm.inference.config.EngineConfig` field for both sides (``max_prefill_batch=32`` lets a
lock-step turn prefill in fewer calls).

RESULT keys: ``selfplay_vs_lockstep`` (barrier-free games/s / lock-step games/s over both games,
medians, each side at the engine config that served it best; goal >= 2), ``barrier_free_games_per_s``,
``lockstep_games_per_s``, ``best_piggyback_tokens``, ``per_game`` (each game's figures, spreads and
decode steps, first config), ``rounds``, ``games_match``, ``configs`` (every config's figures, when
more than one), ``device``, ``workload``.

    python benchmarks/selfplay.py --quick                     # tiny random model, ~2 minutes idle
    python benchmarks/selfplay.py --model shape:smollm2-135m --piggyback-tokens 0,256   # on a GPU
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import time
import zlib
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

GAMES = ("tic-tac-toe", "connect-four")
# flag -> (default, --quick); --quick never overrides a flag given explicitly
DEFAULTS = {
    "num_games": (256, 64),
    "num_slots": (128, 32),
    "group_size": (8, 4),
    "rounds": (3, 3),
    "max_tokens": (128, 48),
    "reply_median": (16.0, 8.0),
    "reply_p99": (128.0, 48.0),
    "max_len": (4096, 1024),
    "max_model_calls": (24, 5),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--quick", action="store_true", help="tiny sizes (about 2 minutes on an idle CPU)"
    )
    p.add_argument(
        "--model",
        default="tiny",
        help="tiny (the tiny random model), shape:smollm2-135m (SmolLM2-135M's "
        "architecture, random weights) or a name gymllm.models.load takes",
    )
    p.add_argument("--games", default=",".join(GAMES), help="comma list of registered games")
    p.add_argument(
        "--num-games",
        type=int,
        default=None,
        help="games per side, game and round (a multiple of the wave: num-slots / 2)",
    )
    p.add_argument(
        "--num-slots", type=int, default=None, help="the engine's KV rows (two per game in flight)"
    )
    p.add_argument("--group-size", type=int, default=None, help="games per batch (one env seed)")
    p.add_argument("--rounds", type=int, default=None, help="timed rounds (after one warm-up)")
    p.add_argument("--max-tokens", type=int, default=None, help="a reply's most tokens")
    p.add_argument(
        "--reply-median",
        type=float,
        default=None,
        help="median reply cap (tokens; 0: all --max-tokens)",
    )
    p.add_argument(
        "--reply-p99", type=float, default=None, help="99th percentile reply cap (tokens)"
    )
    p.add_argument("--max-len", type=int, default=None, help="the engine's context per row")
    p.add_argument(
        "--max-model-calls",
        type=int,
        default=None,
        help="model moves per seat per game (then random)",
    )
    p.add_argument(
        "--piggyback-tokens",
        default="0",
        help="comma list of EngineConfig.piggyback_tokens values, "
        "each an engine config both sides are measured on (a turn's new tokens up to this bucket ride "
        "along decode steps instead of a prefill call of their own; 0: off)",
    )
    p.add_argument(
        "--engine",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="an EngineConfig field for "
        "both sides' engines, e.g. max_prefill_batch=32 or decode_chunk=8 (repeatable)",
    )
    p.add_argument(
        "--compute-dtype",
        default="auto",
        help="EngineConfig.compute_dtype ('auto', 'bfloat16', 'none')",
    )
    p.add_argument(
        "--compile-cache", default=None, help="directory for JAX's persistent compilation cache"
    )
    p.add_argument(
        "--full-warmup",
        action="store_true",
        help="compile every engine shape up front "
        "(JaxEngine.warmup) instead of a warm-up round (minutes on a small CPU)",
    )
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    for flag, (full, quick) in DEFAULTS.items():
        if getattr(a, flag) is None:
            setattr(a, flag, quick if a.quick else full)
    a.games = [g.strip() for g in a.games.split(",") if g.strip()]
    a.piggyback = [int(x) for x in str(a.piggyback_tokens).split(",") if x.strip()]
    import engine_settings

    own = ("num_slots", "max_len", "piggyback_tokens", "compute_dtype")
    a.engine_fields = dict(engine_settings.parse(item, reserved=own) for item in a.engine)
    if a.rounds < 1:
        p.error(f"--rounds: expected at least 1 timed round, received {a.rounds}")
    wave = a.num_slots // 2
    if wave < a.group_size or wave % a.group_size:
        p.error(
            f"--num-slots: expected twice a multiple of --group-size {a.group_size} (two rows per game in "
            f"flight), received {a.num_slots}; e.g. --num-slots {4 * a.group_size}"
        )
    if a.num_games < wave or a.num_games % wave:
        p.error(
            f"--num-games: expected a multiple of the wave (num-slots / 2 = {wave}), received {a.num_games}"
        )
    return a


def load_model(spec: str):
    """``tiny``: the tiny random Llama; ``shape:NAME``: NAME's architecture with random weights
    (``benchmarks/accelerator_check.py``); else ``gymllm.models.load(spec)``."""
    if spec == "tiny":
        from gymllm.models.tiny import make_tiny

        return make_tiny("llama", seed=0)
    if spec.startswith("shape:"):
        from accelerator_check import shaped_model

        return shaped_model(spec)
    from gymllm.models import load

    return load(spec)


class ReplyPlan:
    """Engine wrapper: the reply of call ``n`` of session ``s`` is capped at a length drawn from a
    lognormal seeded by ``(seed, crc32(s), n)`` (same on both sides; see the module docstring)."""

    def __init__(self, engine: Any, *, median: float, p99: float, max_tokens: int, seed: int):
        self.engine, self.median, self.p99, self.max_tokens, self.seed = (
            engine,
            median,
            p99,
            max_tokens,
            seed,
        )
        self.calls: dict[str, int] = {}
        self.tokens = 0

    def __getattr__(self, name: str) -> Any:  # version, max_len, ... of the engine
        return getattr(self.engine, name)

    def cap(self, session: str, n: int) -> int:
        if self.median <= 0:
            return self.max_tokens
        import numpy as np

        rng = np.random.default_rng([self.seed, zlib.crc32(session.encode()), n])
        sigma = max(math.log(self.p99 / self.median) / 2.326, 1e-6)
        return int(
            min(
                self.max_tokens,
                max(1, round(self.median * math.exp(sigma * rng.standard_normal()))),
            )
        )

    async def generate(self, prompt_ids, params, *, session_id=None):
        n = self.calls.get(session_id, 0)
        self.calls[session_id] = n + 1
        out = await self.engine.generate(
            prompt_ids,
            params.replace(max_tokens=self.cap(str(session_id), n)),
            session_id=session_id,
        )
        self.tokens += len(out.token_ids)
        return out

    def end_session(self, session_id: str) -> None:
        self.engine.end_session(session_id)


def make_source(game: str, engine: Any, lm: Any, a: argparse.Namespace):
    from gymllm.inference.params import SamplingParams
    from gymllm.multiagent.factory import game_factory
    from gymllm.rollout import ModelAgent
    from gymllm.rollout.config import RolloutConfig
    from gymllm.rollout.seat_source import MultiAgentSection, SeatGroupSource

    wave = a.num_slots // 2
    r = RolloutConfig(
        group_size=a.group_size,
        max_concurrency=wave,
        max_staleness=None,
        max_model_calls=a.max_model_calls,
        queue_size=a.num_games,
    )
    return SeatGroupSource(
        game_factory(game),
        engine,
        ModelAgent(lm.tokenizer),
        rollout=r,
        seed=a.seed,
        sampling=SamplingParams(temperature=1.0, max_tokens=a.max_tokens),
        config=MultiAgentSection(opponent="self", illegal_move="random"),
    )


async def barrier_free(src: Any, n_games: int) -> tuple[float, dict]:
    """Groups from the seat source until ``n_games`` games have ended; returns (seconds, outcomes)."""
    outcomes: dict = {}
    t0 = time.perf_counter()
    await src.start()
    try:
        while src.counts["games"] < n_games:
            for g in await src.next_groups():
                k = int(g.group_id.split(":")[0][1:])
                for t in g.trajectories:
                    outcomes[(k, t.info["game"], t.info["agent"])] = round(float(t.reward), 4)
        wall = time.perf_counter() - t0
    finally:
        await src.close()
    return wall, outcomes


class LockstepGame:
    """One game of a lock-step wave: :meth:`SeatGamePlayer.play_game`'s moves (self-play), split at the
    model call so a loop can ask every game's mover in one batched call."""

    def __init__(self, src: Any, k: int, member: int):
        import numpy as np

        from gymllm.rollout.episode import Episode, EpisodeKey

        self.src, self.k, self.member, self.seed = src, k, member, src.seed + k
        self.game = src.player.new_game()
        self.rng = np.random.default_rng([self.seed, member])
        self.tally: dict = {"illegal": {}, "errors": {}}
        self.owed: dict[str, float] = {}
        self.started: set[str] = set()
        n = len(src.possible)
        self.episodes = {
            seat: Episode(
                EpisodeKey(
                    group_index=k,
                    member=member * n + i,
                    env_seed=self.seed,
                    task_id=f"seed{self.seed}",
                ),
                src.agent,
                src.sampling,
                base_seed=src.seed,
                max_model_calls=src.rollout.max_model_calls,
                env_id=member,
            )
            for i, seat in enumerate(src.possible)
        }
        self.limit = src.rollout.prompt_limit(src.engine)
        self.mover: str | None = None
        self.game.reset(seed=self.seed)

    def advance(self) -> tuple[list[int], Any, str] | None:
        """Play dead steps and over-budget moves up to the next model move: its (prompt, params,
        session), or None when the game has ended."""
        from gymllm.multiagent.policies import policy_move

        game = self.game
        while game.agents:
            agent = game.agent_selection
            obs, reward, term, trunc, info = game.last()
            reward = float(reward) + self.owed.pop(agent, 0.0)
            ep = self.episodes[agent]
            info = {**info, "agent": agent}
            if term or trunc:
                if agent not in self.started:
                    self.started.add(agent)
                    ep.begin(obs["observation"], info)
                if not ep.done:
                    ep.on_step(obs["observation"], reward, term, trunc, info, 0.0)
                else:
                    ep.rewards.append(reward)
                game.step(None)
                continue
            if agent not in self.started:
                self.started.add(agent)
                ep.begin(obs["observation"], info)
            elif not ep.done:
                ep.on_step(obs["observation"], reward, False, False, info, 0.0)
            else:
                ep.rewards.append(reward)
            if ep.done or not ep.fits(self.limit):
                game.step(
                    policy_move(None, game, agent, self.rng)
                )  # over its budget: unrecorded, as play_game
                continue
            self.mover = agent
            prompt, params = ep.next_request()
            return prompt, params, ep.key.trajectory_id
        for seat, ep in self.episodes.items():
            if seat in self.started and not ep.done:
                ep.on_step(
                    "The game is over.", self.owed.pop(seat, 0.0), True, False, {"agent": seat}, 0.0
                )
        return None

    def apply(self, completion: Any) -> None:
        agent, ep = self.mover, self.episodes[self.mover]
        owe = self.src.player.play_move(
            self.game, agent, ep.on_completion(completion, 0.0), self.rng, self.tally
        )
        if owe:
            self.owed[agent] = self.owed.get(agent, 0.0) + owe

    def close(self, engine: Any) -> dict:
        for ep in self.episodes.values():
            engine.end_session(ep.key.trajectory_id)
        self.game.close()
        return {
            (self.k, self.member, seat): round(float(sum(ep.rewards)), 4)
            for seat, ep in self.episodes.items()
            if seat in self.started
        }


async def lockstep(src: Any, engine: Any, n_games: int, wave: int) -> tuple[float, dict]:
    """Waves of ``wave`` games, turn by turn, one batched engine call per turn; returns (seconds, outcomes)."""
    G = src.rollout.group_size
    outcomes: dict = {}
    t0 = time.perf_counter()
    for w in range(n_games // wave):
        games = [
            LockstepGame(src, k, m)
            for k in range(w * wave // G, (w + 1) * wave // G)
            for m in range(G)
        ]
        live = games
        while live:
            asks = [(g, g.advance()) for g in live]
            live = [(g, req) for g, req in asks if req is not None]
            replies = await asyncio.gather(
                *(engine.generate(p, params, session_id=s) for _, (p, params, s) in live)
            )
            for (g, _), c in zip(live, replies):
                g.apply(c)
            live = [g for g, _ in live]
        for g in games:
            outcomes.update(g.close(engine))
    return time.perf_counter() - t0, outcomes


def engine_for(lm: Any, a: argparse.Namespace, warm: bool, piggyback: int = 0) -> Any:
    from gymllm.inference.config import EngineConfig
    from gymllm.inference.jax_engine import JaxEngine

    dtype = None if a.compute_dtype == "none" else a.compute_dtype
    engine = JaxEngine(
        lm.model,
        lm.tokenizer,
        config=EngineConfig(
            **{
                "min_bucket": 16,
                **a.engine_fields,
                "num_slots": a.num_slots,
                "max_len": a.max_len,
                "compute_dtype": dtype,
                "piggyback_tokens": piggyback,
            }
        ),
    )
    if warm:
        engine.warmup()
    return ReplyPlan(
        engine, median=a.reply_median, p99=a.reply_p99, max_tokens=a.max_tokens, seed=a.seed
    )


COMPILED = {"n": 0, "s": 0.0}


def on_event(event: str, duration: float, **_: Any) -> None:
    if event.startswith("/jax/core/compile/"):
        COMPILED["s"] += duration
        COMPILED["n"] += event.endswith("backend_compile_duration")


def run_side(
    side: str,
    game: str,
    lm: Any,
    a: argparse.Namespace,
    n_games: int,
    warm: bool = False,
    piggyback: int = 0,
) -> dict:
    n0, s0 = COMPILED["n"], COMPILED["s"]
    plan = engine_for(lm, a, warm, piggyback)
    src = make_source(game, plan, lm, a)
    try:
        if side == "barrier_free":
            wall, outcomes = asyncio.run(barrier_free(src, n_games))
        else:
            wall, outcomes = asyncio.run(lockstep(src, plan, n_games, a.num_slots // 2))
    finally:
        plan.engine.shutdown()
    stats = {
        k: plan.engine.stats[k] for k in ("decode_steps", "prefill_tokens", "generated_tokens")
    }
    return {
        "wall_s": wall,
        "games": len({(k, m) for k, m, _ in outcomes}),
        "outcomes": outcomes,
        **stats,
        "tokens": plan.tokens,
        "compiles": COMPILED["n"] - n0,
        "compile_s": round(COMPILED["s"] - s0, 2),
    }


def by_game(outcomes: dict) -> dict:
    """``{(batch, member, seat): reward}`` -> ``{(batch, member): sorted ((seat, reward), ...)}``."""
    out: dict = {}
    for (k, m, seat), r in outcomes.items():
        out.setdefault((k, m), []).append((seat, r))
    return {km: tuple(sorted(v)) for km, v in out.items()}


def spread(xs: list[float]) -> list[float]:
    return [round(min(xs), 3), round(max(xs), 3)]


def median_rounds(rows: list[dict], key: str) -> float:
    """The median of ``key`` over the rounds that compiled nothing (all of them if every round did)."""
    clean = [r for r in rows if r["compiles"] == 0] or rows
    return statistics.median(r[key] for r in clean)


def measure(a: argparse.Namespace, lm: Any, piggyback: int) -> dict:
    """Warm-up, then ``a.rounds`` interleaved rounds of both sides on every game, one engine config."""
    t = time.perf_counter()
    n0 = COMPILED["n"]
    for game in (
        a.games
    ):  # warm-up: compiles the shapes a wave meets (untimed); later engines reuse the programs
        for side in ("barrier_free", "lockstep"):
            run_side(side, game, lm, a, a.num_slots // 2, warm=a.full_warmup, piggyback=piggyback)
    print(
        f"[piggyback {piggyback}] warm-up {time.perf_counter() - t:.1f} s, {COMPILED['n'] - n0} programs compiled",
        flush=True,
    )
    rounds: dict[str, dict[str, list[dict]]] = {
        g: {"barrier_free": [], "lockstep": []} for g in a.games
    }
    last: dict[tuple[str, str], dict] = {}
    for r in range(a.rounds):
        for game in a.games:
            for side in (
                ("barrier_free", "lockstep") if r % 2 == 0 else ("lockstep", "barrier_free")
            ):
                out = run_side(side, game, lm, a, a.num_games, piggyback=piggyback)
                last[(game, side)] = out
                row = {
                    "wall_s": round(out["wall_s"], 3),
                    "games": out["games"],
                    "games_per_s": round(out["games"] / out["wall_s"], 3),
                }
                row.update(
                    {
                        k: out[k]
                        for k in (
                            "tokens",
                            "decode_steps",
                            "prefill_tokens",
                            "compiles",
                            "compile_s",
                        )
                    }
                )
                rounds[game][side].append(row)
                print(
                    f"[piggyback {piggyback}] round {r} {game:13s} {side:12s} {out['games']:4d} games in "
                    f"{out['wall_s']:7.2f} s = {row['games_per_s']:7.2f} games/s, {out['tokens']} tokens, "
                    f"{out['decode_steps']} decode steps, {out['compiles']} compiles ({out['compile_s']} s)",
                    flush=True,
                )
    per_game: dict[str, Any] = {}
    wall = {"barrier_free": 0.0, "lockstep": 0.0}
    matched = compared = 0
    for game in a.games:
        row: dict[str, Any] = {}
        for side in ("barrier_free", "lockstep"):
            rows = rounds[game][side]
            row[f"{side}_games_per_s"] = round(median_rounds(rows, "games_per_s"), 3)
            row[f"{side}_spread"] = spread([x["games_per_s"] for x in rows])
            row[f"{side}_decode_steps"] = median_rounds(rows, "decode_steps")
            wall[side] += median_rounds(rows, "wall_s")
        row["ratio"] = round(row["barrier_free_games_per_s"] / row["lockstep_games_per_s"], 3)
        row["ratio_spread"] = spread(
            [
                b["games_per_s"] / s["games_per_s"]
                for b, s in zip(rounds[game]["barrier_free"], rounds[game]["lockstep"])
            ]
        )
        bf, ls = (by_game(last[(game, side)]["outcomes"]) for side in ("barrier_free", "lockstep"))
        games = bf.keys() & ls.keys()
        same = sum(bf[km] == ls[km] for km in games)
        row["games_match"] = round(same / max(len(games), 1), 3)
        matched, compared = matched + same, compared + len(games)
        per_game[game] = row
        print(
            f"[piggyback {piggyback}] {game}: barrier-free {row['barrier_free_games_per_s']} games/s "
            f"{row['barrier_free_spread']}, lock-step {row['lockstep_games_per_s']} {row['lockstep_spread']}: "
            f"{row['ratio']}x (rounds {row['ratio_spread']}); decode steps {row['barrier_free_decode_steps']} vs "
            f"{row['lockstep_decode_steps']}; games match {row['games_match']}",
            flush=True,
        )
    n = a.num_games * len(a.games)
    bf_rate, ls_rate = n / wall["barrier_free"], n / wall["lockstep"]
    return {
        "selfplay_vs_lockstep": round(bf_rate / ls_rate, 3),
        "barrier_free_games_per_s": round(bf_rate, 3),
        "lockstep_games_per_s": round(ls_rate, 3),
        "per_game": per_game,
        "rounds": rounds,
        "games_match": round(matched / max(compared, 1), 3),
    }


def main(argv: list[str] | None = None) -> None:
    from results.device import choose_platform_args

    argv = choose_platform_args(
        argv
    )  # --cpu: JAX on the CPU (children too); else JAX_PLATFORMS or JAX's default
    a = parse_args(argv)
    import jax

    if a.compile_cache:
        jax.config.update("jax_compilation_cache_dir", a.compile_cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.monitoring.register_event_duration_secs_listener(on_event)
    from gymllm.utils.host import describe_cpu

    dev = jax.devices()[0]
    device = f"{dev.platform}: {dev.device_kind}" + (
        f" ({describe_cpu()}, {os.cpu_count()} cores)" if dev.platform == "cpu" else ""
    )
    load0 = os.getloadavg()[0]
    print(
        f"device {device}; load average {load0:.1f}; model {a.model}; games {a.games}; {a.num_games} games per "
        f"side/game/round, {a.num_slots // 2} in flight ({a.num_slots} rows), G={a.group_size}; engine configs "
        f"piggyback_tokens {a.piggyback}",
        flush=True,
    )
    lm = load_model(a.model)
    configs = {p: measure(a, lm, p) for p in a.piggyback}
    # each side at the engine config that serves it best (both were offered the same configs)
    best_bf = max(configs, key=lambda p: configs[p]["barrier_free_games_per_s"])
    best_ls = max(configs, key=lambda p: configs[p]["lockstep_games_per_s"])
    bf_rate, ls_rate = (
        configs[best_bf]["barrier_free_games_per_s"],
        configs[best_ls]["lockstep_games_per_s"],
    )
    first = configs[a.piggyback[0]]
    result = {
        "selfplay_vs_lockstep": round(bf_rate / ls_rate, 3),
        "barrier_free_games_per_s": bf_rate,
        "lockstep_games_per_s": ls_rate,
        "best_piggyback_tokens": {"barrier_free": best_bf, "lockstep": best_ls},
        "per_game": first["per_game"],
        "games_match": first["games_match"],
        "rounds": first["rounds"],
        "configs": {str(p): c for p, c in configs.items()},
        "model": a.model,
        "device": device,
        "quick": a.quick,
        "load_average": [round(load0, 2), round(os.getloadavg()[0], 2)],
        "workload": {
            k: getattr(a, k)
            for k in (
                "games",
                "num_games",
                "num_slots",
                "group_size",
                "rounds",
                "max_tokens",
                "reply_median",
                "reply_p99",
                "max_len",
                "max_model_calls",
                "piggyback",
                "compute_dtype",
                "engine_fields",
                "seed",
            )
        },
    }
    if len(configs) == 1:
        del result["configs"]
    from results import emit_result  # the RESULT line, and its record in benchmarks/results/

    emit_result("selfplay", result, tpu_keys={"selfplay_vs_lockstep": "selfplay_vs_lockstep_tpu"})


if __name__ == "__main__":
    main()
