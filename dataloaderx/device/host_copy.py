"""Host-to-host copies into pinned staging memory: in a producer thread, split over a few
threads of our own, each range a single-threaded copy that releases the GIL whatever the
intra-op settings; in the loop's thread, with that thread's own intra-op pool (``docs/cuda.md``,
*Pinning*)."""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Sequence
from typing import Final

import numpy
import torch

from dataloaderx.engine.stream import POLL_SECONDS

MIN_SPLIT_BYTES: Final = 1 << 20  #: smallest range worth a hand-off when splitting a copy
#: Integer dtypes by element size, to copy any dtype as raw elements.
_SAME_SIZE_INT: Final = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
Segment = tuple[torch.Tensor, torch.Tensor]  #: ``(destination, source)``, same shape and dtype
_pool_numbers = itertools.count(1)


def _nbytes(segment: Segment) -> int:
    return segment[1].numel() * segment[1].element_size()


def _split(segment: Segment, pieces: int) -> list[Segment]:
    """Cut one segment into at most ``pieces`` parts along its flat or first dimension."""
    destination, source = segment
    if pieces <= 1 or source.dim() == 0:
        return [segment]
    if destination.is_contiguous() and source.is_contiguous():
        destination, source = destination.reshape(-1), source.reshape(-1)
    length = source.shape[0]
    pieces = min(pieces, length)
    bounds = [length * k // pieces for k in range(pieces + 1)]
    return [(destination[a:b], source[a:b]) for a, b in itertools.pairwise(bounds) if b > a]


def plan(segments: Sequence[Segment], threads: int) -> list[list[Segment]]:
    """Deal ``segments`` into at most ``threads`` groups of roughly equal bytes, splitting
    those larger than a group's share, but never below :data:`MIN_SPLIT_BYTES`."""
    total = sum(_nbytes(segment) for segment in segments)
    groups = max(1, min(threads, total // MIN_SPLIT_BYTES))
    if groups == 1:
        return [list(segments)]
    share = -(-total // groups)
    parts: list[Segment] = []
    for segment in segments:
        parts.extend(_split(segment, -(-_nbytes(segment) // share)))
    dealt: list[list[Segment]] = [[] for _ in range(groups)]
    loads = [0] * groups
    for part in sorted(parts, key=_nbytes, reverse=True):
        lightest = loads.index(min(loads))
        dealt[lightest].append(part)
        loads[lightest] += _nbytes(part)
    return [group for group in dealt if group]


def _copy(destination: torch.Tensor, source: torch.Tensor) -> None:
    """Copy on this thread alone: ``Tensor.copy_`` splits a large copy over an intra-op pool
    (one per copy thread); numpy's copy is a single-threaded pass that releases the GIL.
    Copied as same-size integers, every dtype (``bfloat16`` too) moves bit for bit."""
    as_int = _SAME_SIZE_INT.get(source.element_size())
    if as_int is None or source.is_conj() or source.is_neg() or source.requires_grad:
        destination.copy_(source)
        return
    numpy.copyto(destination.view(as_int).numpy(), source.view(as_int).numpy())


def copy_with_own_pool(segments: Sequence[Segment]) -> None:
    """Copy in the calling thread with ``Tensor.copy_``, over that thread's own intra-op pool:
    for the loop's thread, which has one. Any other thread would start a pool of its own
    (``docs/design.md``, *Inline batches on a device*)."""
    for destination, source in segments:
        destination.copy_(source)


def _run(group: Sequence[Segment]) -> None:
    for destination, source in group:
        _copy(destination, source)


class _Job:
    """One split copy: counts the groups still running and keeps the first error."""

    def __init__(self, pending: int) -> None:
        self.pending = pending
        self.error: BaseException | None = None
        self.lock = threading.Lock()
        self.done = threading.Event()

    def finish(self, error: BaseException | None) -> None:
        with self.lock:
            if error is not None and self.error is None:
                self.error = error
            self.pending -= 1
            if self.pending == 0:
                self.done.set()


class CopyThreads:
    """Copies on up to ``threads`` threads (the caller's too); helpers poll until :meth:`close`."""

    def __init__(self, threads: int, *, name: str) -> None:
        self.threads = threads
        self._name = name
        self._work: queue.SimpleQueue[tuple[_Job, list[Segment]]] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._helpers: list[threading.Thread] = []
        self._number = next(_pool_numbers)
        self._closed = False

    def copy(self, segments: Sequence[Segment]) -> None:
        """Copy every ``(destination, source)`` pair; raise the first error once all ranges end."""
        groups = plan(segments, self.threads)
        if len(groups) == 1:
            _run(groups[0])
            return
        self._start(len(groups) - 1)
        job = _Job(len(groups) - 1)
        for group in groups[1:]:
            self._work.put((job, group))
        try:
            _run(groups[0])
        finally:
            self._wait(job)
        if job.error is not None:
            raise job.error

    def _start(self, needed: int) -> None:
        if self._closed:
            raise RuntimeError("dataloaderx: copy threads used after close()")
        while len(self._helpers) < needed:
            name = f"{self._name}-copy-{self._number}.{len(self._helpers) + 1}"
            thread = threading.Thread(target=self._serve, name=name, daemon=True)
            thread.start()
            self._helpers.append(thread)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                job, group = self._work.get(timeout=POLL_SECONDS)
            except queue.Empty:
                continue
            try:
                _run(group)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                job.finish(exc)
            else:
                job.finish(None)

    def _wait(self, job: _Job) -> None:
        while not job.done.wait(POLL_SECONDS):
            if self._stop.is_set() and not any(t.is_alive() for t in self._helpers):
                raise RuntimeError("dataloaderx: copy threads closed while a copy was running")

    def close(self) -> None:
        """Stop the helper threads and wait briefly for them; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        for thread in self._helpers:
            if thread is not threading.current_thread():
                thread.join(POLL_SECONDS * 4)
