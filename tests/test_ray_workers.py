"""``worker_method="ray"``: DataLoader's worker contract, kept by Ray actors.

The reference is ``DataLoader`` with worker processes and the same arguments: the same
batches in the same order, worker ids, seeds and draws, errors, ``worker_init_fn`` calls,
sharded iterable datasets, resume states. The actors run on the session's Ray cluster
(``ray_cluster`` in ``conftest.py``: a head and two worker nodes, all on this machine).
"""

from __future__ import annotations

import gc
import json
import os
import pickle
import re
import signal
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import numpy
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info
from torch.utils.data.datapipes.iter import IterableWrapper

from dataloaderx import DataLoaderX
from dataloaderx.cli import main
from tests.helpers import (
    Draws,
    FailingDataset,
    RangeDataset,
    Sharded,
    StructDataset,
    assert_same,
    run_events,
    wait_for,
)

ray = pytest.importorskip("ray", reason="ray is not installed: pip install 'dataloaderx[ray]'")

from dataloaderx.workers import registry  # noqa: E402 - after the skip
from dataloaderx.workers.ray.group import NAMESPACE  # noqa: E402 - imports ray
from tests.ray_support import (  # noqa: E402 - imports ray
    no_actors_or_threads_left,
    our_actors,
    places,
)

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.usefixtures("ray_cluster"),
    # The reference's worker processes outnumber this machine's cores in some tests.
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

RAY = {"worker_method": "ray"}
#: Actors on the worker nodes only (the head has no ``loader_node``).
ON_WORKER_NODES = {"resources": {"loader_node": 1}}


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    yield from no_actors_or_threads_left()


class Inits:
    """``worker_init_fn`` that counts its calls in the worker's process."""

    calls = 0

    def __call__(self, worker_id: int) -> None:
        type(self).calls += 1


class InitsSeen(Dataset[torch.Tensor]):
    """Item ``i``: ``i``, the worker, its process, its ``worker_init_fn`` calls so far, its
    intra-op threads, and whether ``get_worker_info().dataset`` is a copy of this one."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        info = get_worker_info()
        assert info is not None
        same = isinstance(info.dataset, InitsSeen)
        values = [index, info.id, os.getpid(), Inits.calls, torch.get_num_threads(), same]
        return torch.tensor(values)


class Slow(Dataset[torch.Tensor]):
    """Item ``i`` after ``delay`` seconds from ``slow_from`` on."""

    def __init__(self, size: int, delay: float, slow_from: int = 0) -> None:
        self.size, self.delay, self.slow_from = size, delay, slow_from

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        if index >= self.slow_from:
            time.sleep(self.delay)
        return torch.tensor([index])


def failing_init(worker_id: int) -> None:
    raise OSError(f"no storage for worker {worker_id}")


def seeded(seed: int) -> dict[str, Any]:
    return {"generator": torch.Generator().manual_seed(seed)}


def reference_and_ray(
    dataset: Any, seed: int | None = None, backend: str = "sync", **kwargs: Any
) -> tuple[list[Any], DataLoaderX[Any]]:
    """``DataLoader``'s batches with worker processes, and a loader with Ray workers."""
    extra = {} if seed is None else seeded(seed)
    expected = list(DataLoader(dataset, **kwargs, **extra))
    extra = {} if seed is None else seeded(seed)
    return expected, DataLoaderX(dataset, backend=backend, **kwargs, **extra, **RAY)


# 1. Same batches, order, workers and draws as worker processes --------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"batch_size": 4, "num_workers": 2},
        {"batch_size": 3, "num_workers": 3, "shuffle": True, "drop_last": True},
        {"batch_size": None, "num_workers": 2, "shuffle": True, "prefetch_factor": 3},
        {"batch_size": 5, "num_workers": 2, "prefetch_factor": 1, "persistent_workers": True},
    ],
    ids=["plain", "shuffle-drop-last", "no-batching-prefetch-3", "persistent"],
)
def test_same_batches_workers_and_draws_as_worker_processes_epoch_after_epoch(
    options: dict[str, Any],
) -> None:
    reference = DataLoader(Draws(), **options, **seeded(5))
    loader = DataLoaderX(Draws(), **options, **seeded(5), **RAY)
    for _epoch in range(2):  # the second epoch's actors are the first's, seeded afresh
        expected = list(reference)
        assert len(expected) == len(loader)
        assert_same(list(loader), expected)


