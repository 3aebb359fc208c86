"""``dataloaderx bench --tune``: the sweep on a fake clock, the ceiling, memory, a real run."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, Dataset

from dataloaderx import DataLoaderX
from dataloaderx.bench.plot import pyplot
from dataloaderx.bench.runner import BASELINE
from dataloaderx.bench.tune import plot as tune_plot
from dataloaderx.bench.tune import report
from dataloaderx.bench.tune import tuner as tuner_module
from dataloaderx.bench.tune.cluster import RayCluster
from dataloaderx.bench.tune.grid import Grid, Setting, thread_counts, worker_counts
from dataloaderx.bench.tune.measure import (
    CACHED_BATCHES,
    Ceiling,
    Measurement,
    Workload,
    measure_ceiling,
)
from dataloaderx.bench.tune.memory import PeakMemory
from dataloaderx.bench.tune.sweep import KEEP_SHARE, Budget, SweepResult, run_sweep
from dataloaderx.bench.tune.tuner import TuneConfig, TuneResult, as_code, as_yaml, run_tune
from dataloaderx.cli import main
from dataloaderx.workers.method import MULTIPROCESSING, RAY, THREAD
from tests.helpers import RangeDataset, run_python_without_session_ray

pytestmark = pytest.mark.timeout(120)

GRID = Grid(worker_counts=(0, 1, 2, 4, 8, 16), backends=("sync", "thread"))
#: Worker processes up to 8 cores, worker threads up to twice that.
LADDERS = Grid((0, 1, 2, 4, 8), ("sync", "thread"), thread_counts=(0, 1, 2, 4, 8, 16))
OWN = Setting(0, BASELINE)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Quiet:
    def start_run(self, label: str) -> None:
        pass

    def advance(self, amount: float = 1) -> None:
        pass


def fake_measure(
    clock: FakeClock,
    rate: Callable[[Setting], float],
    seconds: Callable[[Setting], float] = lambda setting: 1.0,
) -> Callable[[Setting], Measurement]:
    """Each run "takes" ``seconds(setting)`` on ``clock`` and reaches ``rate(setting)``."""

    def measure(setting: Setting) -> Measurement:
        clock.now += seconds(setting)
        return Measurement(10, rate(setting), 0.01, 0.0)

    return measure


def sweep(
    rate: Callable[[Setting], float],
    budget: float = 1000.0,
    seconds: Callable[[Setting], float] = lambda setting: 1.0,
    grid: Grid = GRID,
) -> tuple[SweepResult, FakeClock]:
    clock = FakeClock()
    result = run_sweep(
        grid,
        OWN,
        fake_measure(clock, rate, seconds),
        budget=Budget(budget, clock),
        progress=Quiet(),
    )
    return result, clock


def best_at_four_threads(setting: Setting) -> float:
    """Peaks at 4 workers; ``thread`` with ``depth='auto'`` is best by construction."""
    rate = 10.0 + 5 * min(setting.num_workers, 4) - (setting.num_workers > 4) * 3
    bonus = {"thread": 2.0, "sync": 0.0, BASELINE: 0.0}[setting.loader]
    return rate + bonus + (setting.depth == "auto")


# The sweep, on a fake clock -----------------------------------------------------------


def test_the_answer_is_the_best_measured_setting() -> None:
    result, _ = sweep(best_at_four_threads)
    assert result.ranked()[0] == Setting(4, "thread", "auto")
    assert result.leaders[0] == Setting(4, "thread", "auto")
    assert all(len(result.runs[s]) > 1 for s in result.leaders)
    assert all(len(result.runs[s]) == 1 for s in result.pruned())


def test_worker_counts_stop_growing_once_two_more_workers_do_not_help() -> None:
    result, _ = sweep(best_at_four_threads)
    # 8 workers (4 more than the best, 4) are slower: 16 is never tried.
    assert result.worker_counts == {MULTIPROCESSING: (0, 1, 2, 4, 8)}
    assert "num_workers=8 was no faster than num_workers=4" in result.cut_short
    assert {s.num_workers for s in result.runs} == {0, 1, 2, 4, 8}

    flat_after_one, _ = sweep(lambda s: 10.0 + min(s.num_workers, 1))
    assert flat_after_one.worker_counts[MULTIPROCESSING] == (0, 1, 2, 4)  # 2 is not 1 + 2


def test_a_flat_grid_keeps_growing_while_the_workers_count_is_within_two() -> None:
    result, _ = sweep(lambda s: 10.0)
    assert result.worker_counts == {MULTIPROCESSING: (0, 1, 2)}
    assert "num_workers=2 was no faster" in result.cut_short  # 4, 8 and 16 left untried
    at_the_top, _ = sweep(lambda s: 10.0, grid=Grid((0, 1, 2), ("sync",), thread_counts=(0, 2)))
    assert at_the_top.cut_short == ""  # no larger count was left to try


def threads_pay(setting: Setting) -> float:
    """Worker processes pay nothing; each worker thread adds 5 batches/s (I/O-bound items)."""
    return 10.0 + 5 * setting.num_workers * (setting.worker_method == THREAD)


def processes_pay(setting: Setting) -> float:
    """The other way round: threads lose to no workers at all, processes gain."""
    if setting.worker_method == THREAD:
        return 8.0
    return 10.0 + 5 * setting.num_workers * (setting.loader != BASELINE)


def test_threads_climb_past_the_cores_when_processes_stop_paying() -> None:
    result, _ = sweep(threads_pay, grid=LADDERS)
    assert result.worker_counts == {MULTIPROCESSING: (0, 1, 2), THREAD: (0, 1, 2, 4, 8, 16)}
    assert result.cut_short == (
        "worker processes: num_workers=2 was no faster than num_workers=0: larger counts not tried"
    )
    best = result.ranked()[0]
    assert (best.num_workers, best.worker_method) == (16, THREAD)
    assert {s.worker_method for s in result.runs if s.num_workers > 2} == {THREAD}


def test_processes_climb_when_threads_stop_paying() -> None:
    result, _ = sweep(processes_pay, grid=LADDERS)
    assert result.worker_counts == {MULTIPROCESSING: (0, 1, 2, 4, 8), THREAD: (0, 1, 2)}
    assert "worker threads: num_workers=2 was no faster than num_workers=0" in result.cut_short
    assert "worker processes" not in result.cut_short
    best = result.ranked()[0]
    assert (best.num_workers, best.worker_method) == (8, MULTIPROCESSING)


def test_the_first_round_climbs_with_probes_then_fills_in_the_best_counts() -> None:
    order: list[Setting] = []
    clock = FakeClock()
    measure = fake_measure(clock, lambda setting: 10.0 + setting.num_workers)

    def recording(setting: Setting) -> Measurement:
        order.append(setting)
        return measure(setting)

    result = run_sweep(LADDERS, OWN, recording, budget=Budget(1000.0, clock), progress=Quiet())
    first = order[: len(result.runs)]
    assert first == list(result.runs)  # every setting once, then the rounds
    assert result.worker_counts == {MULTIPROCESSING: (0, 1, 2, 4, 8), THREAD: (0, 1, 2, 4, 8, 16)}
    probes = [LADDERS.probe(count, MULTIPROCESSING) for count in (0, 1, 2, 4, 8)]
    probes += [LADDERS.probe(count, THREAD) for count in (1, 2, 4, 8, 16)]
    probes.sort(key=lambda s: (s.num_workers, s.worker_method == THREAD))
    assert all(probe.loader == "thread" and probe.depth == 2 for probe in probes)
    fills = LADDERS.settings(8, MULTIPROCESSING) + LADDERS.settings(16, THREAD)
    # Last, num_workers="auto" with the fastest worker-thread setting (the first of the
    # fastest: the probe at 16 threads).
    elastic = LADDERS.probe(16, THREAD).elastic_setting()
    assert first == list(dict.fromkeys([OWN, *probes, *fills, elastic]))
    assert len(first) < len(LADDERS.all_settings())  # the other counts' backends never ran


def test_a_slow_workload_reaches_the_counts_that_pay_within_a_short_budget() -> None:
    # Without workers a run takes 4 s; each worker makes it faster. A budget that cannot run
    # every setting once still climbs to the best count and tries its backends there.
    result, _ = sweep(
        best_at_four_threads,
        budget=30.0,
        seconds=lambda setting: 4.0 / (1 + setting.num_workers),
    )
    assert result.ranked()[0] == Setting(4, "thread", "auto")
    assert len(result.runs) < len(GRID.all_settings())


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_pruning_never_drops_the_measured_leader(data: st.DataObject) -> None:
    first_rates: dict[Setting, float] = {}
    later = st.floats(min_value=1.0, max_value=100.0)

    def rate(setting: Setting) -> float:
        if setting not in first_rates:
            first_rates[setting] = data.draw(later)
            return first_rates[setting]
        return data.draw(later)

    result, _ = sweep(rate, budget=data.draw(st.floats(min_value=1.0, max_value=200.0)))
    first_best = max(first_rates, key=first_rates.__getitem__)
    assert first_best in result.leaders
    top = first_rates[first_best]
    assert all(first_rates[s] >= KEEP_SHARE * top for s in result.leaders)
    medians = {s: statistics.median(run.rate for run in result.runs[s]) for s in result.leaders}
    assert medians[result.ranked()[0]] == max(medians.values())
    assert result.ranked()[: len(result.leaders)] == sorted(
        result.leaders, key=medians.__getitem__, reverse=True
    )


@settings(max_examples=60, deadline=None)
@given(st.floats(min_value=0.5, max_value=300.0), st.sampled_from([GRID, LADDERS]))
def test_the_budget_is_respected(budget: float, grid: Grid) -> None:
    result, clock = sweep(best_at_four_threads, budget=budget, grid=grid)
    # The first run always goes ahead (an answer needs one); no other run ends past the budget.
    assert clock.now <= max(budget, 1.0)
    assert result.seconds == clock.now


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.integers(0, 16), st.floats(0.1, 5.0)), st.floats(1.0, 100.0))
def test_a_run_longer_than_any_before_overruns_by_at_most_itself(
    durations: dict[int, float], budget: float
) -> None:
    def seconds(setting: Setting) -> float:
        return durations.get(setting.num_workers, 1.0)

    _, clock = sweep(best_at_four_threads, budget=budget, seconds=seconds)
    assert clock.now <= budget + max([1.0, *durations.values()])


def test_rounds_alternate_the_leaders() -> None:
    order: list[Setting] = []
    clock = FakeClock()
    measure = fake_measure(clock, best_at_four_threads)

    def recording(setting: Setting) -> Measurement:
        order.append(setting)
        return measure(setting)

    result = run_sweep(GRID, OWN, recording, budget=Budget(60.0, clock), progress=Quiet())
    later = order[len(result.runs) :]
    leaders = list(result.leaders)
    assert later[: 2 * len(leaders)] == leaders + leaders


# The grid and the answer as code -------------------------------------------------------


def test_worker_counts_double_up_to_the_cores() -> None:
    assert worker_counts(1) == [0, 1]
    assert worker_counts(6) == [0, 1, 2, 4]
    assert worker_counts(16, include=3) == [0, 1, 2, 3, 4, 8, 16]


def test_thread_counts_double_up_to_twice_the_cores() -> None:
    assert thread_counts(1) == [0, 1, 2]
    assert thread_counts(2) == [0, 1, 2, 4]
    assert thread_counts(6) == [0, 1, 2, 4, 8, 12]
    assert thread_counts(2, include=3) == [0, 1, 2, 3, 4]


@pytest.fixture
def cpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """``TuneConfig.grid()`` as on a machine without an accelerator (no ``pin_memory``)."""
    monkeypatch.setattr(tuner_module, "accelerator", lambda: None)


def test_with_an_accelerator_every_setting_is_tried_with_pin_memory_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tuner_module, "accelerator", lambda: torch.device("cuda"))
    grid = TuneConfig(Workload(RangeDataset(8), print, 4, 2), ("sync",), cores=2).grid()
    settings_ = grid.settings(2, THREAD)
    assert settings_ == [
        Setting(2, "sync", worker_method=THREAD),
        Setting(2, "sync", worker_method=THREAD, pin_memory=True),
    ]


@pytest.mark.usefixtures("cpu_only")
def test_the_grid_tries_threads_with_workers_only_and_past_the_cores_for_threads_only() -> None:
    config = TuneConfig(Workload(RangeDataset(8), print, 4, 2), ("sync", "thread"), cores=2)
    grid = config.grid()
    assert grid.ladders() == {MULTIPROCESSING: (0, 1, 2), THREAD: (0, 1, 2, 4)}
    every = grid.all_settings()
    threads = [s for s in every if s.worker_method == THREAD]
    processes = [s for s in every if s.worker_method == MULTIPROCESSING]
    assert {s.num_workers for s in threads} == {1, 2, 4}  # past the 2 cores
    assert {s.num_workers for s in processes} == {0, 1, 2}  # at most the cores
    assert BASELINE not in {s.loader for s in threads}
    assert grid.settings(2, THREAD) == [
        Setting(2, "sync", worker_method=THREAD),
        Setting(2, "thread", 2, worker_method=THREAD),
        Setting(2, "thread", "auto", worker_method=THREAD),
    ]
    # No workers, no worker method: the same settings, run once.
    assert grid.settings(0, THREAD) == grid.settings(0)
    assert len(every) == len(set(every))
    own = TuneConfig(config.workload, ("sync",), num_workers=3, cores=2).grid()
    assert own.ladders() == {MULTIPROCESSING: (0, 1, 2, 3), THREAD: (0, 1, 2, 3, 4)}


def test_a_setting_names_its_worker_method_in_label_and_kwargs() -> None:
    threads = Setting(2, "thread", "auto", worker_method=THREAD)
    assert threads.label == "thread workers=2 (threads) depth=auto"
    assert Setting(2, "thread", "auto").label == "thread workers=2 depth=auto"
    assert threads.loader_kwargs(4)["worker_method"] == "thread"
    assert "worker_method" not in Setting(2, "thread", "auto").loader_kwargs(4)
    assert 'worker_method="thread"' in as_code(threads, 4)
    assert yaml.safe_load(as_yaml(threads, 4))["worker_method"] == "thread"
    with pytest.raises(ValueError, match="DataLoader has worker processes only"):
        Setting(2, BASELINE, worker_method=THREAD)
    with pytest.raises(ValueError, match="must be one of 'multiprocessing', 'thread', 'ray', got"):
        Setting(2, "sync", worker_method="th")
    actors = Setting(2, "sync", worker_method=RAY)
    assert actors.label == "sync workers=2 (Ray actors)"
    assert 'worker_method="ray"' in as_code(actors, 4)
    assert yaml.safe_load(as_yaml(actors, 4))["worker_method"] == "ray"
    with pytest.raises(ValueError, match="DataLoader has worker processes only"):
        Setting(2, BASELINE, worker_method=RAY)


@pytest.mark.usefixtures("cpu_only")
def test_with_a_ray_cluster_ray_workers_climb_to_its_cpus_past_this_machines() -> None:
    cluster = RayCluster(cpus=12, nodes=3, machine_cpus=2)
    workload = Workload(RangeDataset(8), print, 4, 2)
    grid = TuneConfig(workload, ("sync",), num_workers=3, cores=2, ray=cluster).grid()
    assert grid.ladders() == {
        MULTIPROCESSING: (0, 1, 2, 3),
        THREAD: (0, 1, 2, 3, 4),
        RAY: (0, 1, 2, 3, 4, 8, 12),
    }
    assert grid.settings(12, RAY) == [Setting(12, "sync", worker_method=RAY)]  # no DataLoader
    assert grid.settings(0, RAY) == grid.settings(0)
    beyond = TuneConfig(workload, ("sync",), num_workers=16, cores=2, ray=cluster).grid()
    assert beyond.ladders()[RAY] == (0, 1, 2, 4, 8, 12)  # 16 actors would not fit
    assert RAY not in TuneConfig(workload, ("sync",), cores=2).grid().ladders()


def test_grid_tries_both_depths_only_where_a_backend_takes_one() -> None:
    settings_ = GRID.settings(2)
    assert settings_ == [
        Setting(2, BASELINE),
        Setting(2, "sync"),
        Setting(2, "thread", 2),
        Setting(2, "thread", "auto"),
    ]
    pinned = Grid((0,), ("sync",), (False, True)).settings(0)
    assert [s.pin_memory for s in pinned] == [False, False, True, True]


class WhereMade(Dataset[tuple[int, int]]):
    """Item ``i`` is the process and the thread that made it."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> tuple[int, int]:
        return os.getpid(), threading.get_ident()


