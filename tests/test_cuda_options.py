"""``cuda`` and ``auto`` construction: availability, option validation, CPU fallback."""

from __future__ import annotations

import re
import warnings
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import tests.conftest
from dataloaderx import BackendUnavailableError, DataLoaderX, available_backends
from dataloaderx.backends.cuda import CudaBackend
from tests.fake_accelerator import KIND, RecordingAccelerator
from tests.helpers import RangeDataset, StructDataset, assert_same

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a GPU")
UNAVAILABLE = (
    "backend 'cuda' needs a CUDA device; torch.cuda.is_available() is False; "
    "use backend='thread' or backend='auto'"
)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> RecordingAccelerator:
    api = RecordingAccelerator()
    monkeypatch.setattr(CudaBackend, "device_api", api)
    return api


@no_gpu
@pytest.mark.parametrize("name", ["cuda", "cuda_stream"])
def test_cuda_without_a_gpu_fails_at_construction(name: str) -> None:
    with pytest.raises(BackendUnavailableError) as caught:
        DataLoaderX(RangeDataset(4), backend=name)
    assert str(caught.value) == UNAVAILABLE


@no_gpu
def test_available_backends_list_auto_but_not_cuda_without_a_gpu() -> None:
    names = available_backends()
    assert "auto" in names
    assert "cuda" not in names


@no_gpu
@pytest.mark.parametrize("name", ["cuda"])
def test_tests_parametrised_cuda_are_not_mistaken_for_cuda_marked(
    name: str, request: pytest.FixtureRequest
) -> None:
    tests.conftest.pytest_collection_modifyitems(request.config, [request.node])
    assert request.node.get_closest_marker("skip") is None
    assert name in request.node.keywords


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"depth": 0}, ValueError, "option 'depth' must be an int >= 1, got 0"),
        ({"non_blocking": "yes"}, TypeError, "'non_blocking' must be True or False, got 'yes'"),
        ({"transform": 3}, TypeError, "'transform' must be a callable taking and returning"),
        ({"memory_format": "nhwc"}, ValueError, "one of torch.channels_last, torch.channels_"),
        ({"device": "cpu"}, ValueError, "got 'cpu'; use backend='thread' to keep batches on"),
        ({"device": True}, TypeError, "'device' must be a device such as 'cuda', 'cuda:1'"),
        ({"device": 2.0}, TypeError, "got 2.0 (float)"),
        ({"device": -1}, ValueError, "must be a device index >= 0, got -1"),
        ({"device": "gpu:0"}, ValueError, "got 'gpu:0', which is not a device name"),
        ({"device": "cuda:0"}, ValueError, "but this machine's accelerator is 'privateuseone'"),
        ({"device": 2}, ValueError, "has 2 privateuseone device(s) (indices 0 to 1)"),
        ({"device": f"{KIND}:5"}, ValueError, "option 'device' is 'privateuseone:5', but"),
        ({"pin_threads": 0}, ValueError, "'pin_threads' must be an int >= 1 (the threads that"),
        ({"pin_threads": 2.5}, TypeError, "or None for half this machine's cores, at most 8; got"),
        ({"pin_threads": True}, TypeError, "got True (bool)"),
    ],
)
@pytest.mark.parametrize("backend", ["cuda", "auto"])
def test_bad_options_fail_at_construction_naming_option_and_value(
    fake: RecordingAccelerator, backend: str, options: dict[str, Any], error: type, message: str
) -> None:
    with pytest.raises(error, match=re.escape(message)) as caught:
        DataLoaderX(RangeDataset(4), backend=backend, backend_options=options)
    assert f"backend {backend!r}" in str(caught.value)
    assert fake.calls == []


@pytest.mark.parametrize(
    "device", [None, 1, f"{KIND}:1", KIND, torch.device(KIND, 0), torch.device(KIND)]
)
def test_valid_devices_are_accepted_without_touching_the_device(
    fake: RecordingAccelerator, device: Any
) -> None:
    loader = DataLoaderX(RangeDataset(4), backend="cuda", backend_options={"device": device})
    assert loader.prefetch_backend.device == device
    assert fake.calls == []


@no_gpu
def test_auto_without_an_accelerator_runs_as_thread() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader = DataLoaderX(StructDataset(9), batch_size=2, backend="auto")
    assert loader.prefetch_backend.describe()["resolved"] == "thread"
    assert_same(list(loader), list(DataLoader(StructDataset(9), batch_size=2)))


@no_gpu
@pytest.mark.parametrize(
    ("options", "shown"),
    [({"device": "cuda:1"}, "device='cuda:1'"), ({"non_blocking": False}, "non_blocking=False")],
)
def test_auto_warns_once_that_device_options_have_no_effect_on_cpu(
    options: dict[str, Any], shown: str
) -> None:
    with pytest.warns(UserWarning, match="found no accelerator and runs as 'thread'") as caught:
        loader = DataLoaderX(RangeDataset(4), batch_size=2, backend="auto", backend_options=options)
    assert len(caught) == 1
    assert shown in str(caught[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(list(loader)) == 2


@no_gpu
def test_auto_applies_transform_and_memory_format_on_cpu() -> None:
    def collate(items: list[torch.Tensor]) -> dict[str, Any]:
        stacked = torch.stack(items).to(torch.uint8)
        return {"image": stacked.reshape(len(items), 1, 1, 2).expand(-1, 3, 2, 2), "n": 1}

    def transform(batch: dict[str, Any]) -> dict[str, Any]:
        return {**batch, "image": batch["image"].float() / 255}

    options = {"transform": transform, "memory_format": torch.channels_last}
    loader = DataLoaderX(
        RangeDataset(4), batch_size=2, collate_fn=collate, backend="auto", backend_options=options
    )
    batches = list(loader)
    assert len(batches) == 2
    for batch in batches:
        assert batch["image"].dtype == torch.float32
        assert batch["image"].is_contiguous(memory_format=torch.channels_last)
        assert batch["n"] == 1
    assert float(batches[1]["image"].max()) == pytest.approx(9 / 255)  # item 3 is [3, 9]


def test_auto_with_an_accelerator_is_the_cuda_backend(fake: RecordingAccelerator) -> None:
    loader = DataLoaderX(
        RangeDataset(6),
        batch_size=2,
        backend="auto",
        backend_options={"device": 1, "depth": 3, "adaptive": False},
    )
    assert fake.calls == []
    assert loader.prefetch_backend.describe() == {
        "device": 1,
        "depth": 3,
        "non_blocking": True,
        "transform": None,
        "memory_format": None,
        "pin_threads": None,
        "max_depth": None,
        "max_bytes": None,
        "adaptive": False,
        "resolved": "cuda",
    }
    assert_same(list(loader), list(DataLoader(RangeDataset(6), batch_size=2)))
    assert len(fake.ops("copy")) == 3
    assert len(fake.ops("wait_event")) == 3
    list(loader)
    assert len(fake.streams_created) == 1
