"""GPU benchmark of the ``cuda`` backend against the usual hand-written patterns.

Every (scenario, loader pattern, thread setting, ``pin_memory``) combination runs in a
fresh Python process, as one training script would: PyTorch's pin-memory thread calls
``torch.set_num_threads(1)`` for the whole process, and ``torchrun`` starts processes
with ``OMP_NUM_THREADS=1``, and both change how fast later threads copy. Inside that
process one warm-up epoch runs, then ``--epochs`` timed epochs; the median step time is
reported.

Loader patterns:

* ``compute``: the step alone, on a batch already on the GPU (the floor);
* ``dl_to``: ``DataLoader`` + ``.to("cuda", non_blocking=True)`` in the loop;
* ``side_stream``: the copy issued one batch ahead on a side stream in the training
  thread, then ``wait_stream`` + ``record_stream`` (the pattern of timm's
  ``PrefetchLoader``);
* ``cuda``: ``DataLoaderX(backend="cuda")``.

Scenarios: ``pinned`` (whole 38.5 MB uint8 batches from a ring of pinned host buffers,
step = 4x the copy), ``workers`` (a sample-level dataset, uint8 3x224x224 + label,
batch 128, ``num_workers=4``, collated in the workers), ``inline`` (the same dataset,
``num_workers=0``), ``tiny`` (2,000 pinned 64x64 batches, no step); plus ``bandwidth``
(no step: raw pinned ``copy_``; ``cuda`` from pinned and from pageable batches; ``cuda``
from pageable batches made by 4 worker processes and by 4 worker threads, where the copy
thread pins them with whatever intra-op count it was left, each with ``pin_memory`` off
and on) and ``memory`` (pinned staging memory held over 10 epochs).

Usage: ``python benchmarks/gpu_h2d.py [--scenarios workers,tiny] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

SCENARIOS = ("pinned", "workers", "inline", "tiny")
LOADERS = ("dl_to", "side_stream", "cuda")
THREADS = ("default", "omp1")


# -- datasets -------------------------------------------------------------------------


class RingDataset(Dataset[torch.Tensor]):
    """``steps`` whole batches (``batch_size=None``) read from a ring of host buffers."""

    def __init__(self, steps: int, shape: tuple[int, ...], dtype: torch.dtype, *, pinned: bool):
        self.steps = steps
        self.buffers = [torch.randint(0, 255, shape).to(dtype) for _ in range(4)]
        if pinned:
            self.buffers = [buffer.pin_memory() for buffer in self.buffers]

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.buffers[index % len(self.buffers)]


class ImageSamples(Dataset[tuple[torch.Tensor, int]]):
    """Sample-level images: each item a fresh uint8 3x224x224 tensor and a label."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.images = [torch.randint(0, 255, (3, 224, 224), dtype=torch.uint8) for _ in range(16)]

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.images[index % len(self.images)].clone(), index % 1000


# -- loader patterns --------------------------------------------------------------------


