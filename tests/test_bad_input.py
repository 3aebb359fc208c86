"""Every invalid argument or config fails at construction with a clear, documented error.

Each row: how to provoke the error, the exception type, and the fragments the message must
hold (the bad value, shown with ``repr``, and the valid choices or the fix). No row may
start a thread or a process.
"""

from __future__ import annotations

import importlib.metadata
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data.datapipes.iter import IterableWrapper

import dataloaderx.registry as registry
from dataloaderx import (
    BackendUnavailableError,
    ConfigError,
    DataLoaderX,
    UnknownBackendError,
    available_backends,
)
from dataloaderx.options import ENV_VAR
from dataloaderx.registry import ENTRY_POINT_GROUP, get_backend
from tests.helpers import RangeDataset, child_pids
from tests.reliability_support import takes_depth

pytestmark = pytest.mark.timeout(60)

DATASET = RangeDataset(8)


@dataclass(frozen=True)
class Case:
    """One invalid input: ``build(tmp_path)`` must raise ``error`` with ``fragments`` in it."""

    build: Callable[[Path], object]
    error: type[Exception]
    fragments: tuple[str, ...]


def _from_file(name: str, text: str) -> Callable[[Path], object]:
    def build(tmp_path: Path) -> object:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return DataLoaderX.from_config(DATASET, path)

    return build


def _loader(**kwargs: Any) -> Callable[[Path], object]:
    return lambda _tmp_path: DataLoaderX(DATASET, num_workers=2, **kwargs)


def _config(mapping: dict[str, Any]) -> Callable[[Path], object]:
    return lambda _tmp_path: DataLoaderX.from_config(DATASET, mapping)


