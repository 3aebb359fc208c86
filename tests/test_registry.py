"""The backend registry: decorator, lookups, read-only view and entry-point plugins."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

import dataloaderx
from dataloaderx import (
    Backend,
    BackendUnavailableError,
    BatchStream,
    DataLoaderX,
    UnknownBackendError,
    available_backends,
    get_backend,
    register_backend,
    registered_backends,
    registry,
)
from dataloaderx.backends.background import BackgroundBackend
from dataloaderx.backends.sync import SyncBackend
from dataloaderx.backends.thread import ThreadBackend
from dataloaderx.workers import registry as worker_methods
from tests.helpers import RangeDataset


class Doubling(Backend):
    """Doubles every batch, without prefetching."""

    def __init__(self, *, factor: int = 2) -> None:
        self.factor = factor

    def open(self, source: Iterator[Any]) -> BatchStream[Any]:
        return (batch * self.factor for batch in source)


@pytest.fixture
def clean_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Restore the registry's private state after a test that registers backends."""
    entries = dict(registry._entries)
    aliases = dict(registry._aliases)
    yield
    registry._entries.clear()
    registry._entries.update(entries)
    registry._aliases.clear()
    registry._aliases.update(aliases)


@pytest.fixture
def fake_plugins(
    monkeypatch: pytest.MonkeyPatch, clean_registry: None
) -> Iterator[list[importlib.metadata.EntryPoint]]:
    """Serve a controllable list of entry points and rescan them on the next lookup."""
    plugins: list[importlib.metadata.EntryPoint] = []

    def entry_points(*, group: str) -> list[importlib.metadata.EntryPoint]:
        assert group == registry.ENTRY_POINT_GROUP
        return list(plugins)

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    monkeypatch.setattr(registry, "_plugins_scanned", False)
    yield plugins
    monkeypatch.setattr(registry, "_plugins_scanned", False)


def test_builtins_and_aliases() -> None:
    assert get_backend("sync") is SyncBackend
    assert get_backend("none") is SyncBackend
    assert get_backend("thread") is ThreadBackend
    assert get_backend("background") is BackgroundBackend
    assert get_backend("prefetch_generator") is BackgroundBackend
    assert {"sync", "thread", "background"} <= set(available_backends())
    assert "none" not in available_backends()


def test_registered_backends_is_read_only() -> None:
    view = registered_backends()
    assert view["thread"].backend_class is ThreadBackend
    assert view["background"].aliases == ("prefetch_generator",)
    with pytest.raises(TypeError):
        view["mine"] = view["thread"]  # type: ignore[index]


def test_unknown_backend_lists_names_and_suggests() -> None:
    with pytest.raises(UnknownBackendError) as info:
        get_backend("thraed")
    message = str(info.value)
    assert "'thraed'" in message
    assert "'sync', " in message
    assert "'thread'" in message
    assert "'background'" in message
    assert "did you mean 'thread'?" in message
    assert isinstance(info.value, ValueError)


def test_decorator_registers_and_loader_uses_it(clean_registry: None) -> None:
    register_backend("doubling", aliases=("x2",))(Doubling)
    assert Doubling.name == "doubling"
    assert get_backend("x2") is Doubling
    assert "doubling" in available_backends()
    loader = DataLoaderX(RangeDataset(4), batch_size=2, backend="x2", backend_options={"factor": 3})
    assert [batch[:, 0].tolist() for batch in loader] == [[0, 3], [6, 9]]


def test_duplicate_names_are_rejected(clean_registry: None) -> None:
    with pytest.raises(ValueError, match="'thread' is already registered by"):
        register_backend("thread")(Doubling)
    with pytest.raises(ValueError, match=r"'none' is already registered by .*SyncBackend"):
        register_backend("fresh", aliases=("none",))(Doubling)
    assert "fresh" not in registered_backends()


@pytest.mark.parametrize("name", ["", "Upper", "with space", 3])
def test_bad_names_are_rejected(name: Any) -> None:
    with pytest.raises(ValueError, match=f"backend name must be .*got {name!r}"):
        register_backend(name)


