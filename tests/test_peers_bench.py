"""benchmarks/peers.py's pieces that need no peer install: argument parsing, the one shared spec every
side's runner reads, venv paths, RESULT parsing and the ratio / summary lines with fake runners
(small Python scripts run as real subprocesses in place of the peers' venvs)."""

from __future__ import annotations

import ast
import dataclasses
import json
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import peers  # noqa: E402


def test_parse_args_defaults_quick_and_peers():
    full = peers.parse_args([])
    assert (full.rounds, full.steps, full.peers, full.sizes) == (
        3,
        8,
        ("tunix", "trl"),
        ("tiny", "medium"),
    )
    quick = peers.parse_args(["--quick", "--peers", "trl", "--sizes", "tiny"])
    assert (quick.rounds, quick.steps, quick.peers, quick.sizes) == (1, 5, ("trl",), ("tiny",))
    assert peers.parse_args(["--quick", "--rounds", "2"]).rounds == 2
    with pytest.raises(ValueError, match="tunix,trl"):
        peers.parse_args(["--peers", "verl"])
    with pytest.raises(ValueError, match="steps"):
        peers.parse_args(["--steps", "2"])


def test_spec_matches_the_issue_config_and_gymllm_model(tmp_path):
    tok = peers.write_tokenizer(str(tmp_path))
    spec = peers.peer_spec("tiny", steps=3, tokenizer_file=tok)
    m = spec["model"]
    assert (
        m["num_layers"],
        m["hidden_size"],
        m["intermediate_size"],
        m["num_heads"],
        m["head_dim"],
        m["num_kv_heads"],
        m["vocab_size"],
    ) == (2, 64, 128, 4, 16, 2, 512)
    assert (
        spec["num_prompts"],
        spec["group_size"],
        spec["sampling"]["max_new_tokens"],
        spec["sampling"]["max_prompt_tokens"],
    ) == (4, 4, 32, 64)
    assert spec["algo"]["beta"] == 0.04 and spec["optimizer"]["learning_rate"] == 1e-4
    med = peers.peer_spec("medium", steps=3, tokenizer_file=tok)
    assert (
        med["model"]["num_layers"],
        med["model"]["hidden_size"],
        med["num_prompts"],
        med["group_size"],
        med["sampling"]["max_new_tokens"],
    ) == (4, 128, 8, 8, 64)
    # the prompts: TinyRepeat's observations for seeds 0.., templated; the shared tokenizer gives their ids
    from tokenizers import Tokenizer

    t = Tokenizer.from_file(tok)
    assert len(spec["prompts"]) == 3 * 4
    for row in spec["prompts"]:
        assert t.encode(row["text"], add_special_tokens=False).ids == row["ids"]
        assert row["user"] in row["text"] and row["answer"] in "abcd"
        assert len(row["ids"]) <= 64
    json.dumps(spec)  # the runners read it as JSON


def test_gymllm_runner_config_is_built_from_the_spec(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))
    import run_gymllm

    spec = peers.peer_spec("medium", steps=3, tokenizer_file=peers.write_tokenizer(str(tmp_path)))
    cfg = run_gymllm.train_config(spec, str(tmp_path / "run"))
    assert (
        cfg.model.num_layers,
        cfg.model.hidden_size,
        cfg.model.intermediate_size,
        cfg.model.num_heads,
        cfg.model.num_kv_heads,
        cfg.model.vocab_size,
    ) == (4, 128, 256, 8, 4, 512)
    assert (
        cfg.rollout.group_size == 8
        and cfg.learner.groups_per_step == 8
        and cfg.sampling.max_tokens == 64
    )
    assert (
        cfg.loss.kl.beta == 0.04
        and cfg.optimizer.learning_rate == 1e-4
        and cfg.learner.num_steps == 3
    )


def test_every_runner_reads_the_spec_and_no_config_literals():
    """Each runner takes its sizes from the spec JSON: no model size or step shape is typed in a runner."""
    for name in ("run_gymllm.py", "run_tunix.py", "run_trl.py"):
        src = (ROOT / "benchmarks" / "peers" / name).read_text()
        tree = ast.parse(src)
        assert "--spec" in src
        for node in ast.walk(tree):
            if isinstance(node, ast.keyword) and node.arg in (
                "num_layers",
                "num_hidden_layers",
                "hidden_size",
                "num_generations",
                "beta",
                "learning_rate",
            ):
                assert not isinstance(node.value, ast.Constant), f"{name}: {node.arg} is a literal"
        if name != "run_gymllm.py":
            mods = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
            mods += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
            assert not any(m.split(".")[0] == "gymllm" for m in mods), f"{name} imports gymllm"


