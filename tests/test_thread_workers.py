"""``worker_method="thread"``: DataLoader's worker contract, kept by threads, for every backend.

The reference is ``DataLoader`` with worker processes and the same arguments: the same
batches in the same order, worker ids and seeds, errors (the worker named a thread),
``worker_init_fn`` calls, sharded iterable datasets, resume states.
"""

from __future__ import annotations

import gc
import random
import re
import threading
import time
import warnings
import weakref
from collections import Counter as Tally
from typing import Any

import numpy
import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    DistributedSampler,
    SequentialSampler,
    get_worker_info,
)
from torch.utils.data._utils import worker as torch_worker

import dataloaderx.loader as loader_module
import dataloaderx.workers.assignment as assignment_module
import dataloaderx.workers.info as info_module
from dataloaderx import DataLoaderX
from dataloaderx.workers.iterator import WorkersIterator
from dataloaderx.workers.method import dataloader_takes_worker_method
from tests.helpers import (
    FailingDataset,
    RangeDataset,
    Sharded,
    StructDataset,
    assert_same,
    failing_collate,
    run_events,
    run_python_without_session_ray,
    user_warnings,
    wait_until_clean,
)

pytestmark = [
    pytest.mark.timeout(120),
    # The reference's worker processes outnumber this machine's cores in some tests.
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

THREADS = {"worker_method": "thread"}
#: Whether this torch's ``WorkerInfo`` has the fields of thread workers, ``rng`` and
#: ``worker_method`` (2.13 has them, 2.11 has not).
HAS_THREAD_FIELDS = (
    set(getattr(torch_worker.WorkerInfo, "__dataclass_fields__", {})) >= info_module._THREAD_FIELDS
)


class WhoMadeIt(Dataset[torch.Tensor]):
    """Item ``i``: ``i``, the worker's id and seed, and one draw of each generator the worker
    is meant to draw from: ``get_worker_info().rng`` where torch fills it (worker threads),
    else the globals a worker process seeds. Both start from the same states. Without the
    field, worker threads have only the shared globals: no draws are compared."""

    def __len__(self) -> int:
        return 37

    def __getitem__(self, index: int) -> torch.Tensor:
        info = get_worker_info()
        assert info is not None
        rng = info.rng if HAS_THREAD_FIELDS else None
        if not HAS_THREAD_FIELDS:
            draws = [0.0, 0.0, 0.0]
        elif rng is None:
            draws = [random.random(), torch.rand(()).item(), numpy.random.rand()]
        else:
            draws = [
                rng.random_generator.random(),
                torch.rand((), generator=rng.torch_generator).item(),
                rng.numpy_generator.rand(),
            ]
        return torch.tensor([index, info.id, info.num_workers, info.seed, *draws])


def processes_and_threads(
    dataset: Any, backend: str, seed: int | None = None, **kwargs: Any
) -> tuple[DataLoader[Any], DataLoaderX[Any]]:
    """``DataLoader`` with worker processes, and ``DataLoaderX`` with worker threads."""

    def seeded() -> dict[str, Any]:
        return {} if seed is None else {"generator": torch.Generator().manual_seed(seed)}

    return (
        DataLoader(dataset, **kwargs, **seeded()),
        DataLoaderX(dataset, backend=backend, **kwargs, **seeded(), **THREADS),
    )


# 1. Same batches, same order, same workers ---------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"batch_size": 4, "num_workers": 2},
        {"batch_size": 3, "num_workers": 3, "shuffle": True, "drop_last": True},
        {"batch_size": None, "num_workers": 2, "shuffle": True},
        {"batch_size": 5, "num_workers": 2, "prefetch_factor": 1},
        {"batch_size": 2, "num_workers": 4, "prefetch_factor": 3},
    ],
    ids=["plain", "shuffle-drop-last", "no-batching", "prefetch-1", "four-workers"],
)
def test_same_batches_workers_and_draws_as_worker_processes(
    backend: str, options: dict[str, Any]
) -> None:
    reference, loader = processes_and_threads(WhoMadeIt(), backend, seed=5, **options)
    expected = list(reference)
    assert len(expected) == len(loader)
    assert_same(list(loader), expected)


