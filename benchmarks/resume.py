"""Resuming at 90% of a 1,000,000-sample epoch whose ``__getitem__`` costs 1 ms.

Reports the time from ``load_state_dict`` on a fresh loader to the first batch in hand
(target: < 1 s), for ``DataLoaderX``, for torchdata's ``StatefulDataLoader`` when it is
installed, and for iterating to the position (estimated from the measured time per batch:
running it would take about 15 minutes). Also reports what keeping the state costs per
batch handed out (target: < 1 us) and what one ``state_dict()`` costs.
"""

from __future__ import annotations

import importlib.util
import statistics
import time
from collections.abc import Callable, Iterator
from time import perf_counter
from typing import Any

import _common as bench
import torch
from torch.utils.data import Dataset

from dataloaderx import DataLoaderX, PrefetchIterator
from dataloaderx.backends.sync import SyncBackend

SIZE = 1_000_000
BATCH_SIZE = 32
FRACTION = 0.9


class OneMillisecond(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return SIZE

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(0.001)
        return torch.tensor(index)


def seeded() -> torch.Generator:
    generator = torch.Generator()
    generator.manual_seed(0)
    return generator


def ours(dataset: Dataset[torch.Tensor] | None = None) -> Any:
    return DataLoaderX(
        dataset or OneMillisecond(),
        batch_size=BATCH_SIZE,
        shuffle=True,
        generator=seeded(),
        backend="thread",
    )


def stateful(dataset: Dataset[torch.Tensor] | None = None) -> Any:
    from torchdata.stateful_dataloader import StatefulDataLoader

    return StatefulDataLoader(
        dataset or OneMillisecond(), batch_size=BATCH_SIZE, shuffle=True, generator=seeded()
    )


class Fast(OneMillisecond):
    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor(index)


def saved_state(make: Callable[[Dataset[torch.Tensor]], Any], position: int) -> tuple[Any, Any]:
    """A real state after ``position`` batches, saved by a loader on a dataset that costs
    nothing (same length and sampler), and the batch that follows it there."""
    loader = make(Fast())
    iterator = iter(loader)
    for _ in range(position):
        next(iterator)
    state = loader.state_dict()
    following = next(iterator)
    close = getattr(iterator, "close", None)
    if close is not None:
        close()
    return state, following


def time_to_first_batch(make: Callable[[], Any], state: Any, expected: torch.Tensor) -> float:
    start = perf_counter()
    loader = make()
    loader.load_state_dict(state)
    iterator = iter(loader)
    batch = next(iterator)
    seconds = perf_counter() - start
    assert torch.equal(batch, expected), "the resumed epoch went on with another batch"
    close = getattr(iterator, "close", None)
    if close is not None:
        close()
    return seconds


def seconds_per_batch(batches: int = 20) -> float:
    with iter(ours()) as iterator:
        next(iterator)
        start = perf_counter()
        for _ in range(batches):
            next(iterator)
        return (perf_counter() - start) / batches


def handout_cost(items: int = 1_000_000, repeats: int = 5) -> float:
    """Added seconds per ``next()`` of an inline epoch over its source: everything an
    epoch adds to a batch, its count (the resume position) included, so an upper bound
    of what keeping the resume state costs."""

    def drain(stream: Iterator[int]) -> float:
        start = perf_counter()
        for _ in range(items):
            next(stream)
        return perf_counter() - start

    plain: list[float] = []
    tracked: list[float] = []
    for _ in range(repeats):
        plain.append(drain(iter(range(items))))
        tracked.append(drain(PrefetchIterator(iter(range(items)), SyncBackend(), None)))
    return (statistics.median(tracked) - statistics.median(plain)) / items


def state_dict_cost(repeats: int = 2000) -> float:
    loader = ours()
    with iter(loader):
        start = perf_counter()
        for _ in range(repeats):
            loader.state_dict()
        return (perf_counter() - start) / repeats


def main() -> None:
    args = bench.parser(__doc__ or "").parse_args()
    bench.print_machine()
    position = int(FRACTION * SIZE / BATCH_SIZE)
    rows = []
    contestants: dict[str, Callable[..., Any]] = {"DataLoaderX (thread)": ours}
    if importlib.util.find_spec("torchdata") is not None:
        contestants["torchdata StatefulDataLoader"] = stateful
    for name, make in contestants.items():
        state, expected = saved_state(make, position)
        times = [time_to_first_batch(make, state, expected) for _ in range(args.repeats)]
        rows.append([name, f"{statistics.median(times):.3f}", "measured"])
    per_batch = seconds_per_batch()
    rows.append(["iterating to the position", f"{per_batch * position:.0f}", "estimated"])
    print(f"resume after {position:,} of {SIZE // BATCH_SIZE:,} batches of {BATCH_SIZE}")
    print(bench.markdown_table(["loader", "s to first batch (median)", ""], rows))
    print(f"\nper batch: {per_batch * 1000:.1f} ms (the dataset's 1 ms per item, x{BATCH_SIZE})")
    print(f"keeping the state: {handout_cost() * 1e9:.0f} ns per batch handed out")
    print(f"state_dict(): {state_dict_cost() * 1e6:.1f} us per call")


if __name__ == "__main__":
    main()
