"""Peak RSS overhead: each loader in a fresh process, batches of a known size.

Target: peak RSS over DataLoader's <= (depth + 1) batches. Adaptive backends run with
``adaptive=False``, so that they prefetch and the bound is what is measured.
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import time

import _common as bench
import torch
from torch.utils.data import Dataset

BATCH_MB = 32
BATCHES = 30
#: A slow step, so that prefetching loaders fill their buffers.
STEP_SECONDS = 0.02


class Big(Dataset[torch.Tensor]):
    """Each item is a fresh ``BATCH_MB`` MiB tensor (batch_size=None: one item per batch)."""

    def __len__(self) -> int:
        return BATCHES

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((BATCH_MB * 2**20 // 4,), float(index))


def child(name: str, depth: int) -> None:
    loader = bench.contestants(Big(), depth=depth, batch_size=None, always_prefetch=True)[name]()
    bench.time_epoch(loader, lambda batch: time.sleep(STEP_SECONDS))
    print(json.dumps(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))


def main() -> None:
    arguments = bench.parser(__doc__ or "")
    arguments.add_argument("--child", nargs=2, metavar=("NAME", "DEPTH"))
    args = arguments.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]))
        return
    bench.print_machine()
    rows: list[list[str]] = []
    for depth in (2, 4):
        names = list(bench.contestants(Big(), depth=depth, batch_size=None, always_prefetch=True))
        peaks: dict[str, list[float]] = {name: [] for name in names}
        for _ in range(args.repeats):
            for name in names:
                command = [sys.executable, __file__, "--child", name, str(depth)]
                output = subprocess.run(command, capture_output=True, text=True, check=True)
                peaks[name].append(float(output.stdout.strip().splitlines()[-1]))
        base = statistics.median(peaks[bench.BASELINE])
        for name in names:
            extra = statistics.median(peaks[name]) - base
            rows.append(
                [
                    str(depth),
                    name,
                    f"{statistics.median(peaks[name]):.0f}",
                    f"{extra / BATCH_MB:+.2f}",
                ]
            )
    header = ["depth", "loader", "peak RSS MiB", f"over DataLoader, in {BATCH_MB} MiB batches"]
    print(bench.markdown_table(header, rows))


if __name__ == "__main__":
    main()