def to_device(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to("cuda", non_blocking=True)
    return [to_device(part) for part in batch]


def record(batch: Any, stream: torch.cuda.Stream) -> None:
    if isinstance(batch, torch.Tensor):
        batch.record_stream(stream)
    else:
        for part in batch:
            record(part, stream)


def side_stream(loader: Iterable[Any]) -> Iterator[Any]:
    """Copy one batch ahead on a side stream, in the training thread."""
    stream = torch.cuda.Stream()
    previous = None
    for batch in loader:
        with torch.cuda.stream(stream):
            moved = to_device(batch)
        if previous is not None:
            yield previous
        current = torch.cuda.current_stream()
        current.wait_stream(stream)
        record(moved, current)
        previous = moved
    if previous is not None:
        yield previous


def make_compute(target_ms: float) -> Callable[[Any], Any]:
    """A step that reads the batch, then runs matmuls for about ``target_ms``."""
    if target_ms <= 0:
        return lambda batch: None
    weight = torch.randn(2048, 2048, device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        weight @ weight
    start.record()
    for _ in range(20):
        weight @ weight
    end.record()
    end.synchronize()
    repeats = max(1, round(target_ms / (start.elapsed_time(end) / 20)))

    def compute(batch: Any) -> Any:
        first = batch if isinstance(batch, torch.Tensor) else batch[0]
        total = first[:64].float().mean()
        for _ in range(repeats):
            total = total + (weight @ weight)[0, 0]
        return total

    return compute


def copy_ms(nbytes: int) -> float:
    """Milliseconds for one pinned copy of ``nbytes`` on this machine."""
    return nbytes / (raw_bandwidth(nbytes, 20) * 1e9) * 1e3


def raw_bandwidth(nbytes: int, repeats: int) -> float:
    source = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    target = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    target.copy_(source, non_blocking=True)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        target.copy_(source, non_blocking=True)
    end.record()
    end.synchronize()
    return nbytes * repeats / (start.elapsed_time(end) / 1e3) / 1e9


# -- one child process -----------------------------------------------------------------


def scenario_setup(scenario: str, pin_memory: bool) -> tuple[Dataset[Any], dict[str, Any], float]:
    """The dataset, DataLoader keyword arguments and step milliseconds of a scenario."""
    if scenario == "pinned":
        shape = (256, 3, 224, 224)
        dataset: Dataset[Any] = RingDataset(120, shape, torch.uint8, pinned=True)
        step = 4 * copy_ms(torch.Size(shape).numel())
        return dataset, {"batch_size": None, "pin_memory": pin_memory}, step
    if scenario in ("workers", "inline"):
        workers = 4 if scenario == "workers" else 0
        kwargs = {"batch_size": 128, "num_workers": workers, "pin_memory": pin_memory}
        if workers:
            kwargs["persistent_workers"] = True
        return ImageSamples(128 * 80), kwargs, 5.4
    if scenario == "tiny":
        dataset = RingDataset(2000, (64, 64), torch.float32, pinned=True)
        return dataset, {"batch_size": None, "pin_memory": pin_memory}, 0.0
    raise ValueError(f"unknown scenario {scenario!r}")


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    from dataloaderx import DataLoaderX

    scenario, pattern = spec["scenario"], spec["pattern"]
    if scenario == "bandwidth":
        return bandwidth_child(pattern, spec["epochs"], spec["pin_memory"])
    if scenario == "memory":
        return memory_child(spec["epochs"])
    dataset, kwargs, step_ms = scenario_setup(scenario, spec["pin_memory"])
    compute = make_compute(step_ms)
    if pattern == "cuda":
        loader: Iterable[Any] = DataLoaderX(dataset, backend="cuda", **kwargs)
    else:
        loader = DataLoader(dataset, **kwargs)

    def batches() -> Iterable[Any]:
        if pattern == "compute":
            resident = to_device(next(iter(DataLoader(dataset, **kwargs))))
            return itertools.repeat(resident, len(loader))  # type: ignore[arg-type]
        if pattern == "dl_to":
            return (to_device(batch) for batch in loader)
        if pattern == "side_stream":
            return side_stream(loader)
        return loader

    times = []
    for _ in range(spec["epochs"] + 1):
        torch.cuda.synchronize()
        steps = 0
        start = time.perf_counter()
        for batch in batches():
            compute(batch)
            steps += 1
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / steps * 1e3)
    result: dict[str, Any] = {"step_ms": statistics.median(times[1:]), "epochs_ms": times[1:]}
    stats = getattr(loader, "stats", None)
    if stats is not None:  # the cuda pattern: how its last epoch's batches were made
        result["mode"] = stats.mode
    return result


#: Bandwidth patterns: the worker method that makes the (pageable) batches, if any.
OVER_WORKERS = {"over_processes": "multiprocessing", "over_threads": "thread"}


def bandwidth_child(pattern: str, epochs: int, pin_memory: bool) -> dict[str, Any]:
    from dataloaderx import DataLoaderX

    shape = (256, 3, 224, 224)
    nbytes = torch.Size(shape).numel()
    if pattern == "raw":
        return {"gbps": raw_bandwidth(nbytes, 50)}
    dataset = RingDataset(60, shape, torch.uint8, pinned=pattern == "cuda_pinned")
    workers: dict[str, Any] = {}
    if pattern in OVER_WORKERS:
        method = OVER_WORKERS[pattern]
        workers = {"num_workers": 4, "persistent_workers": True, "worker_method": method}
    loader = DataLoaderX(dataset, batch_size=None, backend="cuda", pin_memory=pin_memory, **workers)
    rates = []
    for _ in range(epochs + 1):
        torch.cuda.synchronize()
        start = time.perf_counter()
        moved = sum(batch.numel() for batch in loader)
        torch.cuda.synchronize()
        rates.append(moved / (time.perf_counter() - start) / 1e9)
    return {"gbps": statistics.median(rates[1:])}


def memory_child(epochs: int) -> dict[str, Any]:
    from dataloaderx import DataLoaderX
    from dataloaderx.backends.cuda import CudaBackend

    shape = (128, 3, 224, 224)
    dataset = RingDataset(40, shape, torch.uint8, pinned=False)
    loader = DataLoaderX(dataset, batch_size=None, backend="cuda")
    api: Any = CudaBackend.device_api
    peaks, after = [], []
    for _ in range(max(epochs, 10)):
        api.peak_pinned_bytes = api.pinned_bytes
        for _batch in loader:
            pass
        peaks.append(api.peak_pinned_bytes)
        after.append(api.pinned_bytes)
    batch = torch.Size(shape).numel()
    return {
        "depth": loader.prefetch_backend.depth,  # type: ignore[attr-defined]
        "peak_batches": [peak / batch for peak in peaks],
        "held_after_epoch": after,
    }


# -- the parent: one process per combination ------------------------------------------------


def spawn(spec: dict[str, Any], threads: str) -> dict[str, Any]:
    env = dict(os.environ)
    if threads == "omp1":
        env["OMP_NUM_THREADS"] = "1"
    else:
        env.pop("OMP_NUM_THREADS", None)
    done = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--scenarios", default=",".join((*SCENARIOS, "bandwidth", "memory")))
    parser.add_argument("--threads", default=",".join(THREADS))
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs per process")
    parser.add_argument("--json", help="also write every result to this file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(
            "gpu_h2d: needs a CUDA GPU, and torch.cuda.is_available() is False here; "
            "run it on a machine with a GPU and a CUDA build of torch",
            file=sys.stderr,
        )
        return 2
    if args.child:
        print(json.dumps(run_child(json.loads(args.child))))
        return 0
    print(f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}", flush=True)
    results: list[dict[str, Any]] = []
    scenarios = args.scenarios.split(",")
    for scenario, threads in itertools.product(scenarios, args.threads.split(",")):
        for spec in combinations(scenario, args.epochs):
            outcome = spawn(spec, threads)
            results.append({**spec, "threads": threads, **outcome})
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    print_tables(results)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=1)
    return 0


