"""Worker threads run torch on one intra-op thread each, as worker processes do, and no other
thread's count changes: not the loop's, not a prefetching producer's, not one started during
or after the epoch; a ``worker_init_fn`` that sets another count wins.

Each case runs in a fresh process (``tests/scenarios/intra_op.py``): a count set by one
test would otherwise be what every thread started later in the test session sees.
"""

from __future__ import annotations

from typing import Any

import pytest

import dataloaderx.workers.intra_op as intra_op
from tests.reliability_support import scenario_report

#: Whether worker threads can have an intra-op count of their own here.
PER_THREAD = intra_op.one_intra_op_thread() is not None
per_thread = pytest.mark.skipif(
    not PER_THREAD, reason="no OpenMP runtime found: the intra-op count is not per thread"
)

TIMEOUT = 90.0


def counts(backend: str, *options: str) -> dict[str, Any]:
    return scenario_report("intra_op.py", [backend, *options], TIMEOUT)


def counts_apart(backend: str, *options: str) -> dict[str, Any]:
    """:func:`counts`, skipped where the process runs one intra-op thread: a worker's count of
    one would then tell nothing apart."""
    report = counts(backend, *options)
    if report["process"] == 1:
        pytest.skip("the process runs one intra-op thread already: nothing to tell apart")
    return report


def assert_only_the_workers_changed(report: dict[str, Any], workers: int) -> None:
    process = report["process"]
    assert report["workers"] == [workers] * 32
    assert report["loop_during"] == report["loop_after"] == process
    assert report["new_thread_during"] == report["new_thread_after"] == process
    assert {count for _, count in report["sampler"]} == {process}


@per_thread
@pytest.mark.parametrize("backend", ["sync", "thread"])
def test_worker_threads_run_one_intra_op_thread_and_no_other_thread_sees_it(
    backend: str,
) -> None:
    report = counts_apart(backend)
    assert_only_the_workers_changed(report, 1)
    if backend == "thread":  # the producer drew the later indices, with the process's count
        assert any(name != "MainThread" for name, _ in report["sampler"])


@pytest.mark.cuda
@per_thread
def test_the_cuda_backends_copy_thread_keeps_the_process_count() -> None:
    """The thread that copies batches to the GPU, started after the worker threads took one
    intra-op thread each, pins and copies with the process's count, as over processes."""
    report = counts_apart("cuda")
    assert_only_the_workers_changed(report, 1)
    assert len(report["copier"]) == 16
    assert {count for _, count in report["copier"]} == {report["process"]}
    assert all(name != "MainThread" for name, _ in report["copier"])


@per_thread
def test_a_count_the_user_set_stays_the_loops_and_later_threads() -> None:
    report = counts("thread", "--process", "3")
    assert report["process"] == 3
    assert_only_the_workers_changed(report, 1)
    assert any(name != "MainThread" for name, _ in report["sampler"])


@per_thread
def test_a_worker_init_fn_that_sets_a_count_wins() -> None:
    report = counts("sync", "--init", "3")
    assert report["workers"] == [3] * 32


def test_without_an_openmp_runtime_workers_keep_the_process_count() -> None:
    report = counts_apart("sync", "--no-runtime")
    assert report["per_thread"] is False
    assert report["workers"] == [report["process"]] * 32


@pytest.mark.parametrize(("follows", "calls"), [(True, [1]), (False, [1, 4])])
def test_the_setting_is_kept_only_where_torch_follows_it(follows: bool, calls: list[int]) -> None:
    """A backend whose count is not the OpenMP setting (torch's native pool) gets it back."""
    setting = [4]

    def set_threads(count: int) -> None:
        setting.append(count)

    def torch_count() -> int:
        return setting[-1] if follows else 4

    assert intra_op.own_thread_only(set_threads, torch_count) is follows
    assert setting[1:] == calls


def test_without_a_loaded_openmp_runtime_there_is_no_setter(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setattr(intra_op, "_MAPS", tmp_path / "no-maps")
    assert intra_op._loaded_runtime() is None
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 00000000 00:00 0 /nowhere/libgomp.so.1\n")
    monkeypatch.setattr(intra_op, "_MAPS", maps)
    assert intra_op._loaded_runtime() is None
