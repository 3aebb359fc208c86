"""Ray workers (``worker_method="ray"``) against worker processes, on this machine.

What is measured (each part alone with ``--parts``):

- ``handover``: the cost of a batch's hand-over per MiB. Batches of ``--mib`` MiB (8 tensors
  of ``mib / 8`` MiB each, made once per worker and returned again, so that making them
  costs nothing) from ``--workers`` workers (default 2): ``DataLoader`` worker processes
  (shared memory), Ray workers on this machine (shared memory, the default), Ray workers
  made to hand over through the object store (numpy arrays, no copy on the loop's side:
  what actors on other machines do) and, for reference, the same actors returning torch
  tensors (pickled, a copy). Epochs after the first; the figure is the loop's seconds per
  batch divided by the batch's MiB, the median of ``--rounds`` alternated rounds; the last
  column is Ray's speed on shared memory against processes' (processes' time over Ray's).
- ``first``: time from ``iter(loader)`` to the first batch, epoch 1 (actors start; Ray
  already running) and epoch 2 (actors kept), against worker processes.
- ``scale``: items that wait 20 ms each (GIL released: remote storage, a remote decode),
  batch size 8: batches per second with 1, 2, 4, 8, 16 actors of 1/16 CPU each, and the
  loop's own ceiling (items that take no time, 16 actors).
- ``nodes``: the ``scale`` workload with 16 actors on a simulated cluster of 4 worker
  nodes (``ray.cluster_utils.Cluster``, all on this machine), spread over the nodes.
- ``memory``: PSS after 2 epochs over 2,000,000 Python dicts (the copy-on-read workload of
  ``benchmarks/worker_method.py``), 2 workers: the two worker processes of ``DataLoader``
  (persistent, forked), against the two actors and all of Ray's processes; and the loop
  process's own PSS.
- ``fault``: ``--kills`` epochs of 40 batches (2 workers, 20 ms items); in each, a worker's
  process is killed (``SIGKILL``) after 5 batches. Every epoch must give every batch once,
  in order; the longest wait for a batch after the kill is the stall (median, max).
- ``node``: ``--kills`` runs on a simulated cluster (``ray.cluster_utils.Cluster``: a head
  and two worker nodes), each adding a third worker node, starting 3 actors spread over the
  three (60 batches of 2 items of 20 ms) and removing that node after 5 batches of the
  second epoch: every batch once and in order, and the longest wait for a batch (median,
  max): Ray's detection of the lost node, then the batches made again.
- ``trainval``: a train loader (``num_workers`` = this machine's cores) and a val loader (2
  workers) alternated for 5 epochs on the local Ray the loaders start themselves (items
  that wait 2 ms), against ``DataLoader`` with the same worker processes, started anew each
  epoch and persistent: seconds per epoch, the first epoch apart.

A local Ray is started once (``ray.init``, not counted). Times are of a shared 2-core
machine: compare figures of one run only.

How to run (from the repository root)::

    python benchmarks/ray_workers.py                      # every part: ~3-5 min
    python benchmarks/ray_workers.py --parts handover --mib 8 32
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import _common as bench
import psutil
import ray
import torch
from ray.cluster_utils import Cluster
from torch.utils.data import DataLoader, Dataset

from dataloaderx import DataLoaderX
from dataloaderx.workers.ray.group import NAMESPACE

RAY = {"worker_method": "ray"}


class Big(Dataset[torch.Tensor]):
    """``batches`` batches of ``mib`` MiB: item ``i`` a cached ``mib / 8`` MiB tensor."""

    def __init__(self, batches: int, mib: float) -> None:
        self.size = batches * 8
        self.numel = int(mib * 2**20 / 8 / 4)
        self._cache: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        if self._cache is None:
            self._cache = torch.rand(self.numel)
        return self._cache


class Waits(Dataset[torch.Tensor]):
    """Items that wait ``delay`` seconds (the GIL released)."""

    def __init__(self, size: int, delay: float) -> None:
        self.size, self.delay = size, delay

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.delay:
            time.sleep(self.delay)
        return torch.tensor([index])


def tensors_as_they_are(items: list[torch.Tensor]) -> Any:
    """A collate function whose batch the actor cannot pack (a list in a custom object)."""
    return _Opaque(torch.stack(items))


class _Opaque:
    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


def epoch_seconds(loader: Iterable[Any]) -> tuple[float, int]:
    start = time.perf_counter()
    count = sum(1 for _ in loader)
    return time.perf_counter() - start, count


def handover(sizes: list[float], batches: int, rounds: int, workers: int) -> None:
    print(
        f"\n## Hand-over per MiB of batch ({workers} workers, epochs 2-3, "
        f"median of {rounds} rounds)\n"
    )
    print(
        "| batch MiB | processes | Ray (shared memory) | Ray (object store) "
        "| Ray (torch, pickled) | shared memory / processes |  (ms per MiB)"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for mib in sizes:
        dataset = Big(batches, mib)
        makers: dict[str, Callable[[Big], Iterable[Any]]] = {
            "processes": lambda data: DataLoader(
                data, batch_size=8, num_workers=workers, persistent_workers=True
            ),
            "shared memory": lambda data: DataLoaderX(
                data, batch_size=8, num_workers=workers, backend="sync", **RAY
            ),
            "object store": lambda data: DataLoaderX(
                data,
                batch_size=8,
                num_workers=workers,
                backend="sync",
                worker_options={"handover": "object_store"},
                **RAY,
            ),
            "pickled": lambda data: DataLoaderX(
                data,
                batch_size=8,
                num_workers=workers,
                backend="sync",
                collate_fn=tensors_as_they_are,
                **RAY,
            ),
        }
        runs: dict[str, list[float]] = {name: [] for name in makers}
        for round_number in range(rounds):
            for name in bench.rotated(list(makers), round_number):
                loader = makers[name](dataset)
                epoch_seconds(loader)  # epoch 1: start-up
                times = [epoch_seconds(loader)[0] for _ in range(2)]
                runs[name].append(statistics.median(times) / batches / mib * 1e3)
                del loader
        cells = {name: statistics.median(values) for name, values in runs.items()}
        ratio = cells["processes"] / cells["shared memory"]
        print(
            f"| {mib:g} | " + " | ".join(f"{cell:.3f}" for cell in cells.values()) + f" | "
            f"{ratio:.2f}x |",
            flush=True,
        )


def first_batch() -> None:
    print("\n## Time to the first batch (2 workers, Ray already running)\n")
    print("| loader | epoch 1 ms | epoch 2 ms |")
    print("| --- | --- | --- |")
    loaders = {
        "processes": DataLoader(Waits(16, 0.0), batch_size=2, num_workers=2),
        "processes (persistent)": DataLoader(
            Waits(16, 0.0), batch_size=2, num_workers=2, persistent_workers=True
        ),
        "ray": DataLoaderX(Waits(16, 0.0), batch_size=2, num_workers=2, **RAY),
    }
    for name, loader in loaders.items():
        cells = []
        for _ in range(2):
            start = time.perf_counter()
            iterator = iter(loader)
            next(iterator)
            cells.append(f"{(time.perf_counter() - start) * 1e3:.0f}")
            for _batch in iterator:
                pass
        print(f"| {name} | {cells[0]} | {cells[1]} |", flush=True)


def scale() -> None:
    print("\n## Scale-out: items that wait 20 ms, batch size 8 (actors of 1/16 CPU)\n")
    print("| actors | batches/s | x one actor | of linear |")
    print("| --- | --- | --- | --- |")
    one = None
    for actors in (1, 2, 4, 8, 16):
        batches = 16 * actors + 16
        loader = DataLoaderX(
            Waits(batches * 8, 0.02),
            batch_size=8,
            num_workers=actors,
            worker_options={"num_cpus": 1 / 16},
            backend="sync",
            **RAY,
        )
        epoch_seconds(loader)
        seconds, count = epoch_seconds(loader)
        rate = count / seconds
        one = rate if one is None else one
        print(
            f"| {actors} | {rate:.1f} | {rate / one:.2f} | {rate / one / actors:.2f} |", flush=True
        )
        del loader
    loader = DataLoaderX(
        Waits(4000, 0.0),
        batch_size=8,
        num_workers=16,
        worker_options={"num_cpus": 1 / 16},
        backend="sync",
        **RAY,
    )
    epoch_seconds(loader)
    seconds, count = epoch_seconds(loader)
    rate = count / seconds
    print(f"\nThe loop's ceiling (items that take no time, 16 actors): {rate:.0f} batches/s")


class Records(Dataset[torch.Tensor]):
    """``size`` items, each read from one of 2,000,000 dicts held in a list."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.items = [{"id": i, "label": i % 10, "name": f"item-{i}"} for i in range(2_000_000)]

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        item = self.items[(index * 7919) % len(self.items)]
        return torch.tensor([item["id"], item["label"], len(item["name"])])