def made_in(loader: DataLoader[Any]) -> set[str]:
    """Where the loader's items were made: "this thread", "a thread" or "a process"."""
    places = set()
    for pids, threads in loader:
        for pid, thread in zip(pids.tolist(), threads.tolist(), strict=True):
            if pid != os.getpid():
                places.add("a process")
            else:
                places.add("this thread" if thread == threading.get_ident() else "a thread")
    return places


@pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true but no accelerator")
@pytest.mark.parametrize(
    "setting",
    [
        Setting(2, "thread", "auto"),
        Setting(1, "sync"),
        Setting(2, BASELINE, pin_memory=True),
        Setting(2, "sync", worker_method=THREAD),
    ],
    ids=lambda s: s.label,
)
def test_the_code_and_the_yaml_build_the_recommended_loader(setting: Setting) -> None:
    dataset = WhereMade()
    code = as_code(setting, 4)
    loader = eval(code, {"DataLoader": DataLoader, "DataLoaderX": DataLoaderX, "dataset": dataset})
    assert (loader.batch_size, loader.num_workers) == (4, setting.num_workers)
    assert loader.pin_memory == setting.pin_memory
    from_yaml = DataLoaderX.from_config(dataset, yaml.safe_load(as_yaml(setting, 4)))
    assert (from_yaml.batch_size, from_yaml.num_workers) == (4, setting.num_workers)
    workers = {MULTIPROCESSING: "a process", THREAD: "a thread"}[setting.worker_method]
    assert made_in(loader) == made_in(from_yaml) == {workers}
    if setting.loader == BASELINE:
        assert type(loader) is DataLoader
        assert from_yaml.prefetch_backend.name == "sync"
    else:
        backend = loader.prefetch_backend
        assert backend.name == from_yaml.prefetch_backend.name == setting.loader
        assert backend.describe() == from_yaml.prefetch_backend.describe()
        assert backend.describe().get("depth") == setting.depth


