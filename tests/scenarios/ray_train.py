"""A Ray Train script: a ``TorchTrainer`` whose 2 ranks each build a
``DataLoaderX(worker_method="ray")``, and a Ray task that builds one, on the script's Ray.

Usage: ray_train.py FOLDER. Each rank reads its loader (with a ``DistributedSampler``)
directly and through ``prepare_data_loader``, builds a loader without a sampler (and
notes the warnings), and writes what it saw to ``FOLDER/<rank>.json``; the task writes
``FOLDER/task.json``; the driver writes ``FOLDER/driver.json``.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

# Ray reads pytest's variables as a sign that it runs its own tests; this Ray is not the
# session's (RAY_ADDRESS) either.
for name in [name for name in os.environ if name.startswith(("RAY_", "PYTEST_"))]:
    del os.environ[name]

import ray  # noqa: E402 - after the environment is set
import torch  # noqa: E402
from torch.utils.data import Dataset, DistributedSampler  # noqa: E402

from dataloaderx import DataLoaderX  # noqa: E402

ARGUMENTS = {"batch_size": 2, "num_workers": 2, "worker_method": "ray"}
OPTIONS = {"num_cpus": 0.25}


class WhereMade(Dataset[torch.Tensor]):
    """Item ``i``: ``i``, and the parent of the process that made it."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([index, os.getppid()])


def _batches(loader: Any) -> list[list[int]]:
    return [batch.tolist() for batch in loader]


def _train(config: dict[str, Any]) -> None:
    import ray.train
    from ray.train.torch import prepare_data_loader

    context = ray.train.get_context()
    rank, size = context.get_world_rank(), context.get_world_size()
    dataset = WhereMade()
    sampler = DistributedSampler(dataset, num_replicas=size, rank=rank, shuffle=False)
    loader = DataLoaderX(dataset, sampler=sampler, worker_options=OPTIONS, **ARGUMENTS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        unsharded = DataLoaderX(dataset, worker_options=OPTIONS, **ARGUMENTS)
    report = {
        "pid": os.getpid(),
        "gcs": ray.get_runtime_context().gcs_address,
        "direct": _batches(loader),
        "prepared": _batches(prepare_data_loader(loader)),
        "warnings": [str(w.message) for w in caught],
        "replaced": type(prepare_data_loader(unsharded, move_to_device=False)).__name__,
    }
    Path(config["folder"], f"{rank}.json").write_text(json.dumps(report))


@ray.remote(num_cpus=0)
def _in_a_task(folder: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = DataLoaderX(WhereMade(), worker_options=OPTIONS, **ARGUMENTS)
        batches = _batches(loader)
    report = {
        "gcs": ray.get_runtime_context().gcs_address,
        "pid": os.getpid(),
        "batches": batches,
        "warnings": [str(w.message) for w in caught],
    }
    Path(folder, "task.json").write_text(json.dumps(report))


def main(folder: str) -> None:
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer

    ray.init(address="local", include_dashboard=False, num_cpus=4, log_to_driver=False)
    trainer = TorchTrainer(
        _train,
        train_loop_config={"folder": folder},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
    )
    trainer.fit()
    ray.get(_in_a_task.remote(folder))
    Path(folder, "driver.json").write_text(
        json.dumps({"gcs": ray.get_runtime_context().gcs_address})
    )


if __name__ == "__main__":
    main(sys.argv[1])