def test_every_backend_gives_the_same_batches(backend: str) -> None:
    expected, loader = reference_and_ray(
        StructDataset(23), seed=3, backend=backend, batch_size=4, shuffle=True, num_workers=2
    )
    assert_same(list(loader), expected)


def test_batch_sampler_and_out_of_order_batches() -> None:
    sequential = torch.utils.data.SequentialSampler(range(23))
    sampler = torch.utils.data.BatchSampler(sequential, batch_size=4, drop_last=False)
    expected, loader = reference_and_ray(RangeDataset(23), batch_sampler=sampler, num_workers=2)
    assert_same(list(loader), expected)
    # Without in_order, batches come as they are made: the same batches, in some order.
    expected, loader = reference_and_ray(
        Slow(24, 0.01), batch_size=3, num_workers=2, in_order=False
    )
    assert sorted(batch.tolist() for batch in loader) == sorted(b.tolist() for b in expected)


def test_set_epoch_with_a_distributed_sampler_matches() -> None:
    def loaders(**method: Any) -> DataLoader[Any]:
        dataset = RangeDataset(30)
        sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=2, rank=1, seed=4)
        return DataLoaderX(RangeDataset(30), batch_size=4, sampler=sampler, num_workers=2, **method)

    reference, loader = loaders(), loaders(**RAY)
    for epoch in range(2):
        for each in (reference, loader):
            each.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
        assert_same(list(loader), list(reference))


def test_a_sharded_iterable_dataset_yields_what_it_yields_with_processes() -> None:
    expected, loader = reference_and_ray(Sharded(11), batch_size=2, num_workers=3)
    assert_same(list(loader), expected)


# 2. The worker contract inside an actor ---------------------------------------------------


@pytest.mark.parametrize("persistent", [False, True])
def test_worker_init_fn_worker_info_and_threads_in_an_actor(persistent: bool) -> None:
    loader = DataLoaderX(
        InitsSeen(),
        batch_size=2,
        num_workers=2,
        worker_init_fn=Inits(),
        persistent_workers=persistent,
        **RAY,
    )
    epochs = [torch.cat(list(loader)) for _ in range(2)]
    for epoch, rows in enumerate(epochs):
        assert rows[:, 0].tolist() == list(range(8))
        assert rows[:, 1].tolist() == [0, 0, 1, 1, 0, 0, 1, 1]
        # Once per worker per epoch (a fresh worker each epoch), once in all if persistent.
        assert set(rows[:, 3].tolist()) == {1 if persistent else epoch + 1}
        assert set(rows[:, 4].tolist()) == {1}  # one intra-op thread, as a worker process
        assert set(rows[:, 5].tolist()) == {1}
    # The actors are kept between epochs, persistent workers or not.
    assert epochs[0][:, 2].tolist() == epochs[1][:, 2].tolist()
    assert os.getpid() not in epochs[0][:, 2].tolist()
    assert get_worker_info() is None


def test_the_task_table_lists_each_actors_epoch_starts_and_no_batch() -> None:
    """Ray records task events for an actor's other calls, none for its task per batch."""
    from ray._private import state

    loader = DataLoaderX(RangeDataset(16), batch_size=2, num_workers=2, **RAY)
    for _epoch in range(2):
        assert len(list(loader)) == 8
    handles = [ray.get_actor(name, NAMESPACE) for name in our_actors()]
    actors = {handle._actor_id.hex() for handle in handles}
    assert len(actors) == 2

    def ours() -> list[str]:
        events = state.state._get_all_task_events()
        return [e.task_info.name for e in events if e.task_info.actor_id.hex() in actors]

    # A worker sends its events in order: once an actor's second epoch start is listed, its
    # first epoch's batches would be too.
    assert wait_for(lambda: ours().count("RayWorker.start_epoch") == 4), ours()
    assert ours().count("RayWorker.fetch") == 0


@pytest.mark.parametrize(("handover", "in_shared_memory"), [("auto", 1), ("object_store", 0)])
def test_default_collate_stacks_into_shared_memory_only_for_a_hand_over_in_it(
    handover: str, in_shared_memory: int
) -> None:
    class Shared(Dataset[int]):
        def __len__(self) -> int:
            return 4

        def __getitem__(self, index: int) -> int:
            return index

    def collate(items: list[int]) -> torch.Tensor:
        batch = torch.utils.data.default_collate([torch.tensor(item) for item in items])
        return torch.tensor([batch.is_shared(), get_worker_info() is not None])

    options = {"handover": handover}
    loader = DataLoaderX(
        Shared(), batch_size=2, num_workers=1, collate_fn=collate, worker_options=options, **RAY
    )
    assert [batch.tolist() for batch in loader] == [[in_shared_memory, 1]] * 2


