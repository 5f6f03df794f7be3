"""gymllm side by side with its peers: Tunix (batch and agentic GRPO) and TRL's GRPOTrainer, one invocation.

Every side runs the same GRPO step on the same spec, built once here (:func:`peer_spec`) and handed
to each side's runner as one JSON file, so no side's config is typed twice:

* model: Qwen3 layout, random init, float32, tied embeddings. ``tiny``: 2 layers, d 64, ffn 128,
  4 heads of 16, 2 kv heads, vocab 512 (107k parameters); ``medium``: 4 layers, d 128, ffn 256,
  8 heads of 16, 4 kv heads (657k); ``smollm2`` (for an accelerator; not in the default sizes):
  SmolLM2-135M's shape, 30 layers, d 576, ffn 1536, 9 heads of 64, 3 kv heads, vocab 49152;
* tokenizer: gymllm's tiny byte-level BPE at the size's vocab (the one gymllm's tiny model builds),
  written to ``tokenizer.json`` and loaded by every side with the ``tokenizers`` package;
* task: TinyRepeat-v0 (4 letters; reward: the fraction of the reply's characters equal to the
  letter); the prompts are the env's first observations for seeds 0, 1, ... (group k gets seed k
  on every side), in gymllm's ChatML template (44 tokens; prompt budget 64);
* step: ``num_prompts`` prompts x G samples (tiny 4 x 4, 32 new tokens; medium 8 x 8, 64 new
  tokens; smollm2 8 x 8, 128 new tokens), temperature 1, GRPO (group z-score, clip 0.2, sequence-mean-token-mean), beta 0.04 with
  a reference-model forward every step, AdamW lr 1e-4 (b1 0.9, b2 0.999, eps 1e-8, no decay),
  global-norm clip 1.0, one optimizer step per batch.

Sides (each a subprocess; a peer in its own virtualenv built from ``benchmarks/peers/requirements-
<peer>.txt`` under ``~/.cache/gymllm/peers/<peer>-<hash>``, reused when present):
``gymllm`` (streaming GRPO learner + JaxEngine, ``benchmarks/peers/run_gymllm.py``),
``tunix_batch`` / ``tunix_agentic`` (Tunix 0.1.7's GRPOLearner / agentic GRPOLearner,
``run_tunix.py``), ``trl`` (TRL GRPOTrainer on CPU PyTorch, ``run_trl.py``). On a machine that
cannot build a venv (the offline TPU: no network), ``--peer-site tunix=DIR`` runs the peer's sides
with this interpreter and DIR (``scripts/offline_bundle.py install-peer``) on PYTHONPATH instead. Each runner prints its
own ``RESULT {json}`` with per-step seconds; a side's step time is the mean after the first two
(warm-up: compile) steps. Sides are interleaved over rounds, the order rotated by one each round
(no side always first or last); each side's mean / min / max over rounds is reported, and each ratio
per round (``vs_<side>_rounds``: the peer over gymllm in the same round).

Ends with ``RESULT {json}``: ``vs_tunix_batch``, ``vs_tunix_agentic``, ``vs_trl`` and the
``*_medium`` ones (peer step seconds / gymllm step seconds: above 1, gymllm is faster), per-side
step seconds and spread, peer versions, the CPU, the load average. A peer whose venv cannot be
built, or whose runner fails, appears as an error string in place of its figures.

Measured (2026-12-02, AMD EPYC 2-core, no AMX, quiet, code 0245041, ``--rounds 3 --sizes tiny``,
8 steps a side): gymllm 0.072 s/step (0.067-0.076 over rounds), Tunix batch 0.146 s (2.03x; per round
1.57-2.90), Tunix agentic 1.23 s (17.1x; 14.7-20.5), TRL 0.268 s (3.72x; 3.38-4.17). With ``--steps 5``
(3 measured steps, in the gymllm side's slower first steps): 1.44x / 15.4x / 2.73x. Medium
(2026-12-03, ``--rounds 3 --sizes medium``, code 1c8900d, quiet): gymllm 1.64 s (1.56-1.79), Tunix
batch 2.84 s (1.73x; per round 1.60-1.85), agentic 6.07 s (3.70x; 3.38-3.88), TRL 1.83 s (1.12x;
1.00-1.30). With the shared-prefix learner (2026-12-04, ``--rounds 2 --steps 6 --sizes medium``, code
52cf8d6, quiet): gymllm 1.32 s, Tunix batch 1.85 s (1.40x), agentic 4.39 s (3.33x), TRL 1.44 s (1.09x).

    python benchmarks/peers.py --quick                 # 1 round, fewer steps
    python benchmarks/peers.py --peers tunix --rounds 3
    python benchmarks/peers.py --peers tunix --sizes smollm2 --peer-site tunix=/tmp/gymllm-tunix-site
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Sequence

import engine_settings

HERE = pathlib.Path(__file__).resolve().parent / "peers"
CACHE = pathlib.Path(os.environ.get("GYMLLM_PEERS_CACHE", "~/.cache/gymllm/peers")).expanduser()
PEERS = ("tunix", "trl")
SIDES_OF = {"tunix": ("tunix_batch", "tunix_agentic"), "trl": ("trl",)}
RUNNER_OF = {
    "gymllm": ("run_gymllm.py", "streaming"),
    "tunix_batch": ("run_tunix.py", "batch"),
    "tunix_agentic": ("run_tunix.py", "agentic"),
    "trl": ("run_trl.py", "grpo"),
}
RATIO_KEY = {"tunix_batch": "vs_tunix_batch", "tunix_agentic": "vs_tunix_agentic", "trl": "vs_trl"}
#: the file scripts/offline_bundle.py install leaves in gymllm's offline site (how it is recognised)
GYMLLM_SITE_MARKER = ".gymllm-offline-installed"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Size:
    """One config row: model sizes and the step's shape (``num_prompts`` x ``group_size`` rows)."""

    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_prompts: int
    group_size: int
    max_new_tokens: int
    vocab_size: int = 512
    """the model's vocabulary and the tiny tokenizer's size asked for (gymllm's tiny BPE stops at 591
    tokens: ids above never decode to text, on every side alike)"""
    learner_rows: int = 0
    """gymllm's learner micro-batch, in rows (0: the step's whole batch in one pass). The same loss and
    update either way (gradients accumulate over micro-batches); a batch whose full-vocabulary logits do
    not fit the chip's memory in one pass needs fewer rows"""


