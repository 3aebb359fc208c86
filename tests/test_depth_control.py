"""The ``depth="auto"`` controller, driven by scripted sequences and a tick simulation."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest

from dataloaderx.engine.depth import (
    START_DEPTH,
    WINDOW,
    BufferUsage,
    DepthController,
)


def stall(controller: DepthController, waited: float, step: float = 1.0) -> int:
    """A call that found the buffer empty after the producer waited for room."""
    return controller.observe(
        buffered=0, waited=waited, step=step, room_waited=True, byte_waited=False
    )


def full(controller: DepthController, step: float = 1.0) -> int:
    """A call that found the buffer full and did not wait."""
    return controller.observe(
        buffered=controller.depth, waited=0.0, step=step, room_waited=True, byte_waited=False
    )


def test_starts_small() -> None:
    assert DepthController(16).depth == START_DEPTH == 2
    assert DepthController(1).depth == 1  # never above max_depth


def test_grows_by_the_stall_in_steps() -> None:
    controller = DepthController(16)
    full(controller)
    assert stall(controller, waited=3.0) == 2 + 3  # 3 steps of waiting: 3 more batches
    full(controller)
    assert stall(controller, waited=0.5) == 5 + 1  # at least one
    assert controller.usage(0) == BufferUsage(2, 2, 5, 0)


def test_first_call_is_not_a_stall() -> None:
    controller = DepthController(16)
    depth = controller.observe(
        buffered=0, waited=5.0, step=None, room_waited=True, byte_waited=False
    )
    assert depth == START_DEPTH


def test_hand_off_noise_is_not_a_stall() -> None:
    controller = DepthController(16)
    full(controller, step=1.0)
    assert stall(controller, waited=0.01, step=1.0) == START_DEPTH


def test_growth_stops_at_max_depth() -> None:
    controller = DepthController(6)
    full(controller)
    for _ in range(10):
        assert stall(controller, waited=4.0) <= 6
    assert controller.depth == 6
    assert controller.usage(0).depth_max == 6


def test_no_growth_when_the_producer_never_waited_for_room() -> None:
    # The producer is slower than the loop: a deeper buffer would stay empty.
    controller = DepthController(16)
    for _ in range(200):
        controller.observe(buffered=0, waited=0.5, step=1.0, room_waited=False, byte_waited=False)
    assert controller.depth == START_DEPTH


def test_no_growth_when_the_byte_cap_held_the_producer_back() -> None:
    controller = DepthController(16)
    full(controller)
    controller.observe(buffered=1, waited=0.0, step=1.0, room_waited=False, byte_waited=True)
    assert stall(controller, waited=3.0) == START_DEPTH
    # New evidence of room (and none of the cap) after that stall: growth resumes.
    full(controller)
    assert stall(controller, waited=3.0) == START_DEPTH + 3


def test_each_growth_needs_new_evidence_of_room() -> None:
    controller = DepthController(16)
    full(controller)
    assert stall(controller, waited=2.0) == 4
    # Stalls with the producer never waiting for room since: no further growth.
    for _ in range(5):
        controller.observe(buffered=0, waited=2.0, step=1.0, room_waited=False, byte_waited=False)
    assert controller.depth == 4


def test_shrinks_one_step_per_window_while_the_buffer_stays_full() -> None:
    controller = DepthController(16)
    full(controller)
    stall(controller, waited=8.0)
    assert controller.depth == 10
    depths = [full(controller) for _ in range(WINDOW * 12)]
    steps = [i for i in range(1, len(depths)) if depths[i] != depths[i - 1]]
    assert depths[0] == 10
    assert steps[0] >= WINDOW - 1
    assert all(depths[i - 1] - depths[i] == 1 for i in steps)  # one at a time
    assert all(b - a == WINDOW for a, b in itertools.pairwise(steps))  # per window
    assert controller.depth == START_DEPTH  # and never below the floor


def test_no_shrink_when_the_buffer_ran_low_in_the_window() -> None:
    controller = DepthController(16)
    full(controller)
    stall(controller, waited=4.0)
    for round_number in range(5 * WINDOW):
        low = round_number % 40 == 0
        controller.observe(
            buffered=1 if low else controller.depth,
            waited=0.0,
            step=1.0,
            room_waited=True,
            byte_waited=False,
        )
    assert controller.depth == 6


def test_usage_reports_per_call_median() -> None:
    controller = DepthController(16)
    for _ in range(3):
        full(controller)
    stall(controller, waited=3.0)  # counted at depth 2, then depth 5
    for _ in range(10):
        full(controller)
    assert controller.usage(123) == BufferUsage(2, 5, 5, 123)


# A tick simulation of a producer thread and a training loop around one buffer.


@dataclass
class Run:
    depths: list[int] = field(default_factory=list)
    waits: list[int] = field(default_factory=list)


def simulate(controller: DepthController, loads: list[int], step: int) -> Run:
    """Batch ``k`` takes ``loads[k]`` ticks to make; the loop's step takes ``step`` ticks."""
    run = Run()
    buffered = made = progress = 0
    holding = False
    room_waited = False
    stepping, waiting, waited = 0, False, 0
    first = True
    consumed = 0
    while consumed < len(loads):
        # Producer: make the next batch, or put the one in hand once there is room.
        if holding:
            if buffered < controller.depth:
                buffered += 1
                holding = False
            else:
                room_waited = True
        elif made < len(loads):
            progress += 1
            if progress >= loads[made]:
                made += 1
                progress = 0
                holding = True
        # Loop: step, or wait for a batch.
        if stepping:
            stepping -= 1
            if stepping:
                continue
            waiting, waited = True, 0
            asked_with = buffered
        elif not waiting and first:
            waiting, waited, asked_with = True, 0, buffered
        if waiting:
            if buffered == 0:
                waited += 1
                continue
            buffered -= 1
            consumed += 1
            run.depths.append(controller.depth)
            run.waits.append(waited)
            controller.observe(
                buffered=asked_with,
                waited=float(waited),
                step=None if first else float(step),
                room_waited=room_waited,
                byte_waited=False,
            )
            room_waited = False
            first = False
            waiting, stepping = False, step
    return run


