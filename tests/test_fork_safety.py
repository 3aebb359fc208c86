"""A fork never copies a producer thread in the middle of an import.

``DataLoader`` forks its workers in ``iter(loader)``, possibly while the producer thread of
another iterator is importing a module; a worker forked then would wait forever for that
module's import lock. The fork guard makes the fork wait until the import is over.
"""

from __future__ import annotations

import gc
import importlib
import importlib.abc
import importlib.machinery
import json
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType, ModuleType

import pytest

from dataloaderx import _fork_guard
from tests.reliability_support import run_scenario

#: The scenario imports torch, forks four workers and holds an import for 1 s.
SCENARIO_SECONDS = 90.0
EXPECTED_VALUES = [list(range(start, start + 4)) for start in range(0, 24, 4)]


class HeldExec(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports of ``module`` from other threads than the main one wait for ``release``."""

    def __init__(self, module: str) -> None:
        self.module = module
        self.entered = threading.Event()
        self.release = threading.Event()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.module or threading.current_thread() is threading.main_thread():
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        self.entered.set()
        self.release.wait(timeout=30.0)


@pytest.fixture
def held_import(request: pytest.FixtureRequest) -> Iterator[tuple[HeldExec, threading.Thread]]:
    """A tracked thread importing a module that stays in its import until released."""
    name = f"_dataloaderx_held_{request.node.name.replace('[', '_').replace(']', '')}"
    finder = HeldExec(name)
    sys.meta_path.insert(0, finder)
    thread = threading.Thread(target=importlib.import_module, args=(name,), name="held-import")
    try:
        thread.start()
        _fork_guard.track(thread)
        assert finder.entered.wait(timeout=10.0)
        yield finder, thread
    finally:
        finder.release.set()
        thread.join(timeout=10.0)
        sys.meta_path.remove(finder)
        sys.modules.pop(name, None)


def test_a_stack_inside_an_import_is_recognised(
    held_import: tuple[HeldExec, threading.Thread],
) -> None:
    _, thread = held_import
    assert thread.ident is not None
    assert _fork_guard.importing(sys._current_frames()[thread.ident])
    assert not _fork_guard.importing(sys._current_frames()[threading.get_ident()])


def test_fork_wait_times_out_while_a_producer_stays_in_an_import(
    held_import: tuple[HeldExec, threading.Thread],
) -> None:
    assert _fork_guard.wait_for_producer_imports(timeout=0.05) is False


def test_fork_wait_ends_when_the_import_ends(
    held_import: tuple[HeldExec, threading.Thread],
) -> None:
    finder, _ = held_import
    released = threading.Timer(0.2, finder.release.set)
    released.start()
    try:
        assert _fork_guard.wait_for_producer_imports(timeout=20.0) is True
        assert finder.release.is_set()
    finally:
        released.join()


def test_fork_wait_returns_at_once_without_producers_importing() -> None:
    idle = threading.Thread(target=time.sleep, args=(0.5,))
    idle.start()
    _fork_guard.track(idle)
    try:
        assert _fork_guard.wait_for_producer_imports(timeout=0.0) is True
    finally:
        idle.join()


def test_fork_wait_does_not_wait_when_the_forking_thread_imports(
    held_import: tuple[HeldExec, threading.Thread], tmp_path: Path
) -> None:
    # A fork made while the forking thread itself imports a module: a producer may be
    # waiting for that very module, so waiting for the producer could never end.
    (tmp_path / "_dataloaderx_forks_on_import.py").write_text(
        "from dataloaderx import _fork_guard\n"
        "WAITED = _fork_guard.wait_for_producer_imports(timeout=5.0)\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        module = importlib.import_module("_dataloaderx_forks_on_import")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("_dataloaderx_forks_on_import", None)
    assert module.WAITED is True


def _scenario(backend: str, *flags: str) -> dict[str, object]:
    result = run_scenario("fork_during_import.py", [backend, *flags], timeout=SCENARIO_SECONDS)
    assert result.returncode == 0, result.stderr
    report: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return report


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_workers_forked_during_a_producer_import_start(backend: str) -> None:
    report = _scenario(backend)
    assert report["error"] is None
    assert report["producer_imported"] == report["producer_thread"]
    assert report["first"] == EXPECTED_VALUES
    assert report["second"] == EXPECTED_VALUES


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend_name", ["thread", "background"])
def test_without_the_guard_such_a_worker_hangs(backend_name: str) -> None:
    # The control: the same scenario with the guard off loses a worker to the import lock,
    # which DataLoader's timeout reports.
    report = _scenario(backend_name, "--unguarded")
    assert report["producer_imported"] is True
    assert isinstance(report["error"], str)
    assert "timed out" in report["error"]


@pytest.mark.parametrize("enabled", [True, False])
def test_frames_are_read_with_the_collector_paused(
    monkeypatch: pytest.MonkeyPatch, enabled: bool
) -> None:
    seen: list[bool] = []
    real = sys._current_frames

    def spy() -> dict[int, FrameType]:
        seen.append(gc.isenabled())
        return real()

    monkeypatch.setattr(sys, "_current_frames", spy)
    was_enabled = gc.isenabled()
    if not enabled:
        gc.disable()
    try:
        frames = _fork_guard._thread_frames()
        assert seen == [False]
        assert gc.isenabled() is enabled
    finally:
        if was_enabled:
            gc.enable()
    assert threading.get_ident() in frames