def test_batch_sampler_and_structured_items_match(backend: str) -> None:
    sampler = BatchSampler(SequentialSampler(range(23)), batch_size=4, drop_last=False)
    reference, loader = processes_and_threads(
        StructDataset(23), backend, batch_sampler=sampler, num_workers=2
    )
    assert_same(list(loader), list(reference))


@pytest.mark.parametrize("num_workers", [1, 2, 3])
def test_a_sharded_iterable_dataset_yields_what_it_yields_with_processes(
    backend: str, num_workers: int
) -> None:
    reference, loader = processes_and_threads(
        Sharded(20), backend, batch_size=3, num_workers=num_workers
    )
    assert_same(list(loader), list(reference))


def test_out_of_order_batches_are_the_same_batches(backend: str) -> None:
    reference, loader = processes_and_threads(
        RangeDataset(40), backend, batch_size=2, num_workers=3, in_order=False
    )
    expected = Tally(tuple(batch[:, 0].tolist()) for batch in reference)
    assert Tally(tuple(batch[:, 0].tolist()) for batch in loader) == expected


@pytest.mark.parametrize("persistent", [False, True])
def test_epochs_with_set_epoch_match(backend: str, persistent: bool) -> None:
    dataset = WhoMadeIt()
    samplers = [DistributedSampler(dataset, num_replicas=2, rank=0, seed=3) for _ in range(2)]
    options = {"batch_size": 4, "num_workers": 2, "persistent_workers": persistent}
    reference = DataLoader(
        dataset, sampler=samplers[0], generator=torch.Generator().manual_seed(4), **options
    )
    loader = DataLoaderX(
        dataset,
        sampler=samplers[1],
        generator=torch.Generator().manual_seed(4),
        backend=backend,
        **options,
        **THREADS,
    )
    for epoch in range(3):
        for sampler in samplers:
            sampler.set_epoch(epoch)
        assert_same(list(loader), list(reference))


def test_persistent_worker_threads_survive_epochs_left_early(backend: str) -> None:
    reference, loader = processes_and_threads(
        RangeDataset(30), backend, batch_size=4, num_workers=2, persistent_workers=True
    )
    threads = None
    for epoch in range(5):
        expected, actual = iter(reference), iter(loader)
        for _ in range(2 if epoch % 2 == 0 else len(loader)):
            assert_same(next(actual), next(expected))
        now = loader._iterator._workers  # type: ignore[union-attr]
        assert threads is None or now == threads  # the same threads, epoch after epoch
        threads = now
    assert threads is not None
    assert all(thread.is_alive() for thread in threads)


def test_the_seeds_follow_the_loaders_generator_epoch_after_epoch(backend: str) -> None:
    reference, loader = processes_and_threads(WhoMadeIt(), backend, seed=11, num_workers=2)
    for _ in range(2):  # a new base seed each epoch, drawn from the generator
        assert_same(list(loader), list(reference))


class EvenBatchesSlow(Dataset[torch.Tensor]):
    """Items ``[index, worker id or -1, draw]``, batches of 2: the items of even batches
    (worker 0's with 2 workers) take 20 ms, so a free thread has worker 0's batches to
    take (with ``spin``, 60 ms in Python code that holds the GIL, else asleep). Each item notes the
    thread that made it. The item asks for its worker's info from index ``reads_from`` on,
    and draws from its worker's generator from ``draws_from`` on (where torch has the
    field)."""

    def __init__(
        self,
        size: int = 40,
        reads_from: int = 10**9,
        draws_from: int = 10**9,
        *,
        spin: bool = False,
    ) -> None:
        self.size, self.reads_from, self.draws_from = size, reads_from, draws_from
        self.spin = spin
        self._lock = threading.Lock()
        self.made_in: dict[int, str] = {}

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        with self._lock:
            self.made_in[index] = threading.current_thread().name
        if index // 2 % 2 == 0:
            if self.spin:
                end = time.perf_counter() + 0.06
                while time.perf_counter() < end:
                    pass
            else:
                time.sleep(0.02)
        worker, draw = -1, 0.0
        if index >= self.reads_from:
            info = get_worker_info()
            assert info is not None
            worker = info.id
            if index >= self.draws_from and HAS_THREAD_FIELDS:
                draw = info.rng.random_generator.random()
        return torch.tensor([index, worker, draw], dtype=torch.float64)

    def batches_in_other_threads(self, before: int = 10**9) -> list[int]:
        """The batches (of 2) made, before item ``before``, by another thread than their
        worker's (worker ``k mod 2``, whose thread is named ``...-<k mod 2>``)."""
        return sorted(
            {
                index // 2
                for index, name in self.made_in.items()
                if index < before and not name.endswith(f"-{index // 2 % 2}")
            }
        )