CASES: dict[str, Case] = {
    "unknown backend": Case(
        _loader(backend="threads"),
        UnknownBackendError,
        ("'threads'", "available backends", "'thread'", "'sync'", "did you mean 'thread'"),
    ),
    "unknown backend in a mapping": Case(
        _loader(backend={"name": "bogus"}), UnknownBackendError, ("'bogus'", "'thread'")
    ),
    "backend of the wrong type": Case(
        _loader(backend=3), TypeError, ("3", "int", "backend name", "mapping with a 'name' key")
    ),
    "backend mapping without name": Case(
        _loader(backend={"depth": 2}), ValueError, ("{'depth': 2}", "'name'", "{'name': 'thread'")
    ),
    "backend mapping with a non-str name": Case(
        _loader(backend={"name": 2}), TypeError, ("'name'", "2", "int")
    ),
    "misspelt option": Case(
        _loader(backend="thread", backend_options={"deph": 4}),
        TypeError,
        ("'deph'", "valid options: 'depth'", "did you mean 'depth'"),
    ),
    "misspelt option in a mapping": Case(
        _loader(backend={"name": "background", "dpth": 4}),
        TypeError,
        ("'dpth'", "'depth'"),
    ),
    "adaptive not a bool": Case(
        _loader(backend="thread", backend_options={"adaptive": "no"}),
        TypeError,
        ("'thread'", "'adaptive'", "True or False", "'no'", "str"),
    ),
    "adaptive not a bool for auto": Case(
        _loader(backend={"name": "auto", "adaptive": 0}),
        TypeError,
        ("'auto'", "'adaptive'", "True or False", "0", "int"),
    ),
    "option for a backend without options": Case(
        _loader(backend="sync", backend_options={"depth": 2}),
        TypeError,
        ("'depth'", "'sync'", "valid options: 'stats'"),
    ),
    "backend_options not a mapping": Case(
        _loader(backend="thread", backend_options=[("depth", 2)]),
        TypeError,
        ("backend_options", "[('depth', 2)]", "list", "mapping"),
    ),
    "config file missing": Case(
        lambda tmp_path: DataLoaderX.from_config(DATASET, tmp_path / "absent.yaml"),
        FileNotFoundError,
        ("absent.yaml", "does not exist"),
    ),
    "config file suffix unsupported": Case(
        _from_file("loader.ini", "[x]\n"),
        ConfigError,
        ("loader.ini", "'.ini'", "'.yaml'", "'.toml'", "'.json'"),
    ),
    "malformed YAML": Case(
        _from_file("loader.yaml", "batch_size: [4\nbackend: thread\n"),
        ConfigError,
        ("loader.yaml", "not valid YAML"),
    ),
    "malformed TOML": Case(
        _from_file("loader.toml", "batch_size = = 4\n"),
        ConfigError,
        ("loader.toml", "not valid TOML"),
    ),
    "malformed JSON": Case(
        _from_file("loader.json", '{"batch_size": 4,}'),
        ConfigError,
        ("loader.json", "not valid JSON"),
    ),
    "config file not a mapping": Case(
        _from_file("loader.json", "[1, 2]"), ConfigError, ("loader.json", "mapping", "[1, 2]")
    ),
    "unknown config key": Case(
        _config({"batch_size": 2, "num_worker": 2}),
        ConfigError,
        ("'num_worker'", "did you mean 'num_workers'", "Valid keys", "'backend'"),
    ),
    "unknown config key in a file": Case(
        _from_file("loader.toml", "batch_size = 2\nbakend = 'thread'\n"),
        ConfigError,
        ("'bakend'", "did you mean 'backend'"),
    ),
    "config naming another class": Case(
        _config({"_target_": "torch.utils.data.DataLoader"}),
        ConfigError,
        ("'torch.utils.data.DataLoader'", "'dataloaderx.DataLoaderX'"),
    ),
    "config holding the dataset": Case(
        _config({"dataset": "x"}), ConfigError, ("'dataset'", "from_config's first argument")
    ),
    "config of the wrong type": Case(
        lambda _tmp_path: DataLoaderX.from_config(DATASET, 42),  # type: ignore[arg-type]
        TypeError,
        ("42", "int", ".yaml"),
    ),
    "config backend mapping without name": Case(
        _from_file("loader.yaml", "backend:\n  depth: 2\n"),
        ValueError,
        ("{'depth': 2}", "'name'"),
    ),
    "unknown worker_method": Case(
        _loader(worker_method="threads"),
        ValueError,
        ("worker_method", "'threads'", "'multiprocessing'", "'thread'", "did you mean 'thread'"),
    ),
    "worker_method of the wrong type": Case(
        _loader(worker_method=True), TypeError, ("worker_method", "True", "bool", "'thread'")
    ),
    "multiprocessing_context with worker threads": Case(
        _loader(worker_method="thread", multiprocessing_context="spawn"),
        ValueError,
        ("multiprocessing_context='spawn'", "worker_method='thread'", "Remove"),
    ),
    "a datapipe with worker threads": Case(
        lambda _tmp_path: DataLoaderX(
            IterableWrapper(range(4)), num_workers=2, worker_method="thread"
        ),
        ValueError,
        ("worker_method='thread'", "IterableWrapper", "worker_method='multiprocessing'"),
    ),
    "unknown worker_method in a file": Case(
        _from_file("loader.yaml", "num_workers: 2\nworker_method: process\n"),
        ValueError,
        ("worker_method", "'process'", "'multiprocessing'"),
    ),
    "config with a bad depth": Case(
        _from_file("loader.json", '{"backend": {"name": "thread", "depth": 0}}'),
        ValueError,
        ("'depth'", "0", ">= 1"),
    ),
}


def _depth_backends() -> list[str]:
    return [name for name in available_backends() if takes_depth(name)]


DEPTHS: dict[str, tuple[object, type[Exception], str]] = {
    "0": (0, ValueError, "got 0"),
    "-1": (-1, ValueError, "got -1"),
    "str": ("2", TypeError, "got '2' (str)"),
    "float": (2.5, TypeError, "got 2.5 (float)"),
    "bool": (True, TypeError, "got True (bool)"),
    "None": (None, TypeError, "got None (NoneType)"),
}


