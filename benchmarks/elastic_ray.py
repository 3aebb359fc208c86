"""Elastic Ray workers (``num_workers="auto"``, ``worker_method="ray"``) on a training step
that changes pace, against fixed counts, an oracle and Ray Data's autoscaling actor pool.

What is measured. A map-style dataset whose items wait 20 ms each (remote storage: the
GIL is released) and are a 16-element tensor, batch size 8, so that one actor makes a
batch in 160 ms. One epoch of three phases of ``--phase-batches`` batches each (default
1,200: the 5 ms phase lasts about 12 s at 16 actors): a training step (``time.sleep``) of
30 ms, then 5 ms, then 30 ms again. The 30 ms phases need about 6 actors to keep the loop
fed; the 5 ms phase would need about 32, more than the 16 allowed, so there the actors set
the pace. Every configuration runs in a fresh
process that starts its own Ray first (``ray.init(address="local", num_cpus=2)``: a user's
Ray, which the loader then uses as it is), with actors of 1/8 CPU (16 fit on 2 CPUs; the
loader's actors get 600 s to start, ``placement_timeout_s``, where 60 s is the default:
16 actors starting on two shared cores can take more than a minute):

- ``auto``: ``num_workers="auto"`` with ``min_workers=1``, ``max_workers=16``; its
  worker-seconds are the integral of ``loader.stats.workers`` (the count from each entry's
  time on) over the timed span, and its actor-seconds the integral of its ALIVE actors,
  sampled as Ray Data's are (below): actors starting and leaving count there too;
- ``fixed 16`` and ``fixed 2``: fixed counts; worker-seconds are count x time;
- ``oracle``: each distinct phase (30 ms, 5 ms) run alone, ``--phase-batches`` batches,
  with each count of ``--sweep`` (default 2, 4, 8, 12, 16); per phase the oracle takes the
  fastest count, or the fewest workers within ``--tie`` (default 2%) of the fastest's time
  (the same pace for fewer worker-seconds; ``--tie 0`` takes the fastest alone). Its total
  time is the sum of its three phases (the 30 ms phase counted twice), its worker-seconds
  the sum of count x phase time;
- ``Ray Data``: ``ray.data.range(N, override_num_blocks=N / 64).map_batches(<callable
  class that sleeps 20 ms for each row>, batch_size=8, compute=ActorPoolStrategy(min_size=1,
  max_size=16), num_cpus=1/8)`` read with ``iter_torch_batches(batch_size=8)`` by the same
  loop. Blocks of ``--ray-data-block-rows`` rows (default 64, 8 batches: a 1.28 s task);
  Ray Data's own choice for rows this small is a handful of blocks (4 for 3,600 rows: one
  18 s task each, and at most 2 actors), and blocks of one batch kept its pool at 1-3
  actors; 0 leaves the choice to Ray Data. Its actor-seconds are the integral of the count
  of its ALIVE map actors, sampled every 0.25 s in a background thread from Ray's actor
  table (``ray._private.state.actors()``: the dashboard is off).

Every run is timed from its first batch to the end of its last step, so that actor
start-up is left out alike for all; the time to the first batch (from before the loader
or the dataset is built) is reported apart, and so is the sum of the two (end to end):
Ray Data makes batches ahead of the loop from its start, so its timed span alone flatters
it. Worker-seconds cover the timed span; actor-seconds are given for it and end to end
(Ray Data's actors start before its first batch).

Adaptation: for ``auto``, for each phase, the seconds from the phase's start until a
sliding 2 s window of its batches, lying within the phase, reaches 90% of the oracle's
fastest batch rate for that phase (the window's end; 2 s at the least). With
``--skip-oracle`` the reference is the fastest fixed count's rate in that phase of the full
run. The counts ``auto`` ran in each phase come from its history.

Targets: ``auto`` <= 1.1x the oracle's total time and <= 1.3x its worker-seconds, and
reaches 90% of the oracle's rate within 10 s of each phase's start. Against Ray Data the
question is whether ``auto`` is ahead on total time and on actor-seconds (no target).

With ``--rounds`` above 1 the configurations alternate (each round starts one place
further along) and the figures are medians. Each child shuts its Ray down and the parent
checks that none of the child's processes is left.

How to run (from the repository root)::

    python benchmarks/elastic_ray.py                    # one round: ~15-20 min on 2 cores
    python benchmarks/elastic_ray.py --phase-batches 150 --sweep 2 8 --skip-oracle
    python benchmarks/elastic_ray.py --rounds 3 --json > elastic_ray.json
    python benchmarks/elastic_ray.py --from-json elastic_ray.json     # its tables again
"""

