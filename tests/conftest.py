from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest
import torch
from hypothesis import settings

from dataloaderx import available_backends
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


@pytest.fixture(params=available_backends())
def backend(request: pytest.FixtureRequest) -> str:
    """Every backend that can run on this machine (a new one is tested automatically)."""
    name: str = request.param
    return name


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    """Fail any test that leaves a thread or a child process running."""
    threads = set(threading.enumerate())
    children = child_pids()
    yield
    gc.collect()
    left_threads, left_children = wait_until_clean(threads, children, within=5.0)
    assert not left_threads, f"threads left running: {left_threads}"
    assert not left_children, f"child processes left running: {describe_processes(left_children)}"


# Hypothesis: no example database in the repository, no per-example deadline (the
# machines running CI are slow and shared); a failure prints a blob to reproduce it.
settings.register_profile("dataloaderx", database=None, deadline=None, print_blob=True)
settings.load_profile("dataloaderx")
