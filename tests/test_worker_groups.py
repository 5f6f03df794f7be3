"""The default tier runs on pytest-xdist workers (tests/conftest.py, ``--dist loadgroup``): each module on
one worker, and the modules that start a local Ray cluster (:class:`gymllm.ray_support.LocalCluster`) on
one shared worker, so two clusters never start at once. A new such module left out of
``conftest.RAY_MODULES`` fails here."""

from __future__ import annotations

import pathlib

import conftest

HERE = pathlib.Path(__file__).resolve().parent


def test_every_module_that_starts_a_local_ray_cluster_is_in_the_ray_group():
    starts = {
        p.name
        for p in HERE.glob("test_*.py")
        if p.name != pathlib.Path(__file__).name and "LocalCluster" in p.read_text()
    }
    assert starts == conftest.RAY_MODULES


def test_this_module_is_its_own_group(request):
    groups = [m.args[0] for m in request.node.iter_markers("xdist_group")]
    assert groups == [pathlib.Path(__file__).name]
