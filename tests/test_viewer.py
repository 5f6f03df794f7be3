"""`gymllm view` in a real browser: headless Chromium (the Debian package ``chromium``) driven by
Playwright, against a run made by ``gymllm train --preset tiny`` and run directories written with the
project's own writers (tests/viewer_runs.py).

Every request the page makes goes through ``page.route``: requests to 127.0.0.1 pass, anything else
is aborted and recorded, and each browser test asserts none was made. A screenshot of every page is
written to ``$GYMLLM_VIEWER_SCREENSHOTS`` (default: a temporary directory). Waits are DOM conditions,
never sleeps.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import urllib.parse

import httpx
import pytest

from gymllm.errors import ConfigError
from gymllm.viewer import ViewerConfig, ViewerServer
from gymllm.viewer.index import LogIndex
from gymllm.trajectories.reader import read_log, read_tokens
from viewer_runs import metrics_record, write_episode_run, write_eval_rows, write_suite

# $GYMLLM_CHROMIUM names another Chromium build; by default the Debian package's executable on PATH
CHROMIUM = (
    os.environ.get("GYMLLM_CHROMIUM")
    or shutil.which("chromium")
    or shutil.which("chromium-browser")
)


# ------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def train_run(tmp_path_factory) -> pathlib.Path:
    """A run directory made by `gymllm train --preset tiny` (3 steps)."""
    run_dir = tmp_path_factory.mktemp("viewer-train") / "tiny-run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gymllm.cli.main",
            "train",
            "--preset",
            "tiny",
            "--run-dir",
            str(run_dir),
            "--learner.num-steps",
            "3",
            "--run.no-console",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[str, pathlib.Path]:
    root = tmp_path_factory.mktemp("viewer-written")
    return {
        "episodes": write_episode_run(root),
        "suite": write_suite(root),
        "eval": write_eval_rows(root),
    }


@pytest.fixture(scope="module")
def server(train_run, written):
    runs = (str(train_run), str(written["episodes"]), str(written["suite"]), str(written["eval"]))
    with ViewerServer(ViewerConfig(runs=runs, port=0)) as url:
        yield url


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> pathlib.Path:
    d = pathlib.Path(
        os.environ.get("GYMLLM_VIEWER_SCREENSHOTS") or tmp_path_factory.mktemp("viewer-screenshots")
    )
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM or not os.path.isfile(CHROMIUM):
        pytest.skip(
            f"the chromium executable is absent ({CHROMIUM or 'no chromium on PATH'}; Debian package "
            "`chromium`, which .ci/run installs)"
        )
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright (the `test` extra) is not installed"
    )
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield b
        b.close()


class Watched:
    """A page whose every request is recorded; requests off 127.0.0.1 are aborted and kept in ``outside``."""

    def __init__(self, browser):
        self.context = browser.new_context(
            viewport={"width": 1280, "height": 900}, service_workers="block"
        )
        self.requests: list[str] = []
        self.outside: list[str] = []
        self.page_errors: list[str] = []
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.on("pageerror", lambda e: self.page_errors.append(str(e)))

    def _route(self, route) -> None:
        url = route.request.url
        self.requests.append(url)
        if urllib.parse.urlsplit(url).hostname == "127.0.0.1":
            route.continue_()
        else:
            self.outside.append(url)
            route.abort()

    def check(self) -> None:
        assert self.requests, "the page made no request at all"
        assert not self.outside, f"requests left 127.0.0.1: {self.outside}"
        assert not self.page_errors, f"the page raised: {self.page_errors}"


@pytest.fixture
def watched(browser):
    w = Watched(browser)
    yield w
    w.context.close()


# ------------------------------------------------------------------------------------ browser tests


def test_front_page_draws_the_curves_of_a_gymllm_train_run(server, train_run, watched, shots):
    records = [json.loads(line) for line in (train_run / "metrics.jsonl").read_text().splitlines()]
    page = watched.page
    page.goto(server)
    chart = page.locator('.chart[data-chart="reward (all rollouts)"]')
    chart.locator("polyline").first.wait_for()
    # one series per run with metrics: the train run and the written run, overlaid
    assert chart.locator("polyline").count() == 2
    logged = sum(
        isinstance(r.get("rollout_reward_mean"), float) for r in records
    )  # a step may have no rollout end
    assert int(chart.get_attribute("data-points")) == logged + 3
    for name in (
        "reward (trained groups)",
        "loss",
        "KL",
        "staleness (versions)",
        "trainer idle",
        "engine idle",
        "tool calls per episode",
        "success",
        "compile (s in the step)",
    ):
        assert page.locator(f'.chart[data-chart="{name}"] polyline').count() >= 1, name
    legend = chart.locator(".legend").inner_text()
    assert f"at step {records[-1]['step']}" in legend and "tiny-run" in legend
    card = page.locator('section[data-run="tiny-run"]')
    assert "steps logged: 3" in card.locator("details pre").first.inner_text()  # summary.txt
    compiled = [
        json.loads(line) for line in (train_run / "compiles.jsonl").read_text().splitlines()
    ]
    n = sum(
        r["kind"] == "program" and not r["cache_hit"] for r in compiled
    )  # the run's compiles.jsonl, counted
    assert card.locator(".compiles").inner_text().startswith("compile: ")
    assert f"; {n} program compile(s)" in card.locator(".compiles").inner_text()
    trace = card.locator("a.trace-link")
    assert trace.get_attribute("href") == "/files/tiny-run/trace.json"
    body = httpx.get(urllib.parse.urljoin(server, trace.get_attribute("href"))).json()
    assert body["traceEvents"], "the trace link serves the run's Chrome/Perfetto trace"
    page.screenshot(path=str(shots / "viewer-runs.png"), full_page=True)
    watched.check()


def test_curves_follow_a_run_that_is_still_writing(written, watched, tmp_path):
    run = tmp_path / "live-run"  # its own copy: the other tests see the written run unchanged
    run.mkdir()
    shutil.copy2(written["episodes"] / "metrics.jsonl", run / "metrics.jsonl")
    with ViewerServer(ViewerConfig(runs=(str(run),), port=0)) as url:
        page = watched.page
        page.goto(url)
        steps = page.locator('section[data-run="live-run"] .steps')
        page.wait_for_function(
            "() => (document.querySelector('section[data-run=\"live-run\"] .steps') || {})"
            ".textContent?.includes('last step 3')"
        )
        with open(run / "metrics.jsonl", "a") as f:  # the run logs step 4 after the page loaded
            f.write(json.dumps({"step": 4, "time": 0.0, **metrics_record(4)}) + "\n")
        page.wait_for_function(
            "() => document.querySelector('section[data-run=\"live-run\"] .steps')"
            ".textContent.includes('last step 4')",
            timeout=15000,
        )
        assert "4 metric records" in steps.inner_text()
        legend = page.locator('.chart[data-chart="loss"] .legend').inner_text()
        assert "(last 0.25 at step 4)" in legend
        assert page.locator('.chart[data-chart="loss"]').get_attribute("data-points") == "4"
    watched.check()


def test_deep_link_shows_a_trained_trajectory_text_and_tokens(server, train_run, watched, shots):
    rec = json.loads((train_run / "trajectories.jsonl").read_text().splitlines()[5])
    page = watched.page
    page.goto(f"{server}?run=tiny-run&trajectory={urllib.parse.quote(rec['trajectory_id'])}")
    page.locator("#tokens .tok").first.wait_for()
    assert page.locator("#trajectory h2").inner_text() == f"Trajectory {rec['trajectory_id']}"
    assert page.locator("#tokens .tok").count() == rec["num_tokens"]
    assert page.locator("#tokens .tok.sampled").count() == rec["num_sampled"]
    turns = page.locator(".turn").all_inner_texts()
    assert any("Repeat the letter" in t for t in turns), (
        turns
    )  # TinyRepeat's prompt, decoded from the token ids
    action = page.locator(".turn.action pre").first.inner_text()
    assert action == rec["response"]
    assert "".join(page.locator("#tokens .tok.sampled").all_inner_texts()) == rec["response"]
    # the run's trajectories.jsonl carries per-token logprobs and versions: every colouring is on
    assert (
        len(rec["logprobs"]) == rec["num_tokens"]
        and len(rec["token_versions"]) == rec["num_tokens"]
    )
    for colour in ("logprob", "version", "advantage"):
        assert not page.locator(f"input[name=colour][value={colour}]").is_disabled(), colour
        page.locator(f"input[name=colour][value={colour}]").check()
        styles = page.locator("#tokens .tok.sampled").evaluate_all(
            "els => els.map(e => e.style.background)"
        )
        assert all(styles), f"every sampled token is coloured by its {colour}"
    assert page.locator("#tokens .tok.prompt").first.evaluate("e => e.style.background") == ""
    page.screenshot(path=str(shots / "viewer-trajectory-train.png"), full_page=True)
    watched.check()


def test_logged_episode_colours_tokens_by_logprob_version_and_advantage(
    server, written, watched, shots
):
    ix = LogIndex(next((written["episodes"] / "trajectories").glob("*.jsonl")), "episodes")
    ix.refresh()
    row = ix.rows[2]
    page = watched.page
    page.goto(f"{server}?run=episodes-run&trajectory={row['id']}")
    page.locator("#tokens .tok.sampled").first.wait_for()
    assert (
        page.locator(".turn.tool").count() == 1
        and "calculator" in page.locator(".turn.tool").inner_text()
    )
    assert "\\boxed{" in page.locator(".turn.action").nth(1).inner_text()
    toks = page.locator("#tokens .tok.sampled")
    # the reference: the project's reader over the same log (every step's token arrays, both actions)
    (ep,) = [e for e in read_log(ix.path) if e.episode == row["id"]]
    arrays = [read_tokens(ix.path, t) for t in ep.tokens]
    assert len(arrays) == 2 and toks.count() == sum(int(a["loss_mask"].sum()) for a in arrays)
    assert page.locator("#tokens .tok").count() == sum(len(a["token_ids"]) for a in arrays)

    def colours() -> list[str]:
        return toks.evaluate_all("els => els.map(e => e.style.background)")

    by_logprob = colours()
    assert len(set(by_logprob)) > 3, "logprobs -0.25 * (i % 12) give many shades"
    assert "logprob -0.25" in toks.nth(1).get_attribute("title")
    page.locator("input[name=colour][value=version]").check()
    by_version = colours()
    assert (
        len(set(by_version)) == 1 and by_version != by_logprob[: len(by_version)]
    )  # one policy version
    assert "v2" in page.locator(".note .tok").inner_text()
    page.locator("input[name=colour][value=advantage]").check()
    assert "advantage 0.75" in toks.nth(0).get_attribute("title")
    page.locator("input[name=colour][value=logprob]").check()
    page.screenshot(path=str(shots / "viewer-trajectory-episode.png"), full_page=True)
    watched.check()


def test_trajectory_table_pages_and_filters_on_the_server(server, train_run, watched, shots):
    n = len((train_run / "trajectories.jsonl").read_text().splitlines())
    page = watched.page
    page.goto(f"{server}?tab=trajectories&run=tiny-run")
    page.locator("#trajectory-table tbody tr").first.wait_for()
    assert page.locator("#trajectory-table tbody tr").count() == 50
    assert page.locator("#table-count").inner_text() == f"rows 1–50 of {n}"
    page.screenshot(path=str(shots / "viewer-trajectories.png"), full_page=True)
    page.get_by_text("next ›").click()
    page.wait_for_function(
        f"() => document.querySelector('#table-count')?.textContent === 'rows 51–{n} of {n}'"
    )
    page.locator("input[name=reward_min]").fill("0.1")
    page.get_by_text("Apply").click()
    page.locator(
        '#trajectory-table[data-query*="reward_min=0.1"] tbody tr'
    ).first.wait_for()  # the filtered page drawn
    rewards = [
        float(t)
        for t in page.locator("#trajectory-table tbody tr td:nth-child(7)").all_inner_texts()
    ]
    want = sum(
        json.loads(line)["reward"] >= 0.1
        for line in (train_run / "trajectories.jsonl").read_text().splitlines()
    )
    assert rewards and all(r >= 0.1 for r in rewards) and len(rewards) == min(50, want)
    page.locator("#trajectory-table tbody tr").first.click()
    page.locator("#tokens").wait_for()
    assert "trajectory=" in page.url
    watched.check()


def test_suite_summary_and_eval_table_render(server, watched, shots):
    page = watched.page
    page.goto(f"{server}?tab=suites")
    page.locator("#suite-comparisons").wait_for()
    assert page.locator("#suite-results tbody tr").count() == 4
    heads = page.locator("#suite-results th").all_inner_texts()
    assert {"policy", "env", "pass@1", "pass@4", "mean_reward", "ci"} <= set(heads)
    assert page.locator('section[data-run="suite-eval"] circle[data-interval]').count() == 4 + 2
    assert page.locator("#eval-table tbody tr").count() == 2
    assert "pass@4" in page.locator("#eval-table").inner_text()
    page.screenshot(path=str(shots / "viewer-suites.png"), full_page=True)
    watched.check()


def test_a_malformed_or_half_written_run_shows_errors_not_a_blank_page(
    tmp_path, watched, shots, train_run
):
    run = tmp_path / "broken-run"
    run.mkdir()
    (run / "config.json").write_text('{"model": {"name": "tiny-qwen3"')  # cut mid-write
    good = json.dumps({"step": 1, "loss": 0.5, "rollout_reward_mean": 0.2})
    (run / "metrics.jsonl").write_text(
        good + "\n{not json}\n" + json.dumps({"step": 2, "loss": 0.4}) + '\n{"step": 3, "lo'
    )
    lines = (train_run / "trajectories.jsonl").read_text().splitlines()[:3]
    (run / "trajectories.jsonl").write_text(
        lines[0] + "\n[1, 2\n" + lines[1] + "\n" + lines[2][:40]
    )
    with ViewerServer(ViewerConfig(runs=(str(run),), port=0)) as url:
        page = watched.page
        page.goto(url)
        page.locator("#errors .error").first.wait_for()
        errors = (
            page.locator("#errors").inner_text()
            + page.locator('section[data-run="broken-run"]').inner_text()
        )
        assert "config.json: expected JSON, but it does not parse" in errors
        assert "metrics.jsonl at byte" in errors and "{not json}" in errors
        page.locator('section[data-run="broken-run"] .torn').filter(
            has_text="half-written"
        ).wait_for()
        assert page.locator('.chart[data-chart="loss"]').get_attribute("data-points") == "2"
        page.screenshot(path=str(shots / "viewer-broken-runs.png"), full_page=True)
        page.goto(f"{url}?tab=trajectories&run=broken-run")
        page.locator(".log-error").first.wait_for()
        assert (
            "line 2 of trajectories.jsonl is not a JSON record"
            in page.locator(".log-error").inner_text()
        )
        assert "half-written" in page.locator(".torn").inner_text()
        assert page.locator("#trajectory-table tbody tr").count() == 2
        page.screenshot(path=str(shots / "viewer-broken-trajectories.png"), full_page=True)
        page.goto(f"{url}?run=broken-run&trajectory=no-such-id")
        page.locator("#page-error").wait_for()
        assert "no log of run 'broken-run' holds it" in page.locator("#page-error").inner_text()
    watched.check()


# ------------------------------------------------------------------------------------ server and index


def test_index_reads_only_what_was_appended_and_waits_for_a_torn_line(tmp_path):
    log = tmp_path / "trajectories.jsonl"
    recs = [
        {"step": i // 4, "group_id": f"g{i // 4}", "trajectory_id": f"t{i}", "reward": i / 10}
        for i in range(10)
    ]
    text = "".join(json.dumps(r) + "\n" for r in recs)
    log.write_text(text[:-20])  # the writer is mid-way through the last line
    ix = LogIndex(log, "train")
    ix.refresh()
    assert [r["id"] for r in ix.rows] == [f"t{i}" for i in range(9)] and ix.torn_tail
    pos = ix.pos
    with open(log, "a") as f:
        f.write(text[-20:] + json.dumps({"trajectory_id": "t10", "reward": 1.0, "step": 3}) + "\n")
    ix.refresh()
    assert [r["id"] for r in ix.rows][-2:] == ["t9", "t10"] and not ix.torn_tail and ix.pos > pos
    assert ix.read_records(ix.rows[9]) == [recs[9]]


def test_first_page_of_a_big_log_is_served_before_the_whole_log_is_indexed(tmp_path):
    from gymllm.viewer.index import CHUNK_BYTES, Filters
    from gymllm.viewer.runs import ViewedRun
    from gymllm.viewer.server import trajectory_page

    run = tmp_path / "big"
    run.mkdir()
    line = {"step": 1, "group_id": "g", "reward": 0.5, "token_ids": list(range(200))}
    with open(run / "trajectories.jsonl", "w") as f:
        for i in range(20_000):
            f.write(json.dumps({**line, "trajectory_id": f"t{i}"}) + "\n")
    viewed = ViewedRun(run, "big")
    page = trajectory_page(viewed, Filters(), 0, 50)
    (ix,) = viewed.logs().values()
    assert [r["id"] for r in page["rows"]] == [f"t{i}" for i in range(50)]
    assert (
        not page["complete"] and ix.pos <= CHUNK_BYTES < ix.file_size()
    )  # one chunk read, not the file
    filtered = trajectory_page(viewed, Filters(text="t1999"), 0, 50)
    assert filtered["complete"] and [r["id"] for r in filtered["rows"]] == ["t1999"] + [
        f"t1999{k}" for k in range(10)
    ]


def test_server_binds_loopback_and_serves_only_listed_files(written):
    config = ViewerConfig(runs=(str(written["episodes"]),), port=0)
    assert config.host == "127.0.0.1"
    with ViewerServer(config) as url:
        assert urllib.parse.urlsplit(url).hostname == "127.0.0.1"
        c = httpx.Client(base_url=url)
        assert c.get("/files/episodes-run/config.json").json()["model"]["name"] == "tiny-qwen3"
        for bad in (
            "/files/episodes-run/..%2F..%2Fetc%2Fpasswd",
            "/files/episodes-run/metrics.jsonl",
            "/files/nope/config.json",
        ):
            r = c.get(bad)
            assert r.status_code == 404 and "error" in r.json(), bad
        assert (
            c.get("/api/trajectories", params={"run": "nope"})
            .json()["error"]
            .startswith("run 'nope': expected")
        )
        table = "/api/trajectories"  # the filters are Filters' own keyword arguments
        assert c.get(table, params={"run": "episodes-run"}).json()["total"] > 0
        assert c.get(table, params={"run": "episodes-run", "reward_min": 1e9}).json()["total"] == 0
        assert (
            c.get(table, params={"run": "episodes-run", "text": "no-such-id"}).json()["total"] == 0
        )
        assert c.get(table, params={"run": "episodes-run", "reward_min": "x"}).status_code == 422
        for asset in ("app.js", "app.css", "charts.js"):
            assert c.get(f"/static/{asset}").status_code == 200
        page = c.get("/").text
        assert "http" not in page.replace("http-equiv", ""), "the page names no outside URL"
    with pytest.raises(ConfigError, match="at least one run directory"):
        ViewerConfig(runs=())
    with pytest.raises(ConfigError, match=r"\[0, 65535\]"):
        ViewerConfig(runs=("x",), port=70000)


def test_gymllm_view_prints_its_url_and_serves(written):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gymllm.cli.main",
            "view",
            str(written["episodes"]),
            str(written["suite"]),
            "--port",
            "0",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()  # blocks until the server printed its URL (or exited)
        assert line.startswith("gymllm view: serving 2 run(s) at http://127.0.0.1:"), line
        url = line.split(" at ")[1].split()[0]
        names = [r["name"] for r in httpx.get(url + "api/runs", timeout=30).json()]
        assert names == ["episodes-run", "suite-eval"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    missing = subprocess.run(
        [sys.executable, "-m", "gymllm.cli.main", "view", "/no/such/run"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_the_viewer_starts_without_the_model_stack():
    """Serving a run needs no JAX: the model stack is imported only to decode a trajectory's tokens
    (a tiny model's tokenizer) or recompute an advantage, lazily."""
    code = (
        "import sys, gymllm.viewer, gymllm.viewer.detail, gymllm.cli.view; "
        "print(sorted(m for m in ('jax', 'flax', 'gymllm.models', 'gymllm.inference', 'gymllm.algos') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_wheel_carries_the_page_and_its_assets(tmp_path):
    """The page's files are package data: a wheel built from this tree holds every file of static/."""
    import zipfile

    from gymllm.viewer import STATIC_DIR

    root = pathlib.Path(__file__).resolve().parents[1]
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(root / name, src / name)
    shutil.copytree(
        root / "gymllm", src / "gymllm", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(tmp_path / "wheels"),
            str(src),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    (wheel,) = (tmp_path / "wheels").glob("gymllm-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {f"gymllm/viewer/static/{p.name}" for p in STATIC_DIR.iterdir() if p.is_file()}
    assert {"gymllm/viewer/static/index.html", "gymllm/viewer/static/app.js"} <= shipped <= names