def test_decorating_a_non_backend_is_rejected(clean_registry: None) -> None:
    with pytest.raises(TypeError, match=r"subclass of dataloaderx\.Backend, got <class 'int'>"):
        register_backend("integer")(int)  # type: ignore[type-var]


def _entry_point(name: str, value: str) -> importlib.metadata.EntryPoint:
    return importlib.metadata.EntryPoint(name=name, value=value, group=registry.ENTRY_POINT_GROUP)


def test_plugin_is_loaded_lazily_by_name(
    fake_plugins: list[importlib.metadata.EntryPoint],
) -> None:
    fake_plugins.append(_entry_point("doubling", "tests.test_registry:Doubling"))
    entry = registered_backends()["doubling"]
    assert entry.backend_class is None  # listed, not imported yet
    assert get_backend("doubling") is Doubling
    assert registered_backends()["doubling"].backend_class is Doubling
    assert Doubling.name == "doubling"


def test_broken_plugin_fails_only_when_used(
    fake_plugins: list[importlib.metadata.EntryPoint],
) -> None:
    fake_plugins.append(_entry_point("broken", "no_such_module_for_dataloaderx:Backend"))
    assert "broken" in registered_backends()
    assert "broken" not in available_backends()
    assert get_backend("thread") is ThreadBackend
    with pytest.raises(BackendUnavailableError) as info:
        DataLoaderX(RangeDataset(4), backend="broken")
    message = str(info.value)
    assert "'broken'" in message
    assert "no_such_module_for_dataloaderx:Backend" in message
    assert "ModuleNotFoundError" in message
    assert isinstance(info.value.__cause__, ModuleNotFoundError)


def test_plugin_that_is_not_a_backend_is_reported(
    fake_plugins: list[importlib.metadata.EntryPoint],
) -> None:
    fake_plugins.append(_entry_point("notabackend", "tests.helpers:RangeDataset"))
    with pytest.raises(BackendUnavailableError, match=r"not a dataloaderx\.Backend subclass"):
        get_backend("notabackend")


def test_builtin_wins_a_name_clash(fake_plugins: list[importlib.metadata.EntryPoint]) -> None:
    fake_plugins.append(_entry_point("thread", "tests.test_registry:Doubling"))
    with pytest.warns(RuntimeWarning, match="registers backend 'thread'.*ignored"):
        assert get_backend("thread") is ThreadBackend


def test_import_reads_no_entry_points() -> None:
    code = (
        "import importlib.metadata as m\n"
        "real = m.entry_points\n"
        "def guarded(**kw):\n"
        "    if kw.get('group') == 'dataloaderx.backends':\n"
        "        raise RuntimeError('dataloaderx entry points read at import')\n"
        "    return real(**kw)\n"
        "m.entry_points = guarded\n"
        "import dataloaderx\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_public_names() -> None:
    for name in dataloaderx.__all__:
        assert hasattr(dataloaderx, name)


def test_a_builtin_worker_method_reads_no_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    read: list[object] = []
    real = importlib.metadata.entry_points

    def recording(**params: Any) -> Any:
        read.append(params.get("group"))
        return real(**params)

    monkeypatch.setattr(importlib.metadata, "entry_points", recording)
    monkeypatch.setattr(worker_methods, "_scanned", False)
    DataLoaderX(RangeDataset(4), batch_size=2, num_workers=1, worker_method="thread")
    DataLoaderX(RangeDataset(4), batch_size=2, num_workers=1, worker_method="multiprocessing")
    assert worker_methods.ENTRY_POINT_GROUP not in read
    with pytest.raises(ValueError, match=r"one of 'multiprocessing', 'thread', 'ray'.*'threads'"):
        DataLoaderX(RangeDataset(4), num_workers=1, worker_method="threads")
    assert read.count(worker_methods.ENTRY_POINT_GROUP) == 1