SIZES = {
    "tiny": Size(
        num_layers=2,
        hidden_size=64,
        intermediate_size=128,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        num_prompts=4,
        group_size=4,
        max_new_tokens=32,
    ),
    "medium": Size(
        num_layers=4,
        hidden_size=128,
        intermediate_size=256,
        num_heads=8,
        num_kv_heads=4,
        head_dim=16,
        num_prompts=8,
        group_size=8,
        max_new_tokens=64,
    ),
    # SmolLM2-135M's shape (tied, vocab 49152) in the Qwen3 layout, for the chip (tpu_run.sh peers)
    "smollm2": Size(
        num_layers=30,
        hidden_size=576,
        intermediate_size=1536,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        num_prompts=8,
        group_size=8,
        max_new_tokens=128,
        vocab_size=49152,
        # 64 rows a pass: gymllm's side failed in its setup on the v5e and ran out of the CPU's 24 GB
        # (16 rows: 13.7 GB at most)
        learner_rows=16,
    ),
}
DEFAULT_SIZES = ("tiny", "medium")  # the CPU figures; smollm2 is asked for by name
MAX_PROMPT_TOKENS, WARMUP_STEPS = 64, 2
TASK_KWARGS = {"num_letters": 4}
SYSTEM_PROMPT = (
    "You are a helpful assistant."  # the one gymllm's ChatML template adds when none is given
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """rounds: interleaved rounds (each side once per round); steps: optimizer steps per side and run
    (the first ``WARMUP_STEPS`` are left out of the mean); peers: which peers; sizes: config rows;
    peer_sites: (peer, directory) pairs: that peer's sides run with this interpreter and the directory
    on PYTHONPATH (an offline install: ``scripts/offline_bundle.py install-peer``) instead of a venv;
    only_sides: run only these of the peers' sides (empty: all), gymllm always runs beside them (a
    10-minute accelerator call fits gymllm and one Tunix side; ``("gymllm",)``: gymllm alone, no
    ratio); profile_steps: ``"A:B"`` captures
    gymllm's steps A..B under ``jax.profiler`` and reports its device's busy share (``""``: off);
    gymllm_engine: (field, value) pairs that replace gymllm's ``EngineConfig`` settings (a sweep on the
    accelerator, e.g. ``kv_write=chunk``), recorded with the result."""

    rounds: int = 3
    steps: int = 8
    peers: tuple[str, ...] = PEERS
    sizes: tuple[str, ...] = DEFAULT_SIZES
    runner_timeout_s: float = 1800.0
    peer_sites: tuple[tuple[str, str], ...] = ()
    only_sides: tuple[str, ...] = ()
    profile_steps: str = ""
    gymllm_engine: tuple[tuple[str, Any], ...] = ()

    def peer_sides(self) -> list[str]:
        """The peers' sides this run compares against gymllm, in order."""
        return [
            s
            for p in self.peers
            for s in SIDES_OF[p]
            if not self.only_sides or s in self.only_sides
        ]

    def __post_init__(self) -> None:
        if self.rounds < 1 or self.steps <= WARMUP_STEPS:
            raise ValueError(
                f"BenchConfig: expected rounds >= 1 and steps > {WARMUP_STEPS}, received rounds="
                f"{self.rounds}, steps={self.steps}; fix: e.g. --rounds 3 --steps 8"
            )
        bad = [p for p in self.peers if p not in PEERS]
        if bad or not self.peers:
            raise ValueError(
                f"BenchConfig.peers: expected a non-empty subset of {PEERS}, received {self.peers}; "
                "fix: e.g. --peers tunix,trl"
            )
        bad = [s for s in self.sizes if s not in SIZES]
        if bad or not self.sizes:
            raise ValueError(
                f"BenchConfig.sizes: expected a subset of {tuple(SIZES)}, received {self.sizes}"
            )
        known = [s for p in self.peers for s in SIDES_OF[p]] + ["gymllm"]
        bad = [s for s in self.only_sides if s not in known]
        if bad:
            raise ValueError(
                f"BenchConfig.only_sides: expected sides of the peers run ({', '.join(known)}), "
                f"received {bad}; fix: e.g. --sides tunix_agentic with --peers tunix (--sides gymllm: "
                "gymllm alone, a sweep of its settings with no ratio)"
            )
        bad = [p for p, _ in self.peer_sites if p not in PEERS]
        if bad:
            raise ValueError(
                f"BenchConfig.peer_sites: expected peers among {PEERS}, received {bad}; "
                "fix: e.g. --peer-site tunix=/tmp/gymllm-tunix-site"
            )


def parse_peer_site(text: str) -> tuple[str, str]:
    """``"tunix=/tmp/site"`` -> ``("tunix", "/tmp/site")``; the directory must exist."""
    peer, sep, directory = text.partition("=")
    if not sep or not peer.strip() or not directory.strip():
        raise ValueError(
            f"--peer-site: expected PEER=DIR (e.g. tunix=/tmp/gymllm-tunix-site), received {text!r}"
        )
    if not pathlib.Path(directory).is_dir():
        raise ValueError(
            f"--peer-site {text}: expected an installed directory, {directory} is none; fix: "
            "python scripts/offline_bundle.py install-peer --target DIR"
        )
    return peer.strip(), directory


def parse_args(argv: Sequence[str] | None = None) -> BenchConfig:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--quick", action="store_true", help="1 round, 5 steps per side (about ten minutes here)"
    )
    ap.add_argument(
        "--rounds", type=int, default=None, help="interleaved rounds (default 3; --quick: 1)"
    )
    ap.add_argument(
        "--steps", type=int, default=None, help="optimizer steps per run (default 8; --quick: 5)"
    )
    ap.add_argument("--peers", default=",".join(PEERS), help="comma-separated subset of tunix,trl")
    ap.add_argument(
        "--sizes",
        default=",".join(DEFAULT_SIZES),
        help=f"comma-separated subset of {','.join(SIZES)}",
    )
    ap.add_argument(
        "--sides",
        default="",
        help="comma-separated subset of the peers' sides to run beside gymllm (default: all), "
        "e.g. tunix_agentic",
    )
    ap.add_argument(
        "--profile-steps",
        default="",
        metavar="A:B",
        help="gymllm's optimizer steps A..B under jax.profiler: its device's busy share and top ops",
    )
    ap.add_argument(
        "--gymllm-engine",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="replace one of gymllm's EngineConfig settings (repeat), e.g. kv_write=chunk",
    )
    ap.add_argument(
        "--peer-site",
        action="append",
        default=[],
        metavar="PEER=DIR",
        help="run PEER's sides with this interpreter and DIR on PYTHONPATH, no venv (repeat)",
    )
    args = ap.parse_args(argv)
    return BenchConfig(
        rounds=args.rounds or (1 if args.quick else 3),
        steps=args.steps or (5 if args.quick else 8),
        peers=tuple(p.strip() for p in args.peers.split(",") if p.strip()),
        sizes=tuple(s.strip() for s in args.sizes.split(",") if s.strip()),
        peer_sites=tuple(parse_peer_site(t) for t in args.peer_site),
        only_sides=tuple(s.strip() for s in args.sides.split(",") if s.strip()),
        profile_steps=args.profile_steps,
        gymllm_engine=tuple(
            engine_settings.parse(t, "--gymllm-engine") for t in args.gymllm_engine
        ),
    )