def combinations(scenario: str, epochs: int) -> Iterator[dict[str, Any]]:
    base = {"scenario": scenario, "epochs": epochs}
    if scenario == "bandwidth":
        for pattern in ("raw", "cuda_pinned", "cuda_pageable"):
            yield {**base, "pattern": pattern, "pin_memory": False}
        for pattern, pin_memory in itertools.product(OVER_WORKERS, (False, True)):
            yield {**base, "pattern": pattern, "pin_memory": pin_memory}
        return
    if scenario == "memory":
        yield {**base, "pattern": "cuda", "pin_memory": False}
        return
    if scenario != "tiny":
        yield {**base, "pattern": "compute", "pin_memory": False}
    for pin_memory, pattern in itertools.product((False, True), LOADERS):
        yield {**base, "pattern": pattern, "pin_memory": pin_memory}


def print_tables(results: list[dict[str, Any]]) -> None:
    steps = [r for r in results if "step_ms" in r]
    if steps:
        print(
            "\n| scenario | threads | compute | DL+to | side-stream | cuda | DL+to pin | "
            "side-stream pin | cuda pin | cuda / best peer | cuda / compute |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (scenario, threads), rows in itertools.groupby(
        steps, key=lambda r: (r["scenario"], r["threads"])
    ):
        found = {(r["pattern"], r["pin_memory"]): r["step_ms"] for r in rows}
        compute = found.get(("compute", False))
        peers = [v for (p, _), v in found.items() if p in ("dl_to", "side_stream")]
        ours = [v for (p, _), v in found.items() if p == "cuda"]
        cells = [
            f"{found[key]:.3f}" if key in found else "-"
            for key in (
                ("compute", False),
                ("dl_to", False),
                ("side_stream", False),
                ("cuda", False),
                ("dl_to", True),
                ("side_stream", True),
                ("cuda", True),
            )
        ]
        vs_peer = f"{max(ours) / min(peers):.3f}" if ours and peers else "-"
        vs_compute = f"{max(ours) / compute:.3f}" if ours and compute else "-"
        print(f"| {scenario} | {threads} | " + " | ".join(cells) + f" | {vs_peer} | {vs_compute} |")
    for r in results:
        if "gbps" in r:
            pin = " pin_memory" if r["pin_memory"] else ""
            print(f"bandwidth {r['pattern'] + pin:25s} {r['threads']:8s} {r['gbps']:7.2f} GB/s")
        if "peak_batches" in r:
            peaks = ", ".join(f"{p:.2f}" for p in r["peak_batches"])
            print(
                f"pinned staging held ({r['threads']}), batches per epoch peak: {peaks}; "
                f"after each epoch: {r['held_after_epoch']} bytes; depth {r['depth']}"
            )
        if "error" in r:
            print(f"ERROR {r['scenario']} {r['pattern']} {r['threads']}: {r['error']}")


if __name__ == "__main__":
    sys.exit(main())
