"""Elastic worker threads (``num_workers="auto"``): the same batches whatever the count did,
reproducible randomness, exact resume across a resize, nothing left after resizes, the
count in ``loader.stats``, and the arguments' checks. Forced schedules replace the policy's
decisions (``ScalePolicy.observe``) with a script; the pool, its threads and its resizing
are the real ones. The policy itself is tested apart, on windows."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import nullcontext
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from dataloaderx import DataLoaderX
from dataloaderx.util.cores import usable_cores
from dataloaderx.workers.elastic import scaling as scaling_module
from dataloaderx.workers.elastic.bounds import AutoWorkers, Bounds
from dataloaderx.workers.elastic.policy import (
    CLOSED_WINDOWS,
    GAIN,
    GIL_CORES,
    GROWTH,
    PROBATION,
    Change,
    ScalePolicy,
    Window,
)
from tests.elastic_support import Augmented, Script, climb
from tests.helpers import RangeDataset, Sharded, assert_same, wait_for, wait_until_clean


def _auto(dataset: Any, **options: Any) -> DataLoaderX[Any]:
    return DataLoaderX(
        dataset,
        batch_size=options.pop("batch_size", 2),
        num_workers="auto",
        worker_method="thread",
        generator=torch.Generator().manual_seed(7),
        **options,
    )


def _values(batches: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(batches)[:, :3]  # the index and the draws: not the thread's id


def _worker_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if "worker" in t.name and t.is_alive()]


@pytest.mark.parametrize("backend", ["sync", "thread"])
@pytest.mark.parametrize("counts", [[4, 1, 3, 2, 6, 1], [1, 8, 2]])
def test_forced_resizes_give_the_batches_of_a_fixed_count(
    script: Script, backend: str, counts: list[int]
) -> None:
    ran = script(counts)
    loader = _auto(RangeDataset(400), backend=backend, shuffle=True)
    expected = list(
        DataLoader(
            RangeDataset(400),
            batch_size=2,
            shuffle=True,
            generator=torch.Generator().manual_seed(7),
        )
    )
    assert_same(list(loader), expected)
    assert set(counts) <= set(ran) | {counts[-1]}, ran  # every count of the script ran


def test_randomness_is_the_same_whatever_the_scaling_did(script: Script) -> None:
    script([1, 6, 2, 5])
    first = list(_auto(Augmented(delay=0.001)))
    script([8, 1, 3])
    second = list(_auto(Augmented(delay=0.001)))
    assert_same(_values(first), _values(second))
    made_by = {int(row[3]) for batch in first + second for row in batch}
    assert len(made_by) > 1  # several threads made them
    # Each batch has draws of its own: the seeds differ from batch to batch.
    assert len({round(float(batch[0, 1]), 6) for batch in first}) == len(first)


def test_a_new_seed_gives_other_draws(script: Script) -> None:
    script([])
    one = _values(list(_auto(Augmented(40))))
    other = DataLoaderX(
        Augmented(40),
        batch_size=2,
        num_workers="auto",
        worker_method="thread",
        generator=torch.Generator().manual_seed(8),
    )
    assert not torch.equal(one, _values(list(other)))


def test_every_epoch_draws_anew_with_persistent_workers(script: Script) -> None:
    script([3, 1])
    loader = _auto(Augmented(40), persistent_workers=True)
    epochs = [_values(list(loader)) for _ in range(2)]
    assert torch.equal(epochs[0][:, 0], epochs[1][:, 0])
    assert not torch.equal(epochs[0][:, 1:], epochs[1][:, 1:])


@pytest.mark.parametrize("persistent", [False, True])
def test_resume_across_a_resize_is_exact(script: Script, persistent: bool) -> None:
    script([5, 1, 4, 2])
    whole = _values(list(_auto(Augmented(), persistent_workers=persistent)))
    script([2, 7, 1, 3])
    loader = _auto(Augmented(), persistent_workers=persistent)
    iterator = iter(loader)
    taken = [next(iterator) for _ in range(23)]
    state = loader.state_dict()
    del iterator
    script([1, 6])
    resumed = _auto(Augmented(), persistent_workers=persistent)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert_same(_values(taken + rest), whole)


def test_an_iterable_dataset_changes_its_workers_only_between_epochs(script: Script) -> None:
    ran = script([3, 3, 3, 3, 1, 1, 1, 1, 1, 1])
    loader = _auto(Sharded(60), batch_size=None, persistent_workers=True)
    for _ in range(4):
        epoch = list(loader)
        workers = loader.stats.workers[0][1] if loader.stats else None
        assert workers is not None
        fixed = DataLoaderX(
            Sharded(60), batch_size=None, num_workers=workers, worker_method="thread"
        )
        assert epoch == list(fixed), workers
    assert {1, 3} <= set(ran)


def test_the_count_and_its_reasons_are_in_the_stats(script: Script) -> None:
    script([3, 1])
    loader = _auto(RangeDataset(200), worker_options={"max_workers": 8})
    list(loader)
    assert loader.stats is not None
    counts = [(workers, reason) for _, workers, reason in loader.stats.workers]
    assert counts == [
        (min(8, usable_cores()), "the cores this process may use"),
        (3, "scripted: 3"),
        (1, "scripted: 1"),
    ]
    times = [at for at, _, _ in loader.stats.workers]
    assert times == sorted(times)


def test_the_prefetch_mode_is_decided_again_after_a_resize(script: Script) -> None:
    script([1])
    loader = _auto(RangeDataset(400), worker_options={"max_workers": 4})
    list(loader)
    assert loader.stats is not None
    assert loader.stats.mode is not None
    assert "; measured again once as the workers changed in number" in loader.stats.mode


def _hand_out(scaling: scaling_module.Scaling, running: int, batches: int) -> None:
    """``batches`` batches leave a pool that runs ``running`` workers (and changes nothing)."""
    for _ in range(batches):
        scaling.handed_out(running, resizing=running != scaling.workers)


def _settled(scaling: scaling_module.Scaling) -> None:
    """The batches an epoch's start or a change leaves unmeasured are out."""
    _hand_out(
        scaling, scaling.workers, 2 * scaling.bounds.max_workers + scaling_module.WINDOW_BATCHES
    )