def test_venv_dir_hashes_requirements(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("trl==1.16.0\n")
    b.write_text("trl==1.16.1\n")
    assert peers.venv_dir("trl", a) == peers.venv_dir("trl", a)
    assert peers.venv_dir("trl", a) != peers.venv_dir("trl", b)
    assert peers.venv_dir("trl", a).name.startswith("trl-")
    for peer in peers.PEERS:
        pins = [
            ln
            for ln in peers.requirements_file(peer).read_text().splitlines()
            if ln and not ln.startswith("#")
        ]
        assert pins and all("==" in ln for ln in pins), f"{peer}: every requirement pinned"
    assert "torch==2.13.0+cpu" in peers.requirements_file("trl").read_text()


def test_parse_result_takes_the_last_line():
    assert peers.parse_result('noise\nRESULT {"a": 1}\nmore\nRESULT {"a": 2}\n') == {"a": 2}
    with pytest.raises(ValueError, match="no RESULT"):
        peers.parse_result("Traceback ...\n")


FAKE = """
import json, sys
side = {side!r}
secs = {secs!r}
if secs is None:
    sys.exit("boom: fake failure")
spec = json.load(open(sys.argv[sys.argv.index("--spec") + 1]))
steps = [5.0, 3.0] + [secs] * (spec["steps"] - 2)
print("log line")
print("RESULT " + json.dumps({{"side": side, "step_s": steps, "mean_step_s": secs, "versions": {{side: "0"}}}}))
"""


def test_bench_with_fake_runners_writes_ratios_and_errors(tmp_path, monkeypatch):
    fakes = tmp_path / "fakes"
    fakes.mkdir()
    secs = {"gymllm": 0.1, "tunix_batch": 0.3, "tunix_agentic": 1.0, "trl": None}
    for side, (script, _mode) in peers.RUNNER_OF.items():
        (fakes / f"{side}.py").write_text(FAKE.format(side=side, secs=secs[side]))
    monkeypatch.setattr(
        peers, "RUNNER_OF", {s: (f"{s}.py", m) for s, (_, m) in peers.RUNNER_OF.items()}
    )
    monkeypatch.setattr(peers, "HERE", fakes)
    cfg = peers.BenchConfig(rounds=2, steps=3, sizes=("tiny",))
    out = peers.bench(
        cfg, pythons={s: sys.executable for s in peers.RUNNER_OF}, log=lambda _m: None
    )
    assert out["vs_tunix_batch"] == pytest.approx(3.0) and out["vs_tunix_agentic"] == pytest.approx(
        10.0
    )
    assert out["vs_trl"].startswith("error: trl: exit 1") and "boom" in out["vs_trl"]
    g = out["sides"]["gymllm"]
    assert g["rounds"] == 2 and g["min_step_s"] == g["max_step_s"] == pytest.approx(0.1)
    line = peers.result_line(out)
    assert line.startswith("RESULT ") and json.loads(line[7:])["vs_tunix_batch"] == pytest.approx(
        3.0
    )


def test_a_venv_that_cannot_be_built_is_an_error_in_result(tmp_path, monkeypatch):
    monkeypatch.setattr(peers, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(peers, "HERE", tmp_path)
    (tmp_path / "requirements-trl.txt").write_text("this-is-not-a-requirement-spec ===\n")
    with pytest.raises(RuntimeError, match="exited"):
        peers.ensure_venv("trl", log=lambda _m: None)


def test_sides_picks_one_peer_side_beside_gymllm(tmp_path, monkeypatch):
    cfg = peers.parse_args(["--peers", "tunix", "--sides", "tunix_agentic"])
    assert cfg.peer_sides() == ["tunix_agentic"]
    assert peers.parse_args(["--peers", "tunix"]).peer_sides() == ["tunix_batch", "tunix_agentic"]
    with pytest.raises(ValueError, match="expected sides of the peers run"):
        peers.parse_args(["--peers", "tunix", "--sides", "trl"])
    fakes = tmp_path / "fakes"
    fakes.mkdir()
    for side in ("gymllm", "tunix_agentic"):
        (fakes / f"{side}.py").write_text(FAKE.format(side=side, secs=0.5))
    monkeypatch.setattr(
        peers, "RUNNER_OF", {s: (f"{s}.py", m) for s, (_, m) in peers.RUNNER_OF.items()}
    )
    monkeypatch.setattr(peers, "HERE", fakes)
    out = peers.bench(
        dataclasses.replace(cfg, rounds=1, steps=3, sizes=("tiny",)),
        pythons={s: sys.executable for s in peers.RUNNER_OF},
        log=lambda _m: None,
    )
    assert set(out["sides"]) == {"gymllm", "tunix_agentic"} and "vs_tunix_batch" not in out
    assert out["vs_tunix_agentic"] == pytest.approx(1.0)


def test_profile_steps_reach_the_gymllm_run_and_its_trace_is_summed(tmp_path):
    """--profile-steps goes into the spec, the gymllm runner's run captures those steps, and
    ``device_profile`` reports the device's share of a (hand-made) trace's span."""
    import gzip

    sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))
    import run_gymllm

    assert peers.parse_args(["--profile-steps", "4:5"]).profile_steps == "4:5"
    spec = peers.peer_spec("tiny", steps=5, tokenizer_file=peers.write_tokenizer(str(tmp_path)))
    spec["gymllm_profile_steps"] = "4:5"
    assert run_gymllm.train_config(spec, str(tmp_path / "run")).run.profile_steps == "4:5"
    trace = tmp_path / "profile" / "plugins" / "profile" / "run"
    trace.mkdir(parents=True)
    events = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:TPU:0"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "XLA Ops"}},
        {"ph": "X", "name": "fusion.1", "pid": 1, "tid": 1, "ts": 0, "dur": 300_000},
        {"ph": "X", "name": "host_step", "pid": 2, "tid": 1, "ts": 0, "dur": 1_000_000},
    ]
    with gzip.open(trace / "perfetto_trace.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)
    prof = run_gymllm.device_profile(tmp_path / "profile")
    assert prof["device_busy_share"] == pytest.approx(0.3)
    assert prof["top_ops"][0]["op"] == "fusion.1"


def test_round_order_rotates_and_ratio_spread_is_per_round():
    sides = ["gymllm", "tunix_batch", "trl"]
    assert peers.round_order(sides, 0) == sides
    assert peers.round_order(sides, 1) == ["tunix_batch", "trl", "gymllm"]
    assert [peers.round_order(sides, r)[0] for r in range(3)] == sides  # each side first once
    summary = {
        "gymllm": {"per_round_step_s": [1.0, 2.0]},
        "tunix_batch": {"per_round_step_s": [3.0, 3.0]},
    }
    assert peers.ratio_spread(summary) == {"vs_tunix_batch_rounds": [3.0, 1.5]}


def test_peer_site_parsing_names_the_expected_form(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    cfg = peers.parse_args(["--peers", "tunix", "--peer-site", f"tunix={site}"])
    assert cfg.peer_sites == (("tunix", str(site)),)
    assert peers.parse_args([]).peer_sites == ()
    with pytest.raises(ValueError, match="expected PEER=DIR"):
        peers.parse_args(["--peer-site", str(site)])
    with pytest.raises(ValueError, match="install-peer"):
        peers.parse_args(["--peer-site", f"tunix={tmp_path / 'absent'}"])
    with pytest.raises(ValueError, match="peer_sites: expected peers among"):
        peers.parse_args(["--peer-site", f"verl={site}"])


def test_the_smollm2_size_is_smollm2_135m_shape_and_the_runners_read_it(tmp_path):
    tok = peers.write_tokenizer(str(tmp_path), "smollm2")
    spec = peers.peer_spec("smollm2", steps=3, tokenizer_file=tok)
    m = spec["model"]
    assert (
        m["num_layers"],
        m["hidden_size"],
        m["intermediate_size"],
        m["num_heads"],
        m["num_kv_heads"],
        m["head_dim"],
        m["vocab_size"],
        m["tie_word_embeddings"],
    ) == (30, 576, 1536, 9, 3, 64, 49152, True)
    assert (
        spec["num_prompts"],
        spec["group_size"],
        spec["sampling"]["max_new_tokens"],
    ) == (8, 8, 128)
    # SmolLM2-135M's parameter count (its RMSNorm weights aside; Qwen3's q/k norms add 128 a layer)
    d, f, hd, L = 576, 1536, 64, 30
    layer = d * hd * (9 + 3 + 3) + 9 * hd * d + 3 * d * f
    assert 134.0e6 < m["vocab_size"] * d + L * layer < 135.0e6
    # the prompts are tokenized by the tokenizer written for the size (gymllm's tiny model's own)
    from tokenizers import Tokenizer

    t = Tokenizer.from_file(tok)
    assert all(
        t.encode(r["text"], add_special_tokens=False).ids == r["ids"] for r in spec["prompts"]
    )
    sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))
    import run_gymllm

    cfg = run_gymllm.train_config(spec, str(tmp_path / "run"))
    assert (cfg.model.num_layers, cfg.model.hidden_size, cfg.model.vocab_size) == (30, 576, 49152)
    assert cfg.learner.groups_per_step == 8 and cfg.sampling.max_tokens == 128
    assert peers.parse_args([]).sizes == ("tiny", "medium")  # the CPU default stays small


