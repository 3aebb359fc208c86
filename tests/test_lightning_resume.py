"""Lightning saves a DataLoaderX's state in its checkpoints and restores it on resume."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from dataloaderx import DataLoaderX
from tests.helpers import RangeDataset
from tests.lightning_support import one_machine

lightning = pytest.importorskip(
    "lightning.pytorch",
    reason="lightning is not installed: pip install 'dataloaderx[integrations]'",
)
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402

BATCHES_PER_EPOCH = 10


class Recorder(lightning.LightningModule):
    """Trains on shuffled ``tensor([i, i*i])`` batches and records their indices."""

    def __init__(self, backend: str) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.backend = backend
        self.seen: list[list[int]] = []

    def train_dataloader(self) -> DataLoader[torch.Tensor]:
        generator = torch.Generator()
        generator.manual_seed(0)
        return DataLoaderX(
            RangeDataset(4 * BATCHES_PER_EPOCH),
            batch_size=4,
            shuffle=True,
            generator=generator,
            backend=self.backend,
            backend_options={"stats": False},
        )

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.seen.append(batch[:, 0].tolist())
        loss: torch.Tensor = self.layer(batch.float()).pow(2).mean()
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit(model: Recorder, root: Path, ckpt_path: str | None = None, **kwargs: Any) -> None:
    kwargs.setdefault("max_epochs", 2)
    trainer = lightning.Trainer(
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
        plugins=one_machine(),
        **kwargs,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice on num_workers and logging
        trainer.fit(model, ckpt_path=ckpt_path)


@pytest.mark.parametrize("stop_at", [6, 13])
def test_a_mid_epoch_checkpoint_resumes_the_epoch(
    tmp_path: Path, backend: str, stop_at: int
) -> None:
    reference = Recorder(backend)
    fit(reference, tmp_path / "reference")
    assert len(reference.seen) == 2 * BATCHES_PER_EPOCH

    first = Recorder(backend)
    every_step = ModelCheckpoint(
        dirpath=tmp_path / "checkpoints", every_n_train_steps=1, save_top_k=-1, filename="{step}"
    )
    fit(first, tmp_path / "first", callbacks=[every_step], max_steps=stop_at)
    checkpoint = tmp_path / "checkpoints" / f"step={stop_at}.ckpt"
    saved = torch.load(checkpoint, weights_only=False)["loops"]["fit_loop"]["state_dict"]
    loader_state = saved["combined_loader"][0]
    assert loader_state["consumed"] == stop_at % BATCHES_PER_EPOCH

    second = Recorder(backend)
    fit(second, tmp_path / "second", ckpt_path=str(checkpoint))
    assert first.seen + second.seen == reference.seen
