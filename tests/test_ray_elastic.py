"""Elastic Ray workers (``worker_method="ray"``, ``num_workers="auto"``) on the session's Ray
cluster (a head with 4 CPUs, where the loop runs, and two worker nodes with 2 CPUs): the
batches of elastic worker threads whatever the count did, each batch's generators its own,
iterable datasets resized between epochs, exact resume across a resize, shrunk actors
ended, a lost actor during a shrink, leaving mid-resize (a break, an error, a close),
placement on the loop's node first, and the arguments' checks. Forced schedules
(``script``) replace the policy's decisions; the actors and their resizing are the real
ones."""

from __future__ import annotations

import gc
import json
import random
import re
import threading
import warnings
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy
import pytest
import torch

from dataloaderx import DataLoaderX
from dataloaderx.cli import main
from tests.elastic_support import Augmented, Script
from tests.helpers import Sharded, assert_same, wait_for

ray = pytest.importorskip("ray", reason="ray is not installed: pip install 'dataloaderx[ray]'")

from dataloaderx.workers.ray.elastic import ElasticRay  # noqa: E402 - after the skip
from dataloaderx.workers.ray.group import SlotState  # noqa: E402
from tests.ray_support import no_actors_or_threads_left, our_actors, places  # noqa: E402

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("ray_cluster")]


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    yield from no_actors_or_threads_left()


class Drawing(Augmented):
    """:class:`Augmented`'s item, then a draw from each of the process's global generators
    (``torch``, ``random``, ``numpy``), as an augmentation that uses them."""

    def __getitem__(self, index: int) -> torch.Tensor:
        draws = [float(torch.rand(())), random.random(), float(numpy.random.rand())]
        return torch.cat([super().__getitem__(index), torch.tensor(draws)])


def _auto(dataset: Any, **options: Any) -> DataLoaderX[Any]:
    worker_options = {"num_cpus": 0.25, "max_workers": 3, **options.pop("worker_options", {})}
    return DataLoaderX(
        dataset,
        batch_size=options.pop("batch_size", 2),
        num_workers="auto",
        worker_method="ray",
        worker_options=worker_options,
        generator=torch.Generator().manual_seed(7),
        **options,
    )


def _threads(size: int, epochs: int = 1) -> list[torch.Tensor]:
    """The index and batch-seeded draws of :class:`Augmented`'s items in each of ``epochs``
    epochs, from elastic worker threads that keep their count."""
    loader = DataLoaderX(
        Augmented(size),
        batch_size=2,
        num_workers="auto",
        worker_method="thread",
        generator=torch.Generator().manual_seed(7),
    )
    return [torch.cat(list(loader))[:, :3] for _ in range(epochs)]