SITE_FAKE = """
import json, os, sys
import peer_only_module  # importable only from the peer's site
print("RESULT " + json.dumps({"side": "tunix_batch", "step_s": [1.0, 1.0, 0.5], "mean_step_s": 0.5,
                               "pythonpath": os.environ["PYTHONPATH"], "from": peer_only_module.WHERE}))
"""


def test_a_side_runs_from_the_peer_site_without_a_venv(tmp_path, monkeypatch):
    """--peer-site: the peer's sides run with this interpreter, the site last on PYTHONPATH and
    gymllm's offline site (its marker file) left off; no venv is built."""
    site, gymllm_site, fakes = tmp_path / "site", tmp_path / "gymllm-site", tmp_path / "fakes"
    for d in (site, gymllm_site, fakes):
        d.mkdir()
    (site / "peer_only_module.py").write_text("WHERE = __file__\n")
    (gymllm_site / peers.GYMLLM_SITE_MARKER).write_text("[]")
    (fakes / "site_fake.py").write_text(SITE_FAKE)
    (fakes / "gymllm.py").write_text(FAKE.format(side="gymllm", secs=0.25))
    monkeypatch.setattr(peers, "HERE", fakes)
    monkeypatch.setattr(
        peers,
        "RUNNER_OF",
        {"gymllm": ("gymllm.py", "streaming"), "tunix_batch": ("site_fake.py", "batch")},
    )
    monkeypatch.setattr(peers, "SIDES_OF", {"tunix": ("tunix_batch",), "trl": ("trl",)})

    def no_venv(peer, **kw):
        raise AssertionError(f"a venv was built for {peer}")

    monkeypatch.setattr(peers, "ensure_venv", no_venv)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path / 'first'}:{gymllm_site}")
    cfg = peers.BenchConfig(
        rounds=1, steps=3, peers=("tunix",), sizes=("tiny",), peer_sites=(("tunix", str(site)),)
    )
    out = peers.bench(cfg, log=lambda _m: None)
    r = out["sides"]["tunix_batch"]
    assert "error" not in r, r
    assert out["vs_tunix_batch"] == pytest.approx(2.0)
    run = peers.run_side("tunix_batch", sys.executable, "unused", timeout_s=60, site=str(site))
    assert run["pythonpath"] == f"{tmp_path / 'first'}:{site}"
    assert run["from"] == str(site / "peer_only_module.py")
    # without the site the fake cannot import its module: the error says so
    bare = peers.run_side("tunix_batch", sys.executable, "unused", timeout_s=60)
    assert "peer_only_module" in bare["error"]


