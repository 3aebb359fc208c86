"""Hydra: ``_target_: dataloaderx.DataLoaderX`` configs built with ``instantiate``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

from dataloaderx import DataLoaderX
from tests.helpers import RangeDataset, assert_same_events, run_events

hydra = pytest.importorskip(
    "hydra", reason="hydra-core is not installed: pip install 'dataloaderx[integrations]'"
)
from hydra.errors import InstantiationException  # noqa: E402
from hydra.utils import instantiate  # noqa: E402

CONFIG_DIR = Path(__file__).resolve().parents[1] / "examples" / "hydra" / "conf"


def compose(*overrides: str) -> Any:
    with hydra.initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return hydra.compose(config_name="config", overrides=list(overrides))


def test_dataset_given_at_call_time() -> None:
    loader = instantiate(compose().loader, dataset=RangeDataset(10))
    assert isinstance(loader, DataLoaderX)
    assert loader.prefetch_backend.name == "thread"
    assert loader.prefetch_backend.describe() == {
        "depth": 4,
        "max_depth": None,
        "max_bytes": None,
        "adaptive": True,
    }
    expected = run_events(iter(DataLoader(RangeDataset(10), batch_size=4)))
    assert_same_events(run_events(iter(loader)), expected)


def test_nested_dataset_target_and_overrides() -> None:
    config = compose(
        "loader.backend=sync",
        "~loader.backend_options",
        "+loader.dataset._target_=tests.helpers.RangeDataset",
        "+loader.dataset.size=6",
    )
    loader = instantiate(config.loader)
    assert isinstance(loader.dataset, RangeDataset)
    assert loader.prefetch_backend.name == "sync"
    expected = run_events(iter(DataLoader(RangeDataset(6), batch_size=4)))
    assert_same_events(run_events(iter(loader)), expected)


def test_backend_mapping_from_the_command_line(backend: str) -> None:
    config = compose(f"loader.backend={{name:{backend}}}", "~loader.backend_options")
    loader = instantiate(config.loader, dataset=RangeDataset(3))
    assert loader.prefetch_backend.name == backend
    assert len(list(loader)) == 1


def test_bad_backend_option_names_the_option() -> None:
    config = compose("+loader.backend_options.dpth=2")
    with pytest.raises(InstantiationException, match=r"unknown option 'dpth'.*'depth'"):
        instantiate(config.loader, dataset=RangeDataset(3))


def test_worker_method_and_options_from_overrides(
    worker_method_arguments: dict[str, Any],
) -> None:
    overrides = [
        f"+loader.{name}={_override(value)}" for name, value in worker_method_arguments.items()
    ]
    config = compose("loader.num_workers=2", *overrides)
    loader = instantiate(config.loader, dataset=RangeDataset(10))
    assert loader.worker_method == worker_method_arguments["worker_method"]
    assert loader.worker_options == worker_method_arguments.get("worker_options")
    expected = run_events(iter(DataLoader(RangeDataset(10), batch_size=4)))
    assert_same_events(run_events(iter(loader)), expected)


def _override(value: Any) -> str:
    """``value`` in Hydra's override grammar (a mapping as ``{key:value,...}``)."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{key}:{item}" for key, item in value.items()) + "}"
    return str(value)


def test_elastic_thread_workers_from_overrides() -> None:
    config = compose(
        "loader.num_workers=auto",
        "+loader.worker_method=thread",
        "+loader.worker_options={min_workers:1,max_workers:3}",
    )
    loader = instantiate(config.loader, dataset=RangeDataset(10))
    assert loader._scaling is not None
    assert loader._scaling.bounds[:2] == (1, 3)
    expected = run_events(iter(DataLoader(RangeDataset(10), batch_size=4)))
    assert_same_events(run_events(iter(loader)), expected)
