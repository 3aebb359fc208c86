"""Preemptible training: save every N steps, restart, continue exactly where it stopped.

Run it, kill it at any time (Ctrl-C, SIGKILL, a preempted node), run it again:

    python examples/resume/train.py checkpoints/
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

from dataloaderx import DataLoaderX

EPOCHS = 3
SAVE_EVERY = 50  # steps


def save(path: Path, checkpoint: dict[str, object]) -> None:
    """Write atomically: a kill during the write leaves the previous checkpoint intact."""
    torch.save(checkpoint, path.with_suffix(".tmp"))
    os.replace(path.with_suffix(".tmp"), path)


def main(directory: Path, stop_after: int | None = None) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "last.pt"
    torch.manual_seed(0)
    dataset = TensorDataset(torch.randn(4096, 8), torch.randn(4096, 1))
    generator = torch.Generator()
    generator.manual_seed(0)  # a seeded generator makes every epoch's order reproducible
    loader = DataLoaderX(
        dataset, batch_size=32, shuffle=True, generator=generator, num_workers=2, backend="thread"
    )
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    epoch, step = 0, 0
    if path.exists():
        checkpoint = torch.load(path, weights_only=True)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        loader.load_state_dict(checkpoint["loader"])  # the next iter() continues the epoch
        epoch, step = checkpoint["epoch"], checkpoint["step"]
        print(f"resumed at epoch {epoch}, step {step}")

    while epoch < EPOCHS:
        for inputs, targets in loader:
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step % SAVE_EVERY == 0:
                # loader.state_dict(): the position after this batch, not after the
                # batches the prefetcher already made
                checkpoint = {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "loader": loader.state_dict(),
                    "epoch": epoch,
                    "step": step,
                }
                save(path, checkpoint)
            if step == stop_after:
                return  # a simulated preemption (the tests use it)
        epoch += 1
    print(f"done: {step} steps")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else None)
