"""Hand-off overhead: microseconds per batch each loader adds, on 100,000 tiny batches.

Backends are compared with ``sync`` (the same ``DataLoaderX`` wrapper, no thread), the
naive ``BackgroundGenerator`` pattern with plain ``DataLoader``. Also reports what the
stall statistics cost (``stats`` on vs off). Targets for ``thread`` (same run, same
depth): never worse than ``BackgroundGenerator`` at depth 2, <= 0.5x its overhead at
depth 8. Adaptive backends run with ``adaptive=False``: this measures the hand-off itself.
The rows ``thread (adaptive)`` are the default as users get it: it makes these batches
inline, so their added cost over ``DataLoader`` is the wrapper's fixed cost per batch.
"""

from __future__ import annotations

import _common as bench
from torch.utils.data import Dataset

from dataloaderx import DataLoaderX

#: The default as users get it (it makes these batches inline).
ADAPTIVE = "thread (adaptive)"


class Tiny(Dataset[int]):
    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        return index


def main() -> None:
    arguments = bench.parser(__doc__ or "")
    arguments.add_argument("--batches", type=int, default=100_000)
    args = arguments.parse_args()
    bench.print_machine()
    dataset = Tiny(args.batches)
    per_batch = 1e6 / args.batches
    rows: list[list[str]] = []
    for depth in (2, 8):
        factories = bench.contestants(dataset, depth=depth, batch_size=None, always_prefetch=True)
        for name in ("thread", "sync"):
            spec = bench.backend_spec(name, depth, stats=False, always_prefetch=True)
            factories[f"{name} (stats off)"] = lambda spec=spec: DataLoaderX(
                dataset, backend=spec, batch_size=None
            )
        if depth == 2:  # inline, the depth does not matter
            for stats, label in ((True, ADAPTIVE), (False, f"{ADAPTIVE} (stats off)")):
                spec = bench.backend_spec("thread", depth, stats=stats)
                factories[label] = lambda spec=spec: DataLoaderX(
                    dataset, backend=spec, batch_size=None
                )
        results = bench.medians(bench.alternate(factories, bench.time_epoch, args.repeats))
        naive_cost = (results[bench.NAIVE] - results[bench.BASELINE]) * per_batch
        for name, seconds in results.items():
            reference = (
                bench.BASELINE
                if name in (bench.BASELINE, bench.NAIVE) or name.startswith(("sync", ADAPTIVE))
                else "sync"
            )
            if name == "thread (stats off)":
                reference = "sync (stats off)"
            added = (seconds - results[reference]) * per_batch
            compared = name not in (bench.BASELINE, reference) and not name.startswith(ADAPTIVE)
            ratio = f"{added / naive_cost:.2f}" if compared else ""
            rows.append(
                [str(depth), name, f"{seconds * per_batch:.2f}", reference, f"{added:+.2f}", ratio]
            )
    header = ["depth", "loader", "us/batch", "over", "added us/batch", "vs naive BG added"]
    print(bench.markdown_table(header, rows))


if __name__ == "__main__":
    main()