def prompt_rows(count: int, size: str = "tiny") -> list[dict[str, Any]]:
    """The prompts every side gets: TinyRepeat's first observation for seeds 0..count-1, in the tiny
    tokenizer's ChatML template (the one gymllm's rollout applies), with the answer letter."""
    from gymllm.envs.tiny_tasks import TinyRepeatEnv
    from gymllm.models.tiny import tiny_tokenizer

    tok, env, rows = tiny_tokenizer(SIZES[size].vocab_size), TinyRepeatEnv(**TASK_KWARGS), []
    for seed in range(count):
        obs, info = env.reset(seed=seed)
        text = tok.apply_chat_template(
            [{"role": "user", "content": obs}], add_generation_prompt=True
        )
        rows.append({"text": text, "user": obs, "ids": tok.encode(text), "answer": info["answer"]})
    return rows


def peer_spec(
    size: str, *, steps: int, tokenizer_file: str, prompts: list[dict[str, Any]] | None = None
) -> dict:
    """The one config every side's runner reads (JSON-ready)."""
    from gymllm.models.tiny import tiny_config

    sz = SIZES[size]
    mc = tiny_config(
        "qwen3",
        vocab_size=sz.vocab_size,
        hidden_size=sz.hidden_size,
        intermediate_size=sz.intermediate_size,
        num_layers=sz.num_layers,
        num_heads=sz.num_heads,
        num_kv_heads=sz.num_kv_heads,
    )
    if mc.head_dim != sz.head_dim:
        raise ValueError(f"peer_spec: gymllm's head_dim {mc.head_dim} != the spec's {sz.head_dim}")
    if prompts is None:
        prompts = prompt_rows(steps * sz.num_prompts, size)
    if not all(f"system\n{SYSTEM_PROMPT}<|im_end|>" in p["text"] for p in prompts):
        raise ValueError(
            "peer_spec: the templated prompts do not carry SYSTEM_PROMPT (the agentic side adds it)"
        )
    if max(len(p["ids"]) for p in prompts) > MAX_PROMPT_TOKENS:
        raise ValueError(f"peer_spec: a prompt is longer than the {MAX_PROMPT_TOKENS}-token budget")
    return {
        "size": size,
        "seed": 0,
        "steps": steps,
        "warmup_steps": WARMUP_STEPS,
        "num_prompts": sz.num_prompts,
        "group_size": sz.group_size,
        "learner_rows": sz.learner_rows,
        "task_kwargs": dict(TASK_KWARGS),
        "model": {
            "family": "qwen3",
            "num_layers": mc.num_layers,
            "vocab_size": mc.vocab_size,
            "hidden_size": mc.hidden_size,
            "intermediate_size": mc.intermediate_size,
            "num_heads": mc.num_heads,
            "num_kv_heads": mc.num_kv_heads,
            "head_dim": mc.head_dim,
            "rope_theta": mc.rope_theta,
            "rms_norm_eps": mc.rms_norm_eps,
            "tie_word_embeddings": mc.tie_word_embeddings,
            "dtype": "float32",
        },
        "sampling": {
            "max_prompt_tokens": MAX_PROMPT_TOKENS,
            "max_new_tokens": sz.max_new_tokens,
            "temperature": 1.0,
        },
        "algo": {
            "beta": 0.04,
            "epsilon": 0.2,
            "kl": "k3",
            "aggregation": "sequence-mean-token-mean",
        },
        "optimizer": {
            "name": "adamw",
            "learning_rate": 1e-4,
            "b1": 0.9,
            "b2": 0.999,
            "eps": 1e-8,
            "weight_decay": 0.0,
            "max_grad_norm": 1.0,
        },
        "system_prompt": SYSTEM_PROMPT,
        "tokenizer_file": tokenizer_file,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "prompts": prompts,
    }


