"""Lightning rebuilds the loader to add a ``DistributedSampler``; it must stay a DataLoaderX."""

from __future__ import annotations

import json
import multiprocessing.resource_tracker
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from dataloaderx import DataLoaderX
from tests.helpers import RangeDataset
from tests.lightning_support import one_machine

lightning = pytest.importorskip(
    "lightning.pytorch",
    reason="lightning is not installed: pip install 'dataloaderx[integrations]'",
)

SIZE = 24


@pytest.fixture(scope="module", autouse=True)
def resource_tracker_started_before_the_leak_check() -> None:
    """Spawning starts Python's resource tracker, which lives as long as this process."""
    multiprocessing.resource_tracker.ensure_running()


class ShardRecorder(lightning.LightningModule):
    """Trains on ``tensor([i, i*i])`` batches and writes, per rank, what its loop saw."""

    def __init__(self, out_dir: str, loader_kwargs: dict[str, Any]) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.out_dir = out_dir
        self.loader_kwargs = loader_kwargs
        self.seen: list[int] = []
        self.producer_threads: set[str] = set()

    def train_dataloader(self) -> DataLoader[torch.Tensor]:
        return DataLoaderX(RangeDataset(SIZE), **self.loader_kwargs)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.seen.extend(int(index) for index in batch[:, 0])
        self.producer_threads.update(
            thread.name
            for thread in threading.enumerate()
            if thread.name.startswith("dataloaderx-background-")
        )
        loss: torch.Tensor = self.layer(batch.float()).pow(2).mean()
        return loss

    def on_train_epoch_end(self) -> None:
        loader = self.trainer.train_dataloader
        record = {
            "rank": self.global_rank,
            "world_size": self.trainer.world_size,
            "loader_class": type(loader).__name__,
            "backend": loader.backend,
            "backend_options": loader.backend_options,
            "worker_method": loader.worker_method,
            "resolved": [loader.prefetch_backend.name, loader.prefetch_backend.describe()],
            "batch_size": loader.batch_size,
            "distributed_sampler": isinstance(loader.sampler, DistributedSampler),
            "seen": self.seen,
            "producer_threads": sorted(self.producer_threads),
        }
        path = Path(self.out_dir) / f"rank{self.global_rank}.json"
        path.write_text(json.dumps(record), encoding="utf-8")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.mark.filterwarnings(
    "ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated:FutureWarning"
)
def test_ddp_spawn_keeps_the_loader_class_backend_and_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A seed_everything(workers=True) earlier in this process (LightningCLI's) leaves these
    # set, and Lightning then adds its worker_init_fn, which thread workers cannot take
    # (docs/thread-workers.md).
    monkeypatch.delenv("PL_SEED_WORKERS", raising=False)
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    loader_kwargs = {
        "batch_size": 4,
        "num_workers": 2,
        "worker_method": "thread",
        "backend": "background",
        "backend_options": {"depth": 3},
    }
    trainer = lightning.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        plugins=one_machine(),
    )
    trainer.fit(ShardRecorder(str(tmp_path), loader_kwargs))

    records = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for rank, record in enumerate(records):
        assert record["rank"] == rank
        assert record["world_size"] == 2
        assert record["loader_class"] == "DataLoaderX"
        assert record["backend"] == "background"
        assert record["backend_options"] == {"depth": 3}
        assert record["worker_method"] == "thread"
        assert record["resolved"] == [
            "background",
            {"depth": 3, "max_depth": None, "max_bytes": None},
        ]
        assert record["batch_size"] == 4
        assert record["distributed_sampler"]
        assert record["producer_threads"], f"rank {rank} trained without a producer thread"
        assert len(record["seen"]) == SIZE // 2
    first, second = (set(record["seen"]) for record in records)
    assert not first & second
    assert first | second == set(range(SIZE))
