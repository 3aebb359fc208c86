"""Datasets and comparison helpers shared by the tests (importable by worker processes)."""

from __future__ import annotations

import gc
import math
import os
import random
import subprocess
import sys
import threading
import time
import warnings
from collections import namedtuple
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy
import psutil
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from dataloaderx import get_backend
from dataloaderx.contracts.policy import INLINE, PREFETCH, Cycles, Verdict
from dataloaderx.options import backend_option_names

Pair = namedtuple("Pair", ["left", "right"])


class RangeDataset(Dataset[torch.Tensor]):
    """Item ``i`` is ``tensor([i, i*i])``."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([index, index * index])


class Draws(Dataset[torch.Tensor]):
    """Item ``i``: ``i``, the worker's id, count and seed, and a draw of each global
    generator, which a worker process seeds from its seed."""

    def __init__(self, size: int = 37) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        info = get_worker_info()
        assert info is not None
        draws = [random.random(), torch.rand(()).item(), numpy.random.rand()]
        return torch.tensor([index, info.id, info.num_workers, info.seed, *draws])


class StructDataset(Dataset[dict[str, Any]]):
    """Items mixing tensors, dicts, tuples, namedtuples, strings and numbers."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {
            "image": torch.full((2, 3), float(index)),
            "label": index % 3,
            "weight": index / 10,
            "name": f"item-{index}",
            "pair": Pair(torch.tensor(index), f"r{index}"),
            "nested": (torch.arange(index, index + 2), {"flag": index % 2 == 0}),
        }


class FailingDataset(Dataset[torch.Tensor]):
    """Raises ``error_type(f"bad index {i}")`` for each index in ``fail_at``."""

    def __init__(
        self, size: int, fail_at: frozenset[int], error_type: type[BaseException] = ValueError
    ) -> None:
        self.size = size
        self.fail_at = fail_at
        self.error_type = error_type

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        if index in self.fail_at:
            raise self.error_type(f"bad index {index}")
        return torch.tensor(index)


class SlowDataset(Dataset[torch.Tensor]):
    """Sleeps ``delay`` seconds (releasing the GIL) per item."""

    def __init__(self, size: int, delay: float) -> None:
        self.size = size
        self.delay = delay

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(self.delay)
        return torch.tensor(index)


class StallingDataset(Dataset[torch.Tensor]):
    """Item 0 at once; every later item sleeps ``stall`` seconds (releasing the GIL).

    For tests where a pending batch must never arrive in time: whatever the test sees
    next cannot be that batch.
    """

    def __init__(self, size: int, stall: float) -> None:
        self.size = size
        self.stall = stall

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        if index:
            time.sleep(self.stall)
        return torch.tensor(index)


class WarningDataset(Dataset[torch.Tensor]):
    """Warns ``UserWarning(f"odd item {i}")`` for odd indices."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        if index % 2:
            warnings.warn(f"odd item {index}", UserWarning, stacklevel=1)
        return torch.tensor(index)


class ShortLenIterable(IterableDataset[torch.Tensor]):
    """Yields ``actual`` items but reports ``reported`` as its length."""

    def __init__(self, actual: int, reported: int) -> None:
        self.actual = actual
        self.reported = reported

    def __len__(self) -> int:
        return self.reported

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(torch.arange(self.actual))


class Sharded(IterableDataset[int]):
    """Worker ``k`` of ``n`` yields ``k, k + n, ...`` below ``size + 4 * k``: uneven shards."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __iter__(self) -> Iterator[int]:
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(worker, self.size + 4 * worker, workers))


class FailingSampler(torch.utils.data.Sampler[int]):
    """Yields ``0..size-1`` but raises ``LookupError`` at position ``fail_at``."""

    def __init__(self, size: int, fail_at: int) -> None:
        self.size = size
        self.fail_at = fail_at

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[int]:
        for position in range(self.size):
            if position == self.fail_at:
                raise LookupError(f"sampler broke at {position}")
            yield position


def failing_collate(fail_on_first: int) -> Callable[[list[torch.Tensor]], torch.Tensor]:
    """A collate function raising ``TypeError`` when a batch starts with ``fail_on_first``."""

    def collate(items: list[torch.Tensor]) -> torch.Tensor:
        if int(items[0]) == fail_on_first:
            raise TypeError(f"cannot collate batch starting at {fail_on_first}")
        return torch.stack(items)

    return collate


@dataclass
class Counter:
    """A thread-safe call counter usable as a collate function (``num_workers=0``)."""

    count: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def __call__(self, items: list[torch.Tensor]) -> torch.Tensor:
        with self._lock:
            self.count += 1
        return torch.stack(items)