def write_tokenizer(directory: str, size: str = "tiny") -> str:
    """The tiny tokenizer every side loads at ``size``: ``directory/tokenizer.json`` (and its config
    files); the one gymllm's tiny model of that vocabulary builds."""
    from gymllm.models.tiny import tiny_tokenizer

    tiny_tokenizer(SIZES[size].vocab_size).save(directory)
    return str(pathlib.Path(directory) / "tokenizer.json")


# ---------------------------------------------------------------- virtualenvs


def requirements_file(peer: str) -> pathlib.Path:
    return HERE / f"requirements-{peer}.txt"


def venv_dir(peer: str, requirements: pathlib.Path | None = None) -> pathlib.Path:
    """``CACHE/<peer>-<12 hex of sha256(requirements + python major.minor)>``."""
    data = (requirements or requirements_file(peer)).read_bytes()
    key = hashlib.sha256(
        data + f"\npython{sys.version_info[0]}.{sys.version_info[1]}".encode()
    ).hexdigest()[:12]
    return CACHE / f"{peer}-{key}"


def ensure_venv(peer: str, *, log: Callable[[str], None] = print) -> pathlib.Path:
    """Build (or reuse) the peer's virtualenv; its python. Raises RuntimeError with pip's tail on failure."""
    d = venv_dir(peer)
    py = d / "bin" / "python"
    if (d / ".complete").exists() and py.exists():
        return py
    log(
        f"building the {peer} virtualenv in {d} (pip install -r {requirements_file(peer).name}) ..."
    )
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(d)],
        [str(py), "-m", "pip", "install", "-q", "-r", str(requirements_file(peer))],
    ]
    for cmd in steps:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        if proc.returncode != 0:
            raise RuntimeError(
                f"{' '.join(cmd[:4])} ... exited {proc.returncode}: {(proc.stderr or proc.stdout)[-800:]}"
            )
    (d / ".complete").write_text(requirements_file(peer).read_text())
    return py