def shared_files() -> set[str]:
    """The shared-memory files of Ray workers' batches."""
    return {name for name in os.listdir("/dev/shm") if name.startswith("dataloaderx-")}


def test_on_this_machine_batches_come_in_shared_memory_and_none_is_left_behind() -> None:
    before = shared_files()
    loader = DataLoaderX(Slow(16, 0.0), batch_size=4, num_workers=2, **RAY)
    batches = list(loader)
    assert all(batch.is_shared() for batch in batches)
    assert torch.cat(batches).flatten().tolist() == list(range(16))
    batches[0].add_(100)  # the loop's own to write
    assert batches[0].flatten().tolist() == [100, 101, 102, 103]
    assert not shared_files() - before  # each file's name removed as its batch was mapped
    for _ in range(3):  # epochs left while batches were under way
        next(iter(loader))
    assert len(list(loader)) == 4
    del loader
    gc.collect()
    assert wait_for(lambda: not shared_files() - before, within=10)


def allocated_before_written(items: list[torch.Tensor]) -> torch.Tensor:
    """In the actor: whether a new shared-memory storage's file holds all its pages before
    anything is written to it (``default_collate`` makes its batch's storage so)."""
    nbytes = 1 << 20
    storage = torch.UntypedStorage._new_shared(nbytes)
    path = storage.filename
    allocated = path is not None and os.stat(path).st_blocks * 512 >= nbytes
    return torch.tensor([allocated])


def test_an_actor_allocates_a_batch_s_shared_memory_at_once() -> None:
    loader = DataLoaderX(
        RangeDataset(4), batch_size=2, num_workers=1, collate_fn=allocated_before_written, **RAY
    )
    assert [batch.item() for batch in loader] == [True, True]


def test_a_full_dev_shm_is_a_clear_error_not_a_crash() -> None:
    from dataloaderx.workers.ray.shared import _populate_function

    path = f"/dev/shm/dataloaderx-test-{os.getpid()}"
    storage = torch.UntypedStorage.from_file(path, shared=True, nbytes=1 << 20)
    os.truncate(path, 0)  # the pages now lie past the file's end: writing them faults
    with pytest.raises(RuntimeError, match=r"does not fit in /dev/shm .*--shm-size"):
        _populate_function()(storage.data_ptr(), 1 << 20, path)
    assert not os.path.exists(path)


def test_tensors_numpy_arrays_and_odd_dtypes_come_back_as_they_left() -> None:
    class Mixed(Dataset[dict[str, Any]]):
        def __len__(self) -> int:
            return 4

        def __getitem__(self, index: int) -> dict[str, Any]:
            return {"x": torch.full((3,), index), "b": torch.ones(2, dtype=torch.bfloat16)}

    def collate(items: list[dict[str, Any]]) -> dict[str, Any]:
        batch = torch.utils.data.default_collate(items)
        batch["array"] = numpy.arange(3)
        batch["strided"] = torch.arange(12).reshape(3, 4).t()
        return batch

    loader = DataLoaderX(Mixed(), batch_size=2, num_workers=1, collate_fn=collate, **RAY)
    batches = list(loader)
    assert_same(batches[1]["x"], torch.tensor([[2, 2, 2], [3, 3, 3]]))
    assert batches[0]["b"].dtype is torch.bfloat16
    assert isinstance(batches[0]["array"], numpy.ndarray)
    assert_same(batches[0]["strided"], torch.arange(12).reshape(3, 4).t())
    batches[0]["x"].add_(1)  # the loop's tensor is its own to write
    assert batches[0]["x"].tolist() == [[1, 1, 1], [2, 2, 2]]


# 3. Errors --------------------------------------------------------------------------------


def test_errors_reach_the_loop_with_dataloaders_type_and_wording() -> None:
    dataset = FailingDataset(12, frozenset({5}))
    expected = run_events(iter(DataLoader(dataset, batch_size=2, num_workers=2)))
    got = run_events(iter(DataLoaderX(dataset, batch_size=2, num_workers=2, **RAY)))
    assert [event[0] for event in got] == [event[0] for event in expected]
    error = next(event for event in got if event[0] == "error")
    want = next(event for event in expected if event[0] == "error")
    assert error[1] is want[1] is ValueError
    assert re.search(r"Caught ValueError in DataLoader worker 0 \(Ray actor on node \S+", error[2])
    assert error[2].splitlines()[-1] == want[2].splitlines()[-1] == "ValueError: bad index 5"
    assert "RayTaskError" not in error[2]