def test_a_free_thread_takes_any_workers_batch_and_the_batches_stay_the_same(
    backend: str,
) -> None:
    dataset = EvenBatchesSlow()
    reference, loader = processes_and_threads(dataset, backend, batch_size=2, num_workers=2)
    assert_same(list(loader), list(reference))
    shared = dataset.batches_in_other_threads()
    assert shared, "worker 1's thread made none of worker 0's slow batches"
    assert min(shared) >= 2  # each worker's first batch in its own thread


@pytest.mark.parametrize("why", ["reads its worker", "worker_init_fn", "iterable", "holds the GIL"])
def test_each_workers_batches_stay_in_its_thread_where_a_batch_could_tell(
    why: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a machine with a core to spare: the cores' idle time grows as fast as the clock
    monkeypatch.setattr(assignment_module, "idle_seconds", time.perf_counter)
    options: dict[str, Any] = {"batch_size": 2, "num_workers": 2, **THREADS}
    if why == "iterable":  # each worker iterates its own shard: its batches are its own

        class SlowFirstShard(Sharded):
            def __iter__(self) -> Any:
                for item in super().__iter__():
                    if item % 2 == 0:
                        time.sleep(0.02)
                    yield item

        reference = DataLoader(SlowFirstShard(40), batch_size=2, num_workers=2)
        assert_same(list(DataLoaderX(SlowFirstShard(40), **options)), list(reference))
        return
    dataset = EvenBatchesSlow(
        reads_from=0 if why == "reads its worker" else 10**9, spin=why == "holds the GIL"
    )
    if why == "worker_init_fn":
        options["worker_init_fn"] = InitCalls()
    batches = list(DataLoaderX(dataset, **options))
    assert len(batches) == 20
    assert dataset.batches_in_other_threads() == []


def test_threads_that_hold_the_gil_share_batches_where_no_core_was_idle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the cores were busy with other work all along: the threads took turns for want of cores
    monkeypatch.setattr(assignment_module, "idle_seconds", lambda: 100.0)
    dataset = EvenBatchesSlow(spin=True)
    batches = list(DataLoaderX(dataset, batch_size=2, num_workers=2, **THREADS))
    assert len(batches) == 20
    assert dataset.batches_in_other_threads()


@pytest.mark.parametrize(
    ("cpu_seconds", "seconds", "idle_seconds", "took_turns"),
    [
        ((0.2, 0.2), 0.4, 0.4, True),  # one core's worth, the other core idle: the GIL
        ((0.2, 0.2), 0.4, 0.0, False),  # one core's worth, no core idle: the cores were taken
        ((0.2, 0.2), 0.4, None, False),  # no idle time told: the GIL is not told apart
        ((0.02, 0.02), 0.04, 0.04, False),  # too short to count idle time in
        ((0.35, 0.35), 0.4, 0.4, False),  # both cores busy: the items release the GIL
        ((0.01, 0.01), 0.4, 0.4, False),  # the threads mostly waited
    ],
)
def test_the_first_batches_decide_whether_the_threads_took_turns_on_one_core(
    monkeypatch: pytest.MonkeyPatch,
    cpu_seconds: tuple[float, float],
    seconds: float,
    idle_seconds: float | None,
    took_turns: bool,
) -> None:
    # the idle time the cores had: 100 s at the first start, 100 + idle_seconds at the end
    told = iter([100.0, 100.0, None if idle_seconds is None else 100.0 + idle_seconds])
    monkeypatch.setattr(assignment_module, "idle_seconds", lambda: next(told))
    clock = iter([10.0, 10.0, 10.0 + seconds])  # perf_counter: the two starts, the decision
    monkeypatch.setattr(assignment_module.time, "perf_counter", lambda: next(clock))
    first = assignment_module._FirstTasks(2)
    first.start(0)
    first.start(1)
    first.times = [(cpu, 10.0, 10.0 + seconds) for cpu in cpu_seconds]
    assert first.took_turns() is took_turns


@pytest.mark.skipif(not HAS_THREAD_FIELDS, reason="this torch's WorkerInfo has no rng field")
def test_a_batch_that_asks_late_sees_its_worker_and_draws_in_that_workers_order(
    backend: str,
) -> None:
    def run(reads_from: int) -> tuple[list[torch.Tensor], EvenBatchesSlow]:
        dataset = EvenBatchesSlow(size=60, reads_from=reads_from, draws_from=30)
        loader = DataLoaderX(
            dataset,
            batch_size=2,
            num_workers=2,
            generator=torch.Generator().manual_seed(9),
            backend=backend,
            **THREADS,
        )
        return list(loader), dataset

    # Asking from the first item keeps each worker's batches in its thread: the reference.
    expected, _ = run(reads_from=0)
    actual, dataset = run(reads_from=30)
    assert dataset.batches_in_other_threads(before=30)  # shared before the first ask
    for got, want in zip(actual, expected, strict=True):
        assert_same(got[:, 2], want[:, 2])  # the draws, in each worker's order
    ids = torch.cat(actual)[30:, 1]
    assert ids.tolist() == [index // 2 % 2 for index in range(30, 60)]


# 2. get_worker_info --------------------------------------------------------------------


def test_worker_info_in_worker_threads_and_none_in_the_loop(backend: str) -> None:
    seen: list[Any] = []

    class Recording(RangeDataset):
        def __getitem__(self, index: int) -> torch.Tensor:
            seen.append((threading.current_thread(), get_worker_info()))
            return super().__getitem__(index)

    dataset = Recording(12)
    loader = DataLoaderX(dataset, batch_size=2, num_workers=3, backend=backend, **THREADS)
    assert len(list(loader)) == 6
    assert get_worker_info() is None
    loop = threading.current_thread()
    assert all(thread is not loop for thread, _ in seen)
    infos = {info.id: info for _, info in seen}
    assert sorted(infos) == [0, 1, 2]
    for worker, info in infos.items():
        assert info.num_workers == 3
        assert info.dataset is dataset  # shared, not a copy
        if HAS_THREAD_FIELDS:
            assert info.worker_method == "thread"
        assert info.seed - worker == infos[0].seed  # base seed + worker id


def fresh_python(script: str) -> str:
    """What ``script`` prints in a new Python at the repository's root (it must succeed)."""
    result = run_python_without_session_ray(script, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_get_worker_info_imported_before_the_package_sees_worker_threads() -> None:
    script = (
        "from torch.utils.data import get_worker_info as early\n"
        "from torch.utils.data import Dataset\n"
        "class D(Dataset):\n"
        "    def __len__(self): return 4\n"
        "    def __getitem__(self, i): return early().id\n"
        "from dataloaderx import DataLoaderX\n"
        "ids = [int(b) for b in DataLoaderX(D(), num_workers=2, worker_method='thread')]\n"
        "print(ids, early())\n"
    )
    assert fresh_python(script) == "[0, 1, 0, 1] None"


@pytest.mark.skipif(not HAS_THREAD_FIELDS, reason="this torch's WorkerInfo has no rng field")
def test_the_numpy_generator_is_made_when_first_read() -> None:
    # In a fresh process: numpy.random is imported by the test session already.
    script = (
        "import sys, threading\n"
        "from torch.utils.data import Dataset, get_worker_info\n"
        "from dataloaderx import DataLoaderX\n"
        "seen = []\n"
        "class D(Dataset):\n"
        "    read = False\n"
        "    def __len__(self): return 8\n"
        "    def __getitem__(self, i):\n"
        "        if self.read:\n"
        "            rng = get_worker_info().rng\n"
        "            seen.append((type(rng.numpy_generator).__name__,\n"
        "                         rng.numpy_generator is rng.numpy_generator))\n"
        "        return i\n"
        "loader = DataLoaderX(D(), batch_size=4, num_workers=2, worker_method='thread')\n"
        "assert len(list(loader)) == 2\n"
        "before = 'numpy.random' in sys.modules\n"
        "D.read = True\n"
        "assert len(list(loader)) == 2\n"
        "print(before, sorted(set(seen)), len(seen))\n"
    )
    assert fresh_python(script) == "False [('RandomState', True)] 8"


@pytest.mark.skipif(not HAS_THREAD_FIELDS, reason="this torch's WorkerInfo has no rng field")
def test_a_fork_waits_for_the_numpy_generators_import() -> None:
    # A worker thread's first read imports numpy.random, slowed here to a second. A fork in
    # the middle of that import would leave the child's numpy.random import lock held by a
    # thread the child does not have: the child's own import would wait forever.
    script = (
        "import importlib.abc, os, sys, threading, time\n"
        "from dataloaderx.workers.info import worker_info\n"
        "importing = threading.Event()\n"
        "class Slow(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'numpy.random':\n"
        "            importing.set()\n"
        "            time.sleep(1.0)\n"
        "        return None\n"
        "sys.meta_path.insert(0, Slow())\n"
        "info = worker_info([], 0, 1, 123)\n"
        "reader = threading.Thread(target=lambda: info.rng.numpy_generator)\n"
        "reader.start()\n"
        "assert importing.wait(60)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    import numpy.random\n"
        "    os._exit(0)\n"
        "deadline = time.monotonic() + 30\n"
        "while not os.waitpid(pid, os.WNOHANG)[0]:\n"
        "    if time.monotonic() > deadline:\n"
        "        os.kill(pid, 9)\n"
        "        sys.exit('the forked child hung on numpy.random')\n"
        "    time.sleep(0.02)\n"
        "reader.join()\n"
        "print(type(info.rng.numpy_generator).__name__)\n"
    )
    assert fresh_python(script) == "RandomState"


def test_worker_processes_still_see_their_own_info_after_threads_ran() -> None:
    threads = DataLoaderX(RangeDataset(4), num_workers=2, **THREADS)
    assert len(list(threads)) == 4  # get_worker_info is thread-aware from here on
    options = {"num_workers": 2, "generator": torch.Generator().manual_seed(2)}
    reference = list(DataLoader(WhoMadeIt(), **options))
    options["generator"] = torch.Generator().manual_seed(2)
    assert_same(list(DataLoaderX(WhoMadeIt(), **options)), reference)


def test_default_collate_stacks_in_process_memory_and_a_collate_fn_sees_the_worker(
    backend: str,
) -> None:
    # torch's default_collate stacks a worker's tensors into shared memory, meant for the
    # hand-over to another process; a worker thread hands its batch over as it is. Should a
    # torch ask get_worker_info() from elsewhere for that, the batches are shared again here.
    # The batches are checked where they are made: a device backend's copies (a CUDA tensor
    # is always "shared") tell nothing.
    in_collate: list[Any] = []
    shared: list[bool] = []

    def collate(items: list[torch.Tensor]) -> torch.Tensor:
        in_collate.append(get_worker_info())
        batch = torch.utils.data.default_collate(items)
        shared.append(batch.is_shared())
        return batch

    dataset = RangeDataset(8)
    processes = list(DataLoader(dataset, batch_size=2, num_workers=2))
    assert all(batch.is_shared() for batch in processes)  # what the check below tells apart
    custom = DataLoaderX(
        dataset, batch_size=2, num_workers=2, collate_fn=collate, backend=backend, **THREADS
    )
    assert_same(list(custom), processes)
    assert shared == [False] * 4
    assert sorted(info.id for info in in_collate) == [0, 0, 1, 1]


class KeywordWorkerInfo:
    """``WorkerInfo`` as torch defined it before its ``rng`` and ``worker_method`` fields: a
    plain class that takes its attributes as keywords, and refuses new ones after."""

    def __init__(self, **fields: Any) -> None:
        vars(self).update(fields)

    def __setattr__(self, name: str, value: Any) -> None:
        raise RuntimeError(f"Cannot assign attributes to {type(self).__name__} objects")


def test_a_torch_without_the_rng_field_gets_worker_info_without_it(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch_worker, "WorkerInfo", KeywordWorkerInfo)
    info = info_module.worker_info(RangeDataset(4), 1, 2, base_seed=10)
    assert (info.id, info.num_workers, info.seed) == (1, 2, 11)
    assert not hasattr(info, "rng")
    assert not hasattr(info, "worker_method")
    seen: list[Any] = []

    class Recording(RangeDataset):
        def __getitem__(self, index: int) -> torch.Tensor:
            seen.append(get_worker_info())
            return super().__getitem__(index)

    loader = DataLoaderX(Recording(6), batch_size=2, num_workers=2, backend=backend, **THREADS)
    assert_same(list(loader), list(DataLoader(RangeDataset(6), batch_size=2)))
    assert all(isinstance(info, KeywordWorkerInfo) for info in seen)
    assert sorted({info.id for info in seen}) == [0, 1]


# 3. worker_init_fn ---------------------------------------------------------------------


class InitCalls:
    """A ``worker_init_fn`` recording ``(worker_id, thread, worker info id)`` per call."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, threading.Thread, int | None]] = []
        self.lock = threading.Lock()

    def __call__(self, worker_id: int) -> None:
        info = get_worker_info()
        with self.lock:
            self.calls.append((worker_id, threading.current_thread(), info and info.id))


def eight_items_two_workers(backend: str, **kwargs: Any) -> DataLoaderX[torch.Tensor]:
    """4 batches of 2 from 2 worker threads."""
    return DataLoaderX(
        RangeDataset(8), batch_size=2, num_workers=2, backend=backend, **THREADS, **kwargs
    )


@pytest.mark.parametrize("persistent", [False, True])
def test_worker_init_fn_runs_once_per_worker_thread(backend: str, persistent: bool) -> None:
    init = InitCalls()
    loader = eight_items_two_workers(backend, worker_init_fn=init, persistent_workers=persistent)
    for _ in range(3):
        assert len(list(loader)) == 4
    epochs = 1 if persistent else 3
    assert sorted(worker for worker, _, _ in init.calls) == sorted([0, 1] * epochs)
    assert all(info_id == worker for worker, _, info_id in init.calls)
    assert len({thread for _, thread, _ in init.calls}) == 2 * epochs


def test_a_failing_worker_init_fn_fails_that_workers_first_batch(backend: str) -> None:
    def init(worker_id: int) -> None:
        if worker_id == 1:
            raise OSError("no such shard")

    loader = eight_items_two_workers(backend, worker_init_fn=init)
    events = run_events(iter(loader))
    assert [kind for kind, _, _ in events] == ["batch", "error", "batch", "error"]
    for _, error_type, message in events[1::2]:  # its first batch, as a process; and the rest
        assert error_type is OSError
        assert "Caught OSError in DataLoader worker thread 1" in message
        assert "no such shard" in message


# 4. Errors and timeouts ----------------------------------------------------------------


def outline(events: list[Any]) -> list[Any]:
    """Events with each error's message cut to its first line (which names the worker, its
    process called a thread) and its last (the original error): the traceback between them
    shows where the worker ran, a process's loop or a thread's."""

    def cut(message: str) -> tuple[str, str]:
        lines = message.strip().splitlines()
        return re.sub(r"worker process (\d+)", r"worker thread \1", lines[0]), lines[-1]

    return [(kind, error, cut(message)) for kind, error, message in events if kind == "error"]


@pytest.mark.parametrize("collate", [False, True])
def test_errors_name_the_worker_thread_and_the_epoch_goes_on(backend: str, collate: bool) -> None:
    dataset = FailingDataset(24, frozenset() if collate else frozenset({3, 4, 11}))
    options: dict[str, Any] = {"batch_size": 2, "num_workers": 2}
    if collate:
        options["collate_fn"] = failing_collate(6)
    reference, loader = processes_and_threads(dataset, backend, **options)
    expected = run_events(iter(reference))
    assert any(kind == "error" for kind, _, _ in expected)
    for _ in range(2):  # and the loader works on, epoch after epoch
        actual = run_events(iter(loader))
        assert [kind for kind, _, _ in actual] == [kind for kind, _, _ in expected]
        assert outline(actual) == outline(expected)
        assert_same(
            [batch for kind, batch, _ in actual if kind == "batch"],
            [batch for kind, batch, _ in expected if kind == "batch"],
        )


class Marker:
    """Something weakly referenceable to hang on an exception."""


def test_the_error_is_raised_without_a_reference_cycle(backend: str) -> None:
    loader = DataLoaderX(
        FailingDataset(8, frozenset({0})), batch_size=2, num_workers=2, backend=backend, **THREADS
    )
    iterator = iter(loader)
    gc.collect()
    gc.disable()  # only reference counting frees anything from here on
    try:
        try:
            next(iterator)
        except ValueError as error:
            marker = Marker()
            error.marker = marker  # type: ignore[attr-defined]
            alive = weakref.ref(marker)
            del marker
        assert alive() is None  # the error was freed with its last reference: no cycle
    finally:
        gc.enable()
        iterator.close()


def test_timeout_raises_as_dataloader_does(backend: str) -> None:
    class Stuck(RangeDataset):
        def __getitem__(self, index: int) -> torch.Tensor:
            if index == 2:
                time.sleep(3)
            return super().__getitem__(index)

    loader = DataLoaderX(Stuck(8), num_workers=1, timeout=0.3, backend=backend, **THREADS)
    iterator = iter(loader)
    assert [int(next(iterator)[0, 0]) for _ in range(2)] == [0, 1]
    with pytest.raises(RuntimeError, match=re.escape("DataLoader timed out after 0.3 seconds")):
        next(iterator)
    iterator.close()


def test_a_worker_ended_by_systemexit_is_reported_as_a_dead_worker_is(backend: str) -> None:
    # A worker process that exits makes DataLoader raise "DataLoader worker (pid(s) ...)
    # exited unexpectedly"; a worker thread ended the same way is named alike.
    loader = DataLoaderX(
        FailingDataset(40, frozenset({5}), SystemExit),
        batch_size=1,
        num_workers=2,
        backend=backend,
        **THREADS,
    )
    with pytest.raises(RuntimeError, match="exited unexpectedly") as caught:
        for _batch in loader:
            pass
    assert "DataLoader worker thread 1 exited unexpectedly" in str(caught.value)
    assert isinstance(caught.value.__cause__, SystemExit)


def test_pin_memory_behaves_as_with_worker_processes(backend: str) -> None:
    options = {"batch_size": 4, "num_workers": 2, "pin_memory": True}
    reference, loader = processes_and_threads(RangeDataset(10), backend, **options)
    with warnings.catch_warnings(record=True) as expected_warnings:
        warnings.simplefilter("always")
        expected = list(reference)
    with warnings.catch_warnings(record=True) as actual_warnings:
        warnings.simplefilter("always")
        actual = list(loader)
    assert_same(actual, expected)
    assert user_warnings(actual_warnings) == user_warnings(expected_warnings)
    if torch.accelerator.is_available() and not loader.prefetch_backend.pins_host_memory():
        assert all(batch.is_pinned() for batch in actual)


# 5. Shutdown ---------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["break", "close", "error", "collect"])
def test_worker_threads_stop_when_the_epoch_is_left(backend: str, how: str) -> None:
    baseline = set(threading.enumerate())
    fail_at = frozenset({6}) if how == "error" else frozenset()
    loader = DataLoaderX(
        FailingDataset(200, fail_at), batch_size=2, num_workers=3, backend=backend, **THREADS
    )
    iterator = iter(loader)
    next(iterator)
    if how == "close":
        iterator.close()
    elif how == "error":
        with pytest.raises(ValueError, match="bad index 6"):
            for _batch in iterator:
                pass
    elif how == "collect":
        iterator.cycle = iterator  # type: ignore[attr-defined]
    del iterator
    if how == "collect":
        gc.collect()
    # Threads only: child processes (the session's Ray has some) are the no_leaks fixture's.
    left, _ = wait_until_clean(baseline, set(), within=5.0, list_children=set)
    assert left == []


def test_a_loader_with_persistent_worker_threads_stops_them_when_collected() -> None:
    baseline = set(threading.enumerate())
    loader = DataLoaderX(RangeDataset(8), num_workers=2, persistent_workers=True, **THREADS)
    assert len(list(loader)) == 8
    assert len(set(threading.enumerate()) - baseline) >= 2
    del loader
    left, _ = wait_until_clean(baseline, set(), within=5.0, list_children=set)
    assert left == []


def test_no_global_generator_is_reseeded_by_worker_threads() -> None:
    torch.manual_seed(123)
    random.seed(123)
    numpy.random.seed(123)
    states = (torch.get_rng_state(), random.getstate(), numpy.random.get_state()[1].copy())
    # With a generator of its own, the loader draws its base seed from that one.
    loader = DataLoaderX(RangeDataset(6), num_workers=2, generator=torch.Generator(), **THREADS)
    assert len(list(loader)) == 6
    assert torch.equal(torch.get_rng_state(), states[0])
    assert random.getstate() == states[1]
    assert (numpy.random.get_state()[1] == states[2]).all()


# 6. Resume -----------------------------------------------------------------------------


@pytest.mark.parametrize("iterable", [False, True])
def test_resume_mid_epoch_with_worker_threads(backend: str, iterable: bool) -> None:
    def make() -> DataLoaderX[Any]:
        dataset: Any = Sharded(30) if iterable else RangeDataset(30)
        options: dict[str, Any] = {} if iterable else {"shuffle": True}
        return DataLoaderX(
            dataset,
            batch_size=3,
            num_workers=2,
            generator=torch.Generator().manual_seed(8),
            backend=backend,
            **options,
            **THREADS,
        )

    whole = [batch.tolist() for batch in make()]
    loader = make()
    iterator = iter(loader)
    head = [next(iterator).tolist() for _ in range(4)]
    state = loader.state_dict()
    iterator.close()
    resumed = make()
    resumed.load_state_dict(state)
    if iterable:  # it has no state of its own: the consumed batches are made again, unseen
        with pytest.warns(UserWarning, match="makes the 4 batches already consumed again"):
            rest = [batch.tolist() for batch in resumed]
    else:
        rest = [batch.tolist() for batch in resumed]
    assert head + rest == whole


# 7. A torch whose DataLoader has worker threads of its own -----------------------------


def test_worker_method_is_detected_on_dataloaders_signature() -> None:
    class Future(DataLoader[Any]):
        def __init__(self, *args: Any, worker_method: str = "multiprocessing", **kwargs: Any):
            super().__init__(*args, **kwargs)

    assert not dataloader_takes_worker_method()  # torch 2.13 has none
    assert dataloader_takes_worker_method(Future)


def test_a_dataloader_with_worker_method_is_given_it(monkeypatch: pytest.MonkeyPatch) -> None:
    given: list[Any] = []
    original = DataLoader.__init__

    def init(self: DataLoader[Any], *args: Any, worker_method: str, **kwargs: Any) -> None:
        given.append(worker_method)
        original(self, *args, **kwargs)

    monkeypatch.setattr(DataLoader, "__init__", init)
    monkeypatch.setattr(loader_module, "_TORCH_WORKER_METHOD", True)
    loader = DataLoaderX(RangeDataset(4), num_workers=2, backend="sync", **THREADS)
    assert given == ["thread"]
    iterator = iter(loader)
    assert not isinstance(iterator._inner, WorkersIterator)  # DataLoader's own, here
    assert len(list(iterator)) == 4