from __future__ import annotations

import argparse
import bisect
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from time import perf_counter
from typing import Any

import _common as bench
import numpy as np
import psutil
import torch
from torch.utils.data import Dataset

ITEM_SECONDS = 0.020
ITEM_WIDTH = 16
BATCH_SIZE = 8
#: The training step of each phase, in seconds.
STEPS = (0.030, 0.005, 0.030)
PHASE_BATCHES = 1200
SWEEP = (2, 4, 8, 12, 16)
FIXED = (16, 2)
MIN_WORKERS, MAX_WORKERS = 1, 16
ACTOR_CPUS = 0.125
RAY_CPUS = 2
SAMPLE_SECONDS = 0.25
WINDOW_SECONDS = 2.0
REACHED = 0.9
TIE = 0.02
TARGET_TIME, TARGET_WORKER_SECONDS, TARGET_ADAPTATION = 1.1, 1.3, 10.0
CHILD_TIMEOUT = 1800.0
#: How long an actor may take to start (``placement_timeout_s``, 60 s by default): 16
#: actors starting on two shared cores can take more than a minute.
START_SECONDS = 600.0
AUTO, ORACLE, RAY_DATA = "auto", "oracle", "Ray Data"
#: ``auto`` with a read-ahead: the prefetch buffer bounded by bytes alone (its depth,
#: :data:`AHEAD_DEPTH` batches, never binds), made while the loop trains; its actors end as
#: soon as the epoch's last batch is made (``idle_timeout_s=0``: the loop trains on what
#: the buffer holds for longer than an actor takes to start).
AHEAD = "auto, read-ahead"
READ_AHEAD = "64MiB"
AHEAD_DEPTH = 1_000_000
AUTOS = (AUTO, AHEAD)
#: The child's ``WORKERS`` argument for Ray Data, ``raydata:ROWS_PER_BLOCK``.
RAY_DATA_CHILD = "raydata"
#: Rows per block of Ray Data's ``range`` (8 batches: a 1.28 s task for an actor).
BLOCK_ROWS = 64


