"""The datasets of the worker and peer benchmarks, and the timing of a run's epochs.

``worker_method.py`` and ``peers.py`` build their workloads from these classes; each class
takes its size first, and whatever sets its cost per item as keyword arguments.
:func:`run_epochs` iterates a loader's epochs once, in the calling process, and returns what
both report: throughput, per-epoch times, the first batch of each epoch, the time from the
last batch to the end of each epoch, and the peak memory of the process and its workers.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import io
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from time import perf_counter
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from dataloaderx.bench.tune.memory import PeakMemory

MIB = 2**20
#: Seconds between memory samples (what a sample costs the run: ``PeakMemory``'s notes).
SAMPLE_SECONDS = 0.1

#: The workloads' names, as the benchmarks print them.
COPY_ON_READ = "copy-on-read"
TORCH_OPS = "torch ops"
JPEG = "JPEG decode"
PURE_PYTHON = "pure Python"
BIG_TENSORS = "1 MB tensors"
IO_LATENCY = "I/O latency"


class Sized(Dataset[torch.Tensor]):
    """A map-style dataset of ``size`` items; subclasses make them."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size


class CopyOnRead(Sized):
    """``size`` items, each read from one of ``records`` Python dicts held in a list."""

    def __init__(self, size: int, *, records: int = 2_000_000) -> None:
        super().__init__(size)
        self.items: list[dict[str, Any]] = [
            {"id": i, "label": i % 10, "name": f"item-{i}"} for i in range(records)
        ]

    def __getitem__(self, index: int) -> torch.Tensor:
        item = self.items[(index * 7919) % len(self.items)]
        return torch.tensor([item["id"], item["label"], len(item["name"])])