def _pss_mib(pids: Iterable[int]) -> float:
    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_full_info().pss
        except psutil.Error:
            continue
    return total / 2**20


def memory() -> None:
    print("\n## Memory, copy-on-read workload (2,000,000 dicts), 2 workers, after 2 epochs\n")
    dataset = Records(32 * 2048)
    me = psutil.Process()
    before = {child.pid for child in me.children(recursive=True)}
    reference = DataLoader(dataset, batch_size=32, num_workers=2, persistent_workers=True)
    for _ in range(2):
        epoch_seconds(reference)
    workers = {child.pid for child in me.children(recursive=True)} - before
    print(f"worker processes: {_pss_mib(workers):.0f} MiB PSS (2 processes)")
    del reference
    loader = DataLoaderX(dataset, batch_size=32, num_workers=2, backend="sync", **RAY)
    for _ in range(2):
        epoch_seconds(loader)
    actors = {place.pid for place in _places().values()}
    everything = {child.pid for child in me.children(recursive=True)}
    print(
        f"Ray actors: {_pss_mib(actors):.0f} MiB PSS (2 actors); all of Ray's processes: "
        f"{_pss_mib(everything):.0f} MiB; the loop's process: {_pss_mib([me.pid]):.0f} MiB"
    )
    del loader


def nodes() -> None:
    print("\n## The same with 16 actors on 4 simulated worker nodes (SPREAD)\n")
    ray.shutdown()
    head = {"num_cpus": 1, "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    for _ in range(4):
        cluster.add_node(num_cpus=1, resources={"loader_node": 1})
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        options = {"num_cpus": 1 / 16, "resources": {"loader_node": 1 / 16}}
        loader = DataLoaderX(
            Waits(272 * 8, 0.02),
            batch_size=8,
            num_workers=16,
            worker_options=options,
            backend="sync",
            **RAY,
        )
        epoch_seconds(loader)
        seconds, count = epoch_seconds(loader)
        spread = sorted(Counter(place.node_id for place in _places().values()).values())
        print(f"16 actors: {count / seconds:.1f} batches/s; actors per node: {spread}")
        del loader
    finally:
        ray.shutdown()
        cluster.shutdown()
        ray.init(address="local", include_dashboard=False, log_to_driver=False)


def _places() -> dict[int, Any]:
    """Where the actors of the only loader alive run, by worker id."""
    places = {}
    for actor in ray.util.list_named_actors(all_namespaces=True):
        if actor["namespace"] == NAMESPACE:
            handle = ray.get_actor(actor["name"], NAMESPACE)
            worker = int(actor["name"].rsplit("-w", 1)[1].split("-")[0])
            places[worker] = ray.get(handle.place.remote())
    return places


def _pids() -> dict[int, int]:
    """The worker processes of the only loader alive, by worker id."""
    return {worker: place.pid for worker, place in _places().items()}


def _rest_of_epoch(iterator: Iterable[Any], got: list[int]) -> float:
    """Add the rest of the epoch's first items to ``got``; return the longest wait for a
    batch, in seconds (lost workers' warnings hidden)."""
    last, longest = time.perf_counter(), 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for batch in iterator:
            now = time.perf_counter()
            longest, last = max(longest, now - last), now
            got.append(int(batch[0]))
    return longest


def fault(kills: int) -> None:
    print(f"\n## A worker's process killed mid-epoch, {kills} epochs (2 workers, 20 ms items)\n")
    loader = DataLoaderX(Waits(80, 0.02), batch_size=2, num_workers=2, **RAY)
    epoch_seconds(loader)
    gaps, complete = [], 0
    for epoch in range(kills):
        iterator = iter(loader)
        got = [int(next(iterator)[0]) for _ in range(5)]
        os.kill(_pids()[epoch % 2], signal.SIGKILL)
        gaps.append(_rest_of_epoch(iterator, got))
        complete += got == list(range(0, 80, 2))
    print(f"epochs complete, every batch once and in order: {complete} of {kills}")
    print(
        "longest wait for a batch after the kill (a batch is 40 ms of one worker's time): "
        f"median {statistics.median(gaps) * 1e3:.0f} ms, max {max(gaps) * 1e3:.0f} ms"
    )


def node_loss(runs: int) -> None:
    print(f"\n## A node lost mid-epoch, {runs} runs (3 actors on 3 nodes, 20 ms items)\n")
    ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    for _ in range(2):
        cluster.add_node(num_cpus=1, resources={"loader_node": 2})
    ray.init(address=cluster.address, log_to_driver=False)
    options = {"num_cpus": 0.25, "resources": {"loader_node": 1}}
    gaps, complete, on_it = [], 0, 0
    try:
        for _ in range(runs):
            doomed = cluster.add_node(num_cpus=1, resources={"loader_node": 2})
            cluster.wait_for_nodes()
            loader = DataLoaderX(
                Waits(120, 0.02), batch_size=2, num_workers=3, worker_options=options, **RAY
            )
            epoch_seconds(loader)
            iterator = iter(loader)
            got = [int(next(iterator)[0]) for _ in range(5)]
            on_it += [place.node_id for place in _places().values()].count(doomed.node_id)
            cluster.remove_node(doomed)
            gaps.append(_rest_of_epoch(iterator, got))
            complete += got == list(range(0, 120, 2))
            del loader, iterator
        print(f"actors on the lost node: {on_it} in {runs} runs")
        print(f"epochs complete, every batch once and in order: {complete} of {runs}")
        print(
            "longest wait for a batch after the node's loss: "
            f"median {statistics.median(gaps):.1f} s, max {max(gaps):.1f} s "
            f"(each: {', '.join(f'{gap:.1f}' for gap in gaps)})"
        )
    finally:
        ray.shutdown()
        cluster.shutdown()
        ray.init(address="local", include_dashboard=False, log_to_driver=False)


def train_and_val(epochs: int = 5) -> None:
    cores = os.cpu_count() or 1
    print(f"\n## A train ({cores} workers) and a val (2 workers) loader, alternated\n")
    print("| loader | epoch 1 train s | epoch 1 val s | later train s | later val s |")
    print("| --- | --- | --- | --- | --- |")
    ray.shutdown()  # the loaders start their own local Ray
    pairs = {
        "processes": {},
        "processes (persistent)": {"persistent_workers": True},
        "ray (the loaders' own local Ray)": RAY,
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for name, method in pairs.items():
            loaders = [
                DataLoaderX(Waits(size, 0.002), batch_size=4, num_workers=workers, **method)
                for size, workers in ((256, cores), (64, 2))
            ]
            times: list[list[float]] = [[], []]
            for _ in range(epochs):
                for kind, loader in enumerate(loaders):
                    times[kind].append(epoch_seconds(loader)[0])
            later = [statistics.median(each[1:]) for each in times]
            print(
                f"| {name} | {times[0][0]:.2f} | {times[1][0]:.2f} | {later[0]:.3f} | "
                f"{later[1]:.3f} |",
                flush=True,
            )
            del loaders
    ray.shutdown()
    ray.init(address="local", include_dashboard=False, log_to_driver=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parts = ["handover", "first", "scale", "nodes", "memory", "fault", "node", "trainval"]
    parser.add_argument("--parts", nargs="+", default=parts)
    parser.add_argument("--mib", nargs="+", type=float, default=[8.0])
    parser.add_argument("--batches", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=3, help="alternated rounds (handover)")
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2, help="workers (handover)")
    arguments = parser.parse_args()
    torch.set_num_threads(1)
    ray.init(address="local", include_dashboard=False, log_to_driver=False)
    print(f"torch {torch.__version__}, ray {ray.__version__}, {os.cpu_count()} CPUs")
    try:
        for part in arguments.parts:
            if part == "handover":
                handover(arguments.mib, arguments.batches, arguments.rounds, arguments.workers)
            elif part == "first":
                first_batch()
            elif part == "scale":
                scale()
            elif part == "memory":
                memory()
            elif part == "nodes":
                nodes()
            elif part == "fault":
                fault(arguments.kills)
            elif part == "node":
                node_loss(arguments.kills)
            elif part == "trainval":
                train_and_val()
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