def made_result(
    runs: dict[Setting, list[tuple[float, float]]], ceiling_rate: float = 50.0
) -> TuneResult:
    """A result from given ``(rate, step seconds)`` runs; every setting is a leader."""
    sweep = SweepResult(
        runs={s: [Measurement(10, rate, step, 0.0) for rate, step in r] for s, r in runs.items()},
        leaders=tuple(runs),
    )
    config = TuneConfig(Workload(RangeDataset(8), lambda batch: None, 4, 2), ("thread",))
    return TuneResult(config, config.grid(), Ceiling(ceiling_rate, 0.020, 10), sweep, OWN)


def test_the_verdict_reads_the_rows() -> None:
    fast, slow = Setting(2, "thread", 2), Setting(8, BASELINE)
    result = made_result(
        {OWN: [(20.0, 0.020)] * 2, fast: [(45.0, 0.021), (46.0, 0.021)], slow: [(40.0, 0.0224)] * 2}
    )
    lines = report.verdict(result)
    assert lines[1] == f"    {as_code(fast, 4)}"
    assert "runner-up: DataLoader workers=8, 13.7% slower (their runs spread 2.2%)" in lines
    assert "data loading costs you 9% of what your step allows (45.5 of 50.0 batches/s)" in lines
    assert lines[-1] == "the step ran 12% slower with DataLoader workers=8 running"