def test_gymllm_engine_settings_reach_the_runner_and_gymllm_can_run_alone(tmp_path):
    """--gymllm-engine FIELD=VALUE replaces that EngineConfig setting in gymllm's run (values read as
    JSON, else text; an unknown field is refused with the known ones named); --sides gymllm runs
    gymllm with no peer side; GYMLLM_PEERS_KEEP's copy takes the run's telemetry files."""
    sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))
    import run_gymllm

    cfg = peers.parse_args(
        ["--gymllm-engine", "kv_write=select", "--gymllm-engine", "prefill_tokens=512"]
    )
    assert cfg.gymllm_engine == (("kv_write", "select"), ("prefill_tokens", 512))
    with pytest.raises(SystemExit, match="one of EngineConfig's.*kv_write"):
        peers.parse_args(["--gymllm-engine", "kv_writes=chunk"])
    spec = peers.peer_spec("tiny", steps=5, tokenizer_file=peers.write_tokenizer(str(tmp_path)))
    base = run_gymllm.train_config(spec, str(tmp_path / "run")).engine
    spec["gymllm_engine"] = dict(cfg.gymllm_engine)
    engine = run_gymllm.train_config(spec, str(tmp_path / "run")).engine
    assert (engine.kv_write, engine.prefill_tokens) == ("select", 512)
    assert (
        dataclasses.replace(engine, kv_write=base.kv_write, prefill_tokens=base.prefill_tokens)
        == base
    )
    assert peers.parse_args(["--peers", "tunix", "--sides", "gymllm"]).peer_sides() == []
    run = tmp_path / "kept-run"
    (run / "plugins" / "profile" / "x").mkdir(parents=True)
    for name in (
        "trace.json",
        "metrics.jsonl",
        "plugins/profile/x/host.trace.json.gz",
        "other.bin",
    ):
        (run / name).write_text("x")
    run_gymllm.keep_run(str(run), str(tmp_path / "out"))
    kept = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert kept == ["host.trace.json.gz", "metrics.jsonl", "trace.json"]
    run_gymllm.keep_run(str(run), "")  # off: nothing copied, no error