# ---------------------------------------------------------------- running sides


def parse_result(stdout: str) -> dict:
    """The last ``RESULT {json}`` line of a runner's output."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise ValueError(
        f"no RESULT line in the runner's output (last lines: {stdout.splitlines()[-5:]})"
    )


def peer_pythonpath(site: str, inherited: str | None) -> str:
    """The PYTHONPATH of a side run from an installed peer site: the inherited entries (the machine's
    own JAX first), less gymllm's offline site (its antlr4 4.13 would shadow the 4.9 Tunix's omegaconf
    needs; a side never imports gymllm), then ``site``."""
    keep = [e for e in (inherited or "").split(os.pathsep) if e]
    return os.pathsep.join(
        [e for e in keep if not (pathlib.Path(e) / GYMLLM_SITE_MARKER).exists()] + [site]
    )


def run_side(
    side: str, python: str, spec_file: str, *, timeout_s: float, site: str | None = None
) -> dict:
    """One run of ``side``'s runner; its RESULT dict, or ``{"error": ...}``. ``site``: a peer's
    installed directory, put on PYTHONPATH (:func:`peer_pythonpath`)."""
    script, mode = RUNNER_OF[side]
    cmd = [python, str(HERE / script), "--spec", spec_file, "--mode", mode]
    env = dict(
        os.environ,
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        WANDB_MODE="disabled",
        TF_CPP_MIN_LOG_LEVEL="3",
        GYMLLM_COMPILE_CACHE="off",
    )  # every side compiles from scratch (benchmarks/compile_cache.py: a rerun's gain)
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    if site is not None:
        env["PYTHONPATH"] = peer_pythonpath(site, env.get("PYTHONPATH"))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"{side}: runner exceeded {timeout_s:.0f}s"}
    try:
        out = parse_result(proc.stdout)
    except ValueError as e:
        return {"error": f"{side}: exit {proc.returncode}, {e}; stderr tail: {proc.stderr[-1500:]}"}
    if proc.returncode != 0:
        out["exit_code"] = proc.returncode
    return out


def summarize(runs: list[dict]) -> dict:
    """Mean / min / max over rounds of each run's ``mean_step_s``, or the first error."""
    ok = [r["mean_step_s"] for r in runs if "error" not in r and r.get("mean_step_s") is not None]
    if not ok:
        errs = [r.get("error", "no steps") for r in runs]
        return {"error": errs[0] if errs else "not run"}
    out = {
        "step_s": sum(ok) / len(ok),
        "min_step_s": min(ok),
        "max_step_s": max(ok),
        "rounds": len(ok),
        "per_round_step_s": ok,
    }
    first = next(r for r in runs if "error" not in r)
    for k in (
        "versions",
        "reward_mean",
        "breakdown",
        "clock",
        "profile",
        "engine_overrides",
        "malloc_hugepages",
    ):
        if k in first:
            out[k] = first[k]
    out["step_s_all"] = [r["step_s"] for r in runs if "error" not in r]
    errs = [r["error"] for r in runs if "error" in r]
    if errs:
        out["errors"] = errs
    return out