class RemoteItems(Dataset[torch.Tensor]):
    """``size`` items, each a 20 ms wait (the GIL released) and a 16-element tensor."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(ITEM_SECONDS)
        return torch.full((ITEM_WIDTH,), index)


class SlowRows:
    """Ray Data's map: a 20 ms wait per row, as each item of :class:`RemoteItems` waits
    (one wait of the batch's 160 ms would spare it the seven wake-ups more that the loader's
    worker pays: about 0.2 ms each on an idle machine here), and the rows' 16-element
    vectors."""

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ids = batch["id"]
        for _ in ids:
            time.sleep(ITEM_SECONDS)
        return {"x": np.repeat(ids[:, None], ITEM_WIDTH, axis=1)}


# --- the child: one configuration, one epoch ------------------------------------------------


def train(batches: Iterable[Any], steps: Sequence[float], phase_batches: int) -> list[float]:
    """Run the loop: ``perf_counter()`` when the first batch came, then after each step."""
    marks: list[float] = []
    for _batch in batches:
        if not marks:
            marks.append(perf_counter())
        time.sleep(steps[min((len(marks) - 1) // phase_batches, len(steps) - 1)])
        marks.append(perf_counter())
    return marks


class ActorSampler:
    """Counts the ALIVE actors whose class name holds ``name``, every 0.25 s, in a thread."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="actor-sampler", daemon=True)

    def _run(self) -> None:
        from ray._private import state

        while not self._stop.is_set():
            table = state.actors()
            alive = sum(
                1
                for actor in table.values()
                if self.name in str(actor.get("ActorClassName")) and actor.get("State") == "ALIVE"
            )
            self.samples.append((perf_counter(), alive))
            self._stop.wait(SAMPLE_SECONDS)

    def __enter__(self) -> ActorSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def run_loader(workers: str, steps: Sequence[float], phase_batches: int) -> dict[str, Any]:
    """``workers``: a count, ``auto``, or ``auto+SIZE`` (a read-ahead of ``SIZE`` bytes)."""
    from dataloaderx import DataLoaderX

    options: dict[str, Any] = {"num_cpus": ACTOR_CPUS, "placement_timeout_s": START_SECONDS}
    workers, _, ahead = workers.partition("+")
    count: Any = int(workers) if workers != AUTO else AUTO
    if count == AUTO:
        options.update(min_workers=MIN_WORKERS, max_workers=MAX_WORKERS)
    buffer = {"depth": AHEAD_DEPTH, "max_bytes": ahead, "adaptive": False} if ahead else {}
    if ahead:
        options["idle_timeout_s"] = 0
    with ActorSampler("RayWorker") as sampler:
        begin = perf_counter()
        loader = DataLoaderX(
            RemoteItems(len(steps) * phase_batches * BATCH_SIZE),
            batch_size=BATCH_SIZE,
            num_workers=count,
            worker_method="ray",
            worker_options=options,
            backend_options=buffer,
        )
        marks = train(loader, steps, phase_batches)
    stats = loader.stats
    history = [] if stats is None else [list(entry) for entry in stats.workers]
    del loader
    samples = [list(sample) for sample in sampler.samples]
    return {"begin": begin, "marks": marks, "history": history, "samples": samples}


