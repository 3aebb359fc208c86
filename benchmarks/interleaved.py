"""Single-process workloads, with ``DataLoader`` and each loader taking turns batch by batch.

On a shared machine whose speed drifts by tens of percent within seconds, epochs timed
one after the other differ by more than the 2% a no-regression target asks about (see
``no_regression.py``'s own noise floor). Here both loaders advance together: each turn
times one ``next()`` and the training step of one loader, then of the other (which goes
first alternates by epoch), so both see the same machine at the same moment. The ratio
of their summed times, one per epoch, has a far smaller spread.

Valid only where nothing runs between turns: ``num_workers=0`` (worker processes would
keep working during the other loader's turn), and loaders that make batches in the
loop's own thread (``sync``, and the adaptive default once it decided on inline). Each
loader is built once and its first epoch, where the adaptive default decides, runs alone
and untimed; its mode line says what that decision cost. A later epoch in which a
producer thread ran is counted in the last column (the other loader's turn then counts
as that loader's step, so such epochs are not a fair comparison).

The ``bare wrapper`` row is the floor for any loader written in Python: a ``DataLoader``
whose iterator is wrapped in a class whose ``next()`` only calls PyTorch's.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from time import perf_counter
from typing import Any

import _common as bench
from no_regression import PythonBound, TinyTensors, python_step

#: Loaders that make batches in the loop's thread once decided (others would overlap).
INTERLEAVED = ("sync", "thread", "auto")
FLOOR = "bare wrapper"


class _BareIterator:
    __slots__ = ("_next",)

    def __init__(self, iterator: Iterator[Any]) -> None:
        self._next = iterator.__next__

    def __iter__(self) -> _BareIterator:
        return self

    def __next__(self) -> Any:
        return self._next()


class BareWrapper:
    """``loader``'s batches through one Python ``next()`` call each, and nothing else."""

    def __init__(self, loader: Iterable[Any]) -> None:
        self._loader = loader

    def __iter__(self) -> _BareIterator:
        return _BareIterator(iter(self._loader))


def bare_wrapper(factory: bench.LoaderFactory) -> BareWrapper:
    return BareWrapper(factory())


def interleaved_epoch(
    first: Iterable[Any], second: Iterable[Any], step: Callable[[Any], object] | None
) -> tuple[float, float]:
    """Seconds spent in ``first`` and in ``second``, taking turns batch by batch."""
    spent = [0.0, 0.0]
    iterators = [iter(first), iter(second)]
    done = [False, False]
    while not all(done):
        for index, iterator in enumerate(iterators):
            if done[index]:
                continue
            start = perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                done[index] = True
                spent[index] += perf_counter() - start
                continue
            if step is not None:
                step(batch)
            spent[index] += perf_counter() - start
    return spent[0], spent[1]


def main() -> None:
    args = bench.parser(__doc__ or "").parse_args()
    bench.print_machine()
    cases = {
        "pure Python, GIL-bound": (bench.contestants(PythonBound(), batch_size=10), python_step),
        "num_workers=0, tiny tensors, no step": (
            bench.contestants(TinyTensors(), batch_size=8),
            None,
        ),
    }
    rows: list[list[str]] = []
    first_epochs: list[str] = []
    for case, (factories, step) in cases.items():
        baseline = factories[bench.BASELINE]()
        wrapped: dict[str, bench.LoaderFactory] = {
            FLOOR: partial(bare_wrapper, factories[bench.BASELINE]),
            **{name: factories[name] for name in INTERLEAVED if name in factories},
        }
        loaders = bench.kept_loaders(
            wrapped,
            lambda loader, s=step: bench.time_epoch(loader, s),
            case,
            first_epochs,
        )
        for name, kept in loaders.items():
            loader = kept()
            ratios = []
            threaded = 0
            for epoch in range(args.repeats):
                if epoch % 2:
                    theirs, ours = interleaved_epoch(loader, baseline, step)
                else:
                    ours, theirs = interleaved_epoch(baseline, loader, step)
                ratios.append(ours / theirs)
                stats = getattr(loader, "stats", None)
                mode = None if stats is None else stats.mode
                if mode is not None and "; 0 of " not in mode:
                    threaded += 1  # some batch of this epoch was prefetched
            rows.append(
                [
                    case,
                    name,
                    f"{statistics.median(ratios):.3f}x",
                    f"{min(ratios):.3f}x-{max(ratios):.3f}x",
                    f"{threaded} of {args.repeats}",
                ]
            )
    header = ["case", "loader", "vs DataLoader (median)", "range", "epochs with a producer"]
    print(bench.markdown_table(header, rows))
    print("\n".join(first_epochs))


if __name__ == "__main__":
    main()