def test_close_settings_are_called_within_noise() -> None:
    one, two = Setting(0, "thread", 2), Setting(0, "thread", "auto")
    result = made_result({one: [(49.0, 0.02), (47.0, 0.02)], two: [(48.0, 0.02), (46.5, 0.02)]})
    answer = result.answer()
    assert (answer.best, answer.runner_up) == (one, two)
    assert answer.within_noise
    assert result.noisiest() is None
    assert any("within noise (their runs spread 4.2%)" in line for line in report.verdict(result))
    single = made_result({one: [(49.0, 0.02)], two: [(48.0, 0.02)]})
    assert single.answer().spread is None
    assert any("too few to tell from noise" in line for line in report.verdict(single))


def test_the_answer_reads_well_when_worker_threads_win() -> None:
    threads, processes = Setting(4, "thread", 2, worker_method=THREAD), Setting(2, "thread", 2)
    sweep = SweepResult(
        runs={
            OWN: [Measurement(10, 20.0, 0.02, 0.0, 300 * 2**20)],
            threads: [Measurement(10, r, 0.02, 0.0, 310 * 2**20) for r in (48.0, 49.0)],
            processes: [Measurement(10, r, 0.02, 0.0, 420 * 2**20) for r in (44.0, 45.0)],
        },
        leaders=(threads, processes),
        worker_counts={MULTIPROCESSING: (0, 1, 2), THREAD: (0, 1, 2, 4)},
    )
    config = TuneConfig(Workload(RangeDataset(8), print, 4, 2), ("thread",), num_workers=0)
    result = TuneResult(config, config.grid(), Ceiling(50.0, 0.020, 10), sweep, OWN)
    table = report.as_table(result)
    assert "num_workers tried: 0, 1, 2 (processes); 0, 1, 2, 4 (threads)" in table
    rows = [line.split() for line in table.splitlines() if line.startswith("thread ")]
    assert [row[1:3] for row in rows] == [["4", "threads"], ["2", "processes"]]
    assert (
        '    DataLoaderX(dataset, batch_size=4, num_workers=4, worker_method="thread", '
        'backend="thread", backend_options={"depth": 2})'
    ) in table.splitlines()
    assert "    worker_method: thread" in table.splitlines()
    assert "runner-up: thread workers=2 depth=2, 9.0% slower (their runs spread 2.2%)" in table
    assert "peak memory: 310 MiB with it, 420 MiB with the runner-up" in table
    document = json.loads(report.as_json(result))
    assert [row["worker_method"] for row in document["results"]] == [
        THREAD,
        MULTIPROCESSING,
        MULTIPROCESSING,
    ]
    assert document["recommendation"]["worker_method"] == THREAD
    assert document["recommendation"]["peak_bytes"] == 310 * 2**20
    assert document["sweep"]["worker_counts"] == {
        "multiprocessing": [0, 1, 2],
        "thread": [0, 1, 2, 4],
    }