def assert_same(actual: Any, expected: Any, path: str = "batch") -> None:
    """Assert two batches are equal in structure, types, dtypes and values."""
    assert type(actual) is type(expected), f"{path}: {type(actual)} != {type(expected)}"
    if isinstance(expected, torch.Tensor):
        if actual.device != expected.device:  # a device backend (cuda) hands out copies
            actual, expected = actual.cpu(), expected.cpu()
        assert actual.dtype == expected.dtype, f"{path}: dtype"
        assert actual.shape == expected.shape, f"{path}: shape"
        assert torch.equal(actual, expected), f"{path}: values"
    elif isinstance(expected, dict):
        assert list(actual) == list(expected), f"{path}: keys"
        for key in expected:
            assert_same(actual[key], expected[key], f"{path}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), f"{path}: length"
        for index, (left, right) in enumerate(zip(actual, expected, strict=True)):
            assert_same(left, right, f"{path}[{index}]")
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def user_warnings(records: list[warnings.WarningMessage]) -> list[str]:
    """The messages of the ``UserWarning``s among ``records``: a loader's own warnings. Python
    3.12 adds a ``DeprecationWarning`` to every fork of a process that runs several threads
    (torch's intra-op threads included), whichever loader forks: those are left out."""
    return [str(w.message) for w in records if w.category is UserWarning]


Event = tuple[str, Any, Any]


def run_events(iterator: Iterator[Any], limit: int = 10_000) -> list[Event]:
    """Call ``next`` until ``StopIteration``, recording batches and errors in order."""
    events: list[Event] = []
    for _ in range(limit):
        try:
            events.append(("batch", next(iterator), None))
        except StopIteration:
            return events
        except Exception as exc:  # noqa: BLE001 - recorded for comparison
            events.append(("error", type(exc), str(exc)))
    raise AssertionError(f"iterator did not end after {limit} calls")


def assert_same_events(actual: list[Event], expected: list[Event]) -> None:
    assert [kind for kind, _, _ in actual] == [kind for kind, _, _ in expected]
    for index, (got, want) in enumerate(zip(actual, expected, strict=True)):
        if want[0] == "batch":
            assert_same(got[1], want[1], f"event[{index}]")
        else:
            assert got[1:] == want[1:], f"event[{index}]: {got[1:]} != {want[1:]}"


def child_pids() -> set[int]:
    """Live (non-zombie) child processes of this process."""
    pids = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                pids.add(child.pid)
        except psutil.NoSuchProcess:
            continue
    return pids


def describe_processes(pids: set[int]) -> dict[int, str]:
    """Each process's command line (or why it cannot be read), for failure messages."""
    described = {}
    for pid in sorted(pids):
        try:
            described[pid] = " ".join(psutil.Process(pid).cmdline())[:200]
        except psutil.Error as exc:
            described[pid] = type(exc).__name__
    return described


def extra_threads(baseline: set[threading.Thread]) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t not in baseline and t.is_alive()]


def wait_until_clean(
    threads: set[threading.Thread],
    children: set[int],
    within: float,
    list_children: Callable[[], set[int]] = child_pids,
) -> tuple[list[threading.Thread], set[int]]:
    """Poll until no thread or child beyond the baselines is alive; return what is left."""
    deadline = time.monotonic() + within
    while True:
        left_threads = extra_threads(threads)
        left_children = list_children() - children
        if (not left_threads and not left_children) or time.monotonic() >= deadline:
            return left_threads, left_children
        gc.collect()
        time.sleep(0.01)


