"""``--cluster`` and ``--cluster-workers`` as the engine reads them (flags over COLI_CLUSTER and
COLI_CLUSTER_WORKERS), and the layer grouping the remote call shares with both backends. No
Ray here: these run without the `cluster` extra."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from colibri.backend_kit.ray_cluster import ClusterSpec
from colibri.backend_kit.remote_experts import Placement, group_rows
from colibri.engine.settings import SettingsError, from_environment

MODEL = Path("some-model")


def test_cluster_specs() -> None:
    assert ClusterSpec.parse("ray") == ClusterSpec(None, 0)
    assert ClusterSpec.parse("ray:10.0.0.1:6379", 3) == ClusterSpec("10.0.0.1:6379", 3)
    assert str(ClusterSpec.parse("ray:auto")) == "ray:auto"
    for bad in ("dask", "ray:", "rays"):
        with pytest.raises(ValueError, match="expected ray or ray:ADDRESS"):
            ClusterSpec.parse(bad)
    with pytest.raises(ValueError, match="--cluster-workers"):
        ClusterSpec.parse("ray", -1)


def test_flags_win_over_the_environment() -> None:
    env = {"COLI_CLUSTER": "ray:auto", "COLI_CLUSTER_WORKERS": "4"}
    assert (from_environment(env, model_dir=MODEL).cluster,
            from_environment(env, model_dir=MODEL).cluster_workers) == ("ray:auto", 4)
    flags = from_environment(env, model_dir=MODEL, cluster="ray", cluster_workers=2)
    assert (flags.cluster, flags.cluster_workers) == ("ray", 2)
    assert from_environment({}, model_dir=MODEL).cluster is None
    with pytest.raises(SettingsError, match="expected ray or ray:ADDRESS"):
        from_environment({"COLI_CLUSTER": "mpi"}, model_dir=MODEL)
    with pytest.raises(SettingsError, match="COLI_CLUSTER_WORKERS"):
        from_environment({"COLI_CLUSTER_WORKERS": "-2"}, model_dir=MODEL)


def test_rows_are_grouped_as_the_local_paths_group_them() -> None:
    chosen = np.array([[1, 4], [0, 1], [4, 6]], np.int32)
    groups = group_rows(chosen)
    assert groups.used.tolist() == [0, 1, 4, 6]
    assert groups.start.tolist() == [0, 1, 3, 5, 6]
    assert groups.rows.tolist() == [1, 0, 1, 0, 2, 2]  # each expert's rows ascending
    assert groups.pairs.tolist() == [2, 0, 3, 1, 4, 5]  # row * k + slot


def test_a_striped_placement_gives_every_owner_a_share_of_every_layer() -> None:
    placement = Placement.striped([3, 4], 8, 3)
    shares = [placement.owned(o) for o in range(3)]
    every = [(layer, e) for layer in (3, 4) for e in range(8)]
    assert sorted(p for share in shares for p in share) == every
    assert all({layer for layer, _ in share} == {3, 4} for share in shares)