def round_order(sides: Sequence[str], rnd: int) -> list[str]:
    """The sides in round ``rnd``, rotated by one each round, so no side always runs first (on a cold
    page cache) or last (after the others heated the machine)."""
    k = rnd % len(sides)
    return list(sides[k:]) + list(sides[:k])


def ratio_spread(summary: dict[str, dict], suffix: str = "") -> dict[str, Any]:
    """``vs_<side><suffix>_rounds``: the ratio within each round (the peer's mean step over gymllm's in
    the same round), so the spread of the like-for-like figure is shown, not only each side's."""
    g = summary.get("gymllm", {}).get("per_round_step_s")
    out: dict[str, Any] = {}
    for side, key in RATIO_KEY.items():
        p = summary.get(side, {}).get("per_round_step_s")
        if g and p and len(g) == len(p):
            out[f"{key}{suffix}_rounds"] = [b / a for a, b in zip(g, p)]
    return out


def ratios(summary: dict[str, dict], suffix: str = "") -> dict[str, Any]:
    """``vs_<side><suffix>``: peer step / gymllm step, or the error string of whichever side failed."""
    g = summary.get("gymllm", {"error": "gymllm not run"})
    out: dict[str, Any] = {}
    for side, key in RATIO_KEY.items():
        if side not in summary:
            continue
        p = summary[side]
        if "error" in p:
            out[key + suffix] = f"error: {p['error']}"
        elif "error" in g:
            out[key + suffix] = f"error: {g['error']}"
        else:
            out[key + suffix] = p["step_s"] / g["step_s"]
    return out