def test_a_failing_worker_init_fn_fails_at_once_without_retries() -> None:
    loader = DataLoaderX(RangeDataset(8), num_workers=2, worker_init_fn=failing_init, **RAY)
    with pytest.raises(OSError, match="Caught OSError in DataLoader worker 0") as caught:
        next(iter(loader))
    assert "no storage for worker 0" in str(caught.value)


def test_timeout_raises_as_dataloader_does() -> None:
    # Items 0 and 1 well within the timeout, even on a loaded machine; item 2 far past it.
    loader = DataLoaderX(Slow(6, 30.0, slow_from=2), num_workers=1, timeout=3.0, **RAY)
    iterator = iter(loader)
    try:
        assert [int(next(iterator)) for _ in range(2)] == [0, 1]
        with pytest.raises(RuntimeError, match=re.escape("DataLoader timed out after 3.0 seconds")):
            next(iterator)
    finally:
        iterator.close()


def test_pin_memory_is_accepted_and_batches_are_unchanged() -> None:
    expected = list(DataLoader(RangeDataset(9), batch_size=4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # no accelerator: DataLoader warns
        pinned = DataLoaderX(RangeDataset(9), batch_size=4, num_workers=2, pin_memory=True, **RAY)
        assert_same(list(pinned), expected)


# 4. Resume, configuration ----------------------------------------------------------------


def test_resume_mid_epoch_exactly() -> None:
    def make() -> DataLoaderX[Any]:
        return DataLoaderX(Draws(30), batch_size=3, shuffle=True, num_workers=2, **seeded(1), **RAY)

    expected = list(make())
    loader = make()
    iterator = iter(loader)
    consumed = [next(iterator) for _ in range(4)]
    state = loader.state_dict()
    iterator.close()
    resumed = make()
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert [b[:, 0].tolist() for b in consumed + rest] == [b[:, 0].tolist() for b in expected]


def test_from_config_takes_worker_method_ray_and_worker_options() -> None:
    config = {
        "batch_size": 4,
        "num_workers": 2,
        "worker_method": "ray",
        "worker_options": {"num_cpus": 0.5},
    }
    loader = DataLoaderX.from_config(RangeDataset(10), config)
    assert (loader.worker_method, loader.worker_options) == ("ray", {"num_cpus": 0.5})
    assert_same(list(loader), list(DataLoader(RangeDataset(10), batch_size=4)))


# 5. Bad input ---------------------------------------------------------------------------


class Unpicklable(Dataset[int]):
    def __init__(self) -> None:
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> int:
        return index


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        (
            {"worker_options": {"num_cpu": 1}},
            ValueError,
            ("'num_cpu'", "value 1", "'num_cpus'", "did you mean 'num_cpus'"),
        ),
        (
            {"worker_options": {"num_cpus": -1}},
            ValueError,
            ("worker_options['num_cpus']", "-1", ">= 0"),
        ),
        (
            {"worker_options": {"scheduling_strategy": "SPRED"}},
            ValueError,
            ("'SPRED'", "did you mean 'SPREAD'"),
        ),
        (
            {"multiprocessing_context": "spawn"},
            ValueError,
            ("multiprocessing_context='spawn'", "worker_method='ray'", "Remove"),
        ),
        (
            {"worker_method": "thread", "worker_options": {"num_cpus": 1}},
            ValueError,
            ("worker_options={'num_cpus': 1}", "worker_method='thread'", "remove"),
        ),
    ],
    ids=["unknown-key", "negative-cpus", "strategy-typo", "mp-context", "options-for-threads"],
)
def test_bad_arguments_raise_at_construction(
    kwargs: dict[str, Any], error: type[Exception], words: tuple[str, ...]
) -> None:
    arguments = {**RAY, "num_workers": 2, **kwargs}
    with pytest.raises(error) as caught:
        DataLoaderX(RangeDataset(4), **arguments)
    for word in words:
        assert word in str(caught.value)


def test_a_datapipe_is_refused() -> None:
    with pytest.raises(ValueError, match=r"worker_method='ray'.*IterableWrapper"):
        DataLoaderX(IterableWrapper(range(4)), num_workers=2, **RAY)


