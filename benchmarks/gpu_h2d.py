"""GPU benchmark of the ``cuda`` backend: host-to-device bandwidth and hidden copy time.

Reports, in one run on one GPU:

1. raw pinned H2D bandwidth: ``copy_`` of a pinned tensor on one stream (the link's limit);
2. the backend's achieved H2D bandwidth: iterating ``DataLoaderX(backend="cuda")`` with
   no compute, from pinned batches and from pageable ones (which the backend pins);
3. step time of a compute-bound loop: compute alone (batch already on the GPU) vs
   ``DataLoader`` + ``.to(device)`` in the loop vs ``BackgroundGenerator(DataLoader)`` +
   ``.to(device)`` vs ``DataLoaderX(backend="cuda")``, with ratios.

Usage: ``python benchmarks/gpu_h2d.py [--steps 200] [--batch 256,3,224,224]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterable

import torch
from prefetch_generator import BackgroundGenerator
from torch.utils.data import DataLoader, Dataset

from dataloaderx import DataLoaderX


class RingDataset(Dataset[torch.Tensor]):
    """``steps`` whole batches (``batch_size=None``), read from a ring of host buffers."""

    def __init__(self, steps: int, shape: tuple[int, ...], *, pinned: bool) -> None:
        self.steps = steps
        self.buffers = [torch.randint(0, 255, shape, dtype=torch.uint8) for _ in range(4)]
        if pinned:
            self.buffers = [buffer.pin_memory() for buffer in self.buffers]

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.buffers[index % len(self.buffers)]


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def raw_pinned_bandwidth(shape: tuple[int, ...], repeats: int) -> float:
    source = torch.randint(0, 255, shape, dtype=torch.uint8).pin_memory()
    target = torch.empty(shape, dtype=torch.uint8, device="cuda")
    target.copy_(source, non_blocking=True)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        target.copy_(source, non_blocking=True)
    end.record()
    end.synchronize()
    return gbps(source.numel() * repeats, start.elapsed_time(end) / 1e3)


def backend_bandwidth(dataset: RingDataset, depth: int) -> float:
    loader = DataLoaderX(dataset, batch_size=None, backend="cuda", backend_options={"depth": depth})
    for _ in loader:  # warm-up epoch: stream, pinned host cache, allocator
        pass
    torch.cuda.synchronize()
    nbytes = 0
    start = time.perf_counter()
    for batch in loader:
        nbytes += batch.numel() * batch.element_size()
    torch.cuda.synchronize()
    return gbps(nbytes, time.perf_counter() - start)


def make_compute(target_ms: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """A step that reads the batch, then runs matmuls for about ``target_ms``."""
    weight = torch.randn(4096, 4096, device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    (weight @ weight).sum()
    start.record()
    for _ in range(10):
        weight @ weight
    end.record()
    end.synchronize()
    repeats = max(1, round(target_ms / (start.elapsed_time(end) / 10)))

    def compute(batch: torch.Tensor) -> torch.Tensor:
        total = batch.float().mean()
        for _ in range(repeats):
            total = total + (weight @ weight)[0, 0]
        return total

    return compute


def step_time(
    batches: Callable[[], Iterable[torch.Tensor]],
    compute: Callable[[torch.Tensor], torch.Tensor],
    to_device: bool,
) -> float:
    """Mean seconds per step over one epoch, after a warm-up epoch."""
    for batch in batches():
        compute(batch.to("cuda", non_blocking=True) if to_device else batch)
    torch.cuda.synchronize()
    steps = 0
    start = time.perf_counter()
    for batch in batches():
        compute(batch.to("cuda", non_blocking=True) if to_device else batch)
        steps += 1
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", default="256,3,224,224", help="uint8 batch shape")
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--compute-ms", type=float, default=0.0, help="0: 4x the copy time")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(
            "gpu_h2d: needs a CUDA GPU, and torch.cuda.is_available() is False here; "
            "run it on a machine with a GPU and a CUDA build of torch",
            file=sys.stderr,
        )
        return 2
    shape = tuple(int(part) for part in args.batch.split(","))
    nbytes = torch.Size(shape).numel()
    print(f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}")
    print(f"batch: uint8 {list(shape)} = {nbytes / 1e6:.1f} MB; {args.steps} steps")

    raw = raw_pinned_bandwidth(shape, repeats=50)
    pinned = RingDataset(args.steps, shape, pinned=True)
    pageable = RingDataset(args.steps, shape, pinned=False)
    achieved = backend_bandwidth(pinned, args.depth)
    achieved_pageable = backend_bandwidth(pageable, args.depth)
    print(f"raw pinned H2D:            {raw:7.2f} GB/s")
    print(f"cuda backend, pinned:      {achieved:7.2f} GB/s ({achieved / raw:.1%} of raw)")
    print(
        f"cuda backend, pageable:    {achieved_pageable:7.2f} GB/s ({achieved_pageable / raw:.1%})"
    )

    copy_ms = nbytes / (raw * 1e9) * 1e3
    compute_ms = args.compute_ms or 4 * copy_ms
    compute = make_compute(compute_ms)
    resident = pinned.buffers[0].to("cuda")
    plain = DataLoader(pinned, batch_size=None)
    ours = DataLoaderX(
        pinned, batch_size=None, backend="cuda", backend_options={"depth": args.depth}
    )
    results = {
        "compute alone": step_time(lambda: [resident] * args.steps, compute, False),
        "DataLoader + .to()": step_time(lambda: plain, compute, True),
        "BackgroundGenerator + .to()": step_time(
            lambda: BackgroundGenerator(plain, max_prefetch=args.depth), compute, True
        ),
        "DataLoaderX cuda": step_time(lambda: ours, compute, False),
    }
    alone = results["compute alone"]
    print(f"copy ~{copy_ms:.2f} ms per batch at raw speed; compute target {compute_ms:.2f} ms")
    for name, seconds in results.items():
        print(f"{name:28s} {seconds * 1e3:8.2f} ms/step  {seconds / alone:5.3f}x compute alone")
    cuda = results["DataLoaderX cuda"]
    print(f"DataLoader / cuda:          {results['DataLoader + .to()'] / cuda:5.3f}x")
    print(f"BackgroundGenerator / cuda: {results['BackgroundGenerator + .to()'] / cuda:5.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