def ray_result() -> TuneResult:
    """A sweep with Ray actors (the leader, 2.5 s to start) and worker threads on a cluster
    of 8 CPUs on 3 nodes, seen from a 2-CPU machine."""
    actors, threads = (
        Setting(4, "sync", worker_method=RAY),
        Setting(2, "sync", worker_method=THREAD),
    )
    sweep = SweepResult(
        runs={
            OWN: [Measurement(10, 20.0, 0.02, 0.0)],
            actors: [
                Measurement(10, 48.0, 0.02, 0.004, None, 2.5),
                Measurement(10, 49.0, 0.02, 0.004),
            ],
            threads: [Measurement(10, 30.0, 0.02, 0.001)],
        },
        leaders=(actors, threads),
        worker_counts={MULTIPROCESSING: (0,), THREAD: (0, 2), RAY: (0, 4)},
    )
    cluster = RayCluster(cpus=8, nodes=3, machine_cpus=2)
    config = TuneConfig(Workload(RangeDataset(8), print, 4, 2), ("sync",), cores=2, ray=cluster)
    return TuneResult(config, config.grid(), Ceiling(50.0, 0.02, 10), sweep, OWN)


@pytest.mark.usefixtures("cpu_only")
def test_the_report_gives_the_ray_cluster_beside_this_machine_and_the_actors_start_up() -> None:
    result = ray_result()
    table = report.as_table(result)
    lines = table.splitlines()
    assert "num_workers tried: 0 (processes); 0, 2 (threads); 0, 4 (Ray actors)" in table
    assert lines[2].startswith(
        "Ray cluster: 8 CPUs on 3 nodes; this machine: 2 CPUs; Ray actors are measured on "
        "epochs after the first"
    )
    assert "actors start ms" in table
    assert [line.split()[10] for line in lines if line.startswith("sync ")] == ["2500", "-"]
    assert "    # measured on a Ray cluster: 8 CPUs on 3 nodes; this machine: 2 CPUs" in lines
    assert "    worker_method: ray" in lines
    assert (
        "its Ray actors took 2.5 s to start (once per loader: they are kept between epochs)"
        in lines
    )
    document = json.loads(report.as_json(result))
    assert document["recommendation"]["ray_cluster"] == {"cpus": 8, "nodes": 3, "machine_cpus": 2}
    assert [row["actors_start_ms"] for row in document["results"]] == [2500.0, None, None]
    without = report.as_table(made_result({OWN: [(20.0, 0.02)]}))
    assert "Ray" not in without
    assert "actors start ms" not in without