def test_a_change_is_told_to_the_mode_decision_once_across_epochs() -> None:
    scaling = scaling_module.Scaling(Bounds(1, 8, 2))
    assert scaling.resized() is False  # the count it started with
    scaling.resume_with(3)
    scaling.new_epoch()  # a change told nowhere yet is kept over an epoch's start
    _settled(scaling)
    assert scaling.resized() is True
    assert scaling.resized() is False
    scaling.idled(0, "ended 3 idle between epochs")
    scaling.new_epoch()  # and the count before the epoch's end comes back: two changes
    _settled(scaling)
    assert scaling.resized() is True
    assert scaling.resized() is False


def test_a_change_is_told_once_the_pool_runs_it_and_the_batches_from_before_are_out() -> None:
    scaling = scaling_module.Scaling(Bounds(1, 8, 2))
    scaling.new_epoch()
    _settled(scaling)
    scaling.resume_with(6)
    _hand_out(scaling, 2, 40)  # actors starting: the pool still runs 2
    assert scaling.resized() is False
    _hand_out(scaling, 6, 2 * 6 - 1)  # the batches asked for before it runs 6
    assert scaling.resized() is False
    _hand_out(scaling, 6, 1)
    assert scaling.resized() is True
    assert scaling.resized() is False


def test_shrunk_threads_end_and_nothing_is_left(script: Script) -> None:
    baseline = set(threading.enumerate())
    script([8, 1])
    loader = _auto(Augmented(200, delay=0.002), persistent_workers=True)
    iterator = iter(loader)
    for seen, _ in enumerate(iterator, 1):
        if loader._scaling is not None and loader._scaling.workers == 1 and seen > 60:
            break
    assert wait_for(lambda: len(_worker_threads()) <= 1), _worker_threads()
    del iterator, loader
    left, _ = wait_until_clean(baseline, set(), within=10)
    assert not left, left