def run_python_without_session_ray(code: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a new Python at the repository's root, without the variables this
    session's Ray set for its driver (``RAY_ADDRESS``, ...), and pytest's, which Ray reads as
    a sign that it runs its own tests."""
    environment = {
        key: value for key, value in os.environ.items() if not key.startswith(("RAY_", "PYTEST_"))
    }
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def session_processes(session: int) -> list[int]:
    """The processes of the session ``session`` (a scenario runs in its own)."""
    members = []
    for pid in psutil.pids():
        try:
            if os.getsid(pid) == session:
                members.append(pid)
        except OSError:
            continue
    return members


def wait_for(condition: Callable[[], bool], within: float = 30.0) -> bool:
    """Poll ``condition`` every few milliseconds until it holds (``True``) or ``within``
    seconds passed (``False``): a deadline for a slow, loaded machine, never a speed bound."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() >= deadline:
            return condition()
        time.sleep(0.005)
    return True


def running_producer(iterator: Any) -> threading.Thread | None:
    """The producer thread of ``iterator``'s epoch (a ``PrefetchIterator``) while it is
    alive; ``None`` while batches are made inline or no producer runs."""
    thread = getattr(iterator._epoch.stream, "thread", None)
    return thread if isinstance(thread, threading.Thread) and thread.is_alive() else None


def wait_until_made_ahead(iterator: Any, count: int, within: float = 30.0) -> None:
    """Wait until the producer of ``iterator``'s epoch has ``count`` outcomes (batches, errors
    or the end) ready to hand out, or no producer runs (it ended, or batches are made inline).

    For tests of what happens once a producer ran ahead: they wait for it instead of
    sleeping and hoping it was scheduled meanwhile.
    """

    def ran_ahead() -> bool:
        stream = iterator._epoch.stream
        return running_producer(iterator) is None or (
            stream is not None and stream.buffered() >= count
        )

    assert wait_for(ran_ahead, within), f"the producer made fewer than {count} ahead"


def wait_until_run_ahead(iterator: Any, within: float = 30.0) -> None:
    """:func:`wait_until_made_ahead` for as many as the backend's fixed ``depth`` (1 for a
    backend without one): the producer, if one runs, filled its buffer or ended."""
    depth = iterator._epoch.backend.describe().get("depth")
    wait_until_made_ahead(iterator, depth if isinstance(depth, int) else 1, within)


def waits_in_a_condition(thread: threading.Thread) -> bool:
    """Whether ``thread`` is blocked in ``threading.Condition.wait`` right now: a producer
    reading a source without worker threads does that only while it waits for room."""
    frame = sys._current_frames().get(thread.ident or -1)
    return frame is not None and frame.f_code is threading.Condition.wait.__code__


def assert_closed_source(source: Any) -> None:
    """What ``close()`` guarantees once it returns, whatever the timing: no read starts any
    more, and the source is released unless a read begun before is still under way (its
    thread releases the source as it leaves that read, before it lets go of the lock)."""
    reading = source.lock.locked()  # first: a read that ended has released by then
    assert source.closing.locked()
    assert reading or source.released


def always_prefetching(backend: str | Mapping[str, Any], **options: Any) -> dict[str, Any]:
    """``options`` plus ``adaptive=False`` where ``backend`` (a name or spec) has that option.

    For tests of the prefetching machinery itself (how far ahead a producer runs, how
    full its buffer gets), which adaptive backends only use while it pays.
    """
    name = backend if isinstance(backend, str) else backend["name"]
    if "adaptive" in (backend_option_names(get_backend(name)) or []):
        options["adaptive"] = False
    return options


class SwitchingPolicy:
    """A mode policy that switches on a fixed pattern, whatever the timings.

    Batch ``k`` of every epoch is made in ``pattern[k % len(pattern)]`` mode; the default
    pattern switches both ways several times within a few batches. Batches with
    ``k % probe_every == 1`` are measured, each reported on its own; other batches of
    one mode are asked for in runs (at most 64), each to take ``steady_budget`` seconds
    at most.
    """

    reason = "scripted"

    def __init__(
        self,
        pattern: str = "IPPIPPPIIIIP",
        probe_every: int = 3,
        steady_budget: float = math.inf,
    ) -> None:
        self.pattern = pattern
        self.probe_every = probe_every
        self.steady_budget = steady_budget
        #: How often a run overran its budget.
        self.overruns = 0
        self.index = 0
        #: Every report, and how many cycles they held in all.
        self.observed: list[Cycles] = []
        self.cycles = 0
        #: ``helper_processes`` as given to each :meth:`start_epoch`.
        self.helper_processes: list[bool] = []
        #: The cycle count of each report of a run longer than one.
        self.bulk: list[int] = []
        self._granted = 0
        self._epoch_started = False

    def _mode_at(self, index: int) -> Any:
        return PREFETCH if self.pattern[index % len(self.pattern)] == "P" else INLINE

    def verdict(self) -> Verdict:
        index = self.index
        mode = self._mode_at(index)
        if index % self.probe_every == 1:
            self._granted = 1
            return Verdict(mode, 1, math.inf, measure=True)
        run = 1
        while (
            run < 64
            and self._mode_at(index + run) == mode
            and (index + run) % self.probe_every != 1
        ):
            run += 1
        self._granted = run
        return Verdict(mode, run, self.steady_budget if run > 1 else math.inf, measure=False)

    def start_epoch(self, *, helper_processes: bool) -> Verdict:
        self.index = 0
        self._epoch_started = True
        self.helper_processes.append(helper_processes)
        return self.verdict()

    def observe(self, cycles: Cycles) -> Verdict:
        assert 0 <= cycles.number <= self._granted, "more cycles than the verdict allowed"
        assert len(cycles.seconds) <= cycles.number, "more times than cycles"
        self.observed.append(cycles)
        if self._granted > 1:
            self.bulk.append(cycles.number)
        if cycles.overran:
            self.overruns += 1
        # The epoch's first batch ends no cycle, but it was made.
        self.index += cycles.number + (1 if self._epoch_started else 0)
        self._epoch_started = False
        self.cycles += cycles.number
        return self.verdict()
