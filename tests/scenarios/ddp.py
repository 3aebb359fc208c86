"""One rank of the DDP test; run with ``torchrun --nproc-per-node 2 ddp.py OUT_JSON [ray]``.

For every available backend and ``num_workers`` 0 and 2 (with ``ray``: the default backend
and 2 Ray workers, on the cluster ``RAY_ADDRESS`` names, against 2 worker processes), over
3 epochs with ``set_epoch``:
this rank's batches equal DataLoader's; the ranks together cover the dataset exactly once;
the order changes between epochs; and an ``all_reduce`` of each step's batch sum equals
the sum a single process computes for all ranks. Rank 0 writes a summary to OUT_JSON.
On a CPython whose forked children can hang (:func:`forked_workers_can_hang`), both
loaders start their workers from a forkserver.
"""

from __future__ import annotations

import json
import multiprocessing
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

from dataloaderx import DataLoaderX, available_backends
from tests.helpers import RangeDataset, assert_same

DATASET = RangeDataset(44)
BATCH_SIZE = 4
SEED = 11
EPOCHS = 3
#: Ray workers: the actors import this repository's tests, wherever the cluster runs them.
RAY = {
    "worker_method": "ray",
    "worker_options": {
        "num_cpus": 0.5,
        "runtime_env": {"env_vars": {"PYTHONPATH": str(Path(__file__).resolve().parents[2])}},
    },
}


def forked_workers_can_hang() -> bool:
    """Whether this CPython can hang a worker forked from a process running gloo.

    Before the fix of python/cpython#112275 (3.11.10; 3.12 never had it) a forked child
    re-created the interpreter's thread-list lock only after taking it, so a fork made
    while another thread held it left the child waiting forever. With gloo's threads
    running, about one run of this scenario in 30 to 80 hung that way, with plain
    ``DataLoader`` as with ``DataLoaderX``.
    """
    return sys.version_info < (3, 11, 10)


def worker_options(num_workers: int) -> dict[str, Any]:
    """Loader options for ``num_workers``: on such a CPython, workers start from a forkserver."""
    if num_workers == 0 or not forked_workers_can_hang():
        return {"num_workers": num_workers}
    return {"num_workers": num_workers, "multiprocessing_context": "forkserver"}


def step_sums_for_all_ranks(world: int, epoch: int) -> list[int]:
    """The per-step sum over all ranks, computed in this one process."""
    totals: list[int] = []
    for rank in range(world):
        sampler = DistributedSampler(DATASET, num_replicas=world, rank=rank, seed=SEED)
        sampler.set_epoch(epoch)
        for step, batch in enumerate(DataLoader(DATASET, BATCH_SIZE, sampler=sampler)):
            value = int(batch[:, 0].sum())
            if step == len(totals):
                totals.append(value)
            else:
                totals[step] += value
    return totals


def check(backend: str | None, num_workers: int, world: int, ray: bool = False) -> int:
    ours = DistributedSampler(DATASET, seed=SEED)
    theirs = DistributedSampler(DATASET, seed=SEED)
    options = worker_options(num_workers)
    # Ray's threads run in this process: the reference's workers start from a forkserver.
    reference_options = dict(options, multiprocessing_context="forkserver") if ray else options
    ours_options = {"num_workers": num_workers, **RAY} if ray else options
    loader = DataLoaderX(DATASET, BATCH_SIZE, sampler=ours, backend=backend, **ours_options)
    reference = DataLoader(DATASET, BATCH_SIZE, sampler=theirs, **reference_options)
    orders = []
    for epoch in range(EPOCHS):
        ours.set_epoch(epoch)
        theirs.set_epoch(epoch)
        batches = list(loader)
        assert_same(batches, list(reference))
        mine = torch.cat(batches)[:, 0].tolist()
        everyone: list[list[int] | None] = [None] * world
        dist.all_gather_object(everyone, mine)
        covered = sorted(index for part in everyone for index in part or [])
        assert covered == list(range(len(DATASET))), (backend, num_workers, epoch, covered)
        orders.append(everyone)
        expected = step_sums_for_all_ranks(world, epoch)
        assert len(batches) == len(expected)
        for step, batch in enumerate(batches):
            total = batch[:, 0].sum()
            dist.all_reduce(total)
            assert int(total) == expected[step], (backend, num_workers, epoch, step)
    assert orders[0] != orders[1] != orders[2], "the shuffle did not change between epochs"
    return EPOCHS


def main(out: str, ray: bool) -> None:
    # A forkserver imports these once; each worker it forks then starts at once.
    multiprocessing.set_forkserver_preload(["torch", "tests.helpers"])
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    backends: list[str | None] = [None] if ray else list(available_backends())
    epochs = 0
    try:
        for backend in backends:
            for num_workers in (2,) if ray else (0, 2):
                epochs += check(backend, num_workers, world, ray)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if rank == 0:
        with open(out, "w", encoding="utf-8") as file:
            json.dump({"world": world, "backends": backends, "epochs_checked": epochs}, file)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] == ["ray"])