def run_ray_data(steps: Sequence[float], phase_batches: int, block_rows: int) -> dict[str, Any]:
    import ray.data

    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    rows = len(steps) * phase_batches * BATCH_SIZE
    blocks = {"override_num_blocks": -(-rows // block_rows)} if block_rows else {}
    with ActorSampler(SlowRows.__name__) as sampler:
        begin = perf_counter()
        dataset = ray.data.range(rows, **blocks).map_batches(
            SlowRows,
            batch_size=BATCH_SIZE,
            compute=ray.data.ActorPoolStrategy(min_size=MIN_WORKERS, max_size=MAX_WORKERS),
            num_cpus=ACTOR_CPUS,
        )
        marks = train(dataset.iter_torch_batches(batch_size=BATCH_SIZE), steps, phase_batches)
    return {"begin": begin, "marks": marks, "samples": [list(s) for s in sampler.samples]}


def child(workers: str, steps: Sequence[float], phase_batches: int) -> None:
    """One run in this process, on a Ray it starts; prints its figures as JSON."""
    import ray

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    ray.init(
        address="local",
        num_cpus=RAY_CPUS,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.ERROR,
    )
    try:
        if workers.startswith(RAY_DATA_CHILD):
            block_rows = int(workers.partition(":")[2] or 0)
            result = run_ray_data(steps, phase_batches, block_rows)
        else:
            result = run_loader(workers, steps, phase_batches)
        # Ray's processes, for the parent to check that none outlives this one.
        ours = psutil.Process().children(recursive=True)
        result["processes"] = [[p.pid, p.create_time()] for p in ours]
    finally:
        ray.shutdown()
    begin, marks = result.pop("begin"), result.pop("marks")
    first = marks[0]
    expected = len(steps) * phase_batches
    if len(marks) - 1 != expected:
        raise SystemExit(f"{len(marks) - 1} batches, expected {expected}")
    result["first_batch_s"] = first - begin
    result["marks"] = [round(mark - first, 5) for mark in marks[1:]]
    if "history" in result:
        result["history"] = [[at - first, n, why] for at, n, why in result["history"]]
    if "samples" in result:
        result["samples"] = [[at - first, n] for at, n in result["samples"]]
    print(json.dumps(result), flush=True)


# --- the parent -----------------------------------------------------------------------------


def left_behind(processes: list[list[float]]) -> int:
    """How many of a child's Ray processes still run, 10 s after it ended at the latest."""
    deadline = time.monotonic() + 10.0
    while True:
        alive = 0
        for pid, created in processes:
            try:
                process = psutil.Process(int(pid))
                if abs(process.create_time() - created) < 0.01 and process.is_running():
                    alive += process.status() != psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                pass
        if alive == 0 or time.monotonic() > deadline:
            return alive
        time.sleep(0.5)


def run(workers: str, steps: Sequence[float], phase_batches: int) -> dict[str, Any]:
    """One configuration in a fresh process: its figures, or ``{"error": ...}``."""
    command = [
        sys.executable,
        __file__,
        "--child",
        workers,
        ",".join(map(str, steps)),
        str(phase_batches),
    ]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    ) as process:
        try:
            out, err = process.communicate(timeout=CHILD_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                out, err = process.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                out, err = process.communicate()
            return {"error": f"timed out after {CHILD_TIMEOUT:.0f} s"}
    lines = out.strip().splitlines()
    if process.returncode != 0 or not lines:
        tail = [line for line in err.strip().splitlines() if line.strip()][-12:]
        return {"error": f"exit status {process.returncode}: " + "\n".join(tail)}
    result = dict(json.loads(lines[-1]))
    result["left_behind"] = left_behind(result.pop("processes"))
    return result


def phase_bounds(
    marks: Sequence[float], phase_batches: int, phases: int
) -> list[tuple[float, float]]:
    """Each phase's span: from the end of the previous phase's last step (the first batch,
    for the first phase) to the end of its own last step."""
    ends = [marks[(k + 1) * phase_batches - 1] for k in range(phases)]
    return list(zip([0.0, *ends[:-1]], ends, strict=True))


def integral(counts: Sequence[Sequence[Any]], start: float, end: float) -> float:
    """Count-seconds over ``[start, end]`` of a step function: each ``(time, count, ...)``
    holds from its time on; before the first entry its count holds."""
    total = 0.0
    for index, entry in enumerate(counts):
        since = start if index == 0 else max(start, float(entry[0]))
        until = end if index + 1 == len(counts) else min(end, float(counts[index + 1][0]))
        if until > since:
            total += int(entry[1]) * (until - since)
    return total


def counts_in(history: Sequence[Sequence[Any]], start: float, end: float) -> list[int]:
    """The counts in effect during ``[start, end]``, in order, repeats merged."""
    before = [int(entry[1]) for entry in history if float(entry[0]) <= start]
    seen = (before[-1:] or [int(history[0][1])]) + [
        int(entry[1]) for entry in history if start < float(entry[0]) < end
    ]
    return [n for index, n in enumerate(seen) if index == 0 or n != seen[index - 1]]


def reached_after(marks: Sequence[float], start: float, end: float, rate: float) -> float | None:
    """Seconds from ``start`` to the end of the first window of ``WINDOW_SECONDS`` within
    ``[start, end]`` whose batch rate reaches ``REACHED`` of ``rate``; ``None``: never."""
    wanted = REACHED * rate * WINDOW_SECONDS
    first = bisect.bisect_left(marks, start + WINDOW_SECONDS)
    for index in range(first, len(marks)):
        at = marks[index]
        if at > end + 1e-9:
            break
        inside = index + 1 - bisect.bisect_right(marks, at - WINDOW_SECONDS)
        if inside >= wanted:
            return at - start
    return None


def summarise(
    result: dict[str, Any], phase_batches: int, phases: int, workers: int | None
) -> dict[str, Any]:
    """Total time, worker-seconds and each phase's span and rate of one full run."""
    marks = result["marks"]
    total = marks[-1]
    bounds = phase_bounds(marks, phase_batches, phases)
    if workers is not None:
        worker_seconds = workers * total
    else:
        worker_seconds = integral(result.get("history") or result["samples"], 0.0, total)
    samples = result.get("samples")
    summary: dict[str, Any] = {
        "total_s": total,
        "first_batch_s": result["first_batch_s"],
        "worker_s": worker_seconds,
        # Actors alive (starting and leaving ones too), sampled: the measure Ray Data gets;
        # end to end, from before the loader or the dataset is built.
        "actor_s": integral(samples, 0.0, total) if samples else None,
        "actor_s_end_to_end": (
            integral(samples, -result["first_batch_s"], total) if samples else None
        ),
        "phase_rates": [phase_batches / (end - start) for start, end in bounds],
        "left_behind": result["left_behind"],
    }
    if result.get("history"):
        summary["counts"] = [counts_in(result["history"], a, b) for a, b in bounds]
        summary["changes"] = len(result["history"]) - 1
        summary["history"] = [[round(at, 3), n, why] for at, n, why in result["history"]]
    if samples:
        summary["actors"] = [
            [
                integral(samples, a, b) / (b - a),
                min((n for at, n in samples if a <= at <= b), default=0),
                max((n for at, n in samples if a <= at <= b), default=0),
            ]
            for a, b in bounds
        ]
    return summary


def median_of(values: Sequence[float | None]) -> float | None:
    """The median, an unreached value (``None``) counted as the longest; ``None`` if the
    median is unreached."""
    known = sorted(float("inf") if value is None else value for value in values)
    middle = statistics.median(known)
    return None if middle == float("inf") else middle


def oracle(
    phase_times: dict[float, dict[int, float]], steps: Sequence[float], tie: float
) -> dict[str, Any]:
    """The oracle's count and time per distinct step, and its totals over ``steps``."""
    chosen: dict[float, tuple[int, float]] = {}
    fastest: dict[float, float] = {}
    for step, times in phase_times.items():
        best = min(times.values())
        fastest[step] = best
        count = min(n for n, seconds in times.items() if seconds <= best * (1 + tie))
        chosen[step] = (count, times[count])
    return {
        "chosen": {str(step): list(pick) for step, pick in chosen.items()},
        "fastest_s": {str(step): seconds for step, seconds in fastest.items()},
        "total_s": sum(chosen[step][1] for step in steps),
        "worker_s": sum(chosen[step][0] * chosen[step][1] for step in steps),
        "counts": [chosen[step][0] for step in steps],
        "phase_times": [chosen[step][1] for step in steps],
    }


def configurations(options: argparse.Namespace) -> dict[str, tuple[str, tuple[float, ...]]]:
    """Every run of a round: name -> (the child's workers argument, the steps)."""
    full = tuple(STEPS)
    runs: dict[str, tuple[str, tuple[float, ...]]] = {AUTO: (AUTO, full)}
    if options.read_ahead:
        runs[AHEAD] = (f"{AUTO}+{options.read_ahead}", full)
    runs.update({f"fixed {n}": (str(n), full) for n in FIXED})
    if not options.skip_ray_data:
        runs[RAY_DATA] = (f"{RAY_DATA_CHILD}:{options.ray_data_block_rows}", full)
    if not options.skip_oracle:
        for step in dict.fromkeys(STEPS):
            runs.update({phase_name(step, n): (str(n), (step,)) for n in options.sweep})
    return runs


def phase_name(step: float, workers: int) -> str:
    return f"phase {step * 1000:g} ms, {workers}"


def measure(options: argparse.Namespace) -> dict[str, Any]:
    runs = configurations(options)
    phases = len(STEPS)
    raw: dict[str, list[dict[str, Any]]] = {name: [] for name in runs}
    for round_number in range(options.rounds):
        for name in bench.rotated(list(runs), round_number):
            workers, steps = runs[name]
            print(f"round {round_number + 1}: {name} ...", file=sys.stderr, flush=True)
            raw[name].append(run(workers, steps, options.phase_batches))
    errors = {
        name: result["error"]
        for name, results in raw.items()
        for result in results
        if "error" in result
    }
    left = sum(result.get("left_behind", 0) for results in raw.values() for result in results)
    full: dict[str, list[dict[str, Any]]] = {}
    for name in [*AUTOS, *(f"fixed {n}" for n in FIXED), RAY_DATA]:
        good = [result for result in raw.get(name, []) if "error" not in result]
        if good:
            count = int(name.split()[1]) if name.startswith("fixed") else None
            full[name] = [summarise(r, options.phase_batches, phases, count) for r in good]
    found: dict[str, Any] = {
        "options": {
            "phase_batches": options.phase_batches,
            "steps_s": list(STEPS),
            "sweep": options.sweep,
            "rounds": options.rounds,
            "tie": options.tie,
            "ray_data_block_rows": options.ray_data_block_rows,
            "read_ahead": options.read_ahead,
        },
        "errors": errors,
        "left_behind": left,
        "configurations": {},
    }
    for name, summaries in full.items():
        found["configurations"][name] = {
            "total_s": statistics.median(s["total_s"] for s in summaries),
            "first_batch_s": statistics.median(s["first_batch_s"] for s in summaries),
            "worker_s": statistics.median(s["worker_s"] for s in summaries),
            "actor_s": median_of([s["actor_s"] for s in summaries]),
            "actor_s_end_to_end": median_of([s["actor_s_end_to_end"] for s in summaries]),
            "phase_rates": [
                statistics.median(s["phase_rates"][k] for s in summaries) for k in range(phases)
            ],
            "rounds": summaries,
        }
    reference: list[float] | None = None
    if not options.skip_oracle:
        phase_times: dict[float, dict[int, float]] = {}
        for step in dict.fromkeys(STEPS):
            for n in options.sweep:
                good = [r for r in raw[phase_name(step, n)] if "error" not in r]
                if good:
                    times = [r["marks"][-1] for r in good]
                    phase_times.setdefault(step, {})[n] = statistics.median(times)
        if len(phase_times) == len(dict.fromkeys(STEPS)):
            found["oracle"] = oracle(phase_times, STEPS, options.tie)
            found["oracle"]["missing"] = [
                phase_name(step, n)
                for step in dict.fromkeys(STEPS)
                for n in options.sweep
                if n not in phase_times[step]
            ]
            found["oracle"]["sweep_s"] = {
                str(step): {str(n): t for n, t in times.items()}
                for step, times in phase_times.items()
            }
            reference = [options.phase_batches / min(phase_times[step].values()) for step in STEPS]
            found["reference"] = "oracle"
    if reference is None:
        fixed = [found["configurations"][n] for n in found["configurations"] if "fixed" in n]
        if fixed:
            reference = [max(f["phase_rates"][k] for f in fixed) for k in range(phases)]
            found["reference"] = "fastest fixed count"
    if reference is not None:
        found["reference_rates"] = reference
    for name in (name for name in AUTOS if name in full):
        if reference is None:
            break
        per_round = []
        for result in (r for r in raw[name] if "error" not in r):
            bounds = phase_bounds(result["marks"], options.phase_batches, phases)
            per_round.append(
                [
                    reached_after(result["marks"], start, end, reference[k])
                    for k, (start, end) in enumerate(bounds)
                ]
            )
        found.setdefault("adaptation", {})[name] = {
            "seconds": [median_of([r[k] for r in per_round]) for k in range(phases)],
            "rounds": per_round,
        }
    return found


def ratio_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f}"


def adaptation(found: dict[str, Any]) -> dict[str, list[float | None]]:
    """Seconds to reach the reference rate, per phase, of each ``auto`` configuration (a
    report saved with one ``auto`` alone has them as ``adaptation_s``)."""
    if "adaptation_s" in found:
        return {AUTO: found["adaptation_s"]}
    return {name: entry["seconds"] for name, entry in found.get("adaptation", {}).items()}


def report(found: dict[str, Any]) -> None:
    configs = found["configurations"]
    autos = [name for name in AUTOS if name in configs]
    auto = configs.get(AUTO)
    own = found.get("oracle")
    reached = adaptation(found)
    rows: list[list[str]] = []

    def row(
        name: str, total: float, first: float | None, workers: float, compared: bool = True
    ) -> None:
        compared = compared and bool(auto)
        rows.append(
            [
                name,
                f"{total:.1f}",
                "-" if first is None else f"{first:.1f}",
                "-" if first is None else f"{first + total:.1f}",
                f"{workers:.0f}",
                ratio_text(auto["total_s"] / total) if compared else "-",
                ratio_text(auto["worker_s"] / workers) if compared else "-",
            ]
        )

    for name in autos:
        figures = configs[name]
        row(name, figures["total_s"], figures["first_batch_s"], figures["worker_s"])
        if figures.get("actor_s") is not None:
            label = f"{name} (actors alive: actor-s)"
            row(label, figures["total_s"], None, figures["actor_s"], compared=False)
    if own:
        picks = ", ".join(
            f"{float(step) * 1000:g} ms: {count}" for step, (count, _) in own["chosen"].items()
        )
        row(f"{ORACLE} ({picks})", own["total_s"], None, own["worker_s"])
    for n in FIXED:
        if f"fixed {n}" in configs:
            found_n = configs[f"fixed {n}"]
            row(f"fixed {n}", found_n["total_s"], found_n["first_batch_s"], found_n["worker_s"])
    if RAY_DATA in configs:
        data = configs[RAY_DATA]
        row(f"{RAY_DATA} (actor-s)", data["total_s"], data["first_batch_s"], data["worker_s"])
    ahead = found["options"].get("read_ahead")
    print(
        f"\n## One epoch, 3 x {found['options']['phase_batches']} batches, steps "
        f"{' / '.join(f'{s * 1000:g}' for s in STEPS)} ms (median of "
        f"{found['options']['rounds']}{f'; read-ahead {ahead}' if ahead else ''})\n"
    )
    header = [
        "configuration",
        "total s (from first batch)",
        "first batch s",
        "end to end s",
        "worker-s",
        "auto / this, time",
        "auto / this, worker-s",
    ]
    print(bench.markdown_table(header, rows))

    phase_rows = []
    reference = found.get("reference_rates")
    for k, step in enumerate(STEPS):
        cells = [str(k + 1), f"{step * 1000:g}"]
        if own:
            rate = found["options"]["phase_batches"] / own["phase_times"][k]
            cells.append(f"{own['counts'][k]}: {rate:.1f}")
        else:
            cells.append("-")
        cells.append("-" if reference is None else f"{reference[k]:.1f}")
        for name in autos:
            figures = configs[name]
            cells += [
                f"{figures['phase_rates'][k]:.1f}",
                "; ".join(
                    "→".join(map(str, r["counts"][k])) for r in figures["rounds"] if "counts" in r
                )
                or "-",
                seconds(reached[name][k]) if name in reached else "-",
            ]
        for n in FIXED:
            fixed = configs.get(f"fixed {n}")
            cells.append("-" if fixed is None else f"{fixed['phase_rates'][k]:.1f}")
        data = configs.get(RAY_DATA)
        if data is None:
            cells += ["-", "-"]
        else:
            actors = [r["actors"][k] for r in data["rounds"] if "actors" in r]
            cells.append(f"{data['phase_rates'][k]:.1f}")
            cells.append(
                "; ".join(f"{mean:.1f} ({low}-{high})" for mean, low, high in actors) or "-"
            )
        phase_rows.append(cells)
    print(f"\n## Per phase, batches/s (reference: {found.get('reference', 'none')})\n")
    print(
        bench.markdown_table(
            [
                "phase",
                "step ms",
                "oracle: count, batches/s",
                "reference batches/s",
                *(
                    column
                    for name in autos
                    for column in (name, f"{name}: counts (per round)", f"{name}: 90% after s")
                ),
                *(f"fixed {n}" for n in FIXED),
                RAY_DATA,
                "Ray Data actors: mean (min-max)",
            ],
            phase_rows,
        )
    )

    print()
    for name, error in found["errors"].items():
        print(f"FAILED {name}: {error}")
    print(f"Ray processes left behind by the children: {found['left_behind']}")
    if not autos:
        print("verdict: no figures for auto")
        return
    if own and own.get("missing"):
        print(f"the oracle's sweep is incomplete, these runs failed: {', '.join(own['missing'])}")
    if not own:
        print("verdict: no oracle run (--skip-oracle): the oracle targets are not judged")
    for name in autos:
        verdicts(name, configs[name], own, reached.get(name), found, configs.get(RAY_DATA))


def verdicts(
    name: str,
    figures: dict[str, Any],
    own: dict[str, Any] | None,
    reached: list[float | None] | None,
    found: dict[str, Any],
    data: dict[str, Any] | None,
) -> None:
    """The targets' verdicts for the ``auto`` configuration ``name``."""
    if own:
        ratio = figures["total_s"] / own["total_s"]
        met = "met" if ratio <= TARGET_TIME else "NOT met"
        print(
            f"verdict: {name} / oracle, total time {ratio:.2f}x (target <= {TARGET_TIME}x): {met}"
        )
        ratio = figures["worker_s"] / own["worker_s"]
        met = "met" if ratio <= TARGET_WORKER_SECONDS else "NOT met"
        print(
            f"verdict: {name} / oracle, worker-seconds {ratio:.2f}x "
            f"(target <= {TARGET_WORKER_SECONDS}x): {met}"
        )
    if reached is not None:
        quick = all(value is not None and value <= TARGET_ADAPTATION for value in reached)
        print(
            f"verdict: {name} reaches {REACHED:.0%} of the {found['reference']}'s rate after "
            f"{', '.join(seconds(value) for value in reached)} s "
            f"(target <= {TARGET_ADAPTATION:g} s per phase): {'met' if quick else 'NOT met'}"
        )
    if data is not None:
        faster = figures["total_s"] < data["total_s"]
        sampled = figures.get("actor_s") is not None
        ours = figures["actor_s"] if sampled else figures["worker_s"]
        measure = "actor-s (actors alive, sampled alike)" if sampled else "worker-s / actor-s"
        cheaper = ours < data["worker_s"]
        whole = (figures["first_batch_s"] + figures["total_s"]) / (
            data["first_batch_s"] + data["total_s"]
        )
        print(
            f"{name} against Ray Data: total time {figures['total_s'] / data['total_s']:.2f}x "
            f"({'ahead' if faster else 'not ahead'}; end to end {whole:.2f}x), {measure} "
            f"{ours / data['worker_s']:.2f}x ({'ahead' if cheaper else 'not ahead'})"
        )
        if sampled:
            ratio = figures["actor_s_end_to_end"] / data["actor_s_end_to_end"]
            print(
                f"{name} against Ray Data: actor-s end to end {ratio:.2f}x "
                f"({'ahead' if ratio < 1 else 'not ahead'})"
            )


def machine() -> None:
    import ray

    bench.print_machine()
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"ray {ray.__version__}, {os.cpu_count()} CPUs, load average {load}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", nargs=3, metavar=("WORKERS", "STEPS", "PHASE_BATCHES"))
    parser.add_argument(
        "--phase-batches", type=int, default=PHASE_BATCHES, help="batches per phase"
    )
    parser.add_argument(
        "--sweep",
        nargs="+",
        default=[str(n) for n in SWEEP],
        help="the oracle's fixed counts (2 4 8 or 2,4,8)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="alternated rounds (medians)")
    parser.add_argument(
        "--tie",
        type=float,
        default=TIE,
        help="the oracle takes the fewest workers within this fraction of the fastest time",
    )
    parser.add_argument(
        "--ray-data-block-rows",
        type=int,
        default=BLOCK_ROWS,
        help="rows per block of Ray Data's range (override_num_blocks); 0: Ray Data's default",
    )
    parser.add_argument(
        "--read-ahead",
        default=READ_AHEAD,
        help=f"bytes of the {AHEAD!r} configuration's read-ahead (such as 64MiB); 0: no such run",
    )
    parser.add_argument("--skip-ray-data", action="store_true")
    parser.add_argument("--skip-oracle", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--from-json", metavar="FILE", help="print the report of a --json run")
    options = parser.parse_args()
    options.sweep = sorted({int(n) for text in options.sweep for n in text.split(",") if n})
    options.read_ahead = "" if options.read_ahead in ("", "0") else options.read_ahead
    if options.child:
        workers, steps, phase_batches = options.child
        child(workers, [float(step) for step in steps.split(",")], int(phase_batches))
        return
    if options.from_json:
        with open(options.from_json) as saved:
            report(json.load(saved))
        return
    machine()
    found = measure(options)
    if options.json:
        print(json.dumps(found, indent=2))
        return
    report(found)
    machine()


if __name__ == "__main__":
    main()