class TorchOps(Sized):
    """A 3 x ``image`` x ``image`` uint8 image from the index, cropped to ``crop``, flipped,
    to float, resized back to ``image`` (``interpolate``) and, with ``normalise``,
    normalised per channel."""

    def __init__(
        self, size: int, *, image: int = 224, crop: int = 160, normalise: bool = False
    ) -> None:
        super().__init__(size)
        self.image = image
        self.crop = crop
        self.normalise = normalise
        self.mean = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
        self.std = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)

    def __getitem__(self, index: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(index)
        side = self.image
        image = torch.randint(0, 256, (3, side, side), dtype=torch.uint8, generator=generator)
        room = side - self.crop
        top, left = (index * 37) % room, (index * 53) % room
        crop = image[:, top : top + self.crop, left : left + self.crop]
        if index % 2:
            crop = torch.flip(crop, dims=(2,))
        scaled = crop.float().div_(255.0).unsqueeze(0)
        resized = F.interpolate(scaled, size=(side, side), mode="bilinear", align_corners=False)
        result = resized.squeeze(0)
        if self.normalise:
            result = result.sub_(self.mean).div_(self.std)
        return result


def jpeg_available() -> bool:
    return importlib.util.find_spec("PIL") is not None


class JpegDecode(Sized):
    """Each item one of ``pool`` pre-encoded ``side`` x ``side`` JPEGs, decoded by Pillow
    and, with ``crop``, centre-cropped to ``crop`` x ``crop``."""

    def __init__(
        self, size: int, *, pool: int = 64, side: int = 256, crop: int | None = None
    ) -> None:
        import numpy as np
        from PIL import Image

        super().__init__(size)
        self.crop = crop
        rows, columns = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
        self.pool: list[bytes] = []
        for k in range(pool):
            noise = torch.randint(
                0, 48, (side, side, 3), generator=torch.Generator().manual_seed(k)
            )
            red = (columns * (k % 7 + 1) + rows) % 256
            green = (rows * (k % 5 + 1) + 9 * k) % 256
            blue = ((columns ^ rows) + 17 * k) % 256
            pixels = (torch.stack([red, green, blue], dim=-1) + noise).clamp(0, 255)
            image = Image.fromarray(np.ascontiguousarray(pixels.to(torch.uint8).numpy()))
            encoded = io.BytesIO()
            image.save(encoded, format="JPEG", quality=90)
            self.pool.append(encoded.getvalue())

    def __getitem__(self, index: int) -> torch.Tensor:
        import numpy as np
        from PIL import Image

        with Image.open(io.BytesIO(self.pool[index % len(self.pool)])) as image:
            if self.crop is not None:
                left = (image.width - self.crop) // 2
                top = (image.height - self.crop) // 2
                image = image.crop((left, top, left + self.crop, top + self.crop))
            pixels = np.array(image.convert("RGB"))
        return torch.from_numpy(pixels).permute(2, 0, 1)


def busy(seed: int, steps: int) -> int:
    """Pure-Python integer arithmetic, holding the GIL throughout."""
    value = seed
    for step in range(steps):
        value = (value * 1103515245 + step) & 0xFFFFFFFF
    return value


class PurePython(Sized):
    """``steps`` steps of pure-Python work per item (20,000: about 1 ms); a 2-element tensor."""

    def __init__(self, size: int, *, steps: int = 20_000) -> None:
        super().__init__(size)
        self.steps = steps

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([index, busy(index, self.steps)])


class BigTensors(Sized):
    """Each item a fresh tensor of ``floats`` float32 values (1 MiB by default)."""

    def __init__(self, size: int, *, floats: int = 2**20 // 4) -> None:
        super().__init__(size)
        self.floats = floats

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((self.floats,), float(index))


class IoLatency(Sized):
    """Each item waits ``seconds`` without holding the GIL (a read from remote storage),
    then returns a small tensor."""

    def __init__(self, size: int, *, seconds: float = 0.002) -> None:
        super().__init__(size)
        self.seconds = seconds

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(self.seconds)
        return torch.full((64,), float(index))


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _peak_bytes(sampler: PeakMemory | None) -> int:
    return 0 if sampler is None else sampler.peak_bytes or 0


def run_epochs(
    make_loader: Callable[[], Iterable[Any]], epochs: int, *, memory: bool = True
) -> dict[str, Any]:
    """Build a loader with ``make_loader`` and iterate it ``epochs`` times; what it took.

    ``seconds`` and ``batches_per_s`` count from before the loader is built to the end of
    the last epoch; ``startup_ms`` is the building; ``first_batch_ms`` is from ``iter()`` to
    each epoch's first batch; ``tail_ms`` from each epoch's last batch to the end of its
    ``for`` loop (a loader that waits for its workers there makes the training loop wait);
    ``peak_pss_mib`` is of this process and its child processes, sampled every
    :data:`SAMPLE_SECONDS` (with ``memory=False``, not measured: 0, for a benchmark that
    reports none, as each sample slows the run a little); ``cpu_ms`` is the CPU
    time per batch of this process and of the child processes that ended (workers), from
    the loader's construction to its deletion: a figure that other jobs on the machine move
    far less than the throughput.
    """
    gc.collect()
    first: list[float] = []
    tails: list[float] = []
    epoch_seconds: list[float] = []
    epoch_batches: list[int] = []
    sampler = PeakMemory(interval=SAMPLE_SECONDS) if memory else None
    with contextlib.nullcontext() if sampler is None else sampler:
        dataset_bytes = _peak_bytes(sampler)
        cpu_start = _cpu_seconds()
        start = perf_counter()
        loader = make_loader()
        built = perf_counter()
        for _ in range(epochs):
            epoch_start = last = perf_counter()
            count = 0
            for _batch in loader:
                last = perf_counter()
                if count == 0:
                    first.append(last - epoch_start)
                count += 1
            end = perf_counter()
            tails.append(end - last)
            epoch_seconds.append(end - epoch_start)
            epoch_batches.append(count)
        seconds = perf_counter() - start
        del loader  # persistent workers exit here
        gc.collect()
        cpu = _cpu_seconds() - cpu_start
        peak = _peak_bytes(sampler)
    return {
        "batches": sum(epoch_batches),
        "seconds": seconds,
        "startup_ms": 1000 * (built - start),
        "batches_per_s": sum(epoch_batches) / seconds,
        "epoch_s": epoch_seconds,
        "epoch_batches_per_s": [n / s for n, s in zip(epoch_batches, epoch_seconds, strict=True)],
        "first_batch_ms": [1000 * value for value in first],
        "tail_ms": [1000 * value for value in tails],
        "peak_pss_mib": peak / MIB,
        "cpu_ms": 1000 * cpu / max(1, sum(epoch_batches)),
        "dataset_pss_mib": dataset_bytes / MIB,
    }


def no_step(batch: Any) -> None:
    """The step of ``bench --tune`` in the benchmarks: none, so that loading sets the pace."""


def tune_recommendation(
    dataset: str, *, batch_size: int, batches: int, budget: float, num_workers: int | None = None
) -> dict[str, Any]:
    """The recommendation of ``dataloaderx bench --tune --json`` (no step) on the dataset
    that ``dataset`` (``module:factory``, a module of this folder) makes."""
    command = [sys.executable, "-m", "dataloaderx", "bench", "--tune", "--json"]
    command += ["--dataset", dataset, "--step", "workloads:no_step", "--budget", str(budget)]
    command += ["--batch-size", str(batch_size), "--batches", str(batches)]
    if num_workers is not None:
        command += ["--num-workers", str(num_workers)]
    here = os.path.dirname(os.path.abspath(__file__))
    output = subprocess.run(command, capture_output=True, text=True, cwd=here, check=False)
    if output.returncode != 0:
        raise SystemExit(f"bench --tune on {dataset} failed:\n{output.stderr}")
    return dict(json.loads(output.stdout)["recommendation"])