@pytest.mark.parametrize("how", ["break", "error", "close"])
def test_leaving_during_a_resize_ends_every_thread(script: Script, how: str) -> None:
    baseline = set(threading.enumerate())
    script([8, 2, 8, 1, 8])
    loader = _auto(Augmented(400, delay=0.002))
    iterator = iter(loader)
    with pytest.raises(RuntimeError, match="left") if how == "error" else nullcontext():
        for count, _ in enumerate(iterator):
            if count == 40:
                if how == "close":
                    iterator.close()
                    break
                if how == "error":
                    raise RuntimeError("left")
                break
    del iterator, loader
    left, _ = wait_until_clean(baseline, set(), within=10)
    assert not left, left


def test_the_bounds_hold_the_start_and_a_rebuilt_loader_keeps_them() -> None:
    loader = DataLoaderX(
        RangeDataset(10),
        num_workers="auto",
        worker_method="thread",
        worker_options={"min_workers": 3, "max_workers": 5},
    )
    assert isinstance(loader.num_workers, AutoWorkers)
    assert loader.num_workers == 5
    assert loader._scaling is not None
    assert loader._scaling.workers == min(5, max(3, usable_cores()))  # the cores, bounded
    # Frameworks rebuild a loader from its attributes: it is elastic too, with the bounds.
    again = DataLoaderX(
        RangeDataset(10),
        num_workers=loader.num_workers,
        worker_method=loader.worker_method,
        worker_options=loader.worker_options,
    )
    assert again._scaling is not None
    assert again._scaling.bounds == loader._scaling.bounds
    assert [int(b[0, 0]) for b in again] == list(range(10))


