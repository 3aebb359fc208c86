"""``depth="auto"`` against fixed depths 1, 2, 4, 8 and 16 on bursty loading.

Workloads (``batch_size=None``; each batch is one fresh tensor of ``--batch-kib`` KiB; the
step waits ``--step-ms`` without holding the GIL, as a step on an accelerator does):

* ``heavy-tailed``: each batch's load time is drawn from a Pareto distribution (shape
  1.5: finite mean, infinite variance), rescaled so that its mean over the epoch equals
  the step time. One sequence per round, the same for every contestant of that round.
* ``periodic``: every 50th batch takes 20x as long as the others (half a step).
* ``max_bytes``: the periodic workload with ``depth="auto"`` and a cap of 4 batches.

With ``--default-check`` it runs instead ``depth="auto"`` against ``depth=2`` on the
``dataloaderx bench`` workload, on 20,000 tiny batches (the hand-off cost) and on the two
cases of ``no_regression.py``, which decides whether ``"auto"`` could be the default.

Every contestant runs in one process, alternating (each round starts one place further
along), and the tables give medians (with the spread of the rounds) of the epoch time
and of the peak bytes held in the buffer (``loader.stats.peak_bytes``). Targets: auto
within 3% of the best fixed depth's time on each workload, at or below the memory of the
smallest fixed depth that reaches that time (within 3% of the best); with ``max_bytes``,
peak bytes held never above the cap.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import _common as bench
import torch
from no_regression import PythonBound, python_step
from torch.utils.data import Dataset

from dataloaderx import DataLoaderX
from dataloaderx.bench.workload import (
    DEFAULT_BATCH_SIZE,
    SyntheticImages,
    default_dataset,
    fake_step,
)

DEPTHS: tuple[Any, ...] = ("auto", 1, 2, 4, 8, 16)
PERIOD = 50
SLOWDOWN = 20
TOLERANCE = 0.03
MIB = 1024**2


class TimedLoads(Dataset[torch.Tensor]):
    """Item ``k`` waits ``loads[k]`` seconds (without the GIL), then is a fresh tensor."""

    def __init__(self, loads: list[float], elements: int) -> None:
        self.loads = loads
        self.elements = elements

    def __len__(self) -> int:
        return len(self.loads)

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(self.loads[index])
        return torch.empty(self.elements)


class Tiny(Dataset[int]):
    def __len__(self) -> int:
        return 20_000

    def __getitem__(self, index: int) -> int:
        return index


def heavy_tailed(batches: int, mean: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    draws = [rng.paretovariate(1.5) for _ in range(batches)]
    scale = mean * batches / sum(draws)
    return [draw * scale for draw in draws]


def periodic(batches: int, step: float) -> list[float]:
    base = step / 2
    return [base * SLOWDOWN if k % PERIOD == PERIOD - 1 else base for k in range(batches)]


def run_epoch(
    dataset: Dataset[Any], options: dict[str, Any], step: Callable[[Any], object], **kwargs: Any
) -> tuple[float, int, tuple[int, int, int]]:
    """Seconds for one epoch, peak bytes held and (min, median, max) depth."""
    loader = DataLoaderX(dataset, backend="thread", backend_options=options, **kwargs)
    seconds = bench.time_epoch(loader, step)
    stats = loader.stats
    assert stats is not None
    assert stats.peak_bytes is not None
    assert stats.depth_min is not None
    assert stats.depth_median is not None
    assert stats.depth_max is not None
    return seconds, stats.peak_bytes, (stats.depth_min, stats.depth_median, stats.depth_max)


def compare(
    make_dataset: Callable[[int], Dataset[Any]],
    contestants: dict[str, dict[str, Any]],
    step: Callable[[Any], object],
    repeats: int,
    **kwargs: Any,
) -> dict[str, list[tuple[float, int, tuple[int, int, int]]]]:
    """Every contestant once per round, rotating the order; round ``r`` uses dataset ``r``."""
    names = list(contestants)
    results: dict[str, list[tuple[float, int, tuple[int, int, int]]]] = {n: [] for n in names}
    for round_number in range(repeats):
        dataset = make_dataset(round_number)
        for name in bench.rotated(names, round_number):
            results[name].append(run_epoch(dataset, contestants[name], step, **kwargs))
    return results


def spread(values: list[float]) -> str:
    median = statistics.median(values)
    low, high = min(values), max(values)
    return f"{median:.3f} ({low:.3f}-{high:.3f})"


def report(title: str, results: dict[str, list[tuple[float, int, tuple[int, int, int]]]]) -> None:
    times = {name: statistics.median(r[0] for r in runs) for name, runs in results.items()}
    peaks = {name: statistics.median(r[1] for r in runs) for name, runs in results.items()}
    fixed = [name for name in results if name != "auto" and not name.startswith("auto ")]
    best = min(fixed, key=times.__getitem__)
    reaching = [name for name in fixed if times[name] <= times[best] * (1 + TOLERANCE)]
    smallest = min(reaching, key=lambda name: int(name.split("=")[1]))
    rows = []
    for name, runs in results.items():
        depths = statistics.median_low(r[2] for r in runs)
        rows.append(
            [
                name,
                spread([r[0] for r in runs]),
                f"{times[name] / times[best]:.3f}",
                f"{peaks[name] / MIB:.1f}",
                f"{max(r[1] for r in runs) / MIB:.1f}",
                "/".join(str(d) for d in depths),
            ]
        )
    print(f"\n### {title}\n")
    header = ["loader", "epoch s, median (range)", "vs best fixed", "peak MiB held (median)"]
    header += ["peak MiB held (max)", "depth min/med/max"]
    print(bench.markdown_table(header, rows))
    for name in results:
        if "max_bytes" in name:
            print(
                f"\n{name}: {times[name] / times['depth=4']:.3f}x the time of depth=4, "
                f"which holds as many bytes"
            )
        elif name.startswith("auto"):
            within = times[name] <= times[best] * (1 + TOLERANCE)
            memory = peaks[name] <= peaks[smallest]
            as_fast = [other for other in fixed if times[other] <= times[name]]
            print(
                f"\n{name}: {times[name] / times[best]:.3f}x the best fixed depth ({best}), "
                f"time target {'met' if within else 'NOT met'}; smallest fixed depth within "
                f"{TOLERANCE:.0%} of the best: {smallest} ({peaks[smallest] / MIB:.1f} MiB), "
                f"memory {'at or below' if memory else 'ABOVE'} it; fixed depths at least as "
                f"fast as {name}: {', '.join(as_fast) or 'none'}"
            )


def main() -> None:
    arguments = bench.parser(__doc__ or "")
    arguments.add_argument("--batches", type=int, default=600)
    arguments.add_argument("--step-ms", type=float, default=5.0)
    arguments.add_argument("--batch-kib", type=int, default=1024)
    arguments.add_argument("--default-check", action="store_true")
    args = arguments.parse_args()
    bench.print_machine()
    if args.default_check:
        default_check(args.repeats)
        return
    step_seconds = args.step_ms / 1000
    elements = args.batch_kib * 1024 // 4

    def step(batch: object) -> None:
        time.sleep(step_seconds)

    depths = {f"depth={d}" if d != "auto" else "auto": {"depth": d} for d in DEPTHS}
    batches = args.batches
    heavy = compare(
        lambda r: TimedLoads(heavy_tailed(batches, step_seconds, seed=r), elements),
        depths,
        step,
        args.repeats,
        batch_size=None,
    )
    report("heavy-tailed load, mean = step", heavy)
    loads = periodic(batches, step_seconds)
    periodic_results = compare(
        lambda r: TimedLoads(loads, elements), depths, step, args.repeats, batch_size=None
    )
    report(f"periodic: every {PERIOD}th batch {SLOWDOWN}x slower", periodic_results)
    cap = 4 * elements * 4
    capped = {
        "auto": {"depth": "auto"},
        "auto max_bytes=4 batches": {"depth": "auto", "max_bytes": cap},
        "depth=4": {"depth": 4},
        "depth=16": {"depth": 16},
    }
    capped_results = compare(
        lambda r: TimedLoads(loads, elements), capped, step, args.repeats, batch_size=None
    )
    report("periodic, with max_bytes", capped_results)
    worst = max(r[1] for r in capped_results["auto max_bytes=4 batches"])
    print(
        f"\nmax_bytes={cap / MIB:.1f} MiB: peak held over {args.repeats} runs "
        f"{worst / MIB:.1f} MiB, {'never above the cap' if worst <= cap else 'ABOVE THE CAP'}"
    )


def default_check(repeats: int) -> None:
    """``depth="auto"`` against ``depth=2`` where no burst calls for depth."""
    two = {"depth=2": {"depth": 2}, "auto": {"depth": "auto"}}
    pipeline = compare(
        lambda r: default_dataset(), two, fake_step, repeats, batch_size=DEFAULT_BATCH_SIZE
    )
    handoff = compare(lambda r: Tiny(), two, lambda batch: None, repeats, batch_size=None)
    workers = compare(
        lambda r: SyntheticImages(640), two, lambda batch: None, repeats,
        batch_size=16, num_workers=2,
    )  # fmt: skip
    python = compare(lambda r: PythonBound(), two, python_step, repeats, batch_size=10)
    rows = []
    for title, results in (
        ("bench workload", pipeline),
        ("20,000 tiny batches", handoff),
        ("num_workers=2, fast step", workers),
        ("pure Python, GIL-bound", python),
    ):
        times = {name: statistics.median(r[0] for r in runs) for name, runs in results.items()}
        for name, runs in results.items():
            depths = statistics.median_low(r[2] for r in runs)
            rows.append(
                [
                    title,
                    name,
                    spread([r[0] for r in runs]),
                    f"{times[name] / times['depth=2']:.3f}",
                    "/".join(str(d) for d in depths),
                ]
            )
    print("\n### default check: auto against depth=2\n")
    header = ["workload", "loader", "epoch s, median (range)", "vs depth=2", "depth min/med/max"]
    print(bench.markdown_table(header, rows))


if __name__ == "__main__":
    main()
