"""``worker_method="ray"`` under faults: every one survived, or a clear error in bounded time.

On the session's Ray cluster (``ray_cluster`` in ``conftest.py``), against a real Ray: lost
actors of an iterable dataset, a lost node, a batch that kills its worker, lost results,
an actor that never starts, a batch that holds its actor's GIL, an interrupt while an
epoch starts, a group nothing holds, and a Ray shut down and started again between epochs.
"""

from __future__ import annotations

import ctypes
import gc
import os
import signal
import time
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from dataloaderx import DataLoaderX
from tests.helpers import (
    RangeDataset,
    Sharded,
    SlowDataset,
    assert_same,
    run_python_without_session_ray,
)

ray = pytest.importorskip("ray", reason="ray is not installed: pip install 'dataloaderx[ray]'")

from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

from dataloaderx.workers.contract import Outcome, WorkerSetup  # noqa: E402
from dataloaderx.workers.ray import heartbeat  # noqa: E402 - imports ray
from dataloaderx.workers.ray.group import ActorGroup  # noqa: E402
from dataloaderx.workers.ray.options import RayOptions  # noqa: E402
from tests.ray_support import no_actors_or_threads_left, our_actors, places  # noqa: E402

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.usefixtures("ray_cluster"),
    pytest.mark.filterwarnings("ignore:.*was lost:RuntimeWarning"),
]

RAY = {"worker_method": "ray"}


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    yield from no_actors_or_threads_left()


def first_column(batches: list[torch.Tensor]) -> list[list[int]]:
    return [batch[:, 0].tolist() if batch.dim() > 1 else batch.tolist() for batch in batches]


# 1. Iterable datasets: a lost worker ends its epoch only ------------------------------------


def test_an_iterable_worker_lost_between_epochs_is_replaced_for_the_next() -> None:
    expected = list(DataLoader(Sharded(12), batch_size=2, num_workers=2))
    loader = DataLoaderX(Sharded(12), batch_size=2, num_workers=2, **RAY)
    assert_same(list(loader), expected)
    os.kill(places()[0].pid, signal.SIGKILL)
    with pytest.warns(RuntimeWarning, match=r"worker 0 .*was lost"):
        assert_same(list(loader), expected)
    assert_same(list(loader), expected)


def test_an_iterable_worker_lost_mid_epoch_fails_that_epoch_only() -> None:
    expected = list(DataLoader(Sharded(400), batch_size=2, num_workers=2))
    loader = DataLoaderX(Sharded(400), batch_size=2, num_workers=2, **RAY)
    iterator = iter(loader)
    next(iterator)
    os.kill(places()[0].pid, signal.SIGKILL)
    with pytest.raises(RuntimeError, match=r"worker 0 .*was lost.*the next one starts on a new"):
        list(iterator)
    assert_same(list(loader), expected)  # the next epoch, complete, on a new actor


# 2. A batch that kills its worker -----------------------------------------------------------


class Deadly(RangeDataset):
    """Item 5 ends its process, as a crash in native code does, a while after the actor's
    previous result left: a death right after it could lose that result too, and the
    death would then be the previous task's."""

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == 5:
            time.sleep(1.0)
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(index)


def test_a_batch_that_kills_two_workers_is_an_error_naming_it() -> None:
    loader = DataLoaderX(Deadly(12), batch_size=2, num_workers=2, **RAY)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(RuntimeError) as raised:
            list(loader)
    message = str(raised.value)
    assert "DataLoader worker 0's batch of indices [4, 5] ended the process of 2 Ray" in message
    assert message.count("ActorDiedError") == 2
    lost = [w for w in caught if "was lost" in str(w.message)]
    assert len(lost) == 1  # the first death: a replacement; the second: the error, no more


# 3. Bounded waits and retries ---------------------------------------------------------------