@pytest.mark.usefixtures("cpu_only")
def test_a_recommendation_of_ray_actors_builds_its_loader() -> None:
    pytest.importorskip("ray", reason="ray is not installed: pip install 'dataloaderx[ray]'")
    document = json.loads(report.as_json(ray_result()))
    loader = DataLoaderX.from_config(
        RangeDataset(8), yaml.safe_load(document["recommendation"]["yaml"])
    )
    assert (loader.worker_method, loader.num_workers, loader.batch_size) == ("ray", 4, 4)


def test_the_plot_has_a_line_per_worker_method_and_whole_number_ticks() -> None:
    pytest.importorskip("matplotlib")
    runs = {
        OWN: [(20.0, 0.02)],
        Setting(0, "thread", 2): [(30.0, 0.02)],
        Setting(1, "thread", 2): [(35.0, 0.02)],
        Setting(2, BASELINE): [(33.0, 0.02)],
        Setting(2, "thread", 2): [(36.0, 0.02)],
        Setting(1, "thread", 2, worker_method=THREAD): [(40.0, 0.02)],
        Setting(4, "thread", 2, worker_method=THREAD): [(45.0, 0.02)],
        Setting(2, "thread", 2, worker_method=RAY): [(38.0, 0.02)],
    }
    plt = pyplot()
    figure = tune_plot.draw(made_result(runs), plt)
    try:
        axis = figure.axes[0]
        figure.canvas.draw()
        assert list(axis.get_xticks()) == [0, 1, 2, 4]
        assert [label.get_text() for label in axis.get_xticklabels()] == ["0", "1", "2", "4"]
        lines = {line.get_label(): list(line.get_xdata()) for line in axis.get_lines()}
        assert lines == {
            "DataLoader (processes)": [0, 2],
            "thread (processes)": [0, 1, 2],
            "thread (threads)": [0, 1, 4],  # starts where every line starts: no workers
            "thread (Ray actors)": [0, 2],
            "ceiling": [0, 1],
        }
    finally:
        plt.close(figure)