def test_resizes_and_lost_actors_give_the_batches_of_elastic_threads(
    script: Script, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forced resizes, and at the shrink one actor that leaves and one that stays are
    killed: every batch comes once, in order, as elastic threads make it."""
    adjust = ElasticRay._adjust
    killed: list[str] = []

    def adjust_and_kill(pool: ElasticRay) -> None:
        adjust(pool)
        slots = pool._group.slots.values()
        leaving = [slot for slot in slots if slot.state is SlotState.LEAVING]
        staying = [slot for slot in slots if slot.state is SlotState.READY]
        if leaving and staying and not killed:
            for slot in (leaving[0], staying[0]):
                ray.kill(slot.handle, no_restart=True)
                killed.append(slot.name)

    monkeypatch.setattr(ElasticRay, "_adjust", adjust_and_kill)
    ran = script([3, 2])
    loader = _auto(Augmented(800, delay=0.02))
    epochs: list[torch.Tensor] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # On a loaded machine the third actor can start after the epoch's last batch: the
        # script then goes on in the next epoch, with the actors the loader kept.
        while len(killed) < 2 and len(epochs) < 4:
            epochs.append(torch.cat(list(loader)))
    assert wait_for(lambda: len(our_actors()) == 2), our_actors()  # those that left ended
    assert len(killed) == 2, (killed, ran)
    assert any("was lost" in str(each.message) for each in caught)
    assert {3, 2} <= set(ran), ran  # every count of the script ran
    for batches, made in zip(epochs, _threads(800, len(epochs)), strict=True):
        assert batches[:, 0].tolist() == list(range(800))  # in order, each once
        assert_same(batches[:, :3], made)  # each batch's draws its own
    assert len(set(torch.cat(epochs)[:, 3].tolist())) >= 3  # made by several actors


def test_resume_across_a_resize_is_exact_with_the_processs_generators(script: Script) -> None:
    """Resumed, and under other schedules, every batch draws the same from the batch's
    generators and from the process's global ones."""

    def values(batches: list[torch.Tensor]) -> torch.Tensor:
        whole = torch.cat(batches)
        return torch.cat([whole[:, :3], whole[:, 4:]], dim=1)  # not the worker's id

    script([1])
    whole = values(list(_auto(Drawing(300, delay=0.01))))
    script([])
    loader = _auto(Drawing(300, delay=0.01))
    iterator = iter(loader)
    taken = [next(iterator) for _ in range(60)]
    state = loader.state_dict()
    del iterator
    script([*[2] * 20, 1])
    loader.load_state_dict(state)  # on the actors the loader kept
    assert_same(values(taken + list(loader)), whole)
    assert len(set(whole[:, 3].tolist())) == len(whole)  # each item draws anew


def _ended(loader: DataLoaderX[Any]) -> bool:
    """Whether the loader's latest change of count ended idle actors: the thread that ends
    them records it once it has told them to end, which Ray may show first."""
    stats = loader.stats
    return (
        stats is not None
        and re.fullmatch(r"ended \d+ idle between epochs", stats.workers[-1][2]) is not None
    )


def _states(iterator: Any) -> set[SlotState]:
    """The states of the actors of ``iterator``'s pool now."""
    pool: ElasticRay = iterator._inner._pool
    with pool._lock:
        return {slot.state for slot in pool._group.slots.values()}


@pytest.mark.parametrize("moment", [SlotState.STARTING, SlotState.LEAVING])
@pytest.mark.parametrize("how", ["break", "error", "close"])
def test_leaving_during_a_resize_ends_every_actor(
    script: Script, how: str, moment: SlotState
) -> None:
    """The loop leaves (a ``break``, an exception, ``close()``) while an actor added starts,
    or while one removed still has tasks on hand: every actor and thread of the pool ends
    (the fixture checks), the loader's kept ones once it is let go."""
    # Each change makes the moment at once (from the start count, 2 here); the loop may
    # miss one: an actor leaving lasts as long as its tasks (four, 0.1 s each) take.
    script([3, 1] * 40 if moment is SlotState.STARTING else [1, 3] * 40)
    loader = _auto(
        Augmented(4000, delay=0.05), persistent_workers=how == "close", prefetch_factor=4
    )
    iterator = iter(loader)
    left_at: set[SlotState] = set()
    with pytest.raises(RuntimeError, match="left") if how == "error" else nullcontext():
        for _ in iterator:
            states = _states(iterator)
            if moment not in states:
                continue
            left_at = states
            if how == "close":
                iterator.close()
            elif how == "error":
                raise RuntimeError("left")
            break
    assert moment in left_at, "the loop never saw the pool mid-resize"
    del iterator, loader


def test_an_iterable_dataset_changes_its_actors_only_between_epochs(script: Script) -> None:
    script([1, 1, 1])
    loader = _auto(
        Sharded(40),
        batch_size=None,
        persistent_workers=True,
        worker_options={"placement": "remote_only"},
    )
    counts = []
    for _ in range(3):
        epoch = list(loader)
        assert loader.stats is not None
        workers = loader.stats.workers[0][1]
        counts.append(workers)
        fixed = DataLoaderX(
            Sharded(40), batch_size=None, num_workers=workers, worker_method="thread"
        )
        assert epoch == list(fixed), workers
    assert counts == [2, 1, 1]
    assert _nodes(loader) == [False]  # placement="remote_only": off the loop's node


@pytest.mark.parametrize(("persistent", "kept"), [(False, 0), (True, 2)])
def test_actors_idle_between_epochs_end_and_start_again(
    script: Script, persistent: bool, kept: int
) -> None:
    """Once an epoch's batches are all handed out, its actors idle past ``idle_timeout_s``
    end: all of them where the workers are not persistent, all but ``min_workers`` where
    they are; the next epoch runs the count again, with the same batches."""
    script([3])
    loader = _auto(
        Augmented(120, delay=0.01),
        persistent_workers=persistent,
        worker_options={"min_workers": 2, "idle_timeout_s": 0.2},
    )
    first = torch.cat(list(loader))
    assert wait_for(lambda: _ended(loader)), loader.stats
    assert wait_for(lambda: len(our_actors()) == kept), our_actors()
    assert loader.stats is not None
    at, workers, why = loader.stats.workers[-1]
    assert (workers, why) == (kept, f"ended {3 - kept} idle between epochs")
    assert [count for _, count, _ in loader.stats.workers][-2:] == [3, kept]
    iterator = iter(loader)
    assert wait_for(lambda: len(our_actors()) == 3), our_actors()  # started again
    second = torch.cat(list(iterator))
    assert loader.stats.workers[0][1:] == (3, "the count before the epoch's end")
    assert loader.stats.workers[0][0] > at
    assert second[:, 0].tolist() == first[:, 0].tolist() == list(range(120))
    del iterator


def test_a_read_ahead_ends_the_idle_actors_while_the_loop_takes_the_rest(script: Script) -> None:
    """With a read-ahead that holds the epoch, its batches are all made while the loop has
    taken 10: the actors all end then, and the loop takes the rest from the buffer, the
    batches of elastic threads; resumed after those 10, the rest is the same again."""
    script([])

    def loader() -> DataLoaderX[Any]:
        return _auto(
            Augmented(200, delay=0.005),
            worker_options={"min_workers": 1, "idle_timeout_s": 0},
            backend_options={"depth": 1_000_000, "max_bytes": "64MiB", "adaptive": False},
        )

    ahead = loader()
    batches: list[torch.Tensor] = []
    for batch in ahead:
        batches.append(batch)
        if len(batches) == 10:
            assert wait_for(lambda: not our_actors()), our_actors()
            state = ahead.state_dict()
    assert wait_for(lambda: _ended(ahead)), ahead.stats
    assert ahead.stats is not None
    assert ahead.stats.workers[-1][1] == 0
    whole = torch.cat(batches)
    assert_same(whole[:, :3], _threads(200)[0])
    resumed = loader()
    resumed.load_state_dict(state)
    assert_same(torch.cat(list(resumed))[:, :3], whole[20:, :3])  # 10 batches of 2


def test_a_loader_let_go_ends_its_idle_actors_and_their_timer_at_once(script: Script) -> None:
    """The actors kept between epochs wait out a long idle time in a timer thread; the next
    epoch's taking them cancels it, and so does the loader's end, which ends them too."""
    script([])
    loader = _auto(Augmented(40), worker_options={"idle_timeout_s": 600})

    def timers() -> list[threading.Thread]:
        threads = threading.enumerate()
        return [each for each in threads if each.name.startswith("dataloaderx-kept")]

    list(loader)
    assert wait_for(lambda: len(timers()) == 1), timers()
    list(loader)  # takes the actors kept: the first epoch's timer ends, the second's runs
    assert wait_for(lambda: len(timers()) == 1), timers()
    left = timers()
    assert our_actors()
    del loader
    gc.collect()
    assert wait_for(lambda: not any(each.is_alive() for each in left) and not our_actors())


def test_an_iterable_datasets_idle_actors_end_from_its_last_shard(script: Script) -> None:
    """Its shards are the worker ids: those that end between epochs are the last ones, and
    the next epoch's shards are a fixed count's again."""
    script([])
    loader = _auto(
        Sharded(40),
        batch_size=None,
        persistent_workers=True,
        worker_options={"idle_timeout_s": 0.1, "min_workers": 1, "max_workers": 2},
    )
    for _ in range(2):
        epoch = list(loader)
        assert loader.stats is not None
        assert loader.stats.workers[0][1] == 2
        fixed = DataLoaderX(Sharded(40), batch_size=None, num_workers=2, worker_method="thread")
        assert epoch == list(fixed)
        assert wait_for(lambda: len(our_actors()) == 1), our_actors()
        assert "-w0-" in our_actors()[0]


def test_idle_actors_stay_as_long_as_one_takes_to_start(script: Script) -> None:
    """By default the idle time allowed is how long an actor of the loader took to start
    (the median): what starting one again would cost."""
    script([2])
    loader = _auto(Augmented(60, delay=0.01), worker_options={"min_workers": 1})
    iterator = iter(loader)
    list(iterator)
    pool = iterator._pool  # type: ignore[attr-defined]
    with pool._kept._changed:  # kept: the timer that ends them reads them under this lock
        group = pool._group
        starts = [slot.start_seconds or 0.0 for slot in group.slots.values()]
        assert len(starts) >= 2, starts
        assert all(starts), starts  # each measured
        assert min(starts) <= group.start_seconds <= max(starts)
    assert wait_for(lambda: _ended(loader), within=30 + group.start_seconds), loader.stats
    assert wait_for(lambda: not our_actors()), our_actors()
    assert loader.stats is not None
    assert loader.stats.workers[-1][1:] == (0, f"ended {len(starts)} idle between epochs")


def _nodes(loader: DataLoaderX[Any]) -> list[bool]:
    """For each actor alive, whether it runs on the loop's node."""
    host = ray.get_runtime_context().get_node_id()
    return [place.node_id == host for place in places(loader)]


def test_actors_go_to_the_loops_node_first_and_leave_the_others_first(script: Script) -> None:
    script([3, 2])
    loader = _auto(
        Augmented(2000, delay=0.02), persistent_workers=True, worker_options={"num_cpus": 2}
    )
    seen, left = [], []
    for count, _ in enumerate(loader):
        if not seen and len(our_actors()) == 3:
            seen = sorted(_nodes(loader))
        shrunk = loader._scaling is not None and loader._scaling.workers == 2
        if seen and shrunk and count % 10 == 0 and len(our_actors()) == 2:
            left = _nodes(loader)
            break
    assert seen == [False, True, True]  # the head's 4 CPUs hold two
    assert left == [True, True]  # the one on another node left first


def test_host_only_runs_what_the_loops_node_has_room_for(script: Script) -> None:
    script([3])
    loader = _auto(
        Augmented(2000, delay=0.02),
        persistent_workers=True,
        worker_options={"num_cpus": 2, "placement": "host_only"},
    )
    iterator = iter(loader)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in iterator:
            assert loader.stats is not None
            if loader.stats.workers[-1][1:] == (2, "ran 2: no room for more"):
                break
        for _ in range(10):  # a warning in the producer thread reaches the loop with a batch
            next(iterator)
    assert any(
        re.search(r"no room for more than 2 .*'host_only'", str(each.message)) for each in caught
    )
    assert _nodes(loader) == [True, True]
    del iterator


def test_the_most_actors_are_what_the_cluster_cpus_hold() -> None:
    cpus = int(ray.cluster_resources()["CPU"])  # 4 + 2 + 2
    for num_cpus, most in [(0.5, 2 * cpus), (1, cpus), (3, cpus // 3)]:
        loader = DataLoaderX(
            Augmented(),
            num_workers="auto",
            worker_method="ray",
            worker_options={"num_cpus": num_cpus},
        )
        assert loader.num_workers == most, num_cpus


@pytest.mark.parametrize(
    ("num_workers", "options", "pattern"),
    [
        (2, {"placement": "host_only"}, r"placement='host_only' does not apply .* fixed count"),
        ("auto", {"scheduling_strategy": "SPREAD"}, r"scheduling_strategy='SPREAD' .*'auto'"),
        ("auto", {"placement": "here"}, r"placement.* one of 'host_first', .*got 'here'"),
        (2, {"idle_timeout_s": 5}, r"idle_timeout_s=5 does not apply .* fixed count: use "),
        ("auto", {"idle_timeout_s": -1}, r"\['idle_timeout_s'\] must be a number >= 0, got -1"),
    ],
)
def test_bad_elastic_ray_arguments_name_the_fix(
    num_workers: Any, options: dict[str, Any], pattern: str
) -> None:
    with pytest.raises(ValueError, match=pattern):
        DataLoaderX(
            Augmented(), num_workers=num_workers, worker_method="ray", worker_options=options
        )


def test_bench_auto_runs_each_backend_with_elastic_ray_workers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(
        [
            "bench",
            *("--dataset", "tests.bench_fixtures:tiny", "--step", "tests.bench_fixtures:noop"),
            *("--batches", "4", "--rounds", "1", "--no-progress", "--json"),
            *("--backends", "thread", "--num-workers", "auto", "--worker-method", "ray"),
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    rows = [(row["loader"], row["worker_method"]) for row in json.loads(out)["results"]]
    assert rows == [("DataLoader", "multiprocessing"), ("thread", "thread"), ("thread", "ray")]


@pytest.mark.parametrize("suffix", ["yaml", "mapping"])
def test_elastic_ray_workers_from_a_file_or_a_mapping(tmp_path: Path, suffix: str) -> None:
    config: Any = {
        "num_workers": "auto",
        "worker_method": "ray",
        "worker_options": {"max_workers": 6, "num_cpus": 0.5, "placement": "host_only"},
    }
    if suffix == "yaml":
        config = tmp_path / "loader.yaml"
        config.write_text(
            "num_workers: auto\nworker_method: ray\n"
            "worker_options: {max_workers: 6, num_cpus: 0.5, placement: host_only}\n"
        )
    loader = DataLoaderX.from_config(Augmented(), config)
    assert loader._scaling is not None
    assert loader._scaling.bounds[:2] == (1, 6)
    assert loader.num_workers == 6
    assert loader._workers.options.placement == "host_only"
