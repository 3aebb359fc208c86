"""LightningCLI / jsonargparse: ``class_path: dataloaderx.DataLoaderX`` with ``init_args``."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from dataloaderx import DataLoaderX
from tests.helpers import RangeDataset, assert_same_events, run_events
from tests.lightning_support import one_machine

pytest.importorskip(
    "jsonargparse", reason="jsonargparse is not installed: pip install 'dataloaderx[integrations]'"
)
lightning = pytest.importorskip(
    "lightning.pytorch",
    reason="lightning is not installed: pip install 'dataloaderx[integrations]'",
)
from lightning.pytorch.cli import LightningCLI  # noqa: E402

CONFIG = Path(__file__).resolve().parents[1] / "examples" / "lightning_cli" / "config.yaml"


class TinyModel(lightning.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)


class RangeData(lightning.LightningDataModule):
    def __init__(
        self, loader: Callable[[Dataset[torch.Tensor]], DataLoader[torch.Tensor]], size: int = 8
    ) -> None:
        super().__init__()
        self.loader = loader
        self.size = size

    def train_dataloader(self) -> DataLoader[torch.Tensor]:
        return self.loader(RangeDataset(self.size))


@pytest.fixture(autouse=True)
def no_pytest_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    """LightningCLI reads ``sys.argv`` too; give it only the arguments under test."""
    monkeypatch.setattr(sys, "argv", ["train.py"])


def cli(*args: str) -> LightningCLI:
    return LightningCLI(
        TinyModel,
        RangeData,
        run=False,
        args=list(args),
        trainer_defaults={"plugins": one_machine()},
    )


def test_config_file_builds_a_dataloaderx() -> None:
    loader = cli("--config", str(CONFIG)).datamodule.train_dataloader()
    assert isinstance(loader, DataLoaderX)
    assert loader.backend == "thread"
    assert loader.prefetch_backend.describe() == {
        "depth": 3,
        "max_depth": None,
        "max_bytes": None,
        "adaptive": True,
    }
    expected = run_events(iter(DataLoader(RangeDataset(10), batch_size=4)))
    assert_same_events(run_events(iter(loader)), expected)


def test_command_line_overrides_backend_as_a_mapping() -> None:
    loader = cli(
        "--config",
        str(CONFIG),
        "--data.loader.init_args.backend",
        "{name: sync}",
        "--data.loader.init_args.backend_options",
        "null",
    ).datamodule.train_dataloader()
    assert loader.prefetch_backend.name == "sync"
    assert loader.backend == {"name": "sync"}


def test_command_line_picks_the_worker_method_and_options(
    worker_method_arguments: dict[str, Any],
) -> None:
    arguments = ["--data.loader.init_args.num_workers", "2"]
    for name, value in worker_method_arguments.items():
        text = value if isinstance(value, str) else json.dumps(value)
        arguments += [f"--data.loader.init_args.{name}", text]
    loader = cli("--config", str(CONFIG), *arguments).datamodule.train_dataloader()
    assert loader.worker_method == worker_method_arguments["worker_method"]
    assert loader.worker_options == worker_method_arguments.get("worker_options")
    expected = run_events(iter(DataLoader(RangeDataset(10), batch_size=4)))
    assert_same_events(run_events(iter(loader)), expected)


def test_a_bad_worker_method_is_rejected_with_the_choices(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        cli("--config", str(CONFIG), "--data.loader.init_args.worker_method", "process")
    error = capsys.readouterr().err
    assert "worker_method" in error
    assert "thread" in error


def test_wrong_type_is_rejected_naming_the_argument(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli("--config", str(CONFIG), "--data.loader.init_args.backend_options", "[1, 2]")
    assert "backend_options" in capsys.readouterr().err


def test_help_shows_both_arguments_with_their_types(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli("--data.loader.help", "dataloaderx.DataLoaderX")
    text = " ".join(capsys.readouterr().out.split())
    assert "--data.loader.backend BACKEND a registered backend name" in text
    assert "(type: Union[str, Mapping[str, Any], null], default: null)" in text
    assert "--data.loader.backend_options BACKEND_OPTIONS options for the backend" in text
    assert "(type: Optional[Mapping[str, Any]], default: null)" in text


def test_command_line_asks_for_elastic_thread_workers() -> None:
    loader = cli(
        "--config",
        str(CONFIG),
        "--data.loader.init_args.num_workers",
        "auto",
        "--data.loader.init_args.worker_method",
        "thread",
        "--data.loader.init_args.worker_options",
        '{"max_workers": 3}',
    ).datamodule.train_dataloader()
    assert loader._scaling is not None
    assert loader._scaling.bounds.max_workers == 3
    expected = run_events(iter(DataLoader(RangeDataset(10), batch_size=4)))
    assert_same_events(run_events(iter(loader)), expected)
