"""Hostile HTTP against ``gymllm serve-env`` (OpenEnv's app in a uvicorn thread on 127.0.0.1): step before
reset, non-finite and oversized numbers anywhere in a body, malformed actions all get a 4xx with a JSON body
naming what was wrong (never a plain-text 500), the server serving a good request after each; and no
registered env's gold answer reaches the client in reset or step metadata."""

from __future__ import annotations

import json
import logging

import gymnasium
import httpx
import pytest

pytest.importorskip("openenv", reason="the openenv extra (pip install 'gymllm[openenv]')")

import gymllm  # noqa: E402
from gymllm.envs.openenv_factory import make_env_factory  # noqa: E402
from gymllm.envs.openenv_server import GymllmEnvironment, ServeEnvConfig, ServerThread, build_app  # noqa: E402

J = {"content-type": "application/json"}
GOLD = (
    "answer",
    "answers",
    "gold",
    "gold_answer",
    "solution",
    "ground_truth",
    "reference_answer",
    "expected_answer",
    "correct_answer",
    "target_answer",
)  # what the envs name their gold answer in info


@pytest.fixture(scope="module")
def arithmetic():
    logging.getLogger("uvicorn.error").setLevel(
        logging.CRITICAL
    )  # the 500s before the fix print tracebacks
    with ServerThread(build_app(ServeEnvConfig(env="gymllm/Arithmetic-v0"))) as s:
        yield s.url


def _good(url: str) -> None:
    r = httpx.post(url + "/reset", json={"seed": 1})
    assert r.status_code == 200 and r.json()["observation"]["text"].startswith("Compute"), r.text[
        :300
    ]


BAD = [  # (name, path, raw body, status range, fragment of the JSON error)
    ("step before reset", "/step", b'{"action": {"text": "1"}}', (409, 409), "reset"),
    ("seed NaN", "/reset", b'{"seed": NaN}', (400, 400), "seed"),
    ("seed 1e999", "/reset", b'{"seed": 1e999}', (400, 400), "seed"),
    ("seed -Infinity", "/reset", b'{"seed": -Infinity}', (400, 400), "seed"),
    ("seed 2**64", "/reset", b'{"seed": 18446744073709551616}', (400, 400), "seed"),
    ("reset option NaN", "/reset", b'{"seed": 3, "level": NaN}', (400, 400), "level"),
    (
        "action holding Infinity",
        "/step",
        b'{"action": {"text": "x", "n": Infinity}}',
        (400, 400),
        "action.n",
    ),
    (
        "timeout NaN",
        "/step",
        b'{"action": {"text": "1"}, "timeout_s": NaN}',
        (400, 400),
        "timeout_s",
    ),
    ("action not an object", "/step", b'{"action": "x"}', (400, 499), "action"),
    ("action text not a string", "/step", b'{"action": {"text": 5}}', (400, 499), "text"),
    ("no action", "/step", b"{}", (400, 499), "action"),
    (
        "action too long",
        "/step",
        json.dumps({"action": {"text": "9" * 1_100_000}}).encode(),
        (400, 499),
        "text",
    ),
    ("invalid JSON", "/step", b'{"action": ', (400, 499), ""),
    ("deeply nested", "/reset", b"[" * 50_000 + b"]" * 50_000, (400, 499), ""),
]


@pytest.mark.parametrize("name,path,body,status,fragment", BAD, ids=[b[0] for b in BAD])
def test_hostile_requests_get_a_4xx_json_error(arithmetic, name, path, body, status, fragment):
    r = httpx.post(arithmetic + path, content=body, headers=J)
    assert status[0] <= r.status_code <= status[1], (r.status_code, r.text[:300])
    assert r.headers["content-type"].startswith("application/json"), r.text[:300]
    assert fragment in json.dumps(r.json()), r.text[:500]
    _good(arithmetic)


def test_the_reset_over_http_does_not_carry_the_answer(arithmetic):
    r = httpx.post(arithmetic + "/reset", json={"seed": 3})
    local = gymllm.make("gymllm/Arithmetic-v0")
    obs, info = local.reset(seed=3)
    assert r.json()["observation"]["text"] == obs
    served = json.dumps(r.json())
    assert (
        "answer" not in json.dumps(r.json()["observation"]["metadata"])
        and f'"{info["answer"]}"' not in served
    )


def _leaves(x, path=""):
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _leaves(v, f"{path}.{k}")
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from _leaves(v, f"{path}[{i}]")
    else:
        yield path, x


def _gold(info: dict) -> list[str]:
    return [
        str(v) for p, v in _leaves(info) if p.rsplit(".", 1)[-1] in GOLD and v not in (None, "")
    ]


def _sweep(env_id: str) -> list[str]:
    """Where the gold answer of ``env_id`` (seed 0) shows up in what the server sends at reset and step."""
    raw = gymllm.make(env_id)
    try:
        _, info = raw.reset(seed=0)
        gold = set(_gold(info))
        try:
            gold |= set(_gold(raw.step("no idea")[4]))
        except Exception:  # noqa: BLE001 - an env that rejects the probe action has no step info to compare
            pass
    finally:
        raw.close()
    served = GymllmEnvironment(make_env_factory(env_id), env_name=env_id)
    try:
        sent = [served.reset(seed=0).metadata]
        try:
            sent.append(served.step(type("A", (), {"text": "no idea"})()).metadata)
        except Exception:  # noqa: BLE001 - as above
            pass
    finally:
        served.close()
    # a gold key, or a value equal to the gold answer under another name (short values match by chance)
    return [
        f"{env_id}: {p} = {v!r}"
        for meta in sent
        for p, v in _leaves(meta)
        if p.rsplit(".", 1)[-1] in GOLD
        or (
            isinstance(v, (str, int))
            and not isinstance(v, bool)
            and len(str(v)) >= 3
            and str(v) in gold
        )
    ]


def _ids(catalogue: bool) -> list[str]:
    skip = {"gymllm/OpenEnv-v0", "gymllm/Failing-v0"}  # needs a server of its own; fails on purpose
    ids = sorted(k for k in gymnasium.registry if k.startswith("gymllm/") and k not in skip)
    return (
        ids
        if catalogue
        else [i for i in ids if not i.startswith(("gymllm/rg-", "gymllm/ta-"))]
        + [
            i
            for i in ids
            if i
            in ("gymllm/rg-basic_arithmetic-v0", "gymllm/rg-gcd-v0", "gymllm/ta-GuessTheNumber-v0")
        ]
    )


def test_no_first_party_env_leaks_its_gold_answer():
    leaks = [x for env_id in _ids(catalogue=False) for x in _sweep(env_id)]
    assert not leaks, leaks


@pytest.mark.slow
def test_no_registered_env_leaks_its_gold_answer():
    leaks = [x for env_id in _ids(catalogue=True) for x in _sweep(env_id)]
    assert not leaks, leaks


def test_the_server_withholds_every_gold_key_and_the_operator_can_choose_otherwise():
    from gymllm.envs.openenv_server import GOLD_INFO_KEYS

    assert set(GOLD) <= set(GOLD_INFO_KEYS)
    env = GymllmEnvironment(make_env_factory("gymllm/Arithmetic-v0"), withhold_info=())
    try:
        assert "answer" in env.reset(seed=0).metadata["info"]
    finally:
        env.close()
