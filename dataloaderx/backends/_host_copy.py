"""Host-to-host tensor copies split across a few threads of our own.

``Tensor.copy_`` between two CPU tensors uses the calling thread's intra-op thread
count, which depends on process state the loader does not control: PyTorch's own
pin-memory thread calls ``torch.set_num_threads(1)``, and ``torchrun`` sets
``OMP_NUM_THREADS=1``. :class:`CopyThreads` splits a copy into byte ranges and runs them
on ``threads`` threads (the caller's thread is one of them), each range as one
single-threaded copy that releases the GIL, so the ranges copy in parallel whatever
those settings are.

The helper threads start on the first copy large enough to split, wait for work in
short, interruptible steps, and end on :meth:`CopyThreads.close` (safe to call twice).
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Sequence
from typing import Final

import numpy
import torch

from dataloaderx.backends._engine import POLL_SECONDS

__all__ = ["MIN_SPLIT_BYTES", "CopyThreads", "Segment"]

#: A copy is split only into ranges of at least this many bytes; smaller copies run in
#: the caller's thread, where handing them to another thread would cost more than it saves.
MIN_SPLIT_BYTES: Final = 1 << 20

#: Integer dtypes by element size, to copy any dtype as raw elements.
_SAME_SIZE_INT: Final = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

#: ``(destination, source)``: two tensors of the same shape and dtype.
Segment = tuple[torch.Tensor, torch.Tensor]

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
    return [
        (destination[start:end], source[start:end])
        for start, end in itertools.pairwise(bounds)
        if end > start
    ]


def plan(segments: Sequence[Segment], threads: int) -> list[list[Segment]]:
    """Deal ``segments`` into at most ``threads`` groups of roughly equal bytes.

    Segments larger than a group's share are split; nothing is split below
    :data:`MIN_SPLIT_BYTES`.
    """
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
    """Copy on this thread alone.

    ``Tensor.copy_`` would split a large copy over the intra-op thread pool, and every
    copy thread calling it at once would start a pool of its own; numpy's copy is one
    single-threaded pass that releases the GIL. Elements are copied as same-size
    integers, so every dtype (``bfloat16`` included) is moved bit for bit.
    """
    as_int = _SAME_SIZE_INT.get(source.element_size())
    if as_int is None or source.is_conj() or source.is_neg() or source.requires_grad:
        destination.copy_(source)
        return
    numpy.copyto(destination.view(as_int).numpy(), source.view(as_int).numpy())


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
    """Runs host-to-host copies on up to ``threads`` threads; see the module docstring."""

    def __init__(self, threads: int, *, name: str) -> None:
        self.threads = threads
        self._name = name
        self._work: queue.SimpleQueue[tuple[_Job, list[Segment]]] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._helpers: list[threading.Thread] = []
        self._number = next(_pool_numbers)
        self._closed = False

    def copy(self, segments: Sequence[Segment]) -> None:
        """Copy every ``(destination, source)`` pair; return once all are done.

        Raises the first error of any range, after every range has finished.
        """
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
            thread = threading.Thread(
                target=self._serve,
                name=f"{self._name}-copy-{self._number}.{len(self._helpers) + 1}",
                daemon=True,
            )
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
