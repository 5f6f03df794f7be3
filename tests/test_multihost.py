"""Multi-host learner: two local CPU processes joined by ``jax.distributed.initialize`` (gloo
collectives, 2 host devices each, a (data 2) x (fsdp 2) mesh over both processes) take one
optimizer step on a globally sharded batch: loss and updated parameters equal a single-process,
single-device run on the same global batch."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from gymllm.algos.multihost import MultiHostConfig, config_from_env
from gymllm.errors import ConfigError

WORKER = textwrap.dedent("""
    import json, sys
    from gymllm.algos.multihost import gather, initialize_from_env, is_main_process
    mh = initialize_from_env()                      # before any JAX computation
    import jax, numpy as np
    from gymllm.algos import config as C
    from gymllm.algos.learner import LearnerConfig, StreamingLearner
    from gymllm.algos.optim import OptimizerConfig
    from gymllm.algos.sharding import ShardingConfig, make_mesh
    from gymllm.models import make_tiny
    import sys

    sys.path.insert(0, TESTS_DIR)
    from synthetic_groups import groups

    lm = make_tiny("qwen3", seed=0, vocab_size=300, hidden_size=32, intermediate_size=64, num_layers=1)
    sharding = ShardingConfig(data=2, fsdp=2) if mh is not None else ShardingConfig()
    mesh = make_mesh(sharding)
    lrn = StreamingLearner(lm.config, lm.model.flat_params(), loss=C.async_agentic(), mesh=mesh,
                           optimizer=OptimizerConfig(name="adamw", learning_rate=1e-2, max_grad_norm=1.0),
                           config=LearnerConfig(groups_per_step=2, micro_batch_size=4, max_len=16, min_bucket=16,
                                                fast_compile=True))
    [rep] = lrn.submit(groups(2, 0))                # the same global batch on every process
    params = gather(lrn.trainable)
    base = lm.model.flat_params()
    if is_main_process():
        np.savez(sys.argv[1], **params)
        info = dict(loss=rep.metrics["loss"], grad_norm=rep.metrics["grad_norm"],
                    processes=jax.process_count(), devices=len(jax.devices()), local=len(jax.local_devices()),
                    moved=max(float(np.max(np.abs(params[k] - np.asarray(base[k])))) for k in params),
                    mesh_processes=[[d.process_index for d in row] for row in mesh.devices] if mesh is not None else [],
                    sharded=sorted({str(getattr(v.sharding, "spec", "")) for v in lrn.trainable.values()}))
        print("RESULT " + json.dumps(info), flush=True)
""").replace("TESTS_DIR", repr(os.path.dirname(os.path.abspath(__file__))))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GYMLLM_") and k != "XLA_FLAGS"}
    return dict(env, JAX_PLATFORMS="cpu")


def result(stdout: str) -> dict:
    return json.loads(
        [line for line in stdout.splitlines() if line.startswith("RESULT ")][-1][len("RESULT ") :]
    )


def test_two_processes_equal_one_process(tmp_path):
    port = free_port()
    procs = []
    for i in range(2):
        env = dict(
            clean_env(),
            GYMLLM_COORDINATOR=f"127.0.0.1:{port}",
            GYMLLM_NUM_PROCESSES="2",
            GYMLLM_PROCESS_ID=str(i),
            GYMLLM_LOCAL_DEVICES="2",
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", WORKER, str(tmp_path / f"multi{i}.npz")],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    single = subprocess.run(
        [sys.executable, "-c", WORKER, str(tmp_path / "single.npz")],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=600))
        finally:
            p.kill()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-4000:]
    assert single.returncode == 0, single.stderr[-4000:]
    multi, one = result(outs[0][0]), result(single.stdout)
    assert "RESULT" not in outs[1][0]  # only process 0 reports
    assert (multi["processes"], multi["devices"], multi["local"]) == (2, 4, 2)
    assert multi["mesh_processes"] == [[0, 0], [1, 1]]  # data across the processes, FSDP within one
    assert any("fsdp" in s for s in multi["sharded"])
    assert one["processes"] == 1 and one["moved"] > 1e-4
    assert abs(multi["loss"] - one["loss"]) < 1e-5 + 1e-4 * abs(one["loss"])
    assert abs(multi["grad_norm"] - one["grad_norm"]) < 1e-4 * one["grad_norm"] + 1e-7
    a, b = np.load(tmp_path / "multi0.npz"), np.load(tmp_path / "single.npz")
    assert set(a.files) == set(b.files)
    for k in b.files:
        np.testing.assert_allclose(a[k], b[k], atol=1e-3 * one["moved"] + 1e-6, err_msg=k)


def test_config_from_env():
    assert config_from_env({}) is None
    cfg = config_from_env(
        {
            "GYMLLM_COORDINATOR": "127.0.0.1:1234",
            "GYMLLM_NUM_PROCESSES": "2",
            "GYMLLM_PROCESS_ID": "1",
            "GYMLLM_LOCAL_DEVICES": "2",
        }
    )
    assert cfg == MultiHostConfig(
        coordinator_address="127.0.0.1:1234", num_processes=2, process_id=1, local_devices=2
    )
    with pytest.raises(ConfigError, match="GYMLLM_PROCESS_ID"):
        config_from_env({"GYMLLM_COORDINATOR": "h:1", "GYMLLM_NUM_PROCESSES": "2"})
    with pytest.raises(ConfigError, match="process_id"):
        MultiHostConfig(coordinator_address="h:1", num_processes=2, process_id=2)
    with pytest.raises(ConfigError, match="coordinator_address"):
        MultiHostConfig(coordinator_address="nohostport", num_processes=2, process_id=0)