@pytest.mark.parametrize(
    ("arguments", "pattern"),
    [
        ({}, r"num_workers='auto' sizes the workers of worker_method='thread'.*'multiprocessing'"),
        (
            {"worker_method": "thread", "worker_options": {"min_workers": 4, "max_workers": 2}},
            r"min_workers=4 is above max_workers=2",
        ),
        (
            {"worker_method": "thread", "worker_options": {"max_workers": 0}},
            r"worker_options max_workers must be an int >= 1 with num_workers='auto', got 0",
        ),
        (
            {"worker_method": "thread", "worker_options": {"min_workers": "2"}},
            r"min_workers must be an int >= 1 .* got '2'",
        ),
        (
            {"worker_method": "thread", "worker_options": {"depth": 2}},
            r"worker_options=\{'depth': 2\} does not apply to worker_method='thread'",
        ),
    ],
)
def test_bad_auto_arguments_name_the_fix(arguments: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        DataLoaderX(RangeDataset(4), num_workers="auto", **arguments)


def test_bounds_with_a_fixed_count_are_refused() -> None:
    with pytest.raises(ValueError, match=r"min_workers bound num_workers='auto'.*num_workers=2"):
        DataLoaderX(
            RangeDataset(4),
            num_workers=2,
            worker_method="thread",
            worker_options={"min_workers": 1},
        )


def _windows(workers: int, rate: float, wait: float, count: int = 1) -> Iterator[Window]:
    for _ in range(count):
        yield Window(workers, int(rate * 10), 10.0, wait * 10.0)


def test_the_policy_grows_while_the_loader_waits_and_more_workers_gain() -> None:
    policy = ScalePolicy(1, 16)
    change = policy.observe(Window(2, 20, 1.0, 0.5))  # waited half the time
    assert change is not None
    assert change.workers == 4
    assert "waited 50%" in change.reason
    kept = policy.observe(Window(4, 38, 1.0, 0.05))
    assert kept is not None
    assert kept.workers == 4
    assert kept.reason.startswith("kept 4")


def test_the_policy_goes_back_when_more_workers_do_not_gain_and_stays() -> None:
    # 2 cores, and items that keep them busy: 2 workers are best, the loader waits anyway.
    changes = climb(ScalePolicy(1, 16), 2, lambda n: 10.0 * min(n, 2), 0.5, 4 * CLOSED_WINDOWS)
    # More, then fewer, each tried twice: the first failure closes the direction for
    # CLOSED_WINDOWS windows, the second for good. Nothing after: a steady workload sees
    # no change.
    assert [change.workers for _, change in changes] == [4, 2, 1, 2, 4, 2, 1, 2], changes
    assert changes[-1][0] < 2 * CLOSED_WINDOWS
    assert changes[1][1].reason == "back to 2: 4 gave +0% batches/s (needs +7%)"
    assert changes[2][1].reason == "tried 1: 2 waited 50%, more did not pay"


def test_fewer_workers_as_fast_are_kept_where_the_loader_waits() -> None:
    # Items that hold the GIL: one worker makes batches as fast as four.
    changes = climb(ScalePolicy(1, 16), 4, lambda n: 10.0, 0.5, 4 * CLOSED_WINDOWS)
    counts = [change.workers for _, change in changes]
    assert counts[-1] == 1, changes
    assert changes[-1][0] < 2 * CLOSED_WINDOWS


def test_the_policy_shrinks_while_the_loader_does_not_wait() -> None:
    policy = ScalePolicy(1, 16)
    n = 6
    for _ in range(40):  # the loop is the bottleneck: the rate is the same at any count
        change = policy.observe(Window(n, 50, 1.0, 0.0))
        if change is not None:
            n = change.workers
    assert n == 1


def test_the_policy_keeps_the_count_where_fewer_would_make_the_loader_wait() -> None:
    policy = ScalePolicy(1, 16)
    n = 3
    for _ in range(80):  # 3 workers are just enough: 2 make the loop wait, 4 gain nothing
        rate, wait = (30 * n / 3, 0.3) if n < 3 else (30, 0.0)
        change = policy.observe(Window(n, int(rate), 1.0, wait))
        if change is not None:
            n = change.workers
    assert n == 3


def test_a_shrink_after_which_the_loader_comes_to_wait_goes_back_and_stays() -> None:
    # 6 workers feed the loop; 5 are a little short: the window that judges them waits
    # 4%, those after 6% (a steady workload, where a shrink must not come and go).
    policy, n, judged = ScalePolicy(1, 16), 6, False
    counts, reasons = [], []
    for _ in range(4 * CLOSED_WINDOWS):
        if n >= 6:
            window, judged = Window(n, 33, 1.0, 0.01), False
        else:
            window = Window(n, 33, 1.0, 0.04 if not judged else 0.06)
            judged = True
        change = policy.observe(window)
        if change is not None:
            reasons.append(change)
        if change is not None and change.workers != n:
            counts.append(change.workers)
            n = change.workers
    # Each shrink is kept, then undone within its probation; the second closes it.
    assert counts == [5, 6, 5, 6], counts
    assert [reason for _, reason in reasons] == [
        "tried 5: the loader waited 1% at 6",
        "kept 5: +0% batches/s, waited 4%",
        "back to 6: 5 came to wait 6%",
    ] * 2
    assert n == 6


def test_a_shrink_is_on_probation_for_a_few_windows_only() -> None:
    policy = ScalePolicy(1, 16)
    tried = policy.observe(Window(8, 30, 1.0, 0.0))
    assert tried == Change(6, "tried 6: the loader waited 0% at 8")
    kept = policy.observe(Window(6, 30, 1.0, 0.03))
    assert kept is not None
    assert kept.workers == 6
    for _ in range(PROBATION):
        assert policy.observe(Window(6, 30, 1.0, 0.03)) is None
    # Past its probation, a wait is a reason to try more, not to undo the shrink (once a
    # second window has measured it).
    assert policy.observe(Window(6, 30, 1.0, 0.5)) is None
    more = policy.observe(Window(6, 30, 1.0, 0.5))
    assert more is not None
    assert more.reason == "tried 12: the loader waited 50% at 6"


def test_a_high_wait_tries_enough_workers_at_once_within_growth() -> None:
    # Waiting 76% at 6: ending the wait needs about 25 workers; the most is 16.
    assert ScalePolicy(1, 16).observe(Window(6, 30, 1.0, 0.76)) == Change(
        16, "tried 16: the loader waited 76% at 6"
    )
    assert ScalePolicy(1, 64).observe(Window(2, 10, 1.0, 0.99)) == Change(
        2 * GROWTH, "tried 8: the loader waited 99% at 2"
    )


def test_at_the_most_workers_a_wait_changes_nothing() -> None:
    # The pool sets the pace at its most: fewer are tried only where more failed.
    policy = ScalePolicy(1, 16)
    assert [policy.observe(Window(16, 80, 1.0, 0.35)) for _ in range(10)] == [None] * 10


def test_a_shrink_tries_a_quarter_fewer_where_the_loader_does_not_wait() -> None:
    policy = ScalePolicy(1, 16)
    n, counts = 16, []
    for _ in range(12):  # the loop sets the pace; 6 workers are just enough
        change = policy.observe(Window(n, 30, 1.0, 0.0 if n >= 6 else 0.3))
        if change is not None and change.workers != n:
            n = change.workers
            counts.append(n)
    assert counts[:5] == [12, 9, 7, 6, 5], counts
    assert n == 6


def test_a_phase_change_opens_a_closed_direction() -> None:
    policy = ScalePolicy(2, 16)  # no fewer than 2: the closed direction is the one tried
    assert policy.observe(Window(2, 20, 1.0, 0.5)) is not None  # try 4
    back = policy.observe(Window(4, 20, 1.0, 0.5))  # no gain: back to 2, closed
    assert back is not None
    assert back.workers == 2
    # The rate at 2 halves (a new phase): the closed direction opens after 3 such windows,
    # not after one (noise).
    assert policy.observe(Window(2, 10, 1.0, 0.6)) is None
    assert policy.observe(Window(2, 20, 1.0, 0.6)) is None
    assert [policy.observe(Window(2, 10, 1.0, 0.6)) for _ in range(2)] == [None, None]
    again = policy.observe(Window(2, 10, 1.0, 0.6))
    assert again is not None
    assert again.workers > 2


def test_a_wait_that_moves_at_the_same_rate_opens_a_closed_direction() -> None:
    # 16 workers gained nothing over 6 while the loop set the pace (30 ms steps); then the
    # steps get shorter: 6 make batches 19% faster (not 25%), and the loop waits 79%.
    policy = ScalePolicy(1, 16)
    assert policy.observe(Window(6, 31, 1.0, 0.46)) is not None  # tries 16
    back = policy.observe(Window(16, 30, 1.0, 0.1))
    assert back is not None
    assert back.workers == 6
    assert [policy.observe(Window(6, 37, 1.0, 0.79)) for _ in range(2)] == [None, None]
    again = policy.observe(Window(6, 37, 1.0, 0.79))
    assert again == Change(16, "tried 16: the loader waited 79% at 6")


def _decisions(windows: list[tuple[int, int, float]]) -> list[Change | None]:
    """A new policy's answers to windows of (workers, batches, wait) over 1 s each."""
    policy = ScalePolicy(1, 16)
    return [policy.observe(Window(n, batches, 1.0, wait)) for n, batches, wait in windows]


def test_a_wait_after_a_window_without_one_is_measured_over_a_whole_window() -> None:
    # The step gets shorter within a window: it waits 39% at 6, the next one (all of it in
    # the new phase) 85%. The try asks for what the whole window says.
    assert _decisions([(6, 33, 0.03), (6, 33, 0.39), (6, 37, 0.85)]) == [
        None,
        None,
        Change(16, "tried 16: the loader waited 85% at 6"),
    ]
    # A single window that waits, between windows that do not, changes nothing.
    policy = ScalePolicy(1, 16)
    steady = [Window(6, 33, 1.0, 0.06 if k % 4 == 0 else 0.03) for k in range(1, 40)]
    assert [policy.observe(window) for window in steady] == [None] * len(steady)


def test_a_wait_right_after_a_change_is_measured_over_the_next_window_too() -> None:
    # A shrink to 5 makes the loop wait: back to 6. The first window at 6 waits while the
    # actor that comes back starts; the next does not: nothing is tried. Two in a row are.
    windows = [(6, 33, 0.01), (5, 29, 0.23), (6, 20, 0.5), (6, 33, 0.01), (6, 20, 0.5)]
    assert _decisions([*windows, (6, 20, 0.5)]) == [
        Change(5, "tried 5: the loader waited 1% at 6"),
        Change(6, "back to 6: 5 gave -12% batches/s, waited 23%"),
        None,
        None,
        None,
        Change(12, "tried 12: the loader waited 50% at 6"),
    ]


def test_a_shrink_where_the_loader_did_not_wait_is_judged_by_the_wait_it_adds() -> None:
    # The step gets longer as 16 are tried down to 12: batches come 18% slower, set by the
    # loop, which does not wait. 12 are kept; 9, which make it wait 4 points more, are not.
    assert _decisions([(16, 40, 0.01), (12, 33, 0.01), (12, 33, 0.0), (9, 33, 0.04)]) == [
        Change(12, "tried 12: the loader waited 1% at 16"),
        Change(12, "kept 12: -18% batches/s, waited 1%"),
        Change(9, "tried 9: the loader waited 0% at 12"),
        Change(12, "back to 12: 9 gave +0% batches/s, waited 4%"),
    ]


def test_fewer_workers_than_the_rate_per_worker_needs_are_not_tried() -> None:
    # 4 workers make 58 batches/s where the loader waits, 14.5 each: 7 feed the loop's 98,
    # and 6 (a quarter fewer) would make 87: no shrink is tried. Items that wait on storage
    # (threads) or actors on cores of their own (Ray) make as much per worker at 6.
    tried, kept, *steady = _decisions([(4, 58, 0.4), *[(7, 98, 0.0)] * 30])
    assert tried == Change(7, "tried 7: the loader waited 40% at 4")
    assert kept == Change(7, "kept 7: +69% batches/s over 4")
    assert steady == [None] * 29
    # Workers that compete for the cores: 2 make 47 batches/s, 23.5 each, where 1 alone
    # makes as many. The rate per worker bounds no count below the one it was measured at.
    competing = _decisions([(2, 47, 0.2), (3, 43, 0.0), (2, 47, 0.0)])
    assert competing[-1] == Change(1, "tried 1: the loader waited 0% at 2")


def test_more_workers_kept_over_a_kept_shrink_close_the_way_down() -> None:
    # 6 actors of 6.25 batches/s each feed a loop that takes 31.7; 5 make a little less.
    # The shrink to 5 passes its probation (the wait creeps up), then 5 wait 6% and 6 are
    # kept again: 5 are not tried from 6 again within CLOSED_WINDOWS windows.
    policy = ScalePolicy(1, 16)
    windows = [
        *_windows(6, 31.7, 0.01),
        *_windows(5, 31.2, 0.03),
        *_windows(5, 31.0, 0.04, PROBATION),
        # 6.16 batches/s per worker: the rate per worker alone would let 5 feed 31.7 again.
        *_windows(5, 30.8, 0.06, 2),
        *_windows(6, 32.0, 0.0),
    ]
    history = [policy.observe(window) for window in windows]
    assert [change for change in history if change is not None] == [
        Change(5, "tried 5: the loader waited 1% at 6"),
        Change(5, "kept 5: -2% batches/s, waited 3%"),
        Change(6, "tried 6: the loader waited 6% at 5"),
        Change(6, "kept 6: +4% batches/s over 5"),
    ]
    quiet = [policy.observe(window) for window in _windows(6, 31.7, 0.01, CLOSED_WINDOWS - 2)]
    assert not any(quiet), quiet
    later = [policy.observe(window) for window in _windows(6, 31.7, 0.01, 3)]
    assert Change(5, "tried 5: the loader waited 1% at 6") in later


def test_more_workers_for_a_shorter_step_leave_the_way_down_open() -> None:
    # 8 actors shrink to 6 under a 30 ms step; then the step gets shorter and 10 are kept.
    # Back at 30 ms, 8 may shrink to 6 again: the shrink was not too many, the step changed.
    policy = ScalePolicy(1, 16)
    phases = [
        *_windows(8, 31.7, 0.01),
        *_windows(6, 31.7, 0.03, 1 + PROBATION),
        *_windows(6, 37.5, 0.4, 2),
        *_windows(10, 50.0, 0.1),
    ]
    changes = [policy.observe(window) for window in phases]
    assert changes[-1] == Change(10, "kept 10: +33% batches/s over 6"), changes
    n, counts = 10, []
    for _ in range(20):  # the 30 ms step again: 6 feed it
        change = policy.observe(Window(n, 317, 10.0, 0.1 if n >= 6 else 3.0))
        if change is not None and change.workers != n:
            n = change.workers
            counts.append(n)
    assert counts[:3] == [8, 6, 5], counts


def test_gain_is_measured_against_the_rate_before_the_try() -> None:
    policy = ScalePolicy(1, 16)
    policy.observe(Window(2, 100, 1.0, 0.5))
    just_below = int(100 * (1 + GAIN)) - 1
    back = policy.observe(Window(4, just_below, 1.0, 0.4))
    assert back is not None
    assert back.workers == 2


def test_scaling_measures_windows_after_the_batches_on_their_way(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [0.0]
    monkeypatch.setattr(scaling_module, "perf_counter", lambda: now[0])
    seen: list[Window] = []

    def observe(policy: ScalePolicy, window: Window) -> Change | None:
        seen.append(window)
        return Change(window.workers + 2, "more") if len(seen) == 1 else None

    monkeypatch.setattr(ScalePolicy, "observe", observe)
    scaling = scaling_module.Scaling(Bounds(1, 8, 2))
    scaling.new_epoch()

    def batch(seconds: float, waited: float, running: int | None = None) -> int | None:
        now[0] += seconds
        scaling.waited(waited)
        running = scaling.workers if running is None else running
        return scaling.handed_out(running, resizing=running != scaling.workers)

    # The first 4 batches (two per worker) are on their way at the start, and a window's
    # worth more warms the caches: not measured.
    settle = 4 + scaling_module.WINDOW_BATCHES
    assert [batch(0.5, 0.4) for _ in range(settle)] == [None] * settle
    changes = [batch(0.1, 0.05) for _ in range(scaling_module.WINDOW_BATCHES)]
    assert changes[:-1] == [None] * (scaling_module.WINDOW_BATCHES - 1)
    assert changes[-1] == 4  # the window closed after 16 batches in 1.6 s
    # While the pool starts the workers added, nothing is measured.
    for _ in range(3 * scaling_module.WINDOW_BATCHES):
        assert batch(0.1, 0.05, running=2) is None
    assert len(seen) == 1
    assert seen[0].workers == 2
    assert seen[0].batches == scaling_module.WINDOW_BATCHES
    assert seen[0].seconds == pytest.approx(1.6)
    assert seen[0].wait_seconds == pytest.approx(0.8)
    assert scaling.workers == 4
    # After the change, 8 batches (two per worker of the larger count) are not measured.
    for _ in range(8):
        batch(0.1, 0.0)
    assert len(seen) == 1
    for _ in range(scaling_module.WINDOW_BATCHES):
        batch(0.1, 0.0)
    assert len(seen) == 2
    assert [workers for _, workers, _ in scaling.history()] == [2, 4]
    # Told to the backend's mode decision, which measures both modes now: not measured.
    assert scaling.resized() is True
    for _ in range(scaling_module.MODE_PROBE_BATCHES):
        batch(0.1, 0.1)
    for _ in range(scaling_module.WINDOW_BATCHES):
        batch(0.1, 0.0)
    assert len(seen) == 3
    assert (seen[2].batches, seen[2].wait_seconds) == (scaling_module.WINDOW_BATCHES, 0.0)
    # A pool that runs fewer than asked, and is no longer resizing, had no room for more.
    assert scaling.handed_out(3, resizing=False) == 3
    assert scaling.history()[-1][1:] == (3, "ran 3: no room for more")


@pytest.mark.parametrize(
    ("share", "bounds", "started"),
    [(0.01, (1, 8), 8), (0.0, (1, 8), 8), (0.2, (1, 16), 10), (0.25, (1, 16), 8), (0.1, (1, 5), 5)],
)
def test_the_first_batches_cpu_share_starts_the_count_that_keeps_the_cores_busy(
    share: float, bounds: tuple[int, int], started: int
) -> None:
    change = ScalePolicy(*bounds).start(2, share)
    assert change == Change(
        started, f"started {started}: the first batches spent {share:.0%} of their time on CPU"
    )


@pytest.mark.parametrize("share", [1.0, 0.9, 0.5, 0.3])
def test_threads_that_keep_the_cores_or_the_gil_busy_start_no_more(share: float) -> None:
    # 2 threads that each spent half their time on CPU kept one core busy: as threads that
    # take turns with the GIL do, which more would not speed up.
    assert 2 * share > GIL_CORES
    assert ScalePolicy(1, 16).start(2, share) is None


def test_the_pool_is_sized_from_its_first_batches_once_per_loader() -> None:
    scaling = scaling_module.Scaling(Bounds(1, 8, 2))
    assert scaling.sizing
    assert scaling.size(0.1) == 8
    assert not scaling.sizing
    assert scaling.size(0.1) is None
    assert scaling.history()[-1][1:] == (
        8,
        "started 8: the first batches spent 10% of their time on CPU",
    )
    resumed = scaling_module.Scaling(Bounds(1, 8, 2))
    resumed.resume_with(3)  # the count of the epoch resumed, not the first batches'
    assert resumed.size(0.1) is None
    assert resumed.workers == 3


def test_items_that_wait_start_the_most_threads_where_the_loop_never_waits() -> None:
    # Two threads make batches faster than the loop takes them, so the loop's wait alone
    # never grows the pool: only the first batches' CPU share does.
    loader = _auto(
        Augmented(160, delay=0.002),
        batch_size=4,
        worker_options={"min_workers": 2, "max_workers": 6},
    )
    loader._scaling = scaling_module.Scaling(Bounds(2, 6, 2))  # the start of 2 cores
    batches = []
    for batch in loader:
        batches.append(batch)
        time.sleep(0.03)
    assert loader.stats is not None
    started = [(workers, why) for _, workers, why in loader.stats.workers][:2]
    assert started[0] == (2, "the cores this process may use")
    assert started[1][0] == 6
    assert started[1][1].startswith("started 6: the first batches spent ")
    assert torch.cat(batches)[:, 0].tolist() == list(range(160))  # in order, each once


class _SlowShards(Sharded):
    """:class:`Sharded`, each item a 2 ms sleep (storage)."""

    def __iter__(self) -> Iterator[int]:
        for item in super().__iter__():
            time.sleep(0.002)
            yield item


def test_an_iterable_dataset_runs_the_started_count_from_the_next_epoch() -> None:
    loader = _auto(
        _SlowShards(120), batch_size=None, worker_options={"min_workers": 2, "max_workers": 6}
    )
    loader._scaling = scaling_module.Scaling(Bounds(2, 6, 2))  # the start of 2 cores
    first = list(loader)
    assert loader.stats is not None
    assert [workers for _, workers, _ in loader.stats.workers] == [2, 6]
    assert loader.stats.workers[1][2].startswith("started 6: ")
    fixed = DataLoaderX(Sharded(120), batch_size=None, num_workers=2, worker_method="thread")
    assert first == list(fixed)  # the epoch ran the shards of 2 workers
    second = list(loader)
    assert loader.stats.workers[0][1] == 6
    six = DataLoaderX(Sharded(120), batch_size=None, num_workers=6, worker_method="thread")
    assert second == list(six)


def test_an_iterable_epoch_resumes_with_the_count_it_ran(script: Script) -> None:
    script([3, 3, 3])  # the count becomes 3 from the second epoch on
    loader = _auto(Sharded(60), batch_size=None)
    list(loader)
    iterator = iter(loader)
    taken = [next(iterator) for _ in range(7)]
    assert loader.stats is not None
    workers = loader.stats.workers[0][1]
    assert workers == 3
    state = loader.state_dict()
    del iterator
    assert state["workers"] == 3
    assert state["loader"]["num_workers"] == "auto"
    script([1, 1])
    resumed = _auto(Sharded(60), batch_size=None)
    resumed.load_state_dict(state)
    with pytest.warns(UserWarning, match="makes the 7 batches already consumed again"):
        rest = list(resumed)
    whole = DataLoaderX(Sharded(60), batch_size=None, num_workers=3, worker_method="thread")
    assert taken + rest == list(whole)
    # A map-style epoch's batches do not depend on the count: none is saved.
    assert _auto(RangeDataset(8)).state_dict()["workers"] is None
