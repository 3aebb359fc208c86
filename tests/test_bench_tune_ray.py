"""``dataloaderx bench --tune`` with a Ray initialised: Ray workers in the sweep, on the
session's Ray cluster (``ray_cluster`` in ``conftest.py``: 8 CPUs on 3 nodes). Without a
Ray, see ``test_without_ray_tune_starts_no_ray`` in ``test_bench_tune.py``."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from torch.utils.data import DataLoader

from dataloaderx import DataLoaderX
from dataloaderx.bench.tune.actors import KeptActors
from dataloaderx.bench.tune.cluster import RayCluster
from dataloaderx.bench.tune.grid import Setting
from dataloaderx.bench.tune.measure import Workload
from dataloaderx.bench.tune.memory import PeakMemory
from dataloaderx.bench.tune.tuner import as_yaml
from dataloaderx.cli import main
from tests.helpers import RangeDataset, assert_same, wait_for

ray = pytest.importorskip("ray", reason="ray is not installed: pip install 'dataloaderx[ray]'")

from dataloaderx.workers import registry  # noqa: E402 - after the skip
from dataloaderx.workers.ray.group import NAMESPACE  # noqa: E402 - imports ray

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("ray_cluster")]

TINY = ["--dataset", "tests.bench_fixtures:tiny", "--step", "tests.bench_fixtures:noop"]
#: A few runs of each ladder's first counts: enough to reach the Ray actors' first rung.
TUNE = ["bench", "--tune", *TINY, "--batches", "4", "--batch-size", "2", "--budget", "5"]


def our_actors() -> list[str]:
    named = ray.util.list_named_actors(all_namespaces=True)
    return sorted(actor["name"] for actor in named if actor["namespace"] == NAMESPACE)


def the_cluster() -> dict[str, int]:
    alive = [node for node in ray.nodes() if node["Alive"]]
    cpus = int(ray.cluster_resources()["CPU"])
    return {"cpus": cpus, "nodes": len(alive), "machine_cpus": os.cpu_count() or 1}


@pytest.fixture(scope="module")
def tuned() -> dict[str, Any]:
    """``bench --tune --json`` on the session's Ray, which it finds initialised."""
    assert ray.is_initialized()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main([*TUNE, "--backends", "sync", "--no-progress", "--json"])
    assert code == 0
    assert wait_for(lambda: not our_actors(), within=30), f"actors left: {our_actors()}"
    document: dict[str, Any] = json.loads(out.getvalue())
    return document


def ray_rows(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [row for row in document["results"] if row["worker_method"] == "ray"]


def test_tune_with_a_ray_initialised_weighs_ray_workers_and_reports_the_cluster(
    tuned: dict[str, Any],
) -> None:
    assert tuned["sweep"]["worker_counts"]["ray"][:2] == [0, 1]
    rows = ray_rows(tuned)
    assert rows, "no Ray setting ran"
    assert all(row["loader"] == "sync" and row["num_workers"] >= 1 for row in rows)
    # The actors' start-up is reported apart from the rate, which epochs after it measure.
    assert all(row["actors_start_ms"] > 0 for row in rows)
    others = [row for row in tuned["results"] if row["worker_method"] != "ray"]
    assert all(row["actors_start_ms"] is None for row in others)
    assert tuned["recommendation"]["ray_cluster"] == the_cluster()


def same_batches_from_config(config: Any) -> DataLoaderX[Any]:
    loader = DataLoaderX.from_config(RangeDataset(40), config)
    assert_same(list(loader), list(DataLoader(RangeDataset(40), batch_size=2)))
    return loader


def test_the_recommendation_round_trips_through_from_config(
    tuned: dict[str, Any], tmp_path: Path
) -> None:
    same_batches_from_config(yaml.safe_load(tuned["recommendation"]["yaml"]))
    # The best Ray setting, written as the recommendation would be where it won.
    best = ray_rows(tuned)[0]
    setting = Setting(best["num_workers"], best["loader"], best["depth"], best["pin_memory"], "ray")
    cluster = RayCluster(**tuned["recommendation"]["ray_cluster"])
    written = tmp_path / "loader.yaml"
    written.write_text(as_yaml(setting, 2, cluster))
    assert written.read_text().startswith(f"# measured on a {cluster.describe()}\n")
    loader = same_batches_from_config(written)
    assert (loader.worker_method, loader.num_workers) == ("ray", best["num_workers"])
    del loader
    assert wait_for(lambda: not our_actors(), within=30)


def test_a_ray_setting_keeps_its_actors_between_runs_until_it_needs_their_room() -> None:
    one, two = (Setting(count, "sync", worker_method="ray") for count in (1, 2))
    with KeptActors(Workload(RangeDataset(40), print, 2, 4), cpus=2) as kept:
        first = kept.measure(one)
        actors = our_actors()
        again = kept.measure(one)
        assert len(actors) == 1
        assert our_actors() == actors  # the same actor ran both
        assert (first.startup_seconds or 0) > 0
        assert again.startup_seconds is None
        assert first.batches == again.batches == 4
        kept.measure(two)  # 1 + 2 actors do not fit 2 CPUs: the first setting's go
        assert wait_for(lambda: len(our_actors()) == 2 and actors[0] not in our_actors(), 30)
    assert wait_for(lambda: not our_actors(), within=30)


def test_tune_asked_for_ray_without_ray_installed_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in [name for name in sys.modules if name.startswith("dataloaderx.workers.ray.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "ray", None)  # what an import of a missing package does
    monkeypatch.setattr(registry, "_loaded", {})
    assert main([*TUNE, "--worker-method", "ray", "--no-progress"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "--tune weighs Ray workers (--worker-method ray), but worker_method='ray'" in err
    assert "pip install 'dataloaderx[ray]'" in err


def test_peak_memory_leaves_out_the_ray_this_process_started() -> None:
    psutil = pytest.importorskip("psutil")
    directory = os.path.dirname(ray.__file__)

    def read(what: Callable[[], Any], otherwise: Any) -> Any:
        try:
            return what()
        except psutil.Error:  # a Ray worker that ended between the listing and the read
            return otherwise

    # The session's cluster (ray.cluster_utils.Cluster) runs in children of this process.
    rays = [
        child
        for child in psutil.Process().children()
        if any(part.startswith(directory) for part in read(child.cmdline, [])[:3])
    ]
    assert rays
    below = [
        process for root in rays for process in read(partial(root.children, recursive=True), [])
    ]
    infos = [read(process.memory_full_info, None) for process in rays + below]
    ray_bytes = sum(info.pss for info in infos if info is not None)
    assert ray_bytes > 100 * 2**20
    own = psutil.Process().memory_full_info().pss
    with PeakMemory() as memory:
        time.sleep(0.1)
    assert memory.peak_bytes is not None
    assert memory.peak_bytes < own + ray_bytes / 2