def _raises_without_starting_anything(
    build: Callable[[], object], error: type[Exception], fragments: tuple[str, ...]
) -> None:
    threads = set(threading.enumerate())
    children = child_pids()
    with pytest.raises(error) as caught:
        build()
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} missing from {message!r}"
    assert set(threading.enumerate()) == threads
    assert child_pids() == children


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_invalid_input_is_rejected_clearly(case: Case, tmp_path: Path) -> None:
    _raises_without_starting_anything(lambda: case.build(tmp_path), case.error, case.fragments)


@pytest.mark.parametrize("backend", _depth_backends())
@pytest.mark.parametrize("depth_id", list(DEPTHS))
def test_invalid_depth_is_rejected_clearly(backend: str, depth_id: str) -> None:
    depth, error, fragment = DEPTHS[depth_id]
    for spec in (
        {"backend": backend, "backend_options": {"depth": depth}},
        {"backend": {"name": backend, "depth": depth}},
    ):
        _raises_without_starting_anything(
            lambda spec=spec: DataLoaderX(DATASET, num_workers=2, **spec),  # type: ignore[misc]
            error,
            ("'depth'", fragment, ">= 1"),
        )


def test_unknown_backend_from_the_environment_names_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ENV_VAR, "thraed")
    _raises_without_starting_anything(
        lambda: DataLoaderX(DATASET),
        UnknownBackendError,
        ("'thraed'", ENV_VAR, "did you mean 'thread'"),
    )


# Plugins --------------------------------------------------------------------------------


@pytest.fixture
def fake_plugins(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., None]]:
    """Install fake ``dataloaderx.backends`` entry points and re-run plugin discovery.

    The registry scans entry points once per process and has no public reset; this fixture
    resets its private state and restores the registry's tables afterwards.
    """
    with registry._lock:
        saved = dict(registry._entries), dict(registry._aliases)

    def install(**targets: str) -> None:
        points = [
            importlib.metadata.EntryPoint(name=name, value=value, group=ENTRY_POINT_GROUP)
            for name, value in targets.items()
        ]

        def entry_points(**params: Any) -> list[importlib.metadata.EntryPoint]:
            return points if params.get("group") == ENTRY_POINT_GROUP else []

        monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
        monkeypatch.setattr(registry, "_plugins_scanned", False)

    yield install
    with registry._lock:
        registry._entries.clear()
        registry._entries.update(saved[0])
        registry._aliases.clear()
        registry._aliases.update(saved[1])


def test_plugin_that_fails_to_import(fake_plugins: Callable[..., None]) -> None:
    fake_plugins(broken="dataloaderx_no_such_plugin.module:Backend")
    assert "broken" not in available_backends()
    _raises_without_starting_anything(
        lambda: DataLoaderX(DATASET, backend="broken"),
        BackendUnavailableError,
        (
            "'broken'",
            "'dataloaderx_no_such_plugin.module:Backend'",
            "failed to import",
            "ModuleNotFoundError",
            "fix or uninstall",
            "choose another backend",
        ),
    )


def test_plugin_that_is_not_a_backend(fake_plugins: Callable[..., None]) -> None:
    fake_plugins(notabackend="collections:OrderedDict")
    _raises_without_starting_anything(
        lambda: DataLoaderX(DATASET, backend="notabackend"),
        BackendUnavailableError,
        ("'notabackend'", "'collections:OrderedDict'", "not a dataloaderx.Backend subclass"),
    )


def test_plugin_cannot_shadow_a_builtin(fake_plugins: Callable[..., None]) -> None:
    fake_plugins(thread="dataloaderx_no_such_plugin:Backend")
    with pytest.warns(RuntimeWarning, match="'thread'.*already provides"):
        get_backend("thread")
    assert get_backend("thread").__module__ == "dataloaderx.backends.thread"
