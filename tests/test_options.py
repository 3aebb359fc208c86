"""Choosing a backend: keyword, mapping, environment variable; validation at construction."""

from __future__ import annotations

import inspect
import threading
from typing import Any

import pytest

from dataloaderx import DataLoaderX, UnknownBackendError
from dataloaderx.backends.background import BackgroundBackend
from dataloaderx.backends.sync import SyncBackend
from dataloaderx.backends.thread import ThreadBackend
from dataloaderx.options import ENV_VAR
from tests.helpers import RangeDataset


def test_default_is_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    loader = DataLoaderX(RangeDataset(3))
    assert isinstance(loader.prefetch_backend, ThreadBackend)
    assert loader.prefetch_backend.depth == 2
    assert loader.backend is None
    assert loader.backend_options is None


def test_environment_variable_picks_the_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, "prefetch_generator")
    assert isinstance(DataLoaderX(RangeDataset(3)).prefetch_backend, BackgroundBackend)
    # An explicit argument always wins over the environment.
    assert isinstance(DataLoaderX(RangeDataset(3), backend="sync").prefetch_backend, SyncBackend)


def test_environment_variable_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, "thred")
    with pytest.raises(UnknownBackendError, match=r"'thred'.*did you mean 'thread'"):
        DataLoaderX(RangeDataset(3))


def test_mapping_with_options_and_merge() -> None:
    loader = DataLoaderX(RangeDataset(3), backend={"name": "thread", "depth": 4})
    assert loader.prefetch_backend.depth == 4  # type: ignore[attr-defined]
    merged = DataLoaderX(
        RangeDataset(3), backend={"name": "thread", "depth": 4}, backend_options={"depth": 7}
    )
    assert merged.prefetch_backend.depth == 7  # type: ignore[attr-defined]
    options = DataLoaderX(RangeDataset(3), backend="background", backend_options={"depth": 5})
    assert options.prefetch_backend.depth == 5  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("backend", "backend_options", "error", "pattern"),
    [
        ("thraed", None, UnknownBackendError, r"unknown backend 'thraed'.*'thread'"),
        ({"depth": 2}, None, ValueError, r"backend mapping \{'depth': 2\} has no 'name' key"),
        ({"name": 3}, None, TypeError, r"'name' must be a str, got 3"),
        (42, None, TypeError, r"backend must be a backend name .* got 42 \(int\)"),
        ("thread", ["depth"], TypeError, r"backend_options must be a mapping .* got \['depth'\]"),
        ("thread", {"deph": 2}, TypeError, r"unknown option 'deph'.*'depth'.*did you mean"),
        ("sync", {"depth": 2}, TypeError, r"backend 'sync' got an unknown option 'depth'"),
        ("thread", {"depth": 0}, ValueError, r"option 'depth' must be an int >= 1, got 0"),
        ("thread", {"depth": -1}, ValueError, r"got -1"),
        ("background", {"depth": 0}, ValueError, r"backend 'background' option 'depth'"),
        ("thread", {"depth": "2"}, TypeError, r"got '2' \(str\)"),
        ("thread", {"depth": 2.5}, TypeError, r"got 2.5 \(float\)"),
        ("thread", {"depth": True}, TypeError, r"got True \(bool\)"),
    ],
)
def test_bad_backend_arguments_fail_at_construction(
    backend: Any, backend_options: Any, error: type[Exception], pattern: str
) -> None:
    threads = set(threading.enumerate())
    with pytest.raises(error, match=pattern):
        DataLoaderX(
            RangeDataset(3), num_workers=2, backend=backend, backend_options=backend_options
        )
    assert set(threading.enumerate()) == threads


def test_dataloader_validation_is_unchanged() -> None:
    with pytest.raises(ValueError, match="persistent_workers option needs num_workers > 0"):
        DataLoaderX(RangeDataset(3), persistent_workers=True)
    with pytest.raises(ValueError, match="num_workers option should be non-negative"):
        DataLoaderX(RangeDataset(3), num_workers=-1)


def test_rebuilding_from_attributes_keeps_the_backend() -> None:
    """Frameworks such as Lightning rebuild a loader from same-named attributes."""
    original = DataLoaderX(
        RangeDataset(10),
        batch_size=3,
        num_workers=2,
        worker_method="thread",
        backend={"name": "thread"},
        backend_options={"depth": 5},
    )
    parameters = inspect.signature(DataLoaderX.__init__).parameters
    kwargs = {
        name: getattr(original, name)
        for name in parameters
        if name not in ("self", "sampler", "batch_sampler", "shuffle") and hasattr(original, name)
    }
    rebuilt = DataLoaderX(**kwargs)
    assert rebuilt.backend == {"name": "thread"}
    assert rebuilt.backend_options == {"depth": 5}
    assert rebuilt.prefetch_backend.depth == 5  # type: ignore[attr-defined]
    assert rebuilt.batch_size == 3
    assert rebuilt.worker_method == "thread"


def test_signature_extends_dataloader() -> None:
    from torch.utils.data import DataLoader

    ours = inspect.signature(DataLoaderX.__init__).parameters
    theirs = inspect.signature(DataLoader.__init__).parameters
    assert list(ours)[: len(theirs)] == list(theirs)
    for name, parameter in theirs.items():
        assert ours[name].default == parameter.default
        assert ours[name].kind == parameter.kind
    assert ours["worker_method"].kind is inspect.Parameter.KEYWORD_ONLY
    assert ours["worker_method"].default == "multiprocessing"
    assert ours["backend"].kind is inspect.Parameter.KEYWORD_ONLY
    assert ours["backend_options"].kind is inspect.Parameter.KEYWORD_ONLY
