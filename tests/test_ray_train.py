"""Ray workers under Ray's own clients, for real, in a script of their own
(``tests/scenarios/ray_train.py``): a Ray Train ``TorchTrainer`` whose ranks each build a
``DataLoaderX(worker_method="ray")`` on the trainer's cluster, with and without
``prepare_data_loader``, and a loader built inside a Ray task."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.reliability_support import run_scenario

pytest.importorskip("ray.train.torch", reason="needs Ray Train: pip install 'ray[train]'")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("ray-train")
    done = run_scenario("ray_train.py", [str(folder)], timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return {path.stem: json.loads(path.read_text()) for path in Path(folder).glob("*.json")}


@pytest.mark.parametrize("rank", [0, 1])
def test_each_rank_of_a_torch_trainer_uses_ray_workers_on_the_trainers_cluster(
    reports: dict[str, Any], rank: int
) -> None:
    report = reports[str(rank)]
    indices = [item[0] for batch in report["direct"] for item in batch]
    assert indices == list(range(rank, 16, 2))  # the rank's shard, in order
    assert report["prepared"] == report["direct"]  # prepare_data_loader kept the loader
    makers = {item[1] for batch in report["direct"] for item in batch}
    assert report["pid"] not in makers  # made by actors, not by processes forked here
    assert report["gcs"] == reports["driver"]["gcs"]  # no second Ray


@pytest.mark.parametrize("rank", [0, 1])
def test_a_rank_s_loader_that_prepare_data_loader_would_replace_says_so(
    reports: dict[str, Any], rank: int
) -> None:
    report = reports[str(rank)]
    assert len(report["warnings"]) == 1
    warned = report["warnings"][0]
    assert "Ray Train worker (world size 2) without a DistributedSampler" in warned
    assert "prepare_data_loader(loader, add_dist_sampler=False)" in warned
    assert report["replaced"] == "DataLoader"  # what the warning says Ray's helper does


def test_a_loader_built_in_a_ray_task_uses_that_cluster(reports: dict[str, Any]) -> None:
    report = reports["task"]
    assert report["gcs"] == reports["driver"]["gcs"]
    assert [item[0] for batch in report["batches"] for item in batch] == list(range(16))
    assert report["pid"] not in {item[1] for batch in report["batches"] for item in batch}
    assert not [text for text in report["warnings"] if "local Ray" in text]
