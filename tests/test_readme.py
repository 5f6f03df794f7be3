"""The README's code runs as written, and its Quickstart holds the command CI runs."""

import os
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_quickstart_holds_exactly_two_commands_and_ci_runs_the_test_one():
    quick = README.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```bash\n(.*?)\n```", quick, flags=re.S)
    assert len(commands) == 2 and all("\n" not in c for c in commands)
    assert "gymllm train" in commands[0]
    assert commands[1] in (ROOT / ".ci" / "run").read_text()


def test_api_snippet_runs(tmp_path, monkeypatch):
    snippet = re.search(
        r"## The API in ten lines\n\n```python\n(.*?)\n```", README, flags=re.S
    ).group(1)
    assert (
        len([line for line in snippet.splitlines() if line.strip() and not line.startswith("#")])
        <= 12
    )
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(snippet, "README.md", "exec"), scope)
    assert scope["reward"] == 1.0 and scope["terminated"]
    assert len(scope["env_ids"]) >= 1 and set(scope["env_ids"]) <= {3, 5}
    assert os.path.isdir(tmp_path / "runs" / "readme-log")
    scope["vec"].close()
    scope["env"].close()


# What moved out of the README to docs/ (a front page of at most 8,000 characters): each page is linked
# from the README and is in the site's nav.
MOVED_TO_DOCS = (
    "benchmarks.md",
    "scale-out.md",
    "tutorials/cluster.md",
    "network.md",
    "recipes.md",
    "sft.md",
    "bad-input.md",
    "design.md",
    "commands.md",
    "tutorials/train-default.md",
)


def test_readme_is_a_front_page():
    assert len(README) <= 8000, (
        f"README.md is {len(README)} characters: move detail to docs/ (at most 8,000)"
    )
    assert "RESULT key" not in README and not re.search(r"\| `\w+\.py` \|", README), (
        "benchmark tables live in docs/"
    )


def test_readme_links_resolve_and_every_moved_page_is_linked_and_in_the_nav():
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    local = [link for link in links if not re.match(r"[a-z]+://", link)]
    for link in local:
        assert (ROOT / link).exists(), f"README links {link}, which does not exist"
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in MOVED_TO_DOCS:
        assert f"docs/{page}" in local, f"README does not link docs/{page}"
        assert re.search(rf":\s*{re.escape(page)}\s*$", nav, flags=re.M), (
            f"mkdocs.yml's nav lacks {page}"
        )


def test_command_table_lists_exactly_the_gymllm_subcommands():
    from gymllm.cli.main import COMMANDS

    table = README.split("## Commands", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `gymllm")]
    named = {m for row in rows for m in re.findall(r"`gymllm ([a-z][a-z-]*)", row)}
    assert named == set(COMMANDS), f"table names {sorted(named)}, gymllm has {sorted(COMMANDS)}"
