"""``worker_method="ray"`` on code written for worker processes: a training script's own
functions and globals, a dataset that writes to its arrays, and batches whose tensors share
storage, are written to in place, or are subclasses, each compared with ``DataLoader``'s
worker processes on the session's Ray cluster (``ray_cluster`` in ``conftest.py``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy
import pytest
import torch
from torch.utils.data import DataLoader

from dataloaderx import DataLoaderX
from tests.helpers import RangeDataset
from tests.reliability_support import run_scenario

pytest.importorskip("ray", reason="ray is not installed: pip install 'dataloaderx[ray]'")

from tests.ray_support import no_actors_or_threads_left  # after the skip: imports ray

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("ray_cluster")]


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    yield from no_actors_or_threads_left()


def test_a_script_run_as_main_keeps_its_globals_and_its_arrays_writable(
    ray_cluster: Any,
) -> None:
    # worker_init_fn sets a global of the script that the dataset reads (one payload: the
    # functions share the script's globals), and the dataset writes to its numpy array.
    done = run_scenario("ray_script.py", [ray_cluster.address], timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["ray"] == report["processes"]
    assert {flag for _, flag, _ in report["ray"]} == {100, 101}


class Marked(torch.Tensor):
    """A tensor subclass a batch may hold."""


def mixed(items: list[torch.Tensor]) -> dict[str, Any]:
    """A batch with two tensors over one storage, a subclass, a parameter, a numpy array,
    a dtype numpy has not, and a transposed view."""
    stacked = torch.stack(items).float()
    return {
        "whole": stacked,
        "column": stacked[:, 0],
        "marked": torch.ones(3).as_subclass(Marked),
        "parameter": torch.nn.Parameter(torch.ones(2)),
        "array": numpy.arange(3),
        "bfloat16": torch.ones(2, dtype=torch.bfloat16),
        "transposed": torch.arange(12).reshape(3, 4).t(),
    }


def described(batch: dict[str, Any]) -> dict[str, Any]:
    """What a batch is, and what writes to it do."""
    whole, column, array = batch["whole"], batch["column"], batch["array"]
    shares = whole.untyped_storage().data_ptr() == column.untyped_storage().data_ptr()
    column[0] = -1.0  # written through the view: the whole sees it where they share
    array[0] = -1  # the loop's own array
    return {
        "types": {key: type(value).__name__ for key, value in batch.items()},
        "shares": shares,
        "written": whole[0, 0].item(),
        "array": array.tolist(),
        "grad": batch["parameter"].requires_grad,
        "values": [batch["bfloat16"].tolist(), batch["transposed"].tolist()],
        "strides": batch["transposed"].stride(),
    }


@pytest.mark.parametrize("handover", ["auto", "object_store"])
def test_batches_arrive_as_worker_processes_deliver_them(handover: str) -> None:
    arguments = {"batch_size": 2, "num_workers": 1, "collate_fn": mixed}
    expected = [described(batch) for batch in DataLoader(RangeDataset(4), **arguments)]
    options = {"handover": handover}
    loader = DataLoaderX(RangeDataset(4), **arguments, worker_method="ray", worker_options=options)
    assert [described(batch) for batch in loader] == expected
    assert expected[0]["shares"]
    assert expected[0]["written"] == -1.0