def test_a_dataset_that_does_not_pickle_names_its_member() -> None:
    loader = DataLoaderX(Unpicklable(), num_workers=1, **RAY)
    with pytest.raises(TypeError, match=r"dataset=Unpicklable .*member 'lock' \(lock\)"):
        iter(loader)


def test_a_cluster_too_small_is_a_clear_error() -> None:
    options = {"num_cpus": 64, "placement_timeout_s": 0.5}
    loader = DataLoaderX(RangeDataset(4), num_workers=2, worker_options=options, **RAY)
    with pytest.raises(RuntimeError, match=r"did not fit the Ray cluster.*lower num_workers"):
        iter(loader)


def test_ray_not_installed_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [name for name in sys.modules if name.startswith("dataloaderx.workers.ray.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "ray", None)  # what an import of a missing package does
    monkeypatch.setattr(registry, "_loaded", {})
    with pytest.raises(ImportError) as caught:
        DataLoaderX(RangeDataset(4), num_workers=2, **RAY)
    for words in ("worker_method='ray' needs 'ray'", "pip install 'dataloaderx[ray]'"):
        assert words in str(caught.value)
    assert "ray" in registry.worker_method_names()


# 6. Placement, lost workers ---------------------------------------------------------------


def test_actors_land_where_worker_options_ask_and_a_killed_one_loses_nothing() -> None:
    head = ray.get_runtime_context().get_node_id()
    reference = DataLoader(Draws(40), batch_size=2, shuffle=True, num_workers=2, **seeded(2))
    list(reference)
    expected = list(reference)  # the second epoch's batches
    loader = DataLoaderX(
        Draws(40),
        batch_size=2,
        shuffle=True,
        num_workers=2,
        worker_options=ON_WORKER_NODES,
        **seeded(2),
        **RAY,
    )
    list(loader)  # the first epoch starts the actors; the second loses one
    nodes = [place.node_id for place in places(loader)]
    assert head not in nodes
    assert len(set(nodes)) == 2  # spread over the two worker nodes
    iterator = iter(loader)
    got = [next(iterator) for _ in range(5)]
    victim = places(loader)[1]
    os.kill(victim.pid, signal.SIGKILL)
    with pytest.warns(RuntimeWarning, match=r"worker 1 \(Ray actor \S+ on node .*was lost"):
        got.extend(iterator)
    assert [b[:, 0].tolist() for b in got] == [b[:, 0].tolist() for b in expected]
    alive = places(loader)
    assert alive[1].pid != victim.pid
    assert alive[1].node_id in nodes


# 7. Nothing leaks -------------------------------------------------------------------------


def _leave(loader: DataLoaderX[Any], how: str) -> None:
    if how == "break":
        for _batch in loader:
            break
    elif how == "close":
        iterator = iter(loader)
        next(iterator)
        iterator.close()
    elif how == "exception":
        try:
            for _batch in loader:
                raise KeyError("in the loop")
        except KeyError:
            pass
    else:  # garbage collection of an iterator left mid-epoch
        iterator = iter(loader)
        next(iterator)
        del iterator
        gc.collect()


@pytest.mark.parametrize("how", ["break", "close", "exception", "gc"])
def test_epochs_left_early_keep_one_set_of_actors_and_a_dropped_loader_leaves_none(
    how: str,
) -> None:
    loader = DataLoaderX(Slow(64, 0.001), batch_size=2, num_workers=2, **RAY)
    seen: set[str] = set()
    for _ in range(20):
        _leave(loader, how)
        alive = our_actors()
        # A new epoch waits for the actors of the one left early; under heavy load it may
        # start its own, which the next epoch takes back: never more than two sets.
        assert len(alive) <= 4, alive
        seen.update(alive)
    assert len(seen) <= 4, seen  # no new actors epoch after epoch
    del loader
    gc.collect()
    assert wait_for(lambda: not our_actors(), within=30), our_actors()


def test_an_idle_loaders_actors_give_way_to_a_loader_that_does_not_fit_beside_them() -> None:
    # Each loader's one actor reserves 3 CPUs, which only the head (4 CPUs) has: the two
    # cannot be placed at once, and each epoch's loader takes the room the idle one leaves.
    options = {"num_cpus": 3, "placement_timeout_s": 60}
    loaders = [
        DataLoaderX(RangeDataset(size), batch_size=2, num_workers=1, worker_options=options, **RAY)
        for size in (8, 4)
    ]
    for size, loader in [*zip((8, 4), loaders, strict=True), (8, loaders[0])]:
        assert [batch[:, 0].tolist() for batch in loader] == [
            [index, index + 1] for index in range(0, size, 2)
        ]
        assert len(our_actors()) == 1  # the other loader's actor gave way


def test_past_max_replacements_a_lost_worker_is_an_error_naming_it() -> None:
    loader = DataLoaderX(
        Slow(40, 0.01), batch_size=2, num_workers=2, worker_options={"max_replacements": 0}, **RAY
    )
    iterator = iter(loader)
    next(iterator)
    victim = places(loader)[1]
    os.kill(victim.pid, signal.SIGKILL)
    with pytest.raises(RuntimeError) as caught:
        list(iterator)
    message = str(caught.value)
    for words in ("worker 1", f"pid {victim.pid}", "ActorDiedError", "max_replacements"):
        assert words in message


# 8. Where the workers run ---------------------------------------------------------------


def test_a_loader_with_ray_workers_pickles_without_its_actors() -> None:
    loader = DataLoaderX(RangeDataset(4), num_workers=2, worker_options={"num_cpus": 0.5}, **RAY)
    copy = pickle.loads(pickle.dumps(loader))
    assert (copy.worker_method, copy.worker_options) == ("ray", {"num_cpus": 0.5})


@pytest.mark.parametrize("backend", ["sync", "thread"])
def test_ctrl_c_ends_the_wait_for_a_batch(backend: str) -> None:
    # Item 1 takes 5 s, which an interrupt cuts short for the loop. (The actor, and a
    # producer thread waiting for it, finish that item, as a worker thread would.)
    loader = DataLoaderX(Slow(4, 5.0, slow_from=1), num_workers=1, backend=backend, **RAY)
    iterator = iter(loader)
    assert int(next(iterator)) == 0
    # A suite started in the background by a shell ignores SIGINT: use a terminal's handler.
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            next(iterator)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, handler)
    iterator.close()


def _lose_a_worker_each_epoch(loader: DataLoaderX[Any], epochs: int) -> list[list[int]]:
    seen = []
    for epoch in range(epochs):
        iterator = iter(loader)
        got = [int(next(iterator)[0]) for _ in range(3)]
        os.kill(places(loader)[epoch % 2].pid, signal.SIGKILL)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            for batch in iterator:
                got.append(int(batch[0]))
        seen.append(got)
    return seen


def test_a_loader_that_lost_workers_goes_at_once_when_dropped() -> None:
    # The lost actors' errors hold no frame of the loop (which holds the loader): dropped,
    # the loader goes at once, and its actors with it, without waiting for the collector.
    loader = DataLoaderX(Slow(40, 0.02), batch_size=2, num_workers=2, **RAY)
    list(loader)
    gc.disable()
    try:
        assert _lose_a_worker_each_epoch(loader, 2) == [list(range(0, 40, 2))] * 2
        dropped = weakref.ref(loader)
        del loader
        assert dropped() is None
    finally:
        gc.enable()


# 9. bench --worker-method ray -------------------------------------------------------------


def test_bench_runs_each_backend_with_ray_workers_too(capsys: pytest.CaptureFixture[str]) -> None:
    arguments = ["bench", "--dataset", "tests.bench_fixtures:tiny"]
    arguments += ["--step", "tests.bench_fixtures:noop", "--batches", "2", "--rounds", "1"]
    arguments += ["--no-progress", "--json", "--backends", "sync", "--num-workers", "1"]
    assert main([*arguments, "--worker-method", "ray"]) == 0
    document = json.loads(capsys.readouterr().out)
    rows = [(row["loader"], row["worker_method"]) for row in document["results"]]
    assert rows == [
        ("DataLoader", "multiprocessing"),
        ("sync", "multiprocessing"),
        ("sync", "thread"),
        ("sync", "ray"),
    ]
    assert all(row["batches"] == 2 for row in document["results"])


def test_bench_worker_method_ray_needs_workers_without_tune(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # With --tune the sweep picks the counts (tests/test_bench_tune_ray.py).
    assert main(["bench", "--worker-method", "ray", "--batches", "2"]) == 2
    error = capsys.readouterr().err
    assert "--worker-method ray needs a number of workers: --num-workers 0 has none" in error
    assert "give --num-workers 2 (or more)" in error