def changes(depths: list[int]) -> int:
    return sum(a != b for a, b in itertools.pairwise(depths))


def test_steady_fast_producer_stays_at_the_floor() -> None:
    run = simulate(DepthController(16), loads=[5] * 2000, step=10)
    assert set(run.depths) == {START_DEPTH}
    assert sum(run.waits[1:]) == 0


def test_steady_slow_producer_does_not_grow() -> None:
    # Input-bound: the loop waits on every batch, but depth cannot help.
    run = simulate(DepthController(16), loads=[12] * 2000, step=10)
    assert sum(run.waits) > 0
    assert set(run.depths) == {START_DEPTH}


@pytest.mark.parametrize("slow", [10, 20])
def test_periodic_stall_is_absorbed_then_the_depth_settles(slow: int) -> None:
    # Every 50th batch takes ``slow`` times as long; the mean load is below the step.
    loads = [5 * slow if k % 50 == 49 else 5 for k in range(5000)]
    run = simulate(DepthController(32), loads=loads, step=10)
    late = slice(len(loads) // 2, None)
    assert max(run.depths) > START_DEPTH  # it grew
    assert sum(run.waits[late]) == 0  # ... enough to hide the stall
    assert changes(run.depths[late]) == 0  # ... and then stopped moving
    # No deeper than the stall needs: it covers slow * 5 ticks at 10 ticks a step.
    assert max(run.depths) <= slow * 5 // 10 + 3


def test_burst_then_steady_shrinks_back() -> None:
    loads = [200] + [5] * 20 + [300] + [5] * 3000
    run = simulate(DepthController(32), loads=loads, step=10)
    assert max(run.depths) > 10
    assert run.depths[-1] == START_DEPTH
