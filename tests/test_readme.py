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
    snippet = re.search(r"## The API in ten lines\n\n```python\n(.*?)\n```", README, flags=re.S).group(1)
    assert len([line for line in snippet.splitlines() if line.strip() and not line.startswith("#")]) <= 12
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(snippet, "README.md", "exec"), scope)
    assert scope["reward"] == 1.0 and scope["terminated"]
    assert len(scope["env_ids"]) >= 1 and set(scope["env_ids"]) <= {3, 5}
    assert os.path.isdir(tmp_path / "runs" / "readme-log")
    scope["vec"].close()
    scope["env"].close()