_NO_RAY = """
import sys
from dataloaderx.cli import main
code = main([
    "bench", "--tune", "--dataset", "tests.bench_fixtures:tiny",
    "--step", "tests.bench_fixtures:noop", "--batches", "2", "--batch-size", "2",
    "--budget", "1", "--backends", "sync", "--no-progress",
])
imported = "ray" in sys.modules
try:
    import ray
except ImportError:
    initialised = False
else:
    initialised = ray.is_initialized()
print(f"exit {code}; ray imported: {imported}; initialised: {initialised}")
"""


def test_without_ray_tune_starts_no_ray() -> None:
    done = run_python_without_session_ray(_NO_RAY, timeout=100)
    *report_lines, last = done.stdout.strip().splitlines()
    assert last == "exit 0; ray imported: False; initialised: False", done.stderr[-3000:]
    assert "Ray" not in "\n".join(report_lines) + done.stderr


# The ceiling and memory ----------------------------------------------------------------


class CountingDataset(Dataset[torch.Tensor]):
    def __init__(self, size: int) -> None:
        self.size = size
        self.calls = 0

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        self.calls += 1
        return torch.full((3,), index)


def test_the_ceiling_replays_cached_batches_without_calling_the_dataset() -> None:
    dataset = CountingDataset(100)
    seen: list[torch.Tensor] = []
    ceiling = measure_ceiling(Workload(dataset, seen.append, batch_size=5, batches=12))
    assert dataset.calls == CACHED_BATCHES * 5  # the batches made once, nothing more
    assert ceiling.batches == len(seen) == 12
    assert [int(batch[0, 0]) for batch in seen[:5]] == [0, 5, 10, 15, 0]
    assert ceiling.rate > 0