def bench(
    cfg: BenchConfig, *, pythons: dict[str, str] | None = None, log: Callable[[str], None] = print
) -> dict:
    """Build (or reuse) the venvs, then run every side on every size, interleaved over rounds.
    ``pythons`` (side -> interpreter, tests) skips the venvs."""
    from gymllm.utils.host import describe_cpu

    t0 = time.perf_counter()
    venv_errors: dict[str, str] = {}
    sites = dict(cfg.peer_sites)
    if pythons is None:
        pythons = {"gymllm": sys.executable}
        for peer in cfg.peers:
            if peer in sites:  # installed offline: this interpreter, the site on PYTHONPATH
                pythons.update({side: sys.executable for side in SIDES_OF[peer]})
                continue
            try:
                py = str(ensure_venv(peer, log=log))
                for side in SIDES_OF[peer]:
                    pythons[side] = py
            except Exception as e:  # noqa: BLE001 - reported in RESULT, never skipped
                venv_errors[peer] = f"venv: {type(e).__name__}: {e}"
    sides = ["gymllm"] + cfg.peer_sides()
    out: dict[str, Any] = {
        "cpu": describe_cpu(),
        "rounds": cfg.rounds,
        "steps": cfg.steps,
        "warmup_steps": WARMUP_STEPS,
        "loadavg_start": os.getloadavg(),
    }
    with tempfile.TemporaryDirectory(prefix="gymllm-peers-") as tmp:
        for size in cfg.sizes:
            tok_file = write_tokenizer(f"{tmp}/tokenizer-{size}", size)
            spec_file = f"{tmp}/spec-{size}.json"
            spec = peer_spec(size, steps=cfg.steps, tokenizer_file=tok_file)
            spec["gymllm_profile_steps"] = cfg.profile_steps
            spec["gymllm_engine"] = dict(cfg.gymllm_engine)
            pathlib.Path(spec_file).write_text(json.dumps(spec))
            runs: dict[str, list[dict]] = {s: [] for s in sides}
            for rnd in range(cfg.rounds):
                for side in round_order(sides, rnd):
                    peer = next((p for p, ss in SIDES_OF.items() if side in ss), None)
                    if peer in venv_errors:
                        runs[side].append({"error": venv_errors[peer]})
                        continue
                    t = time.perf_counter()
                    r = run_side(
                        side,
                        pythons[side],
                        spec_file,
                        timeout_s=cfg.runner_timeout_s,
                        site=sites.get(peer) if peer else None,
                    )
                    runs[side].append(r)
                    log(
                        f"[{size} round {rnd + 1}/{cfg.rounds}] {side}: "
                        + (
                            f"{r['mean_step_s']:.3f}s/step"
                            if r.get("mean_step_s") is not None
                            else "..." + str(r.get("error"))[-600:]  # the end names the exception
                        )
                        + f" ({time.perf_counter() - t:.0f}s wall)"
                    )
            summary = {s: summarize(runs[s]) for s in sides}
            suffix = "" if size == "tiny" else f"_{size}"
            out.update(ratios(summary, suffix))
            out.update(ratio_spread(summary, suffix))
            out[f"sides{suffix}"] = summary
    out["loadavg_end"] = os.getloadavg()
    out["total_s"] = time.perf_counter() - t0
    return out


def result_line(out: dict) -> str:
    return "RESULT " + json.dumps(out)


def main(argv: Sequence[str] | None = None) -> None:
    from results.device import choose_platform_args

    argv = choose_platform_args(
        argv
    )  # --cpu: JAX on the CPU (children too); else JAX_PLATFORMS or JAX's default
    cfg = parse_args(argv)
    out = bench(
        cfg, log=lambda msg: print(msg, flush=True)
    )  # progress shows while stdout is a file
    for size in cfg.sizes:
        suffix = "" if size == "tiny" else f"_{size}"
        print(
            f"--- {size} config ({cfg.rounds} rounds, mean over steps "
            f"{WARMUP_STEPS + 1}..{cfg.steps})"
        )
        for side, s in out[f"sides{suffix}"].items():
            if "error" in s:
                print(f"  {side:14s} error: ...{s['error'][-600:]}")
            else:
                print(
                    f"  {side:14s} {s['step_s']:.3f}s/step (min {s['min_step_s']:.3f}, max {s['max_step_s']:.3f})"
                    + (
                        f"  x{s['step_s'] / out[f'sides{suffix}']['gymllm']['step_s']:.2f} vs gymllm"
                        if side != "gymllm" and "error" not in out[f"sides{suffix}"]["gymllm"]
                        else ""
                    )
                )
    print(f"cpu: {out['cpu']}; load average start {out['loadavg_start']}, end {out['loadavg_end']}")
    from results import emit_result  # the RESULT line, and its record in benchmarks/results/

    emit_result("peers", out)


if __name__ == "__main__":
    main()
