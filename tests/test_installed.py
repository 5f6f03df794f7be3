"""The installed package works from any directory: a wheel built from this tree, installed into a fresh
virtualenv, trains a shipped recipe by name and lists the envs from a temporary directory.

The virtualenv reuses this environment's packages (its dependencies: JAX, gymnasium...) through a
``.pth`` line, not its editable gymllm: the ``gymllm`` that runs is the wheel's, which the test checks.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import site
import subprocess
import sys
import sysconfig

import pytest

SOURCE = pathlib.Path(__file__).resolve().parents[1]


def _run(
    cmd: list[str], cwd: pathlib.Path, env: dict[str, str], timeout: float = 600
) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"{cmd}: rc={proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    )
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("installed")
    # build from a copy, so the build leaves nothing (build/, egg-info) in the shared source tree
    src = root / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(SOURCE / name, src / name)
    shutil.copytree(
        SOURCE / "gymllm", src / "gymllm", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    wheels = root / "wheels"
    _run(
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
            str(wheels),
            str(src),
        ],
        cwd=root,
        env=env,
    )
    (wheel,) = wheels.glob("gymllm-*.whl")
    venv = root / "venv"
    _run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
        cwd=root,
        env=env,
    )
    python = venv / "bin" / "python"
    purelib = pathlib.Path(
        _run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            cwd=root,
            env=env,
        ).stdout.strip()
    )
    # this environment's packages (gymllm's dependencies) after the venv's own, without running their .pth files
    # (the editable gymllm's finder is one of them)
    ours = [
        p
        for p in site.getsitepackages() + [sysconfig.get_paths()["purelib"]]
        if pathlib.Path(p).is_dir()
    ]
    (purelib / "zz_reuse_parent_env.pth").write_text("\n".join(dict.fromkeys(ours)) + "\n")
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "--no-index",
            "-q",
            str(wheel),
        ],
        cwd=root,
        env=env,
    )
    work = root / "elsewhere"
    work.mkdir()
    env = {
        **env,
        "PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        "JAX_PLATFORMS": "cpu",
    }
    return {
        "python": python,
        "gymllm": venv / "bin" / "gymllm",
        "cwd": work,
        "env": env,
        "purelib": purelib,
        "wheel": wheel,
    }


def test_the_wheel_ships_the_recipes(installed):
    import zipfile

    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    assert {"gymllm/recipes/arithmetic_tiny.toml", "gymllm/recipes/calc_math.toml"} <= names


def test_installed_gymllm_is_the_wheels_and_lists_envs(installed):
    where = _run(
        [str(installed["python"]), "-c", "import gymllm, json; print(json.dumps(gymllm.__file__))"],
        cwd=installed["cwd"],
        env=installed["env"],
    ).stdout
    assert pathlib.Path(json.loads(where)).is_relative_to(installed["purelib"]), where
    out = _run(
        [str(installed["gymllm"]), "envs"], cwd=installed["cwd"], env=installed["env"]
    ).stdout
    assert "gymllm/Arithmetic-v0" in out and "gymllm/CalcMath-v0" in out
    assert "unavailable" not in out.split("gymllm/Arithmetic-v0", 1)[1].splitlines()[0]


def test_installed_gymllm_trains_a_shipped_recipe_from_another_directory(installed):
    """The recipe's own sizes cut to the smallest it allows (one group of two, 8 tokens): wiring, not learning."""
    small = [
        "--env.num-envs",
        "2",
        "--rollout.group-size",
        "2",
        "--rollout.max-concurrency",
        "2",
        "--engine.num-slots",
        "2",
        "--sampling.max-tokens",
        "4",
        "--learner.groups-per-step",
        "1",
        "--learner.micro-batch-size",
        "2",
        "--run.no-console",
        "--run.no-report",
        "--run.no-log-trajectories",
        "--run.checkpoint-every",
        "0",
    ]
    _run(
        [str(installed["gymllm"]), "train", "arithmetic_tiny", "--learner.num-steps", "2", *small],
        cwd=installed["cwd"],
        env=installed["env"],
    )
    run_dir = (
        installed["cwd"] / "runs" / "arithmetic_tiny"
    )  # the recipe's run_dir, relative to where it ran
    steps = [
        json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
    ]
    assert steps[-2:] == [1, 2], steps
    config = json.loads((run_dir / "config.json").read_text())
    assert config["env"]["id"] == "gymllm/Arithmetic-v0" and config["learner"]["num_steps"] == 2
