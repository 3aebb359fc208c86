"""The shared contract suite, run against the ``cuda`` backend on the recording fake.

On a machine without a GPU this exercises everything around the device calls (errors,
early exits, persistent workers, warnings, depth) through the real backend code.
"""

from __future__ import annotations

from typing import Any

import pytest

import tests.test_contract as contract
from dataloaderx.backends.cuda import CudaBackend
from tests.fake_accelerator import RecordingAccelerator

pytestmark = pytest.mark.timeout(60)

globals().update({name: test for name, test in vars(contract).items() if name.startswith("test_")})


@pytest.fixture(
    params=["cuda", {"name": "cuda", "depth": "auto"}],
    ids=["cuda", "cuda-depth-auto"],
)
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(CudaBackend, "device_api", RecordingAccelerator())
    return request.param
