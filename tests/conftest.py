from __future__ import annotations

import gc
import importlib.util
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from hypothesis import settings

from dataloaderx import available_backends
from dataloaderx.util.reaper import reaper_pid
from dataloaderx.workers.elastic import scaling as scaling_module
from dataloaderx.workers.elastic.policy import Change, ScalePolicy, Window
from tests.elastic_support import Script
from tests.helpers import child_pids, describe_processes, wait_until_clean


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; torch.cuda.is_available() is False")
    for item in items:
        # The marker only: ``item.keywords`` also holds node names and parameter ids
        # (a folder or a backend named "cuda").
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


#: Test modules whose Ray runs in child processes of their own (scenario scripts), never the
#: session's cluster: they need not wait for the session's Ray tests.
_OWN_RAY = frozenset(
    {
        "test_ray_local.py",
        "test_ray_train.py",
        "test_ray_cluster_loss.py",
        "test_ray_elastic_starts.py",
    }
)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``pytest -n N`` (the default, ``pyproject.toml``): the tests spread over N worker
    processes, except those whose id names Ray, which run one after another in one of
    them: one Ray cluster for the session (``ray_cluster``), as without workers. A module
    of :data:`_OWN_RAY` runs as one unit of its own, on any worker. (Not ``--dist
    loadgroup``: pytest-xdist 3.8 cannot rename pytest 9's node ids.)"""
    from xdist.scheduler import LoadScopeScheduling

    class RayTestsTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.partition("::")[0]
            if module.rpartition("/")[2] in _OWN_RAY:
                return module
            return "ray" if "ray" in nodeid.lower() else nodeid

    return RayTestsTogether(config, log)


def pytest_collection_finish(session: pytest.Session) -> None:
    _freeze_what_lives_on()


def _freeze_what_lives_on() -> None:
    """Take what is alive now (modules, what their imports made, the session's fixtures)
    out of the collector's sight (``gc.freeze``). Every test's leak check collects, and a
    collection that walks the few hundred thousand objects torch, Ray and the frameworks
    make at import takes 0.15-0.3 s on a 2-core machine; what a test makes, and drops in
    a reference cycle, is still collected."""
    gc.collect()
    gc.freeze()


@pytest.fixture(params=available_backends())
def backend(request: pytest.FixtureRequest) -> str:
    """Every backend that can run on this machine (a new one is tested automatically)."""
    name: str = request.param
    return name


#: The processes of the test session's Ray cluster (``ray_cluster``): they, and the workers
#: they start, are Ray's; the Ray tests count the actors they leave themselves.
_RAY_PROCESSES: set[int] = set()
#: The threads its driver runs in this process, as long as the session.
_RAY_THREADS: set[threading.Thread] = set()


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """One Ray cluster on this machine for the whole session, the driver connected: a head
    (4 CPUs) and two worker nodes with 2 CPUs and 2 units of the resource ``loader_node``
    each. Skipped, with the reason, where Ray is not installed."""
    if importlib.util.find_spec("ray") is None:
        pytest.skip("ray is not installed: pip install 'dataloaderx[ray]'")
    import ray
    from ray.cluster_utils import Cluster

    before, threads = child_pids(), set(threading.enumerate())
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 4, "include_dashboard": False},
    )
    for _ in range(2):
        cluster.add_node(num_cpus=2, resources={"loader_node": 2})
    # The actors import this repository's tests (the datasets they hold) as the driver does.
    root = str(Path(__file__).resolve().parent.parent)
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    ray.init(
        address=cluster.address,
        runtime_env={"env_vars": {"PYTHONPATH": path}},
        log_to_driver=False,
    )
    _RAY_PROCESSES.update(child_pids() - before)
    _RAY_THREADS.update(set(threading.enumerate()) - threads)
    _freeze_what_lives_on()
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        _RAY_PROCESSES.clear()
        _RAY_THREADS.clear()


@pytest.fixture(params=["thread", "ray"])
def worker_method_arguments(request: pytest.FixtureRequest) -> dict[str, Any]:
    """``worker_method`` (and ``worker_options``) of each worker method other than worker
    processes; ``"ray"`` on the session's Ray cluster (skipped where Ray is not installed)."""
    if request.param == "thread":
        return {"worker_method": "thread"}
    request.getfixturevalue("ray_cluster")
    return {"worker_method": "ray", "worker_options": {"num_cpus": 0.5}}


def _own_children() -> set[int]:
    """Child processes, less the session's Ray processes and those they started, and the
    reaper, which lives as long as this process (``dataloaderx/util/reaper.py``)."""
    reaper = reaper_pid()
    return {pid for pid in child_pids() if pid != reaper and not _under(pid, _RAY_PROCESSES)}


def _under(pid: int, roots: set[int]) -> bool:
    if not roots:
        return False
    try:
        chain = [pid, *(parent.pid for parent in psutil.Process(pid).parents())]
    except psutil.Error:
        return False
    return any(each in roots for each in chain)


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    """Fail any test that leaves a thread or a child process running."""
    threads = set(threading.enumerate())
    children = _own_children()
    yield
    gc.collect()
    left_threads, left_children = wait_until_clean(
        threads | _RAY_THREADS, children, within=5.0, list_children=_own_children
    )
    assert not left_threads, f"threads left running: {left_threads}"
    assert not left_children, f"child processes left running: {describe_processes(left_children)}"


# Hypothesis: no example database in the repository, no per-example deadline (the
# machines running CI are slow and shared); a failure prints a blob to reproduce it.
settings.register_profile("dataloaderx", database=None, deadline=None, print_blob=True)
settings.load_profile("dataloaderx")


@pytest.fixture
def script(monkeypatch: pytest.MonkeyPatch) -> Script:
    """Forced schedules for elastic pools: every window decides the next count of a script
    (then no change), in place of the policy (``ScalePolicy.observe``, and no start from the
    first batches' CPU share); returns the counts each window ran at, as they come. The pool
    and its resizing are the real ones."""
    monkeypatch.setattr(scaling_module, "WINDOW_SECONDS", 0.0)
    monkeypatch.setattr(scaling_module, "WINDOW_BATCHES", 1)

    def install(counts: list[int]) -> list[int]:
        left = iter(counts)
        ran: list[int] = []

        def observe(policy: ScalePolicy, window: Window) -> Change | None:
            ran.append(window.workers)
            count = next(left, None)
            return None if count is None else Change(count, f"scripted: {count}")

        monkeypatch.setattr(ScalePolicy, "observe", observe)
        monkeypatch.setattr(ScalePolicy, "start", lambda *_: None)
        return ran

    return install