def test_peak_memory_counts_the_worker_processes() -> None:
    pytest.importorskip("psutil")
    with PeakMemory() as alone:
        time.sleep(0.2)
    hold = "import sys, time; block = bytearray(200 * 2**20); print('ready', flush=True); time.sleep(30)"  # noqa: E501
    child = subprocess.Popen([sys.executable, "-c", hold], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        with PeakMemory() as with_child:
            time.sleep(0.2)
    finally:
        child.kill()
        child.wait(timeout=10)
    assert alone.peak_bytes is not None
    assert with_child.peak_bytes is not None
    assert with_child.peak_bytes - alone.peak_bytes > 150 * 2**20


def test_peak_memory_counts_the_worker_threads() -> None:
    pytest.importorskip("psutil")
    with PeakMemory() as alone:
        time.sleep(0.2)
    ready, done = threading.Event(), threading.Event()

    def hold() -> None:
        block = bytearray(200 * 2**20)
        ready.set()
        done.wait(30)
        del block

    worker = threading.Thread(target=hold)
    worker.start()
    try:
        assert ready.wait(30)
        with PeakMemory() as with_thread:
            time.sleep(0.2)
    finally:
        done.set()
        worker.join(30)
    assert alone.peak_bytes is not None
    assert with_thread.peak_bytes is not None
    assert with_thread.peak_bytes - alone.peak_bytes > 150 * 2**20


# A real sweep on a small workload ------------------------------------------------------


class SleepyItems(Dataset[torch.Tensor]):
    """Items that wait (releasing the GIL) as storage would: workers help."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(0.002)
        return torch.full((4,), index)


def gil_step(batch: Any) -> None:
    """A step that holds the GIL for about a millisecond."""
    end = time.perf_counter() + 0.001
    while time.perf_counter() < end:
        pass


def real_tune(budget: float = 4.0) -> TuneResult:
    workload = Workload(SleepyItems(), gil_step, batch_size=4, batches=6)
    config = TuneConfig(workload, ("sync", "thread"), budget_seconds=budget, cores=1)
    return run_tune(config, progress=False)


def test_a_real_sweep_recommends_its_best_measured_row() -> None:
    result = real_tune()
    assert result.sweep.worker_counts[THREAD][:2] == (0, 1)  # threads ran, 1 core or not
    assert any(s.worker_method == THREAD for s in result.sweep.runs)
    answer = result.answer()
    assert answer.best == result.sweep.ranked()[0]
    assert result.rate(answer.best) == max(result.rate(s) for s in result.sweep.leaders)
    assert result.own in result.sweep.runs
    table = report.as_table(result)
    assert as_code(answer.best, 4) in table
    assert "of ceiling" in table
    assert "data loading costs you" in table
    document = json.loads(report.as_json(result))
    rows = [row for row in document["results"] if not row["pruned"]]
    assert rows[0]["batches_per_second"] == max(row["batches_per_second"] for row in rows)
    assert [row["pruned"] for row in document["results"]] == sorted(
        row["pruned"] for row in document["results"]
    )  # the leaders first
    assert document["recommendation"]["code"] == as_code(answer.best, 4)
    assert document["ceiling"]["batches_per_second"] == result.ceiling.rate


# The command line ---------------------------------------------------------------------

TINY = ["--dataset", "tests.bench_fixtures:tiny", "--step", "tests.bench_fixtures:noop"]


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["bench", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("budget", ["0", "-5", "soon", "nan", "inf"])
def test_a_budget_that_is_not_a_positive_number_is_refused(
    capsys: pytest.CaptureFixture[str], budget: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["bench", "--tune", "--budget", budget])
    assert exited.value.code == 2
    assert f"expected a positive number of seconds, got {budget!r}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--budget", "5"], "--budget applies to --tune only"),
        (["--tune", "--depth", "4"], "--depth (the sweep tries depth=2 and depth='auto') does"),
        (["--tune", "--rounds", "2"], "--rounds (the sweep runs the leaders"),
        (["--tune", *TINY, "--batch-size", "8"], "but the dataset has 40 items: pass --batches 5"),
        (["--tune", "--dataset", "tests.bench_fixtures:broken"], "raised OSError"),
        (["--tune", "--dataset", "tests.bench_fixtures:not_a_dataset"], "not a Dataset"),
        (["--tune", "--step", "tests.bench_fixtures:NOT_CALLABLE"], "not callable"),
        (["--tune", "--step", "no_such_module:step"], "cannot import module"),
    ],
)
def test_bad_tune_input_fails_before_anything_runs(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, out, err = run_cli(capsys, *args)
    assert code == 2
    assert out == ""
    assert message in err


def test_a_step_that_raises_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(
        capsys, "--tune", "--dataset", "tests.bench_fixtures:tiny",
        "--step", "tests.bench_fixtures:fails", "--batches", "2", "--no-progress",
    )  # fmt: skip
    assert code == 2
    assert "--step: the step raised on a batch of the dataset: ValueError(" in err


def test_tune_from_the_command_line_prints_json_and_a_plot(
    capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    pytest.importorskip("matplotlib")
    plot = tmp_path / "tune.png"
    code, out, _ = run_cli(
        capsys, "--tune", *TINY, "--batches", "4", "--batch-size", "2", "--budget", "3",
        "--backends", "thread", "--no-progress", "--json", "--plot", str(plot),
    )  # fmt: skip
    assert code == 0
    document = json.loads(out)
    assert document["results"][0]["loader"] in {BASELINE, "thread"}
    assert document["sweep"]["seconds"] > 0
    assert plot.stat().st_size > 0


def test_auto_is_weighed_against_the_best_fixed_count() -> None:
    fixed = Setting(4, "thread", 2, worker_method=THREAD)
    elastic = fixed.elastic_setting()
    assert elastic.label == "thread workers=auto (threads) depth=2"
    assert elastic.loader_kwargs(4)["num_workers"] == "auto"
    assert as_code(elastic, 4) == (
        'DataLoaderX(dataset, batch_size=4, num_workers="auto", worker_method="thread", '
        'backend="thread", backend_options={"depth": 2})'
    )
    loader = DataLoaderX.from_config(RangeDataset(8), yaml.safe_load(as_yaml(elastic, 4)))
    assert loader._scaling is not None
    ahead = made_result({OWN: [(20.0, 0.02)], fixed: [(40.0, 0.02)], elastic: [(44.0, 0.02)]})
    assert (
        "num_workers='auto' (worker threads): 44.0 batches/s against 40.0 for the best fixed "
        "setting (thread workers=4 (threads) depth=2): ahead: the setting above"
    ) in report.verdict(ahead)
    behind = made_result({OWN: [(20.0, 0.02)], fixed: [(40.0, 0.02)], elastic: [(38.0, 0.02)]})
    assert any(
        line.startswith("num_workers='auto' (worker threads): 38.0 batches/s against 40.0")
        and "not ahead: keep the fixed count" in line
        for line in report.verdict(behind)
    )
    rows = json.loads(report.as_json(behind))["results"]
    assert sorted(str(row["num_workers"]) for row in rows) == ["0", "4", "auto"]
    with pytest.raises(ValueError, match="num_workers='auto' is tried with worker threads"):
        Setting(4, "thread", 2).elastic_setting()