def test_results_lost_again_and_again_are_an_error_after_three_tries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every task result is taken from the object store, then reported lost (as a node that
    # held it went away would make it): the task is sent again twice, then it is an error.
    real_get, tries = ray.get, []

    def lossy_get(refs: Any, **kwargs: Any) -> Any:
        value = real_get(refs, **kwargs)
        if isinstance(value, tuple) and value and isinstance(value[0], Outcome):
            tries.append(value)
            raise ray.exceptions.ObjectLostError(refs.hex(), "", "")
        return value

    loader = DataLoaderX(RangeDataset(6), batch_size=2, num_workers=1, prefetch_factor=1, **RAY)
    monkeypatch.setattr(ray, "get", lossy_get)
    with pytest.raises(RuntimeError, match=r"batch of indices \[0, 1\] .*lost .*sent 3 times"):
        next(iter(loader))
    assert len(tries) == 3


def test_an_actor_that_never_starts_is_an_error_after_the_placement_timeout() -> None:
    head = ray.get_runtime_context().get_node_id()
    options = {
        "resources": {"nowhere": 1},  # no node has it: the actor waits to be placed
        "scheduling_strategy": NodeAffinitySchedulingStrategy(head, soft=True),
        "placement_timeout_s": 2.0,
    }
    loader = DataLoaderX(RangeDataset(4), num_workers=1, worker_options=options, **RAY)
    with pytest.raises(RuntimeError, match=r"worker 0 .*did not start on the Ray cluster within"):
        next(iter(loader))


class HoldsTheGil(Dataset[torch.Tensor]):
    """Item 1 holds its process's GIL for ``seconds`` (a C call that keeps it)."""

    def __init__(self, seconds: int) -> None:
        self.seconds = seconds

    def __len__(self) -> int:
        return 3

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == 1:
            ctypes.PyDLL(None).sleep(self.seconds)
        return torch.tensor([index])


def test_a_batch_that_holds_the_gil_past_the_liveness_limit_is_no_lost_cluster(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The cluster's liveness is asked of Ray's own servers, not of the actor's Python. The
    # limit is made short here, so that placement_timeout_s (the default) still leaves the
    # actor all the time it needs to start on a loaded machine.
    monkeypatch.setattr(heartbeat, "SILENCE_SECONDS", 2.0)
    loader = DataLoaderX(HoldsTheGil(6), num_workers=1, **RAY)
    assert [int(batch) for batch in loader] == [0, 1, 2]


# 4. Nothing leaks ---------------------------------------------------------------------------


def test_an_interrupt_as_an_epoch_takes_its_actors_leaks_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loader = DataLoaderX(RangeDataset(8), batch_size=2, num_workers=2, **RAY)
    list(loader)  # the actors are kept
    kept = set(our_actors())

    def interrupted(self: ActorGroup) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(ActorGroup, "drop_abandoned", interrupted)
    with pytest.raises(KeyboardInterrupt):
        iter(loader)
    monkeypatch.undo()
    assert set(our_actors()) == kept  # given back, not lost
    assert len(list(loader)) == 4
    assert set(our_actors()) == kept


def test_a_group_nothing_holds_ends_its_actors() -> None:
    dataset = RangeDataset(4)
    setup = WorkerSetup(0, dataset, True, torch.utils.data.default_collate, False, None, 2, 0, None)
    group = ActorGroup(RayOptions(num_cpus=0.5), setup, make_room=lambda: False)
    assert len(our_actors()) == 2
    del group
    gc.collect()  # the group in no cycle: gone already; the check that follows waits


_AGAIN = """
import sys
import ray
from dataloaderx import DataLoaderX
from tests.helpers import RangeDataset

loader = DataLoaderX(RangeDataset(8), batch_size=4, num_workers=2, worker_method="ray",
                     worker_options={"num_cpus": 0.5})
for _ in range(2):
    ray.init(address=sys.argv[1])
    print([batch[:, 0].tolist() for batch in loader])
    ray.shutdown()
"""


def test_ray_shut_down_and_started_again_between_epochs_is_noticed(ray_cluster: Any) -> None:
    done = run_python_without_session_ray(
        f"import sys; sys.argv = ['-', {ray_cluster.address!r}]\n{_AGAIN}", timeout=150
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines() == ["[[0, 1, 2, 3], [4, 5, 6, 7]]"] * 2


# 5. A lost node ------------------------------------------------------------------------------


def test_a_lost_node_mid_epoch_and_the_epoch_completes_on_the_survivors(
    ray_cluster: Any,
) -> None:
    # One worker on a node of its own, which the cluster loses mid-epoch: its batches are
    # made again by the others, and its replacement starts where its bundle is placed.
    doomed = ray_cluster.add_node(num_cpus=2, resources={"loader_node": 2})
    ray_cluster.wait_for_nodes()
    try:
        options = {"resources": {"loader_node": 1}, "num_cpus": 0.5}
        dataset = SlowDataset(60, 0.02)
        expected = first_column(list(DataLoader(dataset, batch_size=2)))
        loader = DataLoaderX(dataset, batch_size=2, num_workers=3, worker_options=options, **RAY)
        iterator = iter(loader)
        got = [next(iterator) for _ in range(4)]
        assert len({place.node_id for place in places()}) == 3  # one per node
        ray_cluster.remove_node(doomed)
        doomed = None
        with pytest.warns(RuntimeWarning, match=r"was lost"):
            got.extend(iterator)
        assert first_column(got) == expected
    finally:
        if doomed is not None:
            ray_cluster.remove_node(doomed)
